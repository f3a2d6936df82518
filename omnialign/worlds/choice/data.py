"""The choice world's data: synthetic multiple-choice questions answered as `<answer>X</answer>`.

"Which is largest (or smallest)?" over four distinct digits 0-9 labelled A-D. Questions are generated
from a seed per split (train: 4000, val: 200), so nothing is stored or downloaded. Preference pairs
(`pairs`) prefer the right letter over a wrong one: the letter A when A is wrong (the shipped model's
bias on "smallest" questions, see `worlds/choice/pretrain.py`), else a random wrong letter.
"""

import random
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"  # the shipped base model (and its student)
LETTERS = "ABCD"
SIZES = {"train": 4000, "val": 200}
SEEDS = {"train": 0, "val": 1}


def question(rng: random.Random) -> tuple[str, str]:
    """One question text and its answer letter."""
    numbers = rng.sample(range(10), 4)
    kind = rng.choice(["largest", "smallest"])
    best = max(numbers) if kind == "largest" else min(numbers)
    options = " ".join(f"{letter}) {n}" for letter, n in zip(LETTERS, numbers))
    return f"Which is {kind}? {options}", LETTERS[numbers.index(best)]


def answer(letter: str) -> str:
    return f"<answer>{letter}</answer>"


def questions(split: str) -> list[dict]:
    """The RL records of a split: chat prompt, ground truth letter, modality text."""
    if split not in SIZES:
        raise ValueError(f"choice split {split!r}: choose one of {sorted(SIZES)}")
    rng = random.Random(SEEDS[split])
    out = []
    for i in range(SIZES[split]):
        text, truth = question(rng)
        out.append({"id": f"choice-{split}-{i}", "prompt": [{"role": "user", "content": text}], "ground_truth": truth,
                    "modality": "text", "split": split, "data_source": "choice"})  # fmt: skip
    return out


def pairs(split: str) -> list[dict]:
    """Preference records of a split: the right answer chosen, a wrong one (A when possible) rejected."""
    rng = random.Random(SEEDS[split] + 100)
    out = []
    for record in questions(split):
        truth = record["ground_truth"]
        wrong = "A" if truth != "A" else rng.choice(LETTERS[1:])
        out.append({**record, "chosen": answer(truth), "rejected": answer(wrong), "chosen_score": 1.0,
                    "rejected_score": 0.0})  # fmt: skip
    return out
