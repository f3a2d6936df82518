"""`staging`: the FlowGRPO update of a Qwen-Image-size transformer (the released config, random
weights, bf16, peft LoRA r64 on the 12 projections, activation checkpointing, FSDP2 at world
size 1) on a synthetic 512x512 trajectory (micro-batch 16, 128 text tokens, no CFG) at each
window size, with timestep staging off, on, and on with prefetch: peak allocated and reserved
memory and update seconds. Needs a CUDA device; `--tiny` runs the same code on a tiny config.
"""

import json
import time

import torch
from diffusers import QwenImageTransformer2DModel
from tensordict import TensorDict

from omnialign.batch import Trajectory
from omnialign.bench.models import QWEN_IMAGE
from omnialign.config import ActorConfig, AlgorithmConfig, Config, RolloutConfig
from omnialign.engine import dist, fsdp
from omnialign.models import lora
from omnialign.models.qwen_image import LORA_TARGETS, QwenImagePolicy
from omnialign.trainer import actor
from omnialign.trainer.objectives import policy_gradient

TINY = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
            num_attention_heads=3, joint_attention_dim=16, axes_dims_rope=(8, 4, 4))  # fmt: skip


class TransformerOnly(QwenImagePolicy):
    """The Qwen-Image adapter's `velocity` without encoders or VAE (a trajectory is synthetic)."""

    def __init__(self, transformer: QwenImageTransformer2DModel):
        self.transformer, self.dtype = transformer, transformer.dtype


def synthetic_trajectory(batch: int, window: int, grid: int, channels: int, text: int, dim: int) -> Trajectory:
    g = torch.Generator().manual_seed(0)
    cond = TensorDict(embeds=torch.randn(batch, text, dim, generator=g).bfloat16(),
                      mask=torch.ones(batch, text, dtype=torch.long), batch_size=[batch])  # fmt: skip
    latents = torch.randn(batch, window + 1, grid, grid, channels, generator=g)
    return Trajectory(
        final=latents[:, -1], latents=latents,
        log_probs=torch.randn(batch, window, generator=g) * 1e-3,
        means=torch.randn(batch, window, grid, grid, channels, generator=g),
        sigmas=torch.linspace(1.0, 0.1, window + 1).expand(batch, -1).contiguous(),
        cond=cond, uncond=None, group=torch.arange(batch) // 4, seeds=torch.arange(batch),
        advantages=torch.randn(batch, generator=g), batch_size=[batch],
    )  # fmt: skip


def bench_staging(windows: list[int], modes: list[str], tiny: bool = False, micro: int = 16) -> list[dict]:
    world = dist.init()
    config, grid, text = (TINY, 4, 8) if tiny else (QWEN_IMAGE, 32, 128)
    with torch.device(world.device):
        net = QwenImageTransformer2DModel(**config).to(torch.bfloat16)
    lora.apply_lora(net, rank=64 if not tiny else 4, alpha=128 if not tiny else 8, targets=LORA_TARGETS)
    fsdp.shard(net, list(net.transformer_blocks), fsdp.mesh(world), torch.bfloat16, activation_checkpointing=True)
    policy = TransformerOnly(net)
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-6)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    run = Config(rollout=RolloutConfig(guidance=1.0, kind="sde", eta=1.2), algorithm=AlgorithmConfig(clip_range=1e-5))
    objective = policy_gradient(policy, run, None, None, None).objective
    cuda = world.device.type == "cuda"
    modes = [m for m in modes if m != "prefetch" or cuda]  # prefetch overlaps host-to-device copies: CUDA only
    warm = synthetic_trajectory(micro, 1, grid, config["in_channels"], text, config["joint_attention_dim"])
    actor.update(objective, warm.to(world.device), params, optimizer, scheduler, ActorConfig(micro_batch_size=micro),
                 seed=0, device=world.device)  # fmt: skip
    rows = []
    for window in windows:
        host = synthetic_trajectory(micro, window, grid, config["in_channels"], text, config["joint_attention_dim"])
        for mode in modes:
            staged = mode != "off"
            batch = host if staged else host.to(world.device)
            cfg = ActorConfig(
                micro_batch_size=micro, shuffle=False, timestep_staging=staged, prefetch=mode == "prefetch"
            )
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            actor.update(objective, batch, params, optimizer, scheduler, cfg, seed=0, device=world.device)
            if cuda:
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
            rows.append({
                "window": window, "staging": mode, "update_s": round(seconds, 2),
                "s_per_step": round(seconds / window, 3),
                "peak_alloc_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None,
                "trajectory_gb": round(sum(t.numel() * t.element_size() for t in host.values(True, True)) / 2**30, 3),
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            del batch
    return rows
