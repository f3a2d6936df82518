"""Learning checks on the glyphs world (slow: run with --runslow; CI skips them).

Every diffusion algorithm's glyphs recipe, run for 60 steps (DanceGRPO, the slowest to learn, 120) on
the fixed seed of BENCHMARKS.md's learning table and judged on 320 validation images (10 digits x 32
seeds, four times the recipes' grid, so that a few images more or less are not the verdict), must learn
for the right reason: the gold judge (which
no recipe trains or selects against) reads the prompted digit at least 0.15 more often than in the
shipped base, no more samples than before are judged "not a digit", the reward rises too, the
per-prompt diversity keeps three quarters of its start, and no update is skipped.
"""

import pytest

from omnialign.config import apply_overrides, validate
from omnialign.metrics import read_metrics
from omnialign.recipes import RECIPES
from omnialign.train import main

GLYPHS_RECIPES = ["glyphs", "glyphs_cps", "glyphs_dance", "glyphs_mixgrpo", "glyphs_grpo_guard", "glyphs_dppo",
                  "glyphs_nft", "glyphs_online_dpo", "glyphs_distill"]  # fmt: skip
# DanceGRPO still draws a few glitchy digit hybrids at step 60 (not a digit 0.050 -> 0.062 of the 320 images on
# the CPU, likewise on an H200 at lr 1e-4 and 2e-4); by step 120 it is under the base's (BENCHMARKS.md).
STEPS = {"glyphs_dance": 120}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", GLYPHS_RECIPES)
def test_algorithm_raises_gold_accuracy_without_collapse(recipe, tmp_path):
    config = validate(apply_overrides(RECIPES[recipe](), [
        f"trainer.output_dir={tmp_path}", f"trainer.total_steps={STEPS.get(recipe, 60)}", "trainer.val_every=60",
        "trainer.save_every=60", "trainer.progress=false", "data.val_seeds=32",
    ]))  # fmt: skip
    summary = main(config)
    gold = summary["val/gold/accuracy_after"] - summary["val/gold/accuracy_before"]
    assert gold >= 0.15 - 1e-6, summary  # 48 of the 320 validation images; the metrics are float32
    assert summary["val/gold/not_a_digit_after"] <= summary["val/gold/not_a_digit_before"], summary
    assert summary["val_after"] > summary["val_before"], summary
    assert summary["val/diversity_after"] >= 0.75 * summary["val/diversity_before"], summary
    records = read_metrics(tmp_path / recipe / "metrics.jsonl")
    assert all(r["actor/skipped_updates"] == 0 for r in records if "actor/skipped_updates" in r)
