"""Benchmarks: `omnialign bench NAME`. Each prints a table and writes JSON; figures go to BENCHMARKS.md.

    omnialign bench staging --windows 2 10 50 --modes off on prefetch --out staging.json
    omnialign bench recipe --recipe qwen_image_ocr_flowgrpo_lora --prompts 8 --steps 1 --out flowgrpo.json

`recipe`: full training steps of a Qwen-Image recipe at one GPU's share of its global batch
(`--prompts` prompts x the recipe's rollout.n images) on the full-size pipeline with random weights
(transformer 20.4 B, Qwen2.5-VL-7B text encoder, VAE; bf16) built in memory: images per GPU per
second, seconds per phase, peak memory and MFU. MFU counts the transformer's model FLOPs (rollout
forwards with CFG; training forward + backward, the backward costed as 1x forward for LoRA and 2x
for full fine-tuning; activation recomputation not counted; text encoder and VAE not counted) over
`--peak` TFLOP/s (the measured bf16 matmul peak). The reward is a CPU stand-in (`jpeg_compressibility`)
so the figure measures the trainer; prompts are short OCR prompts (128 text tokens).

`staging`: the FlowGRPO update of a Qwen-Image-size transformer (the released config, random
weights, bf16, peft LoRA r64 on the 12 projections, activation checkpointing, FSDP2 at world
size 1) on a synthetic 512x512 trajectory (micro-batch 16, 128 text tokens, no CFG) at each
window size, with timestep staging off, on, and on with prefetch: peak allocated and reserved
memory and update seconds. Needs a CUDA device; `--tiny` runs the same code on a tiny config.
"""

import json
import time
from pathlib import Path

import torch
from diffusers import QwenImageTransformer2DModel
from tensordict import TensorDict

from omnialign.batch import Trajectory
from omnialign.config import ActorConfig, AlgorithmConfig, RolloutConfig
from omnialign.engine import dist, fsdp
from omnialign.models import lora
from omnialign.models.qwen_image import LORA_TARGETS, QwenImagePolicy
from omnialign.trainer import actor

QWEN_IMAGE = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=60, attention_head_dim=128,
                  num_attention_heads=24, joint_attention_dim=3584, axes_dims_rope=(16, 56, 56))  # fmt: skip
TINY = dict(patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16,
            num_attention_heads=3, joint_attention_dim=16, axes_dims_rope=(8, 4, 4))  # fmt: skip


class TransformerOnly(QwenImagePolicy):
    """The Qwen-Image adapter's `velocity` without encoders or VAE (a trajectory is synthetic)."""

    def __init__(self, transformer: QwenImageTransformer2DModel):
        self.transformer = transformer


def synthetic_trajectory(batch: int, window: int, grid: int, channels: int, text: int, dim: int) -> Trajectory:
    g = torch.Generator().manual_seed(0)
    cond = TensorDict(embeds=torch.randn(batch, text, dim, generator=g).bfloat16(),
                      mask=torch.ones(batch, text, dtype=torch.long), batch_size=[batch])  # fmt: skip
    return Trajectory(
        latents=torch.randn(batch, window + 1, grid, grid, channels, generator=g),
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
    rollout = RolloutConfig(guidance=1.0, kind="sde", eta=1.2)
    objective = actor.flowgrpo_objective(policy, rollout, AlgorithmConfig(clip_range=1e-5))
    cuda = world.device.type == "cuda"
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


OCR_PROMPTS = [f'A storefront sign that says "{w}"' for w in
               ("OPEN", "BAKERY", "EXIT 12", "HELLO", "SALE 50%", "CAFE", "STOP", "PARK", "BOOKS", "TAXI", "HOTEL",
                "PHARMACY", "GARAGE", "MUSEUM", "LIBRARY", "STATION")]  # fmt: skip


def transformer_flops(layers: int, dim: int, image_tokens: int, text_tokens: int) -> float:
    """MM-DiT forward FLOPs of one sample: dense layers per stream (24 L d^2 per token) + joint attention."""
    tokens = image_tokens + text_tokens
    return 24 * layers * dim**2 * tokens + 4 * layers * dim * tokens**2


def full_qwen_image(device: torch.device, text_tokens: int) -> QwenImagePolicy:
    """The Qwen-Image pipeline at its released sizes with random weights, built on `device` in bf16."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from omnialign.models.tiny import QWEN_IMAGE_SCHEDULER, qwen2_tokenizer

    text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6,
                rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default"})  # fmt: skip
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            transformer = QwenImageTransformer2DModel(**QWEN_IMAGE)
            encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))
            vae = AutoencoderKLQwenImage()
    finally:
        torch.set_default_dtype(default)
    return QwenImagePolicy(transformer, vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval(),
                           qwen2_tokenizer(), FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER),
                           max_sequence_length=text_tokens)  # fmt: skip


def bench_recipe(
    recipe: str, prompts: int, steps: int, tiny: bool, peak_tflops: float, work: Path, extra: list[str] = ()
) -> list[dict]:
    """Full training steps of a recipe with `prompts` prompts per GPU; see the module docstring."""
    import dataclasses

    import pyarrow as pa
    import pyarrow.parquet as pq

    from omnialign import rewards
    from omnialign.config import apply_overrides, validate
    from omnialign.engine import optim
    from omnialign.models import tiny as tiny_models
    from omnialign.models.qwen_image import load
    from omnialign.recipes import RECIPES
    from omnialign.train import build_policy
    from omnialign.trainer.objectives import ALGORITHMS
    from omnialign.trainer.online import OnlineTrainer

    world = dist.init()
    if world.is_main:
        work.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"prompt": OCR_PROMPTS, "ground_truth": [p.split('"')[1] for p in OCR_PROMPTS]}),
                       work / "prompts.parquet")  # fmt: skip
        if tiny:
            tiny_models.qwen_image(work / "tiny")
    torch.distributed.barrier()
    overrides = [f"data.prompts={work / 'prompts.parquet'}", f"data.val_prompts={work / 'prompts.parquet'}",
                 f"data.prompts_per_step={prompts * world.size}",
                 'reward.weights={"jpeg_compressibility": 1.0}', "model.text_tokens=128", "trainer.progress=false",
                 f"trainer.output_dir={work}"]  # fmt: skip
    if tiny:
        overrides += ["model.dtype=float32", "rollout.height=32", "rollout.width=32", "rollout.n=4",
                      "rollout.micro_batch_size=4", "actor.micro_batch_size=2",
                      "engine.activation_checkpointing=false"]  # fmt: skip
    config = validate(apply_overrides(RECIPES[recipe](), overrides + list(extra)))
    config.actor = dataclasses.replace(config.actor, mini_batch_size=None)
    if tiny:
        config.model.path = str(work / "tiny")
        policy = load(config.model)
    else:
        policy = full_qwen_image(world.device, config.model.text_tokens)
    policy, contexts = build_policy(config, world, policy)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    algorithm = ALGORITHMS[config.algorithm.name](policy, config, contexts.get("reference"), contexts.get("teacher"),
                                                  contexts.get("old"))  # fmt: skip
    rows = []
    with rewards.RewardWorker(config.reward) as worker:
        trainer = OnlineTrainer(config, policy, params, optimizer, scheduler, algorithm, world, work / "run", worker,
                                sync=dist.synchronizer(world.device))  # fmt: skip
        for step in range(1, steps + 1):
            if world.device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            metrics = trainer.train_step(step)
            phases = trainer.timer.pop()
            rows.append(recipe_row(config, step, phases, peak_tflops, policy, world))
            for name in ("actor/clip_frac", "actor/rollout_logprob_gap"):  # exactness of the rollout's log-probs
                if name in metrics:
                    rows[-1][name.removeprefix("actor/")] = float(metrics[name])
            print(json.dumps(rows[-1]), flush=True)
    return rows


def recipe_row(config, step: int, phases: dict, peak_tflops: float, policy, world) -> dict:
    """images/GPU/s, phase seconds, peak memory and MFU of one measured step."""
    r, a = config.rollout, config.algorithm
    images = config.data.prompts_per_step * r.n // world.size
    seconds = sum(phases.values())
    tc = policy.transformer.config
    grid = policy.latent_shape(r.height, r.width)
    forward = transformer_flops(tc.num_layers, tc.num_attention_heads * tc.attention_head_dim, grid[0] * grid[1],
                                config.model.text_tokens or 512)  # fmt: skip
    cfg = 2 if r.guidance != 1.0 else 1
    backward = 1 if config.model.lora.rank else 2
    if a.name == "nft":
        train = a.nft_timesteps * (3 + backward)  # v, v_old, v_ref forwards + backward of v
        rollout_fwd = r.steps
    elif a.name == "online_dpo":
        train = 2 * (1 + backward) / r.n * 2  # two pair members per prompt, policy + reference
        rollout_fwd = r.steps * cfg
    else:
        train = r.window_size * cfg * (1 + backward) + (r.window_size * cfg if a.kl_coef > 0 else 0)
        rollout_fwd = r.steps * cfg
    flops = images * forward * (rollout_fwd + train)
    return {
        "recipe": config.recipe, "gpus": world.size, "compile": config.engine.compile, "step": step,
        "images": images, "step_s": round(seconds, 1),
        "images_per_gpu_s": round(images / seconds, 3),
        **{k.removeprefix("timing/") + "_s": round(v, 1) for k, v in phases.items()},
        "peak_alloc_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if torch.cuda.is_available() else None,
        "tflop_per_image": round(flops / images / 1e12, 1), "mfu": round(flops / seconds / (peak_tflops * 1e12), 3),
        "peak_tflops": peak_tflops,
    }  # fmt: skip


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))


def main(name: str, args) -> None:
    if name == "staging":
        rows = bench_staging(args.windows, args.modes, args.tiny)
    else:
        rows = bench_recipe(args.recipe, args.prompts, args.steps, args.tiny, args.peak, Path(args.work), args.set)
    if not dist.init().is_main:
        return
    print_table(rows)
    if args.out:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        Path(args.out).write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=2))
