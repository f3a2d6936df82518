"""Learning checks on the glyphs world (slow: run with --runslow; CI skips them)."""

import pytest

from omnialign.config import apply_overrides, validate
from omnialign.metrics import read_metrics
from omnialign.recipes import RECIPES
from omnialign.train import main


@pytest.mark.slow
def test_flowgrpo_raises_glyphs_reward_without_collapse(tmp_path):
    """A shortened default recipe on a fixed seed: validation reward rises, diversity survives."""
    config = validate(apply_overrides(RECIPES["glyphs"](), [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=60", "trainer.val_every=20", "trainer.progress=false",
    ]))  # fmt: skip
    summary = main(config)
    assert summary["val_after"] - summary["val_before"] >= 0.1, summary
    assert summary["val/diversity_after"] >= 0.5 * summary["val/diversity_before"], summary
    records = read_metrics(tmp_path / "glyphs" / "metrics.jsonl")
    assert all(r["actor/skipped_updates"] == 0 for r in records if "actor/skipped_updates" in r)
