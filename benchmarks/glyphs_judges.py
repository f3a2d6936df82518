"""Measure gold judges of the glyphs world against a person's reading (issue 29, item 3).

    python benchmarks/glyphs_judges.py [JUDGE_FOLDER ...] [--min-prob P ...] [--labelled DIR]  # default: shipped judge

For each judge folder (a `GoldJudge.save_pretrained` folder) and each acceptance threshold P (an image counts as
the prompted digit when the judge reads it and gives it probability >= P; 0 is the plain argmax), prints one
table row:

- on the person-labelled RL samples of `benchmarks/glyphs/judged/` (320 step-300 validation images; labels.json
  marks each as readable as the prompted digit, unreadable, or unsure), or of `--labelled DIR` (the held-out set
  `benchmarks/glyphs/judged_84a7a35/`, labelled after the judges were designed): the share of unreadable images it
  accepts (goal under 2%), of readable images it accepts, and of unsure ones;
- on 2,000 fresh renders of the renderer (seed 999): the share it accepts (goal at least 97%);
- on the renderer's digits distorted as in training and drawn bold or hazy: its accuracy;
- on the saved RL hacks (`gold/rl_negatives.pt`, which the shipped judge trained on): the share it reads as no
  digit.
"""

import argparse
import json
from pathlib import Path

import torch

from omnialign.worlds.glyphs.data import ASSETS, CHARSET, augment, bold_or_hazy, render
from omnialign.worlds.glyphs.gold import NOT_A_DIGIT, GoldJudge

JUDGED = Path(__file__).parent / "glyphs" / "judged"


def labelled(folder: Path = JUDGED) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """The person-labelled images (N, 1, 32, 32) in [0, 1] of a folder, their prompted digit (N,), and each label."""
    labels = json.loads((folder / "labels.json").read_text())
    images, digits, marks = [], [], []
    for name, entry in labels.items():
        saved = torch.load(folder / f"{name}.pt")
        images.append(saved["images"].float() / 255)
        digits += [CHARSET.index(p) for p in saved["prompts"]]
        marks += ["no" if i in entry["no"] else "unsure" if i in entry["unsure"] else "yes" for i in range(80)]
    return torch.cat(images), torch.tensor(digits), marks


@torch.no_grad()
def accepts(judge: GoldJudge, images: torch.Tensor, digits: torch.Tensor, min_prob: float) -> torch.Tensor:
    """Whether the judge reads each image (N, 1, 32, 32) in [0, 1] as its digit with probability >= min_prob."""
    probs = judge(images * 2 - 1).softmax(-1)
    chosen = probs[torch.arange(len(images)), digits]
    return (probs.argmax(-1) == digits) & (chosen >= min_prob)


def image_sets(folder: Path = JUDGED) -> dict[str, tuple[torch.Tensor, ...]]:
    """Every set a judge is measured on, drawn once: the labelled images (images, digits, marks), then (images,
    digits) for the renders, the distorted renders and the bold or hazy ones, and the RL hacks (images,)."""
    texts = [CHARSET[i % 10] for i in range(2000)]
    target = torch.tensor([i % 10 for i in range(2000)])
    g = torch.Generator().manual_seed(999)
    return {
        "labelled": labelled(folder),
        "renders": ((render(texts, seed=999) + 1) / 2, target),
        "distorted": ((augment(render(texts, seed=998), g) + 1) / 2, target),
        "bold_or_hazy": ((augment(bold_or_hazy(render(texts, seed=997), g), g, 0.5) + 1) / 2, target),
        "hacks": (torch.load(ASSETS / "gold" / "rl_negatives.pt").float() / 255,),
    }


@torch.no_grad()
def measure(judge: GoldJudge, min_prob: float, sets: dict[str, tuple[torch.Tensor, ...]]) -> dict[str, float]:
    images, digits, marks = sets["labelled"]
    ok = accepts(judge, images, digits, min_prob)
    share = {m: ok[[i for i, x in enumerate(marks) if x == m]].float().mean().item() for m in ("yes", "no", "unsure")}
    (hacks,) = sets["hacks"]
    return {
        "unreadable_accepted": share["no"], "unreadable_count": marks.count("no"),
        "readable_accepted": share["yes"], "unsure_accepted": share["unsure"],
        "renders_accepted": accepts(judge, *sets["renders"], min_prob).float().mean().item(),
        "distorted_accuracy": accepts(judge, *sets["distorted"], min_prob).float().mean().item(),
        "bold_or_hazy_accuracy": accepts(judge, *sets["bold_or_hazy"], min_prob).float().mean().item(),
        "hacks_not_a_digit": (judge(hacks * 2 - 1).argmax(-1) == NOT_A_DIGIT).float().mean().item(),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("judges", nargs="*", default=[str(ASSETS / "gold")])
    p.add_argument("--min-prob", type=float, nargs="*", default=[0.0])
    p.add_argument("--labelled", type=Path, default=JUDGED, help=f"a folder of labelled images (default {JUDGED})")
    args = p.parse_args()
    rows, sets = [], image_sets(args.labelled)
    for path in args.judges:
        judge = GoldJudge.from_pretrained(path).eval()
        for min_prob in args.min_prob:
            rows.append({"judge": path, "min_prob": min_prob, **measure(judge, min_prob, sets)})
            print(json.dumps(rows[-1]))
    print_table(rows)


def print_table(rows: list[dict]) -> None:
    """The rows as a table: the first row's keys, then each row's values (floats to 3 places)."""
    keys = list(rows[0])
    print(" | ".join(keys))
    for row in rows:
        print(" | ".join(f"{row[k]:.3f}" if isinstance(row[k], float) else str(row[k]) for k in keys))


if __name__ == "__main__":
    main()
