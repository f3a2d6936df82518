"""Every glyphs recipe runs 2 steps end to end at debug sizes, with its own algorithm's metrics, and with
trainer.deterministic twice gives the same metrics.jsonl bit for bit, timings aside (the video recipes' second run,
and that of the edit recipes after glyphs_edit, only with --runslow: 5-15 s each on a 2-core CPU, for paths that
glyphs_edit and each algorithm's first recipe check; `make test-slow` runs them). For the first
recipe of each algorithm (FAMILIES) the second run is the resume check instead: the 2-step run resumed for a third
step equals 3 steps straight, every metric and every trained weight, bit for bit."""

import pytest
import torch
from matrix import recipe_params

from omnialign.config import apply_overrides, validate
from omnialign.engine import checkpoint
from omnialign.export import load_trained_network
from omnialign.metrics import read_metrics, without_timing
from omnialign.recipes import RECIPES
from omnialign.train import main

GLYPHS = [name for name in RECIPES if name.startswith("glyphs")]
EXPECTED = {"flowgrpo": "actor/clip_frac", "grpo_guard": "actor/clip_frac", "dppo": "actor/masked",
            "distill": "actor/distill_kl", "nft": "actor/nft/positive", "awm": "actor/clip_frac",
            "dgpo": "actor/dgpo/weight", "gardo": "gardo/gated", "tempflow": "actor/clip_frac",
            "branchgrpo": "actor/clip_frac", "online_dpo": "actor/dpo/accuracy"}  # fmt: skip
FAMILIES = set({RECIPES[name]().algorithm.name: name for name in reversed(GLYPHS)}.values())  # each one's first
# every algorithm on glyphs; the edit and video tasks' representatives on a CPU (tests/matrix.py; FlowGRPO's are
# glyphs_edit and glyphs_video)
EDIT_VIDEO = [name for name in GLYPHS if name.startswith(("glyphs_edit", "glyphs_video"))]
TASKS = [name for name in GLYPHS if name not in EDIT_VIDEO] + recipe_params(
    EDIT_VIDEO, ("_edit", "_video", "_nft", "_online_dpo")
)


def trained_weights(run):
    return dict(load_trained_network(checkpoint.latest(run))[1].named_parameters())


@pytest.mark.parametrize("name", TASKS)
def test_recipe_runs_two_steps(name, tmp_path, request):
    config = RECIPES[name]()
    small = ["data.prompts_per_step=2", "rollout.n=4", "rollout.steps=4", "rollout.val_steps=4",
             "data.val_seeds=1", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2",
             "trainer.progress=false", "actor.mini_batch_size=none", "trainer.deterministic=true",
             f"actor.micro_batch_size={2 if config.algorithm.name == 'online_dpo' else 4}"]  # fmt: skip
    if config.rollout.window_size:
        small += ["rollout.window_size=2", "rollout.window_shift_every=1", "rollout.window_end=3"]
    if config.algorithm.name == "awm":
        small.append("algorithm.awm_timesteps=2")  # of the 3 steps after the first
    if name.startswith("glyphs_video"):  # clips cost a frame count each: the smallest group
        small.append("rollout.n=2")
    if config.algorithm.name in ("tempflow", "branchgrpo"):  # one trunk or tree per prompt
        small.append("rollout.n=1")
    if config.algorithm.name == "tempflow":
        small += ["rollout.branches=2", "rollout.branch_steps=[1,2]"]  # 4 images a trunk
    if config.algorithm.name == "branchgrpo":
        small.append("rollout.split_steps=[0,2]")  # of the 4 steps
    if config.algorithm.name == "dgpo":
        small += ["algorithm.dgpo_timesteps=2", "algorithm.dgpo_first_steps=3"]  # of the 4 steps
    if config.algorithm.name == "gardo":  # refreshed after step 2: a resumed step 3 needs the checkpointed one
        small.append("algorithm.ref_update_every=2")
    summary = main(validate(apply_overrides(config, [*small, f"trainer.output_dir={tmp_path / 'a'}"])))
    assert not torch.are_deterministic_algorithms_enabled()  # the run's setting ended with it
    records = read_metrics(tmp_path / "a" / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert EXPECTED[config.algorithm.name] in records[1], sorted(records[1])
    assert records[2]["actor/skipped_updates"] == 0
    assert "val_after" in summary and "val/diversity_after" in summary
    if name in FAMILIES:
        three = [*small, "trainer.total_steps=3"]
        main(validate(apply_overrides(RECIPES[name](), [*three, f"trainer.output_dir={tmp_path / 'a'}"])), "auto")
        main(validate(apply_overrides(RECIPES[name](), [*three, f"trainer.output_dir={tmp_path / 'b'}"])))
        a, b = (without_timing(read_metrics(tmp_path / run / name / "metrics.jsonl")) for run in ("a", "b"))
        assert [r["step"] for r in a] == [0, 1, 2, 3] and a == b
        wa, wb = (trained_weights(tmp_path / run / name) for run in ("a", "b"))
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        return
    if name.startswith(("glyphs_video", "glyphs_edit_")) and not request.config.getoption("--runslow"):
        return  # each algorithm's determinism is its family's check above; the edit world's is glyphs_edit's
    main(validate(apply_overrides(RECIPES[name](), [*small, f"trainer.output_dir={tmp_path / 'b'}"])))
    assert without_timing(read_metrics(tmp_path / "b" / config.name / "metrics.jsonl")) == without_timing(records)
