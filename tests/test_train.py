"""End to end on the shipped glyphs model: outputs, the porting check, resume, crash safety."""

import dataclasses
import functools
import http.server
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from http_stub import JSONHandler, serving
from tensordict import TensorDict

from omnialign.batch import Trajectory
from omnialign.cli import main as cli
from omnialign.config import ConfigError, apply_overrides, validate
from omnialign.engine import checkpoint, optim
from omnialign.engine.dist import World
from omnialign.engine.optim import NonFiniteUpdate
from omnialign.metrics import read_metrics, without_timing
from omnialign.recipes import RECIPES
from omnialign.rollout.diffusion import generate
from omnialign.train import check_inputs, main
from omnialign.trainer import actor, objectives
from omnialign.worlds.glyphs import glyph_gold
from omnialign.worlds.glyphs import model as glyphs


def debug_config(tmp_path, *overrides):
    return validate(apply_overrides(RECIPES["debug"](), [f"trainer.output_dir={tmp_path}", *overrides]))


def assert_debug_runs_match(a_dir, b_dir):
    """Two debug runs log the same metrics at every step (0, 1, 2), equal up to float32 rounding; timings aside."""
    a, b = (without_timing(read_metrics(d / "debug" / "metrics.jsonl")) for d in (a_dir, b_dir))
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for key in ra:
            assert abs(ra[key] - rb[key]) <= 1e-5 + 1e-4 * abs(ra[key]), key


def test_debug_run_writes_every_output(tmp_path):
    summary = main(debug_config(tmp_path, "trainer.save_val_images=true"))
    run = tmp_path / "debug"
    assert json.loads((run / "config.json").read_text())["rollout"]["n"] == 4
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert ["val/reward/mean" in r for r in records] == [True, False, True]
    expected = ["reward/mean", "reward/std", "reward/zero_std_ratio", "actor/clip_frac", "actor/approx_kl",
                "actor/grad_norm", "rollout/diversity", "timing/rollout", "timing/reward_wait",
                "timing/update"]  # fmt: skip
    assert set(expected) <= set(records[1])
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "samples" / "step_000000.png").exists() and (run / "samples" / "step_000002.png").exists()
    assert (run / "reward_curve.png").exists()
    assert checkpoint.latest(run).name == "step_000002"
    assert summary["val_before"] == records[0]["val/reward/mean"] and summary["metric"] == "val/reward/mean"
    # the gold judge is reported beside the reward, and the saved validation images reproduce both
    saved = torch.load(run / "samples" / "step_000002.pt")
    assert saved["images"].dtype == torch.uint8 and saved["images"].shape == (10, 1, 32, 32)
    assert saved["prompts"] == list("0123456789")
    images = saved["images"].float() / 255
    assert abs(sum(glyph_gold(images, saved["prompts"])) / 10 - records[2]["val/gold/accuracy"]) < 1e-6
    assert 0 <= records[2]["val/gold/not_a_digit"] <= 1
    assert summary["val/gold/accuracy_after"] == records[2]["val/gold/accuracy"]


def test_first_replay_reproduces_rollout_log_probs():
    """Porting check: on a fresh rollout, replaying with the rollout's micro-batch gives ratio 1."""
    config = debug_config("unused", "rollout.micro_batch_size=8", "actor.micro_batch_size=8")
    policy = glyphs.load()
    prompts = ["1"] * 4 + ["7"] * 4
    traj, _ = generate(policy, prompts, torch.arange(2).repeat_interleave(4), torch.arange(8) + 99,
                       config.rollout, torch.device("cpu"))  # fmt: skip
    replayed = actor.infer(objectives.log_prob_objective(policy, config.rollout), traj, 8)["log_prob"]
    ratio = torch.exp(replayed - traj.log_probs)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-6)


def test_resume_continues_identically(tmp_path):
    # deterministic kernels: on CUDA two straight runs otherwise differ in the last bits (approx KL at step 2 off by
    # 1e-8 in four of six runs on an H100), before any resume
    every = ("trainer.save_every=2", "trainer.val_every=2", "trainer.deterministic=true")
    straight = debug_config(tmp_path / "a", "trainer.total_steps=4", *every)
    main(straight)
    first = debug_config(tmp_path / "b", "trainer.total_steps=2", *every)
    main(first)
    resumed = debug_config(tmp_path / "b", "trainer.total_steps=4", *every)
    main(resumed, resume="auto")
    a = without_timing(read_metrics(tmp_path / "a" / "debug" / "metrics.jsonl"))
    b = without_timing(read_metrics(tmp_path / "b" / "debug" / "metrics.jsonl"))
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert a == b


def test_new_run_refuses_to_overwrite_checkpoints(tmp_path, capsys):
    main(debug_config(tmp_path, "trainer.total_steps=1", "trainer.val_every=1"))
    assert re.search(r" after 1 step[ ;]", capsys.readouterr().out)
    with pytest.raises(SystemExit, match="--resume auto"):
        main(debug_config(tmp_path, "trainer.total_steps=1"))
    capsys.readouterr()
    main(debug_config(tmp_path, "trainer.total_steps=1", "trainer.val_every=1"), resume="auto")
    assert "step_000001 has reached trainer.total_steps=1: nothing left to train" in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"--resume .*nowhere: does not exist; give auto .*, a run folder, or"):
        main(debug_config(tmp_path, "trainer.total_steps=1"), resume=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"--resume .*checkpoints: not a complete checkpoint"):
        main(debug_config(tmp_path, "trainer.total_steps=1"), resume=str(tmp_path / "debug" / "checkpoints"))


def test_crash_during_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    world = World(0, 1, torch.device("cpu"))
    checkpoint.save(tmp_path, 1, model, opt, sched, {"step": 1}, keep_last=2, world=world)
    saved = model.weight.detach().clone()
    with torch.no_grad():
        model.weight.add_(1.0)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(checkpoint.dcp, "save", crash)
    with pytest.raises(OSError):
        checkpoint.save(tmp_path, 2, model, opt, sched, {"step": 2}, keep_last=1, world=world)
    latest = checkpoint.latest(tmp_path)
    assert latest.name == "step_000001"
    assert checkpoint.load(latest, model, opt, sched, world)["step"] == 1
    assert torch.equal(model.weight, saved)


def test_a_crash_while_deleting_a_checkpoint_leaves_none_in_part(tmp_path, monkeypatch):
    """Pruned and replaced checkpoints are renamed hidden before they are deleted: a crash mid-delete leaves no
    step_* folder holding part of its files, and the next save clears what it left."""
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    world = World(0, 1, torch.device("cpu"))
    rmtree = checkpoint.shutil.rmtree

    def crash_midway(path, *args, **kwargs):  # the process dies after deleting the shards, before .metadata
        for shard in Path(path).glob("*.distcp"):
            shard.unlink()
        raise KeyboardInterrupt

    for step in (1, 2):
        checkpoint.save(tmp_path, step, model, opt, sched, {"step": step}, keep_last=2, world=world)
    with torch.no_grad():
        model.weight.add_(1.0)
    saved = model.weight.detach().clone()
    monkeypatch.setattr(checkpoint.shutil, "rmtree", crash_midway)
    with pytest.raises(KeyboardInterrupt):  # step 2 again (a resumed run's), replacing the one there
        checkpoint.save(tmp_path, 2, model, opt, sched, {"step": 2}, keep_last=1, world=world)
    assert [p.name for p in checkpoint.checkpoints(tmp_path)] == ["step_000002"]  # step 1 pruned, hidden first
    with torch.no_grad():
        model.weight.zero_()
    assert checkpoint.load(tmp_path / "checkpoints" / "step_000002", model, opt, sched, world)["step"] == 2
    assert torch.equal(model.weight, saved)  # the new step 2, whole
    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    checkpoint.save(tmp_path, 3, model, opt, sched, {"step": 3}, keep_last=1, world=world)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000003"]  # no leftovers


def test_a_damaged_checkpoint_names_itself_and_the_earlier_ones(tmp_path):
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    world = World(0, 1, torch.device("cpu"))
    for step in (1, 2):
        checkpoint.save(tmp_path, step, model, opt, sched, {"step": step}, keep_last=0, world=world)
    newest = checkpoint.latest(tmp_path)
    for shard in newest.glob("*.distcp"):  # a copy cut short
        shard.write_bytes(shard.read_bytes()[:10])
    with pytest.raises(
        RuntimeError,
        match=r"step_000002 could not be read into this run \(EOFError\)\. .*copied in part.*: step_000001 ",
    ):
        checkpoint.load(newest, model, opt, sched, world)
    assert checkpoint.load(tmp_path / "checkpoints" / "step_000001", model, opt, sched, world)["step"] == 1


def test_learning_rate_drops_by_gamma_at_each_milestone_of_applied_updates():
    """lr 1e-4, milestones [100, 200], gamma 0.5: the first 100 applied updates at 1e-4 exactly, the next 100 at
    5e-5, then 2.5e-5; an update with a zero gradient is not applied and does not count."""
    weight = torch.nn.Parameter(torch.ones(2))
    config = dataclasses.replace(RECIPES["debug"]().actor, lr=1e-4, lr_milestones=[200, 100], lr_gamma=0.5)
    opt, sched = optim.build([weight], config)
    used = []
    for n in range(251):
        used.append(opt.param_groups[0]["lr"])
        weight.grad = torch.zeros(2) if n == 10 else torch.ones(2)
        optim.step(opt, sched, [weight], torch.zeros(()), 1.0)
    assert used[:101] == [1e-4] * 101  # 100 applied updates, the one at n=10 skipped
    assert used[101:201] == [5e-5] * 100 and used[201:] == [2.5e-5] * 50


def test_non_finite_update_stops_or_is_skipped_and_counted():
    model = torch.nn.Linear(2, 1)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    opt = torch.optim.AdamW(params, lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    batch = Trajectory(final=torch.zeros(4, 2), latents=torch.zeros(4, 2, 2), log_probs=torch.zeros(4, 1),
                       means=torch.zeros(4, 1, 2), sigmas=torch.zeros(4, 2), cond=TensorDict(batch_size=[4]),
                       uncond=None, group=torch.zeros(4), seeds=torch.zeros(4), batch_size=[4])  # fmt: skip

    def fn(inputs):
        return model(inputs["x"]).squeeze(-1) * float("nan"), {}, {}

    objective = actor.Objective(fn, resident=(), per_step={"x": ("latents", 0), "x_next": ("latents", 1)})
    config = RECIPES["debug"]().actor
    with pytest.raises(NonFiniteUpdate, match="loss is nan and the gradient norm nan"):
        actor.update(objective, batch, params, opt, sched, config, seed=0)
    out = actor.update(objective, batch, params, opt, sched, dataclasses.replace(config, skip_nonfinite=True), seed=0)
    assert out.metrics["skipped_updates"].item() == out.metrics["updates"].item() == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, params))


def test_a_finite_loss_with_a_non_finite_gradient_is_blamed_on_the_backward():
    """pytorch/pytorch#196678 (cuDNN's masked attention backward): the loss is finite and the gradient is not; the
    error names the backward and the switch, and the weights stay."""

    class NanBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * float("nan")

    weight = torch.nn.Parameter(torch.ones(2))
    opt, sched = optim.build([weight], RECIPES["debug"]().actor)
    loss = NanBackward.apply(weight).sum()
    loss.backward()
    with pytest.raises(NonFiniteUpdate, match="loss is 2.0 and the gradient norm nan: the loss is finite, so the "
                       "backward pass made it.*engine.cudnn_attention=false"):  # fmt: skip
        optim.step(opt, sched, [weight], loss, 1.0)
    assert torch.equal(weight.detach(), torch.ones(2)) and weight.grad is None


def test_cli_lists_recipes(capsys):
    cli(["train", "--list"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(RECIPES) and lines[0].startswith("glyphs ") and "FlowGRPO" in lines[0]


def test_cli_runs_from_a_source_tree_that_was_never_installed(monkeypatch, capsys):
    """`PYTHONPATH=checkout python -m omnialign` (the GPU machine's way) has no distribution metadata: the CLI still
    parses, and --version says so."""
    from importlib.metadata import PackageNotFoundError

    from omnialign import cli as cli_module

    def missing(name):
        raise PackageNotFoundError(name)

    monkeypatch.setattr(cli_module, "version", missing)
    with pytest.raises(SystemExit) as done:
        cli(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == "omnialign (a source tree, not installed)"


def test_cli_bad_override_fails_before_anything_loads(tmp_path):
    """In this process (`python -m omnialign` runs in the serve-reward and prepare tests' subprocesses)."""
    with pytest.raises(SystemExit, match=r"unknown config key 'rollout.nn'(.|\n)*rollout.n: int"):
        cli(["train", "glyphs", "rollout.nn=3", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(SystemExit, match="rollout.n='three': expected int"):
        cli(["train", "glyphs", "rollout.n=three", f"trainer.output_dir={tmp_path}"])
    assert not any(tmp_path.iterdir())  # no run folder was created
    with pytest.raises(SystemExit, match="did you mean trainer.total_steps"):
        cli(["train", "glyphs", "trainer.total_step=3", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(SystemExit, match="actor.max_grad_norm=-1.0 must be > 0"):  # it would flip the gradient
        cli(["train", "glyphs", "actor.max_grad_norm=-1", f"trainer.output_dir={tmp_path}"])
    with pytest.raises(SystemExit, match="actor.lr=0.0 must be > 0"):
        cli(["train", "glyphs", "actor.lr=0", f"trainer.output_dir={tmp_path}"])


def test_a_missing_path_fails_before_the_run_folder_is_made(tmp_path):
    with pytest.raises(SystemExit, match=r"data.pairs='nowhere/pairs' does not exist .*give the local path"):
        cli(["train", "sd3_offline_dpo", f"model.path={tmp_path}", "data.pairs=nowhere/pairs",
             f"trainer.output_dir={tmp_path / 'runs'}"])  # fmt: skip
    with pytest.raises(SystemExit, match=r"data.prompts='nowhere.parquet' does not exist"):
        cli(["train", "glyphs", "data.prompts=nowhere.parquet", f"trainer.output_dir={tmp_path / 'runs'}"])
    (tmp_path / "bad.jsonl").write_text('"3"\n{"caption": "7"}\n')
    with pytest.raises(SystemExit, match=r"stopped: .*bad.jsonl:2: expected a non-empty prompt string or an object"):
        cli(["train", "glyphs", f"data.prompts={tmp_path / 'bad.jsonl'}", f"trainer.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(SystemExit, match=r"stopped: reward 'glyph_ocrr' is not a key of omnialign.rewards.REWARDS"):
        cli(["train", "glyphs", 'reward.weights={"glyph_ocrr": 1}', f"trainer.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(SystemExit, match=r"stopped: reward 'glyph_gld' is not a key"):  # the gold judge too
        cli(["train", "glyphs", "reward.gold=glyph_gld", f"trainer.output_dir={tmp_path / 'runs'}"])
    with pytest.raises(SystemExit, match=r"stopped: reward 'nowhere.py:score': expected path/to/file.py:function"):
        cli(["train", "glyphs", 'reward.weights={"nowhere.py:score": 1}', f"trainer.output_dir={tmp_path / 'runs'}"])
    assert not (tmp_path / "runs").exists()


def test_cli_takes_overrides_after_the_options(capsys):
    cli(["train", "glyphs", "--show", "trainer.total_steps=41", "rollout.n=4"])
    shown = capsys.readouterr().out
    assert "trainer.total_steps = 41" in shown and "rollout.n = 4" in shown
    with pytest.raises(SystemExit):  # an unknown option is still refused
        cli(["train", "glyphs", "--show", "--total-steps", "41"])


def test_training_with_the_reward_behind_serve_reward_matches_in_process(tmp_path):
    """The glyphs reward served by `omnialign serve-reward` over loopback scores the rollout like in process."""
    process = subprocess.Popen([sys.executable, "-m", "omnialign", "serve-reward", "glyph_ocr", "--port", "0"],
                               stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = process.stdout.readline()
        url = line.split(" at ")[1].split()[0]
        main(debug_config(tmp_path / "remote", f'reward.remote={{"glyph_ocr": "{url}"}}', "trainer.total_steps=1"))
    finally:
        process.kill()
    main(debug_config(tmp_path / "local", "trainer.total_steps=1"))
    remote = read_metrics(tmp_path / "remote" / "debug" / "metrics.jsonl")
    local = read_metrics(tmp_path / "local" / "debug" / "metrics.jsonl")
    for key in ("val/reward/mean", "reward/mean"):  # images travel as 8-bit PNG: equal up to quantisation
        step = 0 if key.startswith("val") else 1
        assert abs(remote[step][key] - local[step][key]) < 2e-3, key
    assert "timing/reward_wait" in remote[1]


def test_an_unreachable_reward_server_stops_the_run_before_its_folder_is_made(tmp_path):
    """A required remote reward's server is asked for /health (with the reward's retries) before the model loads: a
    closed port stops the run naming the reward and the fix; a server without /health (404, or 501 from one that
    serves only POST) is let through, and an optional reward is not asked."""
    with socket.socket() as s:  # a loopback port that nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    remote = [f'reward.remote={{"glyph_ocr": "{closed}"}}', f"trainer.output_dir={tmp_path / 'runs'}"]
    with pytest.raises(SystemExit, match=r"stopped: reward.remote\['glyph_ocr'\]=.*no answer after 2 attempts.*"
                                         r"Connection refused.*omnialign serve-reward.*reward.optional"):  # fmt: skip
        cli(["train", "glyphs", *remote, 'reward.options={"glyph_ocr": {"retries": 1}}'])
    assert not (tmp_path / "runs").exists()
    config = validate(apply_overrides(RECIPES["glyphs"](), [*remote, 'reward.optional=["glyph_ocr"]']))
    check_inputs(config)  # optional: scored 0 while its server is down, so not asked
    not_found = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))  # 404 on /health
    for handler in (not_found, http.server.BaseHTTPRequestHandler):  # the second serves no GET: 501, retried
        with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)) as server:
            url = f"http://127.0.0.1:{server.server_address[1]}"
            overrides = [f'reward.remote={{"glyph_ocr": "{url}"}}', 'reward.options={"glyph_ocr": {"retries": 1}}']
            check_inputs(validate(apply_overrides(RECIPES["glyphs"](), overrides)))


class ModelsHandler(JSONHandler):
    """An OpenAI-compatible endpoint's model list, as vLLM and SGLang serve it; every request is counted."""

    asked: list[str] = []

    def do_GET(self):
        ModelsHandler.asked.append(self.path)
        self.answer(200 if self.path == "/v1/models" else 404, {"object": "list", "data": [{"id": "judge"}]})


def test_an_unreachable_vlm_endpoint_stops_the_run_before_its_folder_is_made(tmp_path):
    """A required VLM reward's OpenAI-compatible endpoint is asked for its models (GET {url}/models, with retries)
    before the model loads: a closed port stops the run naming the reward's url option, the URL and the fix; a live
    endpoint passes, and an optional reward is not asked."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    judged = ['reward.weights={"glyph_ocr": 1, "vlm_judge": 0.5}', f"trainer.output_dir={tmp_path / 'runs'}"]
    with pytest.raises(SystemExit, match=r"stopped: reward.options\['vlm_judge'\]\['url'\]: .*/v1/models: no answer "
                                         r"after 3 attempts.*Connection refused.*endpoint up at .*/v1\?.*list "
                                         r"vlm_judge in reward.optional"):  # fmt: skip
        cli(["train", "glyphs", *judged, f'reward.options={{"vlm_judge": {{"url": "{closed}", "model": "j"}}}}'])
    assert not (tmp_path / "runs").exists()
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), ModelsHandler)) as server:
        live = f"http://127.0.0.1:{server.server_address[1]}/v1"
        for url, extra in ((live, []), (closed, ['reward.optional=["vlm_judge"]'])):
            options = f'reward.options={{"vlm_judge": {{"url": "{url}", "model": "j"}}}}'
            check_inputs(validate(apply_overrides(RECIPES["glyphs"](), [*judged, options, *extra])))
    assert ModelsHandler.asked == ["/v1/models"]


def test_activation_checkpointing_and_cpu_offload_train_the_same(tmp_path):
    main(debug_config(tmp_path / "plain"))
    main(debug_config(tmp_path / "engine", "engine.activation_checkpointing=true", "engine.cpu_offload=true"))
    assert_debug_runs_match(tmp_path / "plain", tmp_path / "engine")


@pytest.mark.gpu
def test_compiled_blocks_train_like_eager(tmp_path):
    """Regional torch.compile (inside FSDP and checkpointing) changes speed, not the numbers beyond rounding. In the
    GPU tier, where compilation is for: on a CPU, inductor's C++ builds of the block's variants (last block or not,
    with gradients or without) cost 80-110 s of a CI run even with one batch size throughout (10 samples: rollout,
    update and validation) and no frozen reference."""
    same = ["engine.activation_checkpointing=true", "rollout.n=5", "actor.micro_batch_size=10", "algorithm.kl_coef=0"]
    main(debug_config(tmp_path / "eager", *same))
    main(debug_config(tmp_path / "compiled", *same, "engine.compile=true"))
    assert_debug_runs_match(tmp_path / "eager", tmp_path / "compiled")


def test_any_reward_can_be_the_gold_judge(tmp_path):
    """reward.gold takes any reward name: a plain list of floats is logged as val/gold/accuracy (its mean)."""
    main(debug_config(tmp_path, "reward.gold=jpeg_compressibility", "trainer.total_steps=1"))
    first = read_metrics(tmp_path / "debug" / "metrics.jsonl")[0]
    assert first["val/gold/accuracy"] < 0  # minus the JPEG size in kB
    assert not [k for k in first if k.startswith("val/gold/") and k != "val/gold/accuracy"]


def test_unknown_gold_judge_fails_before_the_model_loads():
    from omnialign.config import RewardConfig
    from omnialign.rewards import RewardWorker

    with pytest.raises(ValueError, match="'glyph_gld' is not a key"):
        RewardWorker(RewardConfig(gold="glyph_gld"))
