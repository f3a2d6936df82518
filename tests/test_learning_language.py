"""Learning checks on the choice world (slow: run with --runslow; CI skips them). Figures in BENCHMARKS.md."""

import json

import pytest

from omnialign.config import apply_overrides, validate
from omnialign.recipes import RECIPES
from omnialign.train import main


def run(name, tmp_path, *overrides):
    config = validate(apply_overrides(RECIPES[name](), [f"trainer.output_dir={tmp_path}", "trainer.progress=false",
                                                        *overrides]))  # fmt: skip
    return main(config)


WEAK_BASE = (
    "the shipped choice base (250 pretraining steps on a contended CPU) answers A everywhere and has not "
    "learned the comparison; RL from the 0/1 reward does not teach it within the recipe's steps "
    "(BENCHMARKS.md): retrain the base longer (omnialign prepare choice --steps 1000)"
)


@pytest.mark.slow
@pytest.mark.xfail(reason=WEAK_BASE, strict=False)
@pytest.mark.parametrize("name", ["choice_dapo", "choice_gspo", "choice_grpo"])
def test_rl_raises_greedy_accuracy(name, tmp_path):
    summary = run(name, tmp_path)
    assert summary["val_after"] - summary["val_before"] >= 0.1, summary


@pytest.mark.slow
@pytest.mark.xfail(reason=WEAK_BASE + "; the noised student is then as good as the teacher", strict=False)
def test_distillation_recovers_faster_than_gspo(tmp_path):
    steps = ["trainer.total_steps=30", "trainer.val_every=10"]
    distill = run("choice_distill", tmp_path, *steps)
    gspo = run("choice_gspo_noised", tmp_path, *steps)
    (tmp_path / "compare.json").write_text(json.dumps({"distill": distill, "gspo": gspo}))
    assert distill["val_after"] > gspo["val_after"], (distill, gspo)
    assert distill["val_after"] - distill["val_before"] >= 0.1, distill


@pytest.mark.slow
def test_dpo_raises_held_out_reward_accuracy(tmp_path):
    summary = run("choice_dpo", tmp_path, "trainer.total_steps=10", "trainer.val_every=5")
    assert summary["val_after"] - summary["val_before"] >= 0.2, summary
