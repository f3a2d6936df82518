"""Learning checks on the glyphs world (slow: run with --runslow; CI skips them).

Every diffusion algorithm's glyphs recipe, shortened to 60 steps on the fixed seed of BENCHMARKS.md's
learning table, must learn for the right reason: the gold judge (which no recipe trains or selects
against) reads the prompted digit at least 0.15 more often than in the shipped base, no more samples
than before are judged "not a digit", the reward rises too, the per-prompt diversity keeps three
quarters of its start, and no update is skipped.
"""

import pytest

from omnialign.config import apply_overrides, validate
from omnialign.metrics import read_metrics
from omnialign.recipes import RECIPES
from omnialign.train import main

GLYPHS_RECIPES = ["glyphs", "glyphs_cps", "glyphs_dance", "glyphs_mixgrpo", "glyphs_grpo_guard", "glyphs_dppo",
                  "glyphs_nft", "glyphs_online_dpo", "glyphs_distill"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("recipe", GLYPHS_RECIPES)
def test_algorithm_raises_gold_accuracy_without_collapse(recipe, tmp_path):
    config = validate(apply_overrides(RECIPES[recipe](), [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=60", "trainer.val_every=10", "trainer.save_every=60",
        "trainer.progress=false",
    ]))  # fmt: skip
    summary = main(config)
    gold = summary["val/gold/accuracy_after"] - summary["val/gold/accuracy_before"]
    assert gold >= 0.15 - 1e-6, summary  # 12 of the 80 validation images; the metrics are float32
    assert summary["val/gold/not_a_digit_after"] <= summary["val/gold/not_a_digit_before"], summary
    assert summary["val_after"] > summary["val_before"], summary
    assert summary["val/diversity_after"] >= 0.75 * summary["val/diversity_before"], summary
    records = read_metrics(tmp_path / recipe / "metrics.jsonl")
    assert all(r["actor/skipped_updates"] == 0 for r in records if "actor/skipped_updates" in r)
