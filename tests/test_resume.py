"""Nothing lost, nothing silent: a resumed run is the same run (for every diffusion algorithm in
tests/test_recipes.py), a crash mid-write leaves readable files, and a run that learns nothing does not report
success."""

import json
import math

import pytest
import torch

from omnialign.algorithms.policy_gradient import ppo_clip
from omnialign.config import ConfigError, apply_overrides, validate
from omnialign.engine import checkpoint
from omnialign.engine.dist import World
from omnialign.engine.optim import NonFiniteUpdate
from omnialign.export import load_trained_network
from omnialign.metrics import read_metrics, without_timing
from omnialign.models import LOADERS
from omnialign.recipes import RECIPES
from omnialign.train import main
from omnialign.trainer import objectives

SMALL = ["data.prompts_per_step=2", "rollout.n=4", "rollout.steps=4", "rollout.val_steps=4", "data.val_seeds=1",
         "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
         "actor.mini_batch_size=none"]  # fmt: skip


def small(name, out, *extra):
    config = RECIPES[name]()
    args = [*SMALL, f"trainer.output_dir={out}", f"actor.micro_batch_size={2 if name.endswith('dpo') else 4}"]
    if config.rollout.window_size:
        args += ["rollout.window_size=2", "rollout.window_end=3"]
    if config.algorithm.name == "awm":
        args.append("algorithm.awm_timesteps=2")  # of the 3 steps after the first
    if config.algorithm.name in ("tempflow", "branchgrpo"):  # one trunk or tree per prompt, 4 images each
        args += ["rollout.n=1", "rollout.branches=2", "rollout.branch_steps=[1,2]", "rollout.split_steps=[0,2]"]
    if config.algorithm.name == "dgpo":
        args += ["algorithm.dgpo_timesteps=1", "algorithm.dgpo_first_steps=3"]  # one level (test_recipes: two)
    if config.algorithm.name == "gardo":  # refreshed after step 2, so step 3's KL (0) needs the checkpointed one
        args.append("algorithm.ref_update_every=2")
    return validate(apply_overrides(config, [*args, *extra]))


def records_without_timing(run):
    return without_timing(read_metrics(run / "metrics.jsonl"))


@pytest.mark.parametrize("lora", [[], ["model.lora.rank=4"]], ids=["full", "lora"])
def test_online_dpo_refreshed_reference_resumes_exactly(lora, tmp_path):
    """algorithm.ref_update_every=1: the reference is the policy at the start of every step (DPO's loss is log 2
    there), and a resumed run restores the refreshed reference, not the base model (a frozen copy, or the
    `reference` LoRA adapter)."""
    name, refresh = "glyphs_online_dpo", ["algorithm.ref_update_every=1", *lora]
    main(small(name, tmp_path / "a", "trainer.total_steps=3", *refresh))
    main(small(name, tmp_path / "b", "trainer.total_steps=2", *refresh))
    main(small(name, tmp_path / "b", "trainer.total_steps=3", *refresh), resume="auto")
    a, b = (records_without_timing(tmp_path / run / name) for run in ("a", "b"))
    assert a == b  # with the base model as the reference, step 3's loss is 0.681 here
    assert [r["actor/loss"] for r in a[1:]] == pytest.approx([math.log(2)] * 3, abs=1e-4)


def test_online_dpo_with_every_pair_tied_leaves_the_weights_alone(tmp_path, capsys):
    """algorithm.dpo_min_gap above any reward gap: every pair is dropped, the gradient is 0 and no optimizer step
    is taken, so AdamW's momentum and weight decay do not move the weights (they did before: 6 learning-rate
    steps of drift over 10 empty steps). A run in which no step had anything to learn ends with a warning naming
    the likely causes, and its summary counts those steps."""
    config = small("glyphs_online_dpo", tmp_path, "trainer.total_steps=2", "algorithm.dpo_min_gap=2")
    main(config)
    assert "WARNING: no step had anything to learn" in capsys.readouterr().out
    assert json.loads((tmp_path / config.name / "summary.json").read_text())["steps_without_update"] == 2
    records = records_without_timing(tmp_path / config.name)
    assert [r["actor/grad_norm"] for r in records[1:]] == [0.0, 0.0]
    assert [r["actor/dpo/kept"] for r in records[1:]] == [0.0, 0.0]
    saved, trained, _ = load_trained_network(checkpoint.latest(tmp_path / config.name))
    base = LOADERS[saved.model.arch](saved.model).transformer.state_dict()
    assert all(torch.equal(p, base[k]) for k, p in trained.state_dict().items())


def test_resume_refuses_changed_training_settings_and_allows_the_schedule(tmp_path):
    main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=2"))
    with pytest.raises(ConfigError, match=r"actor.lr: 0.0001 -> 0.001.*name=NEW_NAME"):
        main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=3", "actor.lr=1e-3"), resume="auto")
    with pytest.raises(ConfigError, match=r"trainer.ema_decay: 0.0 -> 0.9"):  # the average is the run's state
        main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=3", "trainer.ema_decay=0.9"), resume="auto")
    main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=3", "trainer.save_every=3"), resume="auto")
    assert json.loads((tmp_path / "glyphs_flowgrpo" / "config.json").read_text())["trainer"]["total_steps"] == 3


def test_resume_from_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path):
    main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=4", "trainer.keep_last=0"))
    run = tmp_path / "glyphs_flowgrpo"
    assert [p.name for p in checkpoint.checkpoints(run)] == ["step_000002", "step_000004"]
    main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=3", "trainer.keep_last=0"),
         resume=str(run / "checkpoints" / "step_000002"))  # fmt: skip
    assert [p.name for p in checkpoint.checkpoints(run)] == ["step_000002", "step_000003"]
    assert (run / "checkpoints" / "abandoned" / "step_000004" / ".metadata").exists()
    main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=4", "trainer.keep_last=0"), resume="auto")
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3, 4]  # the new branch continued


def test_resume_after_a_crash_mid_line(tmp_path):
    main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=2"))
    log = tmp_path / "glyphs_flowgrpo" / "metrics.jsonl"
    with log.open("a") as f:
        f.write('{"step": 3, "reward/me')  # a crash while writing step 3
    assert [r["step"] for r in read_metrics(log)] == [0, 1, 2]
    main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=3"), resume="auto")
    assert [r["step"] for r in read_metrics(log)] == [0, 1, 2, 3]
    log.write_text('{"step": 0}\nnot json\n{"step": 1}\n')
    with pytest.raises(ValueError, match="metrics.jsonl:2 is not a JSON record"):
        read_metrics(log)


def test_keep_last_zero_keeps_every_checkpoint(tmp_path):
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    world = World(0, 1, torch.device("cpu"))
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, step, model, opt, sched, {"step": step}, keep_last=0, world=world)
    assert len(checkpoint.checkpoints(tmp_path)) == 3
    checkpoint.save(tmp_path, 4, model, opt, sched, {"step": 4}, keep_last=1, world=world)
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step_000004"]
    with pytest.raises(ValueError, match="keep_last=-1"):
        checkpoint.save(tmp_path, 5, model, opt, sched, {"step": 5}, keep_last=-1, world=world)


def test_a_non_finite_loss_stops_the_run_unless_skipping_is_asked(tmp_path, monkeypatch):
    def diverged(*args, **kwargs):  # a model that diverged: its loss is NaN, its gradient finite (zero)
        loss, metrics = ppo_clip(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(objectives, "ppo_clip", diverged)
    with pytest.raises(NonFiniteUpdate, match="loss is nan.*last checkpoint is intact.*actor.skip_nonfinite=true"):
        main(small("glyphs_flowgrpo", tmp_path / "stop", "trainer.total_steps=2"))
    with pytest.raises(RuntimeError, match="every update .* was skipped as non-finite: nothing was learned"):
        main(small("glyphs_flowgrpo", tmp_path / "skip", "trainer.total_steps=2", "actor.skip_nonfinite=true"))
    records = read_metrics(tmp_path / "skip" / "glyphs_flowgrpo" / "metrics.jsonl")
    assert records[1]["actor/skipped_updates"] == records[1]["actor/updates"] == 1


def test_a_failing_optional_reward_is_shouted_in_the_step_line_and_the_summary(tmp_path, capsys):
    broken = f"{(__file__.rsplit('/', 1)[0])}/reward_fns.py:broken"
    rewards = [f'reward.weights={{"glyph_ocr": 1, "{broken}": 1}}', f'reward.optional=["{broken}"]']
    summary = main(small("glyphs_flowgrpo", tmp_path, "trainer.total_steps=2", *rewards))
    out = capsys.readouterr().out
    assert f"OPTIONAL REWARDS FAILED, scored 0: {broken}" in out
    assert f"WARNING: optional reward {broken} failed in 3 of 3 steps" in out
    assert summary["failed_rewards"] == {broken: 3}
    records = read_metrics(tmp_path / "glyphs_flowgrpo" / "metrics.jsonl")
    assert records[0][f"val/reward/{broken}/failed_chunks"] > 0 and records[1][f"reward/{broken}/failed_chunks"] > 0


@pytest.mark.parametrize("name", ["..", ".", "/tmp/elsewhere", "a/b", ""])
def test_a_run_writes_only_inside_its_own_folder(name, tmp_path):
    with pytest.raises(ConfigError, match="must be a plain folder name"):
        small("glyphs_flowgrpo", tmp_path, f"name={name}")


def test_an_image_size_the_model_cannot_draw_fails_before_loading(tmp_path):
    with pytest.raises(ConfigError, match="rollout.height=33.*divisible by 2"):
        main(small("glyphs_flowgrpo", tmp_path, "rollout.height=33"))
