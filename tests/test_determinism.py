"""A run's settings stay with the run: the attention kernels a model asks for apply inside its blocks only, and
trainer.deterministic is restored when the run ends (tests/test_recipes.py checks it after each run). With
trainer.deterministic, the same config and seed give the same metrics.jsonl (timings aside), bit for bit: every
glyphs recipe in tests/test_recipes.py, the language recipes in tests/test_language.py, and here two separate
processes (their own hash seeds) of the default recipe."""

import subprocess
import sys

import pytest
import torch

from omnialign.config import apply_overrides, validate
from omnialign.engine import dist
from omnialign.metrics import read_metrics, without_timing
from omnialign.recipes import RECIPES
from omnialign.rollout.diffusion import generate_ode
from omnialign.trainer.build import build_policy


def cudnn_seen_by_first_block(policy, device: torch.device) -> bool:
    """Whether the first block's attention runs with cuDNN's SDPA kernel allowed: a sample drawn with a hook on that
    block's first submodule reading PyTorch's switch."""
    seen = []
    first = next(iter(policy.blocks()[0].children()))
    handle = first.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    try:
        generate_ode(policy, ["1"], torch.tensor([0]), RECIPES["glyphs"]().rollout, device)
    finally:
        handle.remove()
    return seen[0]


def test_attention_kernel_choice_stays_in_the_blocks_of_the_model_that_asks(tmp_path):
    """A model built with engine.cudnn_attention=false runs its blocks without cuDNN's kernel while the process-wide
    switch stays on, and a model built after it in the same process has its blocks' default back."""
    world = dist.init()
    restricted, _ = build_policy(
        validate(apply_overrides(RECIPES["glyphs"](), ["engine.cudnn_attention=false"])), world
    )
    assert torch.backends.cuda.cudnn_sdp_enabled()
    assert not cudnn_seen_by_first_block(restricted, world.device)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    default, _ = build_policy(validate(RECIPES["glyphs"]()), world)
    assert cudnn_seen_by_first_block(default, world.device) and not cudnn_seen_by_first_block(restricted, world.device)


def test_deterministic_settings_are_restored():
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)  # fmt: skip
    with dist.deterministic(True):
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert not torch.backends.cudnn.benchmark
    after = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
             torch.backends.cudnn.benchmark)  # fmt: skip
    assert after == before and not after[0]


SMALL = ["data.prompts_per_step=2", "rollout.n=4", "rollout.steps=4", "rollout.val_steps=4", "data.val_seeds=1",
         "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
         "actor.mini_batch_size=none", "actor.micro_batch_size=4", "trainer.deterministic=true"]  # fmt: skip


@pytest.mark.slow
def test_two_processes_give_identical_metrics(tmp_path):
    """`omnialign train glyphs` twice, in two processes started together: metrics.jsonl equal in every entry but the
    timings. Slow (50 s on CI's two cores): on a GPU, where two processes share the card, the tier's
    `test_deterministic_glyphs_runs_agree_on_cuda` checks it, and every recipe's test repeats its run in one process."""
    logs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    procs = [subprocess.Popen([sys.executable, "-m", "omnialign", "train", "glyphs", f"name={name}", *SMALL,
                               f"trainer.output_dir={tmp_path}"], stdout=subprocess.DEVNULL, stderr=log.open("w"))
             for name, log in logs.items()]  # fmt: skip
    for p, log in zip(procs, logs.values()):
        assert p.wait(timeout=600) == 0, log.read_text()[-2000:]
    a, b = (without_timing(read_metrics(tmp_path / n / "metrics.jsonl")) for n in logs)
    assert [r["step"] for r in a] == [0, 1, 2] and a == b
