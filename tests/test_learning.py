"""Learning checks on the glyphs world (slow: run with --runslow; CI skips them).

Every diffusion algorithm's glyphs recipe, shortened to 60 steps on the fixed seed of
BENCHMARKS.md's learning table: the validation reward rises by at least 0.1 over the shipped base
(0.422; the weakest algorithms measured +0.17) while the per-prompt diversity keeps three
quarters of its start (the lowest measured: 0.81) and no update is skipped.
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
def test_algorithm_raises_glyphs_reward_without_collapse(recipe, tmp_path):
    config = validate(apply_overrides(RECIPES[recipe](), [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=60", "trainer.val_every=60", "trainer.save_every=60",
        "trainer.progress=false",
    ]))  # fmt: skip
    summary = main(config)
    assert summary["val_after"] - summary["val_before"] >= 0.1, summary
    assert summary["val/diversity_after"] >= 0.75 * summary["val/diversity_before"], summary
    records = read_metrics(tmp_path / recipe / "metrics.jsonl")
    assert all(r["actor/skipped_updates"] == 0 for r in records if "actor/skipped_updates" in r)
