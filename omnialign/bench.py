"""Benchmarks: `omnialign bench NAME`. Each prints a table and writes JSON; figures go to BENCHMARKS.md.

    omnialign bench staging --windows 2 10 50 --modes off on prefetch --out staging.json
    omnialign bench recipe --recipe qwen_image_ocr_flowgrpo_lora --prompts 8 --steps 1 --out flowgrpo.json
    omnialign bench recipe --recipe wan21_t2v_1_3b_ocr_flowgrpo_lora --prompts 1 --steps 2 --out wan.json
    omnialign bench language --recipe qwen3_omni_dpo --steps 3 --seq-len 1024 --out dpo.json
    omnialign bench language --recipe choice_gspo --model-size 4b --steps 2 --out gspo.json
    omnialign bench decode --model-size 8b --prompts 128 --prompt-len 256 --max-new-tokens 128 --out decode.json

`recipe`: full training steps of a Qwen-Image recipe at one GPU's share of its global batch
(`--prompts` prompts x the recipe's rollout.n images) on the full-size pipeline with random weights
(transformer 20.4 B, Qwen2.5-VL-7B text encoder, VAE; bf16) built in memory: images per GPU per
second, seconds per phase, peak memory and MFU. MFU counts the transformer's model FLOPs (rollout
forwards with CFG; training forward + backward, the backward costed as 1x forward for LoRA and 2x
for full fine-tuning; activation recomputation not counted; text encoder and VAE not counted) over
`--peak` TFLOP/s (the measured bf16 matmul peak). The reward is a CPU stand-in (`jpeg_compressibility`)
so the figure measures the trainer; prompts are short OCR prompts (128 text tokens).
FLUX recipes (`model.arch` flux or flux_kontext, `full_flux`) run the same way on FLUX.1-dev / FLUX.1-Kontext-dev
at their released sizes (transformer 11.9 B: 19 double- and 38 single-stream blocks of 3072, guidance embedding;
CLIP-L and T5-XXL encoders; VAE; random bf16 weights); MFU counts all 57 blocks (a single-stream block has a
double-stream block's dense FLOPs per token) and, for Kontext, the source tokens too. Kontext's edit prompts
carry one random source image of the rollout size each, resized as `model.source_resize` says.
Qwen-Image-Edit recipes (`model.arch=qwen_image_edit`) run on Qwen-Image-Edit-2509 at its released sizes (Qwen-Image's
transformer, VAE and Qwen2.5-VL-7B with its vision tower, random bf16 weights) with the same prompts as instructions,
each with one random source image of the rollout size (the recipes keep sources at their size); MFU counts the
source's tokens among the image tokens and its vision tokens among the text tokens.
Wan recipes (`model.arch=wan`, `full_wan`) run on the released transformer named by `model.path`'s folder
(Wan2.1-T2V-1.3B: 1.42 B, 30 blocks of 1536; Wan2.1-T2V-14B: 14.3 B, 40 blocks of 5120; Wan2.2-T2V-A14B: two such
experts), the UMT5-XXL encoder and the Wan 2.1 VAE, random bf16 weights, at the recipe's frames and size (e.g.
`--set model.frames=33`); the stand-in reward scores every frame (`reward.per_frame`) and a row counts videos
(`videos_per_gpu_s`). MFU counts the video tokens (latent frames x H/16 x W/16: 32760 at 832x480x81) in
self-attention and the MLP and the 512 text tokens in cross-attention (`wan_flops`).

`staging`: the FlowGRPO update of a Qwen-Image-size transformer (the released config, random
weights, bf16, peft LoRA r64 on the 12 projections, activation checkpointing, FSDP2 at world
size 1) on a synthetic 512x512 trajectory (micro-batch 16, 128 text tokens, no CFG) at each
window size, with timestep staging off, on, and on with prefetch: peak allocated and reserved
memory and update seconds. Needs a CUDA device; `--tiny` runs the same code on a tiny config.

`language`: training steps of a language recipe through its own trainer at one GPU's share of the step
(`--prompts` prompts, or pairs for DPO; default the recipe's `data.prompts_per_step`), on a model with
random weights built on the device in bf16 (`language_policy`): for `model.arch=qwen3_omni` the
Qwen3-Omni-30B-A3B thinker with its full-size text stack (48 MoE layers, 128 experts, 8 active;
30.5 B parameters) and the audio and vision towers shrunk; for `model.arch=qwen3` a Qwen3 causal LM of
a released size (`--model-size`, `QWEN3_SIZES`). The recipe's config is kept (LoRA, FSDP2 at world
size 1, the objective, micro- and mini-batches) except: bf16, activation checkpointing on, the data
(synthetic text of random letters under a byte-level tokenizer, one token per character), the reward
(`choice`, a CPU string match) and, for RL, `generation.max_new_tokens` (`--max-new-tokens`); a
mini-batch that does not divide the per-GPU batch becomes the whole batch.
- Offline DPO (`algorithm.name=dpo`, e.g. `qwen3_omni_dpo`): the offline trainer's step on pairs of
  `--seq-len` tokens each (half prompt, half response): data (tokenize, pack), reference (log-probs
  with the adapters off, forward only) and update (policy forward + backward of every micro-batch of
  `actor.micro_batch_size` sequences, one optimizer step per mini-batch). Per step: sequences
  (`samples_per_gpu_s`) and pairs per GPU per second, seconds per phase, peak allocated memory.
- RL (grpo, dapo, gspo, e.g. `choice_gspo`, full fine-tuning unless `--set model.lora.rank=32
  model.lora.alpha=64`): the language trainer's step on prompts of `--prompt-len` tokens: rollout
  (`rollout.n` samples per prompt; random weights rarely stop early, so responses run to
  `--max-new-tokens`), reward, advantage, [reference] and update. Per step: samples per GPU per
  second, generated tokens per second of rollout, seconds per phase, peak allocated memory.
Every step is reported, the first with its warm-up. `--tiny` runs the same code on tiny configs on the CPU.
`recipe --deterministic both` runs the steps again under trainer.deterministic's kernels on the same model: its
cost side by side (`--set trainer.deterministic=true` runs every step with them).

`decode`: sampling from a Qwen3 of `--model-size` (random weights, bf16) by each decoder in turn, side by side:
transformers' `generate` with its dynamic and its static cache (the log-prob recorder of the rollout on), and
omnialign's static-cache decoder (rollout/decode.py) with an eager and a CUDA-graph decode step. `--prompts`
prompts (the batch, default 128) of `--prompt-len` random byte tokens, `--max-new-tokens` sampled tokens
(temperature 1, no filters; random weights rarely stop a row, and a call ends only when every row has).
Per decoder: seconds of the whole call, of the prefill and first token, tokens/s overall
and of the decode steps alone ((N - 1) tokens over the time beyond the first), their share of the memory-
bandwidth bound, the largest and mean gap between the recorded log-probs and the training forward's
(`token_logprobs` on the sampled sequences), peak memory. The bound: every step reads the weights (less the
input embedding table, of which it reads B rows) and the keys and values of the mean context
(prompt + (N + 1) / 2) once, at `--bandwidth` TB/s (4.8 for an H200): B x bandwidth / bytes per step.
"""

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from diffusers import QwenImageTransformer2DModel
from tensordict import TensorDict

from omnialign.batch import Trajectory
from omnialign.config import ActorConfig, AlgorithmConfig, ModelConfig, RolloutConfig
from omnialign.engine import dist, fsdp
from omnialign.models import lora
from omnialign.models.base import LanguagePolicy
from omnialign.models.flux import GUIDANCE, PREFERRED_KONTEXT_RESOLUTIONS, FluxPolicy
from omnialign.models.qwen_image import LORA_TARGETS, QwenImagePolicy
from omnialign.models.wan import MAX_SEQUENCE_LENGTH, WanPolicy
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


@contextmanager
def built_on(device: torch.device, dtype: torch.dtype) -> Iterator[None]:
    """Modules made inside are created on `device` in `dtype` (random full-size weights without a host copy); the
    default dtype is restored after."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(default)


def transformer_flops(layers: int, dim: int, image_tokens: int, text_tokens: int) -> float:
    """MM-DiT forward FLOPs of one sample: dense layers per stream (24 L d^2 per token) + joint attention."""
    tokens = image_tokens + text_tokens
    return 24 * layers * dim**2 * tokens + 4 * layers * dim * tokens**2


def full_qwen_image(
    device: torch.device, text_tokens: int, edit: bool = False, source_resize: bool = True
) -> QwenImagePolicy:
    """The Qwen-Image pipeline at its released sizes with random weights, built on `device` in bf16; with `edit`,
    Qwen-Image-Edit-2509 (the same parts, Qwen2.5-VL's image processor; sources sized as `source_resize` says)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from omnialign.models.qwen_image_edit import QwenImageEditPolicy
    from omnialign.models.tiny import QWEN_IMAGE_SCHEDULER, qwen2_tokenizer, qwen_vl_image_processor

    text = dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                num_attention_heads=28, num_key_value_heads=4, rope_theta=1e6,
                rope_scaling={"mrope_section": [16, 24, 24], "rope_type": "default"})  # fmt: skip
    vision = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=3584)
    with built_on(device, torch.bfloat16):
        transformer = QwenImageTransformer2DModel(**QWEN_IMAGE)
        encoder = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))
        vae = AutoencoderKLQwenImage()
    vae, encoder = vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval()
    scheduler = FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER)
    if edit:
        return QwenImageEditPolicy(transformer, vae, encoder, qwen2_tokenizer(), qwen_vl_image_processor(), scheduler,
                                   plus=True, max_sequence_length=text_tokens, source_resize=source_resize)  # fmt: skip
    return QwenImagePolicy(transformer, vae, encoder, qwen2_tokenizer(), scheduler, max_sequence_length=text_tokens)


# The released FLUX.1-dev / FLUX.1-Kontext-dev transformer (the class defaults, with the guidance embedding).
FLUX = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
            axes_dims_rope=(16, 56, 56))  # fmt: skip


def full_flux(device: torch.device, text_tokens: int, model: ModelConfig) -> FluxPolicy:
    """The FLUX.1-dev (or, for model.arch=flux_kontext, FLUX.1-Kontext-dev) pipeline at its released sizes with
    random weights, built on `device` in bf16: the transformer, CLIP-L, T5-XXL's encoder, the VAE. The tiny
    byte-level CLIP and character-level T5 tokenizers stand in (the prompts are synthetic)."""
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from omnialign.models.tiny import FLUX_SCHEDULER, clip_tokenizer, t5_tokenizer

    clip_tok, t5_tok = clip_tokenizer(), t5_tokenizer()
    clip = CLIPTextConfig(vocab_size=49408, hidden_size=768, intermediate_size=3072, num_attention_heads=12,
                          num_hidden_layers=12, max_position_embeddings=77, hidden_act="quick_gelu", projection_dim=768,
                          bos_token_id=clip_tok.bos_token_id, eos_token_id=clip_tok.eos_token_id,
                          pad_token_id=clip_tok.pad_token_id)  # fmt: skip
    t5 = T5Config(vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                  feed_forward_proj="gated-gelu", decoder_start_token_id=0)  # fmt: skip
    with built_on(device, torch.bfloat16):
        transformer = FluxTransformer2DModel(**FLUX)
        encoders = (CLIPTextModel(clip), T5EncoderModel(t5))
        vae = AutoencoderKL(down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                            block_out_channels=(128, 256, 512, 512), layers_per_block=2, latent_channels=16,
                            sample_size=1024, use_quant_conv=False, use_post_quant_conv=False,
                            scaling_factor=0.3611, shift_factor=0.1159)  # fmt: skip
    return FluxPolicy(transformer, vae.requires_grad_(False).eval(), tuple(e.requires_grad_(False).eval() for e in
                      encoders), (clip_tok, t5_tok), FlowMatchEulerDiscreteScheduler(**FLUX_SCHEDULER),
                      guidance=GUIDANCE[model.arch] if model.embedded_guidance is None else model.embedded_guidance,
                      edits=model.arch == "flux_kontext",
                      source_resolutions=PREFERRED_KONTEXT_RESOLUTIONS if model.source_resize else None,
                      max_sequence_length=text_tokens)  # fmt: skip


# The released Wan transformers by the folder name of a recipe's model.path (diffusers' defaults are the 14B's:
# dim 5120 = 40 heads of 128, 40 layers, ffn 13824, text_dim 4096, 16 latent channels, patch (1, 2, 2)).
# A14B: two experts of the 14B's shape, the high-noise one above its boundary_ratio.
WAN = {
    "Wan2.1-T2V-1.3B-Diffusers": dict(num_attention_heads=12, ffn_dim=8960, num_layers=30),
    "Wan2.1-T2V-14B-Diffusers": {},
    "Wan2.2-T2V-A14B-Diffusers": {},
}
WAN_BOUNDARY = {"Wan2.2-T2V-A14B-Diffusers": 0.875}
# google/umt5-xxl's encoder, the text encoder of every Wan pipeline.
UMT5_XXL = dict(vocab_size=256384, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
                feed_forward_proj="gated-gelu", decoder_start_token_id=0)  # fmt: skip


def full_wan(device: torch.device, model: ModelConfig) -> WanPolicy:
    """The Wan pipeline named by `model.path`'s folder (a key of `WAN`) at its released sizes with random weights,
    built on `device` in bf16: the transformer (Wan 2.2 A14B: both experts), the UMT5-XXL encoder, the Wan 2.1 VAE
    (`AutoencoderKLWan`'s default config). The tiny character-level T5 tokenizer stands in (the prompts are
    synthetic)."""
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    from omnialign.models.tiny import t5_tokenizer

    name = Path(model.path or "").name
    if name not in WAN:
        raise ValueError(f"model.path={model.path!r}: the full-size Wan benchmark builds a folder named one of "
                         f"{sorted(WAN)}; set model.path=models/NAME")  # fmt: skip
    boundary = WAN_BOUNDARY.get(name)
    with built_on(device, torch.bfloat16):
        transformer = WanTransformer3DModel(**WAN[name])
        second = None if boundary is None else WanTransformer3DModel(**WAN[name])
        encoder = UMT5EncoderModel(UMT5Config(**UMT5_XXL))
        vae = AutoencoderKLWan()
    return WanPolicy(transformer, vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval(),
                     t5_tokenizer(), shift=model.shift or 3.0, frames=model.frames,
                     transformer_2=None if second is None else second.requires_grad_(False).eval(),
                     boundary_ratio=boundary,
                     max_sequence_length=model.text_tokens or MAX_SEQUENCE_LENGTH)  # fmt: skip


def write_bench_prompts(path: Path, edits: bool, height: int, width: int) -> None:
    """The OCR prompts as a prompt parquet; for an editing model each with one random RGB source (PNG) of the
    output size."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    columns = {"prompt": OCR_PROMPTS, "ground_truth": [p.split('"')[1] for p in OCR_PROMPTS]}
    if edits:
        rng = np.random.default_rng(0)
        sources = []
        for _ in OCR_PROMPTS:
            buffer = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(buffer, format="PNG")
            sources.append([buffer.getvalue()])
        columns["sources"] = sources
    pq.write_table(pa.table(columns), path)


@contextmanager
def recipe_trainer(recipe: str, prompts: int, tiny: bool, work: Path, extra: list[str] = ()) -> Iterator:
    """The `OnlineTrainer` of a Qwen-Image, FLUX or Wan recipe with `prompts` prompts per GPU on the full-size random
    pipeline (or the tiny one), its reward worker running; see the module docstring."""
    import dataclasses

    from omnialign import rewards
    from omnialign.config import apply_overrides, validate
    from omnialign.engine import optim
    from omnialign.models import LOADERS
    from omnialign.models import tiny as tiny_models
    from omnialign.recipes import RECIPES
    from omnialign.train import build_policy
    from omnialign.trainer.objectives import ALGORITHMS
    from omnialign.trainer.online import OnlineTrainer

    world = dist.init()
    base = RECIPES[recipe]()
    video = base.model.arch == "wan"
    overrides = [f"data.prompts={work / 'prompts.parquet'}", f"data.val_prompts={work / 'prompts.parquet'}",
                 f"data.prompts_per_step={prompts * world.size}",
                 'reward.weights={"jpeg_compressibility": 1.0}', f"model.text_tokens={base.model.text_tokens or 128}",
                 "trainer.progress=false", f"trainer.output_dir={work}"]  # fmt: skip
    if video:  # the stand-in scores every frame
        overrides.append('reward.per_frame={"jpeg_compressibility": "mean"}')
    if tiny:
        overrides += ["model.dtype=float32", "rollout.height=32", "rollout.width=32", "rollout.n=4",
                      "rollout.micro_batch_size=4", "actor.micro_batch_size=2",
                      "engine.activation_checkpointing=false"]  # fmt: skip
        overrides += ["model.frames=5"] if video else []
    config = validate(apply_overrides(base, overrides + list(extra)))
    config.actor = dataclasses.replace(config.actor, mini_batch_size=None)
    arch = config.model.arch
    if world.is_main:
        work.mkdir(parents=True, exist_ok=True)
        write_bench_prompts(work / "prompts.parquet", arch in ("flux_kontext", "qwen_image_edit"),
                            config.rollout.height, config.rollout.width)  # fmt: skip
        if tiny:
            {"qwen_image": tiny_models.qwen_image, "flux": tiny_models.flux, "flux_kontext": tiny_models.flux_kontext,
             "qwen_image_edit": partial(tiny_models.qwen_image_edit, plus=True),
             "wan": tiny_models.wan}[arch](work / "tiny")  # fmt: skip
    torch.distributed.barrier()
    if tiny:
        config.model.path = str(work / "tiny")
        policy = LOADERS[arch](config.model)
    elif arch in ("flux", "flux_kontext"):
        policy = full_flux(world.device, config.model.text_tokens, config.model)
    elif arch == "wan":
        policy = full_wan(world.device, config.model)
    else:
        policy = full_qwen_image(world.device, config.model.text_tokens, arch == "qwen_image_edit",
                                 config.model.source_resize)  # fmt: skip
    with dist.deterministic(config.trainer.deterministic), rewards.RewardWorker(config.reward) as worker:
        policy, contexts = build_policy(config, world, policy)
        params = [p for p in policy.transformer.parameters() if p.requires_grad]
        optimizer, scheduler = optim.build(params, config.actor)
        algorithm = ALGORITHMS[config.algorithm.name](policy, config, contexts.get("reference"),
                                                      contexts.get("teacher"), contexts.get("old"))  # fmt: skip
        yield OnlineTrainer(config, policy, params, optimizer, scheduler, algorithm, world, work / "run", worker,
                            sync=dist.synchronizer(world.device))  # fmt: skip


def bench_recipe(
    recipe: str,
    prompts: int,
    steps: int,
    tiny: bool,
    peak_tflops: float,
    work: Path,
    extra: list[str] = (),
    deterministic: tuple[bool, ...] = (False,),
) -> list[dict]:
    """Full training steps of a recipe with `prompts` prompts per GPU; see the module docstring. With
    `deterministic` (False, True) the same trainer runs its steps without, then with trainer.deterministic's kernels
    (side by side on one model); the row says which."""
    rows = []
    with recipe_trainer(recipe, prompts, tiny, work, extra) as trainer:
        for mode in deterministic:
            with dist.deterministic(mode):
                for step in range(1, steps + 1):
                    if trainer.world.device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    metrics = trainer.train_step(step)
                    phases = trainer.timer.pop()
                    row = recipe_row(trainer.config, step, phases, peak_tflops, trainer.policy, trainer.world)
                    rows.append({**row, "deterministic": mode or trainer.config.trainer.deterministic})
                    for name in ("actor/clip_frac", "actor/rollout_logprob_gap"):  # exactness of rollout log-probs
                        if name in metrics:
                            rows[-1][name.removeprefix("actor/")] = float(metrics[name])
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def flux_layers_and_tokens(policy, height: int, width: int) -> tuple[int, int]:
    """FLUX's blocks (double- and single-stream: the same dense FLOPs per token) and image tokens per sample: the
    noisy tokens and, for Kontext, those of a source of the output size as the policy prepares it."""
    tc, multiple = policy.transformer.config, policy.vae_scale_factor * 2
    grid = policy.latent_shape(height, width)
    tokens = grid[0] * grid[1]
    if policy.edits:
        source = policy.source_pixels(torch.zeros(3, height, width)).shape
        tokens += source[1] // multiple * (source[2] // multiple)
    return tc.num_layers + tc.num_single_layers, tokens


def qwen_image_edit_tokens(policy, height: int, width: int) -> tuple[int, int]:
    """Qwen-Image-Edit's image tokens per sample (the noisy ones and those of a source of the output size as the
    policy sizes it) and its text tokens (that source's vision tokens and the padded instruction)."""
    (w, h), (vision_w, vision_h) = policy.source_sizes(width, height)
    multiple, merge = policy.vae_scale_factor * 2, policy.image_processor.merge_size
    grid = policy.latent_shape(height, width)
    vision = policy.image_processor.get_number_of_image_patches(vision_h, vision_w) // merge**2
    return grid[0] * grid[1] + (h // multiple) * (w // multiple), vision + policy.max_sequence_length


def wan_tokens(policy, height: int, width: int) -> int:
    """Wan's video tokens per sample: latent frames x (H / 16) x (W / 16) for the released VAE and patch (1, 2, 2)."""
    _, frames, h, w = policy.latent_shape(height, width)
    patch = policy.transformer.config.patch_size
    return frames // patch[0] * (h // patch[1]) * (w // patch[2])


def wan_flops(layers: int, dim: int, ffn: int, video_tokens: int, text_tokens: int) -> float:
    """Wan transformer forward FLOPs of one sample: per block, self-attention over the video tokens (projections
    8 N d^2, scores and values 4 N^2 d), cross-attention to the text (query and output 4 N d^2, keys and values
    4 T d^2, scores and values 4 N T d) and the MLP (4 N d ffn)."""
    n, t = video_tokens, text_tokens
    return layers * (12 * n * dim**2 + 4 * t * dim**2 + 4 * n * n * dim + 4 * n * t * dim + 4 * n * dim * ffn)


def recipe_row(config, step: int, phases: dict, peak_tflops: float, policy, world) -> dict:
    """images (videos for Wan)/GPU/s, phase seconds, peak memory and MFU of one measured step."""
    r, a = config.rollout, config.algorithm
    images = config.data.prompts_per_step * r.n // world.size
    seconds = sum(phases.values())
    tc = policy.transformer.config
    text_tokens = config.model.text_tokens or 512
    if config.model.arch == "wan":
        forward = wan_flops(tc.num_layers, tc.num_attention_heads * tc.attention_head_dim, tc.ffn_dim,
                            wan_tokens(policy, r.height, r.width), text_tokens)  # fmt: skip
    else:
        grid = policy.latent_shape(r.height, r.width)
        layers, image_tokens = tc.num_layers, grid[0] * grid[1]
        if config.model.arch in ("flux", "flux_kontext"):
            layers, image_tokens = flux_layers_and_tokens(policy, r.height, r.width)
        if config.model.arch == "qwen_image_edit":
            image_tokens, text_tokens = qwen_image_edit_tokens(policy, r.height, r.width)
        forward = transformer_flops(layers, tc.num_attention_heads * tc.attention_head_dim, image_tokens,
                                    text_tokens)  # fmt: skip
    cfg = 2 if r.guidance != 1.0 else 1
    backward = 1 if config.model.lora.rank else 2
    if a.name == "nft":
        train = a.nft_timesteps * (3 + backward)  # v, v_old, v_ref forwards + backward of v
        rollout_fwd = r.steps
    elif a.name == "awm":  # the old log-probs' forward, then v with its backward, and v_ref for the KL
        train = a.awm_timesteps * (1 + (1 + backward) + (1 if a.kl_coef > 0 else 0))
        rollout_fwd = r.steps * cfg
    elif a.name == "dgpo":  # policy and reference forwards before the update (the KL reuses the latter), then v
        train = a.dgpo_timesteps * (2 + (1 + backward))
        rollout_fwd = r.steps * cfg
    elif a.name == "online_dpo":
        train = 2 * (1 + backward) / r.n * 2  # two pair members per prompt, policy + reference
        rollout_fwd = r.steps * cfg
    else:
        train = r.window_size * cfg * (1 + backward) + (r.window_size * cfg if a.kl_coef > 0 else 0)
        rollout_fwd = r.steps * cfg
    flops = images * forward * (rollout_fwd + train)
    unit = "video" if config.model.arch == "wan" else "image"
    return {
        "recipe": config.recipe, "gpus": world.size, "compile": config.engine.compile, "step": step,
        f"{unit}s": images, "step_s": round(seconds, 1),
        f"{unit}s_per_gpu_s": round(images / seconds, 3),
        **{k.removeprefix("timing/") + "_s": round(v, 1) for k, v in phases.items()},
        "peak_alloc_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if torch.cuda.is_available() else None,
        f"tflop_per_{unit}": round(flops / images / 1e12, 1), "mfu": round(flops / seconds / (peak_tflops * 1e12), 3),
        "peak_tflops": peak_tflops,
    }  # fmt: skip


# --------------------------------------------------------------------------- language models

# The text stack of the Qwen3-Omni-30B-A3B thinker (released config): every layer MoE (128 experts of 768, 8 per
# token, so `intermediate_size` is unused), 32 query / 4 key-value heads of 128, interleaved M-RoPE.
QWEN3_OMNI_TEXT = dict(vocab_size=152064, hidden_size=2048, moe_intermediate_size=768, num_hidden_layers=48,
                       num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                       num_experts_per_tok=8, max_position_embeddings=65536, rms_norm_eps=1e-6,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [24, 20, 20],
                                        "mrope_interleaved": True})  # fmt: skip
# Released Qwen3 dense sizes (vocab 151936, head_dim 128, rope theta 1e6); the small ones tie their embeddings.
QWEN3_SIZES = {
    "0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
    "14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=8, tie_word_embeddings=False),
}  # fmt: skip
QWEN3_COMMON = dict(vocab_size=151936, head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6})  # fmt: skip


def language_policy(arch: str, size: str, device: torch.device, dtype: torch.dtype) -> LanguagePolicy:
    """A `LanguagePolicy` with random weights built on `device` in `dtype`: the Qwen3-Omni-30B-A3B thinker
    (`arch` qwen3_omni; full-size text stack, shrunk towers) or a Qwen3 causal LM of `size` (a key of
    QWEN3_SIZES); `size="tiny"` gives the tiny twin of either. The byte-level tokenizer of the tiny models
    (ids below 266) stands in for Qwen's: the benchmark's text is synthetic."""
    from transformers import (
        Qwen3Config,
        Qwen3ForCausalLM,
        Qwen3OmniMoeThinkerConfig,
        Qwen3OmniMoeThinkerForConditionalGeneration,
    )

    from omnialign.models.qwen3 import CausalLMPolicy
    from omnialign.models.qwen3_omni import OmniThinkerPolicy
    from omnialign.models.tiny import TINY_OMNI_TEXT, byte_tokenizer, qwen3_sizes, thinker_config

    tokenizer = byte_tokenizer()
    special = dict(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with built_on(device, dtype):
        if arch == "qwen3_omni":
            text = {**(TINY_OMNI_TEXT if size == "tiny" else QWEN3_OMNI_TEXT), **special}
            config = Qwen3OmniMoeThinkerConfig(**thinker_config(text, tokenizer))  # shrunk towers
            net = Qwen3OmniMoeThinkerForConditionalGeneration(config)
        elif arch == "qwen3":
            sizes = qwen3_sizes() if size == "tiny" else {**QWEN3_COMMON, **QWEN3_SIZES[size]}
            net = Qwen3ForCausalLM(Qwen3Config(**sizes, **special))
        else:
            raise ValueError(f"model.arch={arch!r}: the language benchmark builds qwen3 or qwen3_omni")
    net.generation_config.eos_token_id = special["eos_token_id"]
    net.generation_config.pad_token_id = special["pad_token_id"]
    if arch == "qwen3_omni":
        return OmniThinkerPolicy(net, tokenizer, None, None)  # no media: no image processor, no feature extractor
    return CausalLMPolicy(net, tokenizer)


def synthetic_records(
    policy: LanguagePolicy, dpo: bool, count: int, prompt_tokens: int, response_tokens: int
) -> list[dict]:
    """`count` train records and 2 val records of random letters (one token per character under the byte
    tokenizer) whose chat-formatted prompts are `prompt_tokens` long; DPO pairs hold two responses of
    `response_tokens` tokens with their end-of-turn token, RL prompts a ground truth for the `choice` reward."""
    import random

    overhead = len(policy.encode([[{"role": "user", "content": ""}]])[0][0])
    if prompt_tokens <= overhead or (dpo and response_tokens < 2):
        raise ValueError(f"prompts need more than {overhead} tokens (the chat template) and responses at least 2")
    rng = random.Random(0)

    def text(n: int) -> str:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n))

    out = []
    for i in range(count + 2):
        record = {"id": f"bench-{i}", "prompt": [{"role": "user", "content": text(prompt_tokens - overhead)}],
                  "modality": "text", "split": "train" if i < count else "val"}  # fmt: skip
        if dpo:
            record.update(chosen=text(response_tokens - 1), rejected=text(response_tokens - 1))
        else:
            record["ground_truth"] = "A"
        out.append(record)
    return out


def language_trainer(
    recipe: str,
    prompts: int | None,
    tiny: bool,
    work: Path,
    extra: list[str] = (),
    model_size: str = "4b",
    seq_len: int = 1024,
    prompt_len: int = 256,
    max_new_tokens: int = 512,
) -> tuple:
    """The trainer of a language recipe (offline DPO or RL) on a random full-size model, its policy, and the row
    head that describes it; see the module docstring."""
    import dataclasses

    from omnialign.config import apply_overrides, recomputes_old_log_probs, validate
    from omnialign.data.language import write_records
    from omnialign.engine import optim
    from omnialign.recipes import RECIPES
    from omnialign.trainer import language, offline
    from omnialign.trainer.language_objectives import dpo_objective, policy_objective

    world = dist.init()
    base = RECIPES[recipe]()
    arch, algorithm = base.model.arch, base.algorithm.name
    if arch not in ("qwen3", "qwen3_omni") or algorithm not in ("dpo", "grpo", "dapo", "gspo"):
        raise SystemExit(f"bench language: recipe {recipe} ({arch}, {algorithm}) is not a qwen3/qwen3_omni recipe of "
                         "dpo, grpo, dapo or gspo")  # fmt: skip
    dpo = algorithm == "dpo"
    per_gpu = prompts or (2 if tiny else base.data.prompts_per_step // world.size)
    data = work / "language.parquet"
    overrides = [f"data.prompts={data}", f"data.val_prompts={data}", f"data.prompts_per_step={per_gpu * world.size}",
                 'reward.weights={"choice": 1.0}', f"model.dtype={'float32' if tiny else 'bfloat16'}",
                 "engine.activation_checkpointing=true", "trainer.progress=false",
                 f"trainer.output_dir={work}"]  # fmt: skip
    if not dpo:
        overrides.append(f"generation.max_new_tokens={max_new_tokens}")
    if tiny:
        overrides += ["rollout.n=4", "actor.micro_batch_size=4", "generation.micro_batch_size=8"]
    config = apply_overrides(base, overrides + list(extra))
    local = per_gpu * (2 if dpo else config.rollout.n)  # sequences per GPU and step
    local_mini = (config.actor.mini_batch_size or 0) // world.size
    if config.actor.mini_batch_size and (not local_mini or local % local_mini):
        config.actor = dataclasses.replace(config.actor, mini_batch_size=None)
    config = validate(config)
    policy = language_policy(arch, "tiny" if tiny else model_size, world.device, getattr(torch, config.model.dtype))
    response = seq_len // 2 if dpo else max_new_tokens
    if world.is_main:
        work.mkdir(parents=True, exist_ok=True)
        length = seq_len - response if dpo else prompt_len
        write_records(synthetic_records(policy, dpo, per_gpu * world.size, length, response), data)
    torch.distributed.barrier()
    params_b = sum(p.numel() for p in policy.transformer.parameters()) / 1e9
    policy, reference, _ = language.build(config, world, policy)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    run_dir = work / "run"
    if dpo:
        objective = dpo_objective(policy, config.algorithm)
        trainer = offline.language_dpo(config, policy, params, optimizer, scheduler, objective, reference, world,
                                       run_dir)  # fmt: skip
    else:
        objective = policy_objective(policy, config.algorithm, config.generation.temperature,
                                     recomputes_old_log_probs(config))  # fmt: skip
        trainer = language.LanguageTrainer(config, policy, params, optimizer, scheduler, objective, world, run_dir,
                                           reference)  # fmt: skip
    model = "qwen3-omni-30b-a3b-thinker" if arch == "qwen3_omni" else f"qwen3-{model_size}"
    head = {"recipe": recipe, "model": f"tiny-{arch}" if tiny else model,
            "params_b": round(params_b, 3), "trainable_m": round(sum(p.numel() for p in params) / 1e6, 3),
            "gpus": world.size}  # fmt: skip
    return trainer, policy, head


def bench_language(
    recipe: str,
    prompts: int | None,
    steps: int,
    tiny: bool,
    work: Path,
    extra: list[str] = (),
    model_size: str = "4b",
    seq_len: int = 1024,
    prompt_len: int = 256,
    max_new_tokens: int = 512,
) -> list[dict]:
    """Training steps of a language recipe (offline DPO or RL) on a random full-size model; see the module docstring."""
    trainer, _, head = language_trainer(recipe, prompts, tiny, work, extra, model_size, seq_len, prompt_len,
                                     max_new_tokens)  # fmt: skip
    config, world = trainer.config, trainer.world
    dpo = config.algorithm.name == "dpo"
    per_gpu = config.data.prompts_per_step // world.size
    local = per_gpu * (2 if dpo else config.rollout.n)  # sequences per GPU and step
    cuda = world.device.type == "cuda"
    rows = []
    for step in range(1, steps + 1):
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        metrics = trainer.train_step(step)
        phases = {k.removeprefix("timing/"): v for k, v in trainer.timer.pop().items()}
        seconds = sum(phases.values())
        row = {**head, "step": step}
        if dpo:
            row.update(pairs=per_gpu, seq_len=seq_len, step_s=round(seconds, 2),
                       samples_per_gpu_s=round(2 * per_gpu / seconds, 3),
                       pairs_per_gpu_s=round(per_gpu / seconds, 3))  # fmt: skip
        else:
            tokens = float(metrics["rollout/response_length"]) * local
            row.update(samples=local, prompt_len=prompt_len, max_new_tokens=max_new_tokens,
                       response_len=round(tokens / local, 1), step_s=round(seconds, 2),
                       samples_per_gpu_s=round(local / seconds, 3),
                       gen_tokens_per_s=round(tokens / phases["rollout"], 1))  # fmt: skip
        row.update({f"{k}_s": round(v, 2) for k, v in phases.items()})
        row["peak_alloc_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


GSPO_CLIP = 3e-4  # choice_gspo's lower clip range: a sequence whose mean log-ratio exceeds it is clipped at once


def training_logprobs(policy, ids: torch.Tensor, out: torch.Tensor, keep: torch.Tensor,
                      head_dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """The training forward's log-probs (B, R) of responses `out` to prompts `ids` (no padding) through the kept
    tokens, 16 sequences at a time; `head_dtype` bfloat16 runs the output head in the network's own dtype instead
    (what the decoders recorded before their head was float32)."""
    parts = []
    with torch.no_grad():
        for lo in range(0, len(ids), 16):
            full = torch.cat([ids[lo : lo + 16], out[lo : lo + 16]], 1)
            mask = torch.cat([torch.ones_like(ids[lo : lo + 16]), keep[lo : lo + 16].long()], 1)
            if head_dtype == torch.float32:
                parts.append(policy.token_logprobs(full, mask, None, ids.shape[1]))
            else:
                logits = policy.transformer(input_ids=full, attention_mask=mask, use_cache=False).logits
                logp = logits[:, ids.shape[1] - 1 : -1].float().log_softmax(-1)
                parts.append(logp.gather(-1, full[:, ids.shape[1] :, None]).squeeze(-1))
    return torch.cat(parts)


def logprob_gaps(reference: torch.Tensor, lp: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
    """Recorded log-probs `lp` (B, R) against `reference` over the kept tokens: the mean and largest |difference| per
    token, the largest |mean difference| of a sequence (GSPO's log-ratio at the first update) and the share of
    sequences whose mean exceeds GSPO_CLIP."""
    keep = keep.float()
    diff = (reference - lp.float()) * keep
    seq = diff.sum(-1) / keep.sum(-1)
    return {"logprob_gap_mean": round(float(diff.abs().sum() / keep.sum()), 5),
            "logprob_gap_max": round(float(diff.abs().max()), 4), "seq_gap_max": round(float(seq.abs().max()), 5),
            "gspo_clipped": round(float((seq.abs() > GSPO_CLIP).float().mean()), 3)}  # fmt: skip


def bench_decode(batch: int, tiny: bool, model_size: str, prompt_len: int, max_new_tokens: int,
                 bandwidth: float, logit_scale: float = 1.0) -> list[dict]:  # fmt: skip
    """The decoders side by side on one Qwen3 of `model_size` with random weights (bf16; `--tiny`: the tiny
    twin in float32 on the CPU), the final norm's weight times `logit_scale` (realistic logits: random weights
    give logits of about unit spread, a trained model's spread over tens): see the module docstring."""
    from omnialign.rollout import decode

    cuda = torch.cuda.is_available() and not tiny
    device = torch.device("cuda" if cuda else "cpu")
    policy = language_policy("qwen3", "tiny" if tiny else model_size, device, torch.float32 if tiny else torch.bfloat16)
    net = policy.transformer.eval()
    with torch.no_grad():
        net.model.norm.weight.mul_(logit_scale)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (batch, prompt_len), generator=g).to(device)  # byte tokens, no special ones
    mask = torch.ones_like(ids)
    stop, pad = policy.stop_token_ids, policy.pad_token_id
    hf = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}

    def transformers(cache: dict):
        return lambda n: policy.generate(ids, mask, None, {**hf, **cache, "max_new_tokens": n})

    decoders = {
        "transformers generate, dynamic cache": transformers({}),
        "transformers generate, static cache": transformers({"cache_implementation": "static"}),
        "omnialign static cache, eager step": lambda n: decode.generate(net, ids, mask, stop, pad, n, graph=False),
        "omnialign static cache, CUDA graph": lambda n: decode.generate(net, ids, mask, stop, pad, n, graph=cuda),
    }
    layers, kv_heads = net.config.num_hidden_layers, net.config.num_key_value_heads
    weights = sum(p.numel() * p.element_size() for p in net.parameters())
    if not net.config.tie_word_embeddings:  # a step reads B rows of the input embedding, not the table
        weights -= net.model.embed_tokens.weight.numel() * net.model.embed_tokens.weight.element_size()
    mean_len = prompt_len + (max_new_tokens + 1) / 2
    kv = 2 * layers * kv_heads * net.config.head_dim * 2 * batch * mean_len  # bf16 keys and values
    bound = batch * bandwidth * 1e12 / (weights + kv)
    rows = []
    for name, run in decoders.items():

        def timed(n: int, run=run) -> tuple[float, torch.Tensor, torch.Tensor]:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out, lp = run(n)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - start, out, lp

        torch.manual_seed(0)
        timed(4)  # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        first, _, _ = timed(1)
        total, out, lp = timed(max_new_tokens)
        is_stop = torch.isin(out, torch.tensor(stop, device=out.device)).long()
        keep = is_stop.cumsum(1) - is_stop == 0  # through each row's stop token
        reference = training_logprobs(policy, ids, out, keep)
        gaps = logprob_gaps(reference, lp, keep)
        decode_tps = batch * (out.shape[1] - 1) / max(total - first, 1e-9)
        row = {"decoder": name, "model": f"qwen3-{'tiny' if tiny else model_size}", "batch": batch,
               "prompt_len": prompt_len, "new_tokens": out.shape[1], "seconds": round(total, 3),
               "prefill_and_first_s": round(first, 3), "tokens_per_s": round(batch * out.shape[1] / total, 1),
               "decode_tokens_per_s": round(decode_tps, 1), "bound_tokens_per_s": round(bound, 1),
               "share_of_bound": round(decode_tps / bound, 3), **gaps,
               "peak_alloc_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    # what a bf16 output head alone adds: the training forward with its head in bf16, on the last decoder's tokens
    bf16_head = training_logprobs(policy, ids, out, keep, torch.bfloat16)
    rows.append({k: None for k in rows[-1]} | {"decoder": "training forward, bf16 head (reference)",
                                               **logprob_gaps(reference, bf16_head, keep)})  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(str(r[k]) for k in keys))


def main(name: str, args) -> None:
    if name == "staging":
        rows = bench_staging(args.windows, args.modes, args.tiny)
    elif name == "decode":
        rows = bench_decode(args.prompts or 128, args.tiny, args.model_size, args.prompt_len, args.max_new_tokens,
                            args.bandwidth, args.logit_scale)  # fmt: skip
    elif name == "language":
        rows = bench_language(args.recipe or "qwen3_omni_dpo", args.prompts, args.steps, args.tiny,
                              Path(args.work), args.set, args.model_size, args.seq_len, args.prompt_len,
                              args.max_new_tokens)  # fmt: skip
    else:
        rows = bench_recipe(args.recipe or "qwen_image_ocr_flowgrpo_lora", args.prompts or 8, args.steps, args.tiny,
                            args.peak, Path(args.work), args.set,
                            {"off": (False,), "both": (False, True)}[args.deterministic])  # fmt: skip
    if not dist.init().is_main:
        return
    print_table(rows)
    if args.out:
        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        Path(args.out).write_text(json.dumps({"device": device, "torch": torch.__version__, "rows": rows}, indent=2))
