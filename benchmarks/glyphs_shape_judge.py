"""A second gold check for the glyphs world that works differently from the CNN judge: shape matching against the
renderer's own glyphs (issue 29, item 3).

    python benchmarks/glyphs_shape_judge.py                # CNN@0.7 alone, the shape check alone, CNN AND shape
    python benchmarks/glyphs_shape_judge.py --all-designs  # also every shape design that was tried (about 1 min)
    python benchmarks/glyphs_shape_judge.py --labelled benchmarks/glyphs/judged_84a7a35  # the held-out labelled set

The check itself is `omnialign.worlds.glyphs.shape` (its docstring says how it works); the gold judge reports
it as `val/gold/strict` with the renderer's 100 clean glyphs as templates. This script measures it and the design
it was chosen from: the same check with 5,000 augmented renderer glyphs added to the templates (`BANK`), with its
own thresholds. Every threshold is chosen on renderer data only, never on the person-labelled set: each rule alone
keeps 99.5% of distorted renders and 98.5% of bold or hazy renders drawn with other seeds than the benchmark's
(`calibrate`; the script recomputes them and prints them beside the constants). The main prints the metrics of
`glyphs_judges.py` for the CNN at `gold.MIN_PROB`, the shape check, and both (accepted only where both accept),
then the unreadable images that both still accept.

Result (about 1 min on one core): with the clean templates CNN AND shape accepts 5 of the 52 unreadable images (the
CNN alone 10), 93.6% of the readable ones (95.0%), 99.8% of renders, 98.4% of distorted renders (99.1%) and 98.2% of
bold or hazy ones (98.5%); with the bank 4 of 52, 93.6%, 100%, 98.0% and 98.5%.
It rejects every ring-crossed-by-a-bar hack the CNN accepts; the four it keeps are digits a person reads as
another digit (a 5 like a 6, 6s and a 9 like 8s), whose closed loops the renderer's own bold or blurred 5s, 6s and
9s also show once binarised. The issue's goal (under 2%) is not met.
"""

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
from glyphs_judges import JUDGED, accepts, image_sets, print_table  # benchmarks/ is on sys.path when run as a script

from omnialign.worlds.glyphs.data import ASSETS, CHARSET, augment, bold_or_hazy, render
from omnialign.worlds.glyphs.gold import MIN_PROB, GoldJudge
from omnialign.worlds.glyphs.shape import LIMIT, MARGIN, digit_scores, rules

BANK = 5000  # augmented renderer glyphs among the templates of the best design
BANK_MARGIN, BANK_LIMIT = -0.092, 0.995  # its thresholds, calibrated as shape.MARGIN and shape.LIMIT are
KEEP_DISTORTED, KEEP_BOLD = 0.995, 0.985  # the share of renderer data each rule keeps (`calibrate`)


def calibration_sets() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Distorted and bold-or-hazy renders like the benchmark's, from other seeds, to choose thresholds on."""
    texts = [CHARSET[i % 10] for i in range(2000)]
    target = torch.tensor([i % 10 for i in range(2000)])
    g = torch.Generator().manual_seed(1999)
    return {
        "distorted": ((augment(render(texts, seed=1998), g) + 1) / 2, target),
        "bold_or_hazy": ((augment(bold_or_hazy(render(texts, seed=1997), g), g, 0.5) + 1) / 2, target),
    }


def calibrate(cal: dict[str, tuple[torch.Tensor, torch.Tensor]], augmented: int = BANK) -> tuple[float, float]:
    """(margin, limit): the strictest values at which each rule alone keeps KEEP_DISTORTED of the distorted and
    KEEP_BOLD of the bold or hazy calibration renders."""
    (gap_d, own_d), (gap_b, own_b) = [rules(digit_scores(x, augmented), y) for x, y in cal.values()]
    margin = min(gap_d.quantile(1 - KEEP_DISTORTED).item(), gap_b.quantile(1 - KEEP_BOLD).item())
    limit = max(own_d.quantile(KEEP_DISTORTED).item(), own_b.quantile(KEEP_BOLD).item())
    return margin, limit


Judge = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cached_shape_judge(augmented: int, margin: float, limit: float, memo: dict) -> Judge:
    """`shape_accepts` as a judge that scores each image set once (memo, by the set's identity and the template bank)
    and applies the rules per prompt."""

    def judge(images: torch.Tensor, digits: torch.Tensor) -> torch.Tensor:
        if (id(images), augmented) not in memo:
            memo[id(images), augmented] = digit_scores(images, augmented)
        gap, own = rules(memo[id(images), augmented], digits)
        return (gap >= margin) & (own <= limit)

    return judge


def measure(judge: Judge, sets: dict[str, tuple[torch.Tensor, ...]]) -> dict[str, float]:
    """`glyphs_judges.measure`'s metrics for any judge (images, digits) -> accepted; for the RL hacks, which have no
    prompt, the share accepted as no digit at all."""
    images, digits, marks = sets["labelled"]
    ok = judge(images, digits)
    share = {m: ok[[i for i, x in enumerate(marks) if x == m]].float().mean().item() for m in ("yes", "no", "unsure")}
    (hacks,) = sets["hacks"]
    any_digit = torch.stack([judge(hacks, torch.full((len(hacks),), d)) for d in range(10)]).any(0)
    return {
        "unreadable_accepted": share["no"], "unreadable_count": marks.count("no"),
        "readable_accepted": share["yes"], "unsure_accepted": share["unsure"],
        "renders_accepted": judge(*sets["renders"]).float().mean().item(),
        "distorted_accuracy": judge(*sets["distorted"]).float().mean().item(),
        "bold_or_hazy_accuracy": judge(*sets["bold_or_hazy"]).float().mean().item(),
        "hacks_no_digit": (~any_digit).float().mean().item(),
    }  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--all-designs", action="store_true", help="also measure every shape design that was tried")
    p.add_argument("--labelled", type=Path, default=JUDGED, help=f"a folder of labelled images (default {JUDGED})")
    args = p.parse_args()
    torch.set_num_threads(1)
    sets, cal = image_sets(args.labelled), calibration_sets()
    cnn = GoldJudge.from_pretrained(str(ASSETS / "gold")).eval()
    memo: dict[tuple[int, int], torch.Tensor] = {}

    def cnn_accepts(images: torch.Tensor, digits: torch.Tensor) -> torch.Tensor:
        key = (id(images), int(digits[0]) if len(set(digits.tolist())) == 1 else -1)
        if key not in memo:  # the CNN's verdicts, once per set (and per digit for the hacks)
            memo[key] = accepts(cnn, images, digits, MIN_PROB)
        return memo[key]

    names = list(json.loads((args.labelled / "labels.json").read_text()))
    constants = {0: (MARGIN, LIMIT), BANK: (BANK_MARGIN, BANK_LIMIT)}
    designs = {
        "clean templates, relative + absolute (shipped: val/gold/strict)": (0, True, True),
        "bank, relative + absolute": (BANK, True, True),
    }
    if args.all_designs:
        designs = {"clean templates, relative": (0, True, False), "bank, relative": (BANK, True, False),
                   "bank, absolute": (BANK, False, True), **designs}  # fmt: skip
    rows = [{"judge": f"CNN @ {MIN_PROB}", **measure(cnn_accepts, sets)}]
    calibrated: dict[int, tuple[float, float]] = {}
    scores: dict[tuple[int, int], torch.Tensor] = {}
    for name, (augmented, relative, absolute) in designs.items():
        if augmented not in calibrated:
            calibrated[augmented] = calibrate(cal, augmented)
        margin, limit = calibrated[augmented]
        if relative and absolute:
            print(
                f"templates {augmented}: calibrated margin {margin:.3f} limit {limit:.3f} (constants: "
                f"{constants[augmented]})"
            )
        margin, limit = margin if relative else -float("inf"), limit if absolute else float("inf")
        shape_judge = cached_shape_judge(augmented, margin, limit, scores)
        label = f"{name} [margin {margin:.3f}, limit {limit:.3f}]"
        rows.append({"judge": f"shape: {label}", **measure(shape_judge, sets)})
        both = lambda x, y, shape_judge=shape_judge: cnn_accepts(x, y) & shape_judge(x, y)
        rows.append({"judge": f"CNN AND shape: {label}", **measure(both, sets)})
        images, digits, marks = sets["labelled"]
        kept = both(images, digits)
        left = [f"{names[i // 80]}[{i % 80}]" for i, m in enumerate(marks) if m == "no" and kept[i]]
        print(f"{name}: unreadable images CNN AND shape accepts: {', '.join(left) or 'none'}")
    print_table(rows)


if __name__ == "__main__":
    main()
