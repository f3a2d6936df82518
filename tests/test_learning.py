"""Learning checks on the glyphs world, its edit task and its video task (slow: run with --runslow; CI skips them).

Every diffusion algorithm's glyphs recipe, run for 60 steps (DanceGRPO, the slowest to learn, 120) on
the fixed seed of BENCHMARKS.md's learning table and judged on 320 validation images (10 digits x 32
seeds, four times the recipes' grid, so that a few images more or less are not the verdict), must learn
for the right reason: the gold judge (which
no recipe trains or selects against) reads the prompted digit at least 0.15 more often than in the
shipped base, at most 0.03 more samples (10 images) are judged "not a digit", the reward rises too, the
per-prompt diversity keeps three quarters of its start, and no update is skipped. The edit and video checks
below allow the same 0.03.
"""

import pytest

from omnialign.config import apply_overrides, validate
from omnialign.metrics import read_metrics
from omnialign.recipes import RECIPES
from omnialign.train import main

AWM_NARROWS = pytest.mark.xfail(strict=True, reason=(
    "AWM raises gold and reward fast (reward 0.357 -> 0.994 in 60 CPU steps) but narrows its samples: diversity "
    "0.260 -> 0.176 (2026-12-02), under three quarters of the base's, and as much with a 5x stronger reference KL; "
    "over five seeds x 300 GPU steps it ends at 0.085, one bold style per digit (BENCHMARKS.md, AWM, DGPO and GARDO "
    "on five seeds)"))  # fmt: skip
GLYPHS_RECIPES = ["glyphs", "glyphs_cps", "glyphs_dance", "glyphs_mixgrpo", "glyphs_grpo_guard", "glyphs_dppo",
                  "glyphs_nft", pytest.param("glyphs_awm", marks=AWM_NARROWS), "glyphs_dgpo", "glyphs_gardo",
                  "glyphs_tempflow", "glyphs_branch",
                  "glyphs_online_dpo", "glyphs_distill"]  # fmt: skip
# online DPO drew clean digits that the gold judge calls no digit and glitchy 4s at step 60 (not a digit 0.050 ->
# 0.156 with plain DPO, 2026-12-02); with DPO-Positive's penalty (algorithm.dpo_positive=1) 0.050 -> 0.044 and gold
# 0.309 -> 0.675 (BENCHMARKS.md, Learning on every seed)
# DanceGRPO drew a few glitchy digit hybrids at step 60 (not a digit 0.050 -> 0.062 of the 320 images on the CPU,
# with its window anywhere); with the window in steps 0-4, at 120 steps: gold 0.309 -> 0.753, not a digit 0.019.
STEPS = {"glyphs_dance": 120}
# the rise in the share judged "not a digit" that every learning check allows (10 of 320 images): the sampling noise of
# a difference of two such shares, not a rise in hacks (see the text-to-image check)
SLACK = 0.03


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
    # 16 of the 320 base images are no digit; with no slack one image more failed FlowGRPO (2026-12-03) where it had
    # failed Flow-DPPO before (2026-11-30), each passing in the other run: the random streams had moved, not the
    # learning (the standard error of the difference is about 0.017). Over five seeds x 300 GPU steps (80 images,
    # base 0.038) twelve recipes end at 0.062 or less on every seed, DanceGRPO and online DPO at up to 0.113.
    assert summary["val/gold/not_a_digit_after"] <= summary["val/gold/not_a_digit_before"] + SLACK + 1e-6, summary
    assert summary["val_after"] > summary["val_before"], summary
    assert summary["val/diversity_after"] >= 0.75 * summary["val/diversity_before"], summary
    records = read_metrics(tmp_path / recipe / "metrics.jsonl")
    assert all(r["actor/skipped_updates"] == 0 for r in records if "actor/skipped_updates" in r)


# online DPO's edits drew hybrids of the source and the requested digit with the base model as reference (not a digit
# 0.047 -> 0.094 at step 60); with the reference refreshed every 50 steps it passes (0.297 -> 0.781, not a digit 0.016,
# 2026-12-02)
EDIT_RECIPES = ["glyphs_edit", "glyphs_edit_cps", "glyphs_edit_mixgrpo", "glyphs_edit_grpo_guard", "glyphs_edit_dppo",
                "glyphs_edit_nft", "glyphs_edit_online_dpo"]  # fmt: skip
# Flow-DPPO passes through grainy strokes that the gold judge partly calls no digit (0.047 -> 0.109 at step 60 on
# the CPU and an H200 alike); by step 120 they are gone (0.056) while gold accuracy keeps rising (BENCHMARKS.md).
EDIT_STEPS = {"glyphs_edit_dppo": 120}


@pytest.mark.slow
@pytest.mark.parametrize("recipe", EDIT_RECIPES)
def test_edit_recipe_raises_gold_accuracy_and_keeps_the_place(recipe, tmp_path):
    """The glyphs edit task, 60 steps (`EDIT_STEPS`), judged on 320 validation images (20 edits x 16 seeds): the
    gold judge reads the requested digit at least 0.15 more often than from the shipped edit model, the results
    stay where the source's digit was (the share in place falls by at most 0.02, 6 images) and no more than 0.03
    more of them (10 images) are "not a digit"; the reward rises and no update is skipped."""
    steps = EDIT_STEPS.get(recipe, 60)
    config = validate(apply_overrides(RECIPES[recipe](), [
        f"trainer.output_dir={tmp_path}", f"trainer.total_steps={steps}", "trainer.val_every=60",
        "trainer.save_every=60", "trainer.progress=false", "data.val_seeds=16",
    ]))  # fmt: skip
    summary = main(config)
    gold = summary["val/gold/accuracy_after"] - summary["val/gold/accuracy_before"]
    assert gold >= 0.15 - 1e-6, summary
    assert summary["val/gold/kept_after"] >= summary["val/gold/kept_before"] - 0.02 - 1e-6, summary
    assert summary["val/gold/not_a_digit_after"] <= summary["val/gold/not_a_digit_before"] + SLACK + 1e-6, summary
    assert summary["val_after"] > summary["val_before"], summary
    records = read_metrics(tmp_path / recipe / "metrics.jsonl")
    assert all(r["actor/skipped_updates"] == 0 for r in records if "actor/skipped_updates" in r)


# From the shipped video base (2026-12-02, fifth session: 0.444 of the 1280 validation frames read right, 0.126 no
# digit), 60 steps (BENCHMARKS.md, glyphs video task): every video recipe passes on five of five H200 seeds, MixGRPO
# (KL 0.03), NFT (lr 1.5e-4) and GRPO-Guard (SDE window in the first five steps, lr 7e-5) since 2026-12-03, FlowGRPO
# and online DPO judged on their moving average (`trainer.ema_decay=0.9`) since 2026-12-04, CPS and Flow-DPPO with
# the window, KL 0.03, lr 1e-4 and the moving average since 2026-12-04 (all five CPU seeds too; CPS with advantages
# per group since 2026-12-06: +0.222 to +0.282 on five CPU seeds). Online DPO, plain,
# fell short on diversity (0.748 of the base's on the CPU, 0.74 on the H200); DPO-Positive's penalty fixed it.
VIDEO_RECIPES = ["glyphs_video", "glyphs_video_cps", "glyphs_video_mixgrpo", "glyphs_video_grpo_guard",
                 "glyphs_video_dppo", "glyphs_video_nft", "glyphs_video_online_dpo"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("recipe", VIDEO_RECIPES)
def test_video_recipe_raises_gold_accuracy_per_frame(recipe, tmp_path):
    """The glyphs video task, 60 steps, judged on 320 validation clips (10 digits x 32 seeds, 1280 frames): the
    gold judge reads the prompt's digit on a frame at least 0.15 more often than from the shipped video model and
    every frame of a clip right on at least 0.10 more clips, no more than 0.03 more frames (38) are "not a digit", the
    reward rises, diversity keeps three quarters and no update is skipped."""
    config = validate(apply_overrides(RECIPES[recipe](), [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=60", "trainer.val_every=60",
        "trainer.save_every=60", "trainer.progress=false", "data.val_seeds=32",
    ]))  # fmt: skip
    summary = main(config)
    gold = summary["val/gold/accuracy_after"] - summary["val/gold/accuracy_before"]
    assert gold >= 0.15 - 1e-6, summary
    assert summary["val/gold/clip_after"] - summary["val/gold/clip_before"] >= 0.10 - 1e-6, summary
    assert summary["val/gold/not_a_digit_after"] <= summary["val/gold/not_a_digit_before"] + SLACK + 1e-6, summary
    assert summary["val_after"] > summary["val_before"], summary
    assert summary["val/diversity_after"] >= 0.75 * summary["val/diversity_before"], summary
    records = read_metrics(tmp_path / recipe / "metrics.jsonl")
    assert all(r["actor/skipped_updates"] == 0 for r in records if "actor/skipped_updates" in r)
