"""FSDP2 across 2 processes (torchrun) against one process on the same global batch: NCCL where two GPUs are
visible, else gloo on the CPU (every run of a test in its own process, with the GPUs hidden)."""

import os
import subprocess
import sys

import torch

from omnialign.config import apply_overrides, validate
from omnialign.engine import checkpoint
from omnialign.export import load_trained_network
from omnialign.metrics import read_metrics
from omnialign.recipes import RECIPES
from omnialign.train import main

ARGS = ["data.prompts_per_step=2", "rollout.n=4", "actor.micro_batch_size=4", "actor.shuffle=false",
        "actor.epochs=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.keep_last=3"]  # fmt: skip
COMPARED = ["reward/mean", "reward/std", "actor/loss", "actor/grad_norm", "actor/ratio", "val/reward/mean"]


GPUS = torch.cuda.device_count() >= 2
HIDE = {} if GPUS else {"CUDA_VISIBLE_DEVICES": ""}  # one GPU cannot hold two ranks: compare on the CPU
ATOL = 1e-5 if GPUS else 1e-6  # NCCL's reduction order differs from one process's by a few 1e-6


def torchrun(nproc: int, *args: str, recipe: str = "debug") -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **HIDE}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "omnialign", "train", recipe, *args]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]


def train_in_process(*args: str, resume: str | None = None) -> None:
    """One process: here on the CPU (or where two GPUs compare over NCCL), else in a process with the GPUs hidden."""
    if torch.cuda.is_available() and not GPUS:
        torchrun(1, *args, *(["--resume", resume] if resume else []))
    else:
        main(validate(apply_overrides(RECIPES["debug"](), list(args))), resume=resume)


def weights(ckpt):
    return dict(load_trained_network(ckpt)[1].named_parameters())


def assert_close_metrics(a, b, steps):
    for step in steps:
        ra, rb = a[step], b[step]
        for key in COMPARED:
            if key in ra:
                assert abs(ra[key] - rb[key]) <= 1e-5 + 1e-4 * abs(rb[key]), (step, key, ra[key], rb[key])


def test_two_processes_match_one_and_resume_in_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    train_in_process(*ARGS, "trainer.total_steps=4", f"trainer.output_dir={one}")
    torchrun(2, *ARGS, "trainer.total_steps=2", f"trainer.output_dir={two}")
    a = read_metrics(one / "debug" / "metrics.jsonl")
    b = read_metrics(two / "debug" / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2]
    assert_close_metrics(a, b, [0, 1, 2])
    w1, w2 = weights(one / "debug" / "checkpoints" / "step_000002"), weights(checkpoint.latest(two / "debug"))
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=ATOL)
    # the 2-process checkpoint continues in one process like the uninterrupted single-process run
    train_in_process(*ARGS, "trainer.total_steps=4", f"trainer.output_dir={two}", resume="auto")
    b = read_metrics(two / "debug" / "metrics.jsonl")
    assert [r["step"] for r in b] == [0, 1, 2, 3, 4]
    assert_close_metrics(a, b, [3, 4])
    w1, w2 = weights(checkpoint.latest(one / "debug")), weights(checkpoint.latest(two / "debug"))
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=ATOL)


def test_default_recipe_runs_on_two_processes_without_overrides(tmp_path):
    """The default glyphs recipe as shipped (batch, mini- and micro-batch sizes untouched) on two devices."""
    torchrun(2, "trainer.total_steps=1", f"trainer.output_dir={tmp_path}", "data.val_seeds=1", recipe="glyphs")
    records = read_metrics(tmp_path / "glyphs" / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1]
    assert records[1]["actor/skipped_updates"] == 0 and 0 <= records[1]["val/reward/mean"] <= 1
