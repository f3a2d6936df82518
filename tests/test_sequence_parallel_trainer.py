"""engine.sequence_parallel in the online trainer: two FlowGRPO steps on the tiny Wan 2.2 A14B twin (full fine-tuning
with a reference KL, so the frozen reference copy is split too, and the frozen low-noise expert `transformer_2` runs
the steps below the boundary) with engine.sequence_parallel=2 on two processes (torchrun, gloo on the CPU) train like
one process without a split: the same metrics and the same trained weights. Each process of the split run also
reports how it holds `transformer_2`: split (diffusers' context-parallel config set) and sharded (about half of its
parameters on each process).

Run by pytest, this file builds the twin, runs the one-process run in the test's process (launching itself under
torchrun with the GPUs hidden where there are some), then launches itself on two processes for the split run (the
`__main__` part is each process's work: `main` on the same config; both on the CPU, where a GPU is too), and
compares the two runs' metrics.jsonl and final checkpoints. Both processes of the group hold the same prompts, so
the split run has one data-parallel rank: were its samples counted once per process, reward/std and the advantages
(group statistics) would differ; without the loss scale of the group size, actor/grad_norm would be half (Adam's
steps alone would not show it).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from diffusers import WanTransformer3DModel
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.tensor import DTensor

from omnialign.config import ConfigError, apply_overrides, check_world_size, validate
from omnialign.engine import checkpoint, dist
from omnialign.metrics import read_metrics
from omnialign.models import tiny
from omnialign.recipes import RECIPES
from omnialign.recipes.wan import A14B_BOUNDARY
from omnialign.train import main
from omnialign.trainer.build import build_policy

FRAMES, HEIGHT, WIDTH, TEXT = 5, 16, 32, 32  # latents (4, 2, 2, 4): 2 latent frames of 1 x 2 tokens, 2 per process
LR = 1e-4
COMPARED = ["reward/mean", "reward/std", "reward/group_std", "actor/loss", "actor/grad_norm", "actor/clip_frac",
            "actor/kl", "val/reward/mean"]  # fmt: skip


def config(wan: Path, output_dir: Path, sequence_parallel: int):
    """The glyphs FlowGRPO recipe (full fine-tuning, reference KL) on the two-expert Wan twin at tiny sizes, trained
    on its first step (the high-noise expert's), scoring each frame's JPEG size."""
    overrides = ["model.arch=wan", f"model.path={wan}", f"model.frames={FRAMES}", f"model.text_tokens={TEXT}",
                 "data.prompts_per_step=2", "data.val_seeds=1", "rollout.n=2", f"rollout.height={HEIGHT}",
                 f"rollout.width={WIDTH}", "rollout.steps=4", "rollout.val_steps=2", "rollout.window_size=1",
                 "rollout.window_end=1",  # sigma 1 (transformer); 0.86, 0.60 and 0.01 run transformer_2
                 "actor.micro_batch_size=2", "actor.mini_batch_size=4", f"actor.lr={LR}", "trainer.total_steps=2",
                 "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
                 f"trainer.output_dir={output_dir}", "reward.gold=none", 'reward.weights={"jpeg_compressibility": 1}',
                 'reward.per_frame={"jpeg_compressibility": "mean"}', f"engine.sequence_parallel={sequence_parallel}",
                 "name=split" if sequence_parallel > 1 else "name=one"]  # fmt: skip
    return validate(apply_overrides(RECIPES["glyphs"](), overrides))


def weights(run_dir: Path, out: Path) -> dict[str, torch.Tensor]:
    """The trained parameters of the run's last checkpoint (DCP shards, read back whole in this process)."""
    dcp_to_torch_save(checkpoint.latest(run_dir), out)
    return torch.load(out)["model"]


def test_two_processes_split_train_like_one_process(tmp_path):
    wan = tiny.wan(tmp_path / "wan", boundary_ratio=A14B_BOUNDARY)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }  # both runs on the CPU, also where a GPU is
    for processes in (1, 2):  # one process without a split, then two processes split in two
        if processes == 1 and not torch.cuda.is_available():  # here, saving a launch; under torchrun to hide a GPU
            main(config(wan, tmp_path, 1))
            continue
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}", __file__,
               str(wan), str(tmp_path), str(processes)]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
    second = sum(p.numel() for p in WanTransformer3DModel.from_pretrained(wan / "transformer_2").parameters())
    ranks = [json.loads((tmp_path / f"transformer_2.{rank}.json").read_text()) for rank in (0, 1)]
    assert all(r["split"] and r["parameters"] == second for r in ranks), ranks
    held = [
        r["held"] for r in ranks
    ]  # FSDP2 splits each parameter's first dimension, the first rank's share rounded up
    assert sum(held) == second and max(held) < 0.55 * second, (held, second)
    one, split = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("one", "split"))
    assert [r["step"] for r in split] == [r["step"] for r in one] == [0, 1, 2]
    # Rewards are JPEG sizes in kB of 8-bit frames: where a pixel of the split run rounds the other way, a frame may
    # differ by a byte, which moves a mean over 5 frames and the videos by 1e-3 / 5 kB at most (seen: 4e-5, in
    # val/reward/mean after training); counting samples twice moves reward/std by 8e-4 and group_std by 1.5e-3
    for a, b in zip(one, split):
        for key in (k for k in COMPARED if k in a):
            tolerance = dict(rel=0, abs=2e-4) if "reward/" in key else dict(rel=1e-4, abs=1e-6)
            assert b[key] == pytest.approx(a[key], **tolerance), f"step {a['step']} {key}"
    assert one[2]["actor/kl"] > 0 and one[1]["actor/grad_norm"] > 0  # the compared numbers are not trivially 0
    trained, trained_split = (weights(tmp_path / name, tmp_path / f"{name}.pt") for name in ("one", "split"))
    initial = WanTransformer3DModel.from_pretrained(wan / "transformer").state_dict()
    assert trained.keys() == trained_split.keys() == initial.keys()
    moved = max((trained[k] - initial[k]).abs().max() for k in trained)
    assert moved > LR  # Adam moves a weight by about LR per step: 2 steps, nearly 2 * LR
    # The split computes velocities to ~1e-6 and gradients to ~1e-4 relative (tests/test_sequence_parallel.py); Adam
    # steps by m / sqrt(v), about LR * sign(gradient), so such differences move a weight by a small fraction of LR
    for key, value in trained_split.items():
        torch.testing.assert_close(value, trained[key], rtol=0, atol=LR / 100, msg=key)


def test_a_network_without_a_split_plan_fails_at_build():
    glyphs = validate(apply_overrides(RECIPES["glyphs"](), ["engine.sequence_parallel=2"]))
    with pytest.raises(
        ValueError,
        match=r"engine.sequence_parallel=2: model.arch=glyphs's network "
        r"\(SD3Transformer2DModel\) has no context-parallel plan .* set engine.sequence_parallel=1",
    ):
        build_policy(glyphs, dist.init())


def test_settings_that_cannot_split_fail_before_any_model_loads():
    glyphs = validate(apply_overrides(RECIPES["glyphs"](), ["engine.sequence_parallel=2"]))  # 8 prompts, 64 samples
    check_world_size(glyphs, 4)
    with pytest.raises(ConfigError, match=r"engine.sequence_parallel=2 must divide the number of processes \(3\)"):
        check_world_size(glyphs, 3)
    with pytest.raises(ConfigError, match=r"16 groups of engine.sequence_parallel=2 devices cannot share"):
        check_world_size(glyphs, 32)
    with pytest.raises(ConfigError, match="engine.sequence_parallel=0 must be at least 1"):
        validate(apply_overrides(RECIPES["glyphs"](), ["engine.sequence_parallel=0"]))
    for recipe in ("sd3_offline_dpo", "qwen3_omni_grpo"):
        with pytest.raises(ConfigError, match="engine.sequence_parallel=2: only the online diffusion trainer"):
            validate(apply_overrides(RECIPES[recipe](), ["engine.sequence_parallel=2"]))


if __name__ == "__main__":
    run = config(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
    if run.engine.sequence_parallel > 1:
        world = dist.init()
        second = build_policy(run, world)[0].transformer_2
        local = [(p.to_local() if isinstance(p, DTensor) else p) for p in second.parameters()]
        held = {"split": second._parallel_config is not None, "parameters": sum(p.numel() for p in second.parameters()),
                "held": sum(p.numel() for p in local)}  # fmt: skip
        (Path(sys.argv[2]) / f"transformer_2.{world.rank}.json").write_text(json.dumps(held))
    main(run)
