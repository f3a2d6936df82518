"""`recipe`: full training steps of a Qwen-Image recipe at one GPU's share of its global batch
(`--prompts` prompts x the recipe's rollout.n images) on the full-size pipeline with random weights
(transformer 20.4 B, Qwen2.5-VL-7B text encoder, VAE; bf16) built in memory: images per GPU per
second, seconds per phase, peak memory and MFU. MFU counts the transformer's model FLOPs (rollout
forwards with CFG; training forward + backward, the backward costed as 1x forward for LoRA and 2x
for full fine-tuning; activation recomputation not counted; text encoder and VAE not counted) over
`--peak` TFLOP/s (the measured bf16 matmul peak; with `--set engine.fp8=true`, whose row says `"fp8": true`, and
with `engine.fp8_backward`, the same bf16 peak, so the MFU of an FP8 run compares its speed with the bf16 run's, not
with the FP8 peak). Attention's own backward (queries', keys' and values' gradients) is about 2x its forward even
under LoRA, and the 1x counts it as 1x: the count is low where attention is a large share of the forward (Wan 2.1
1.3B at 81 frames, 71%: its step is 6% short; FLUX.1 at 512x512, 6%: 1%). The reward
is a CPU stand-in (`jpeg_compressibility`) so the figure measures the trainer; prompts are short OCR prompts (128
text tokens).
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
SD3.5 recipes (`model.arch=sd3`, `full_sd3`) run on SD3.5 medium (2.5 B: 24 MM-DiT blocks of 1536, the first 13 with
MMDiT-X's second attention) or large (8.1 B: 38 of 2432) by `model.path`'s folder name, with CLIP-L, CLIP-G, T5-XXL's
encoder and the SD3 VAE, random bf16 weights; MFU counts the image tokens and CLIP's 77 + T5's text tokens.
Z-Image recipes (`model.arch=zimage`, `full_zimage`) run on Z-Image or Z-Image-Turbo (by `model.path`'s folder name)
at the released sizes (transformer 6.15 B: 30 single-stream layers of 3840 and 2 noise and 2 context refiners;
Qwen3-4B; FLUX.1's VAE; random bf16 weights); MFU counts the image tokens and the prompts' own caption tokens (Z-Image
drops the padding), each padded to a multiple of 32 as its transformer pads them, the refiners over their own tokens.
FLUX.2 recipes (`model.arch` flux2 or flux2_klein, `full_flux2`) run on FLUX.2-dev (transformer 32.2 B: 8 double- and 48
single-stream blocks of 6144 with the guidance embedding; Mistral Small 3.1's text stack up to the 30th of its 40
layers, the last the pipeline reads: 17.9 B) or the FLUX.2-klein named by `model.path`'s folder (4B: 3.9 B transformer,
5 + 20 blocks of 3072, Qwen3-4B's first 27 layers; 9B: 9.1 B, 8 + 24 blocks of 4096, Qwen3-8B's), with the FLUX.2 VAE,
random bf16 weights; MFU counts every block at (4 + 3 x 3) d^2 weights per token (the SwiGLU MLP of ratio 3) over the
image and the recipes' 512 text tokens (`flux2_flops`).
LTX-2 recipes (`model.arch=ltx2`, `full_ltx2`) run on LTX-2 at its released sizes (the 18.9 B audio-video transformer:
48 blocks, video 4096 wide and audio 2048; its text connectors, video VAE and Gemma-3-12B; random bf16 weights) at the
recipe's frames and size (`--set model.frames=25`); every frame is scored and a row counts videos. MFU counts both
streams of every block (`ltx2_flops`): the video tokens (latent frames x H/32 x W/32: 6144 at 768x512x121), the audio
tokens (25 a second: 126) and the 1024 text tokens the connectors give.
`recipe --deterministic both` runs the steps again under trainer.deterministic's kernels on the same model: its
cost side by side (`--set trainer.deterministic=true` runs every step with them).
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch

from omnialign.bench.models import (
    flux2_flops,
    flux_layers_and_tokens,
    full_flux,
    full_flux2,
    full_ltx2,
    full_qwen_image,
    full_sd3,
    full_wan,
    full_zimage,
    ltx2_flops,
    progress,
    qwen_image_edit_tokens,
    transformer_flops,
    wan_flops,
    wan_tokens,
    zimage_flops,
    zimage_tokens,
)
from omnialign.bench.profile import profiled
from omnialign.config import VIDEO_ARCHS, branch_steps, images_per_sample, tree_rows, tree_widths
from omnialign.engine import dist
from omnialign.recipes.wan import A14B_BOUNDARY

OCR_PROMPTS = [f'A storefront sign that says "{w}"' for w in
               ("OPEN", "BAKERY", "EXIT 12", "HELLO", "SALE 50%", "CAFE", "STOP", "PARK", "BOOKS", "TAXI", "HOTEL",
                "PHARMACY", "GARAGE", "MUSEUM", "LIBRARY", "STATION")]  # fmt: skip


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
    """The `OnlineTrainer` of a Qwen-Image, FLUX.1, FLUX.2, SD3.5, Z-Image, Wan or LTX-2 recipe with `prompts` prompts
    per GPU on the full-size random pipeline (or the tiny one), its reward worker running; see the module docstring."""
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
    video = base.model.arch in VIDEO_ARCHS
    overrides = [f"data.prompts={work / 'prompts.parquet'}", f"data.val_prompts={work / 'prompts.parquet'}",
                 f"data.prompts_per_step={prompts * world.size}", 'reward.weights={"jpeg_compressibility": 1.0}',
                 "reward.options={}", f"model.text_tokens={base.model.text_tokens or 128}",
                 "trainer.progress=false", f"trainer.output_dir={work}",
                 "actor.mini_batch_size=none"]  # fmt: skip
    if video:  # the stand-in scores every frame
        overrides.append('reward.per_frame={"jpeg_compressibility": "mean"}')
    if base.algorithm.name == "gardo":  # its uncertainty needs an auxiliary reward: a second CPU stand-in, weight 0
        overrides += ['reward.weights={"jpeg_compressibility": 1.0, "jpeg_incompressibility": 0.0}',
                      'algorithm.gardo_auxiliary=["jpeg_incompressibility"]']  # fmt: skip
    if tiny:
        overrides += ["model.dtype=float32", "rollout.height=32", "rollout.width=32", "rollout.n=4",
                      "rollout.micro_batch_size=4", "actor.micro_batch_size=2",
                      "engine.activation_checkpointing=false"]  # fmt: skip
        overrides += ["model.frames=5"] if video else []
        # compiling the tiny blocks on a CPU takes minutes and checks nothing of the bench (--set engine.compile=true)
        overrides += ["engine.compile=false"] if world.device.type == "cpu" else []
        if base.model.arch == "ltx2":  # frames 8k + 1; its VAE decodes 2 x 2 latent pixels at least
            overrides += ["model.frames=9", "rollout.height=64", "rollout.width=64"]
    config = validate(apply_overrides(base, overrides + list(extra)))
    arch = config.model.arch
    if world.is_main:
        work.mkdir(parents=True, exist_ok=True)
        write_bench_prompts(work / "prompts.parquet", arch in ("flux_kontext", "qwen_image_edit"),
                            config.rollout.height, config.rollout.width)  # fmt: skip
        if tiny:
            {"qwen_image": tiny_models.qwen_image, "flux": tiny_models.flux, "flux_kontext": tiny_models.flux_kontext,
             "sd3": tiny_models.sd3,
             "qwen_image_edit": partial(tiny_models.qwen_image_edit, plus=True),
             # a recipe with a second guidance scale is Wan 2.2 A14B's: the twin gets its second (low-noise) expert
             "wan": partial(tiny_models.wan,
                            boundary_ratio=None if config.rollout.guidance_2 is None else A14B_BOUNDARY),
             "zimage": tiny_models.zimage, "flux2": tiny_models.flux2,
             "flux2_klein": tiny_models.flux2_klein, "ltx2": tiny_models.ltx2}[arch](work / "tiny")  # fmt: skip
    torch.distributed.barrier()
    progress(f"building {recipe}'s {'tiny' if tiny else 'full-size'} {arch} pipeline on {world.device}", world.is_main)
    if tiny:
        config.model.path = str(work / "tiny")
        policy = LOADERS[arch](config.model)
    elif arch in ("flux", "flux_kontext"):
        policy = full_flux(world.device, config.model.text_tokens, config.model)
    elif arch in ("flux2", "flux2_klein"):
        policy = full_flux2(world.device, config.model.text_tokens, config.model)
    elif arch == "sd3":
        policy = full_sd3(world.device, config.model)
    elif arch == "wan":
        policy = full_wan(world.device, config.model)
    elif arch == "zimage":
        policy = full_zimage(world.device, config.model.text_tokens, config.model)
    elif arch == "ltx2":
        policy = full_ltx2(world.device, config.model)
    else:
        policy = full_qwen_image(world.device, config.model.text_tokens, arch == "qwen_image_edit",
                                 config.model.source_resize)  # fmt: skip
    with dist.deterministic(config.trainer.deterministic), rewards.RewardWorker(config.reward) as worker:
        policy, contexts = build_policy(config, world, policy)
        params = [p for p in policy.transformer.parameters() if p.requires_grad]
        optimizer, scheduler = optim.build(params, config.actor)
        algorithm = ALGORITHMS[config.algorithm.name](policy, config, contexts.get("reference"),
                                                      contexts.get("teacher"), contexts.get("old"))  # fmt: skip
        progress("built; training steps next", world.is_main)
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
    profile: Path | None = None,
) -> list[dict]:
    """Full training steps of a recipe with `prompts` prompts per GPU; see the module docstring. With
    `deterministic` (False, True) the same trainer runs its steps without, then with trainer.deterministic's kernels
    (side by side on one model); the row says which. With `profile` the last step runs under the torch profiler
    (`bench.profile`: its trace and device time by kernel kind in that folder; the row gets `busy_share`)."""
    rows = []
    with recipe_trainer(recipe, prompts, tiny, work, extra) as trainer:
        for mode in deterministic:
            with dist.deterministic(mode):
                for step in range(1, steps + 1):
                    progress(f"step {step} of {steps}", trainer.world.is_main)
                    if trainer.world.device.type == "cuda":
                        torch.cuda.reset_peak_memory_stats()
                    if profile and (mode, step) == (deterministic[-1], steps):
                        metrics, summary = profiled(
                            partial(trainer.train_step, step), profile, trainer.world.device.type == "cuda"
                        )
                    else:
                        metrics, summary = trainer.train_step(step), {}
                    phases = trainer.timer.pop()
                    row = recipe_row(trainer.config, step, phases, peak_tflops, trainer.policy, trainer.world)
                    rows.append({**row, "deterministic": mode or trainer.config.trainer.deterministic})
                    if summary:  # the profiler's overhead is in this row's seconds
                        rows[-1].update(profiled=True, busy_share=summary["busy_share"])
                    for name in ("actor/clip_frac", "actor/rollout_logprob_gap"):  # exactness of rollout log-probs
                        if name in metrics:
                            rows[-1][name.removeprefix("actor/")] = float(metrics[name])
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def recipe_row(config, step: int, phases: dict, peak_tflops: float, policy, world) -> dict:
    """images (videos for Wan)/GPU/s, phase seconds, peak memory and MFU of one measured step. Rollout and training
    forwards are counted per image (a TempFlow-GRPO trunk's or BranchGRPO tree's share over its images)."""
    r, a = config.rollout, config.algorithm
    per = images_per_sample(config)  # a TempFlow-GRPO trunk's or a BranchGRPO tree's images
    images = config.data.prompts_per_step * r.n * per // world.size
    seconds = sum(phases.values())
    tc = policy.transformer.config
    text_tokens = config.model.text_tokens or 512
    if config.model.arch == "wan":
        forward = wan_flops(tc.num_layers, tc.num_attention_heads * tc.attention_head_dim, tc.ffn_dim,
                            wan_tokens(policy, r.height, r.width), text_tokens)  # fmt: skip
    elif config.model.arch == "zimage":  # its captions are the prompts' own tokens, padded to a multiple of 32
        forward = zimage_flops(policy, *zimage_tokens(policy, r.height, r.width, OCR_PROMPTS))
    elif config.model.arch in ("flux2", "flux2_klein"):
        forward = flux2_flops(policy, r.height, r.width, text_tokens)
    elif config.model.arch == "sd3":  # MM-DiT over (H/16)(W/16) image tokens and CLIP's 77 + T5's text tokens
        forward = transformer_flops(tc.num_layers, tc.num_attention_heads * tc.attention_head_dim,
                                    (r.height // 16) * (r.width // 16), 77 + text_tokens)  # fmt: skip
    elif config.model.arch == "ltx2":
        f, h, w = policy.video_grid(r.height, r.width)
        forward = ltx2_flops(tc.num_layers, tc.num_attention_heads * tc.attention_head_dim,
                             tc.audio_num_attention_heads * tc.audio_attention_head_dim, f * h * w, policy.audio_tokens,
                             text_tokens)  # fmt: skip
    else:
        grid = policy.latent_shape(r.height, r.width)
        layers, image_tokens = tc.num_layers, grid[0] * grid[1]
        if config.model.arch in ("flux", "flux_kontext"):
            layers, image_tokens = flux_layers_and_tokens(policy, r.height, r.width)
        if config.model.arch == "qwen_image_edit":
            image_tokens, text_tokens = qwen_image_edit_tokens(policy, r.height, r.width)
        forward = transformer_flops(layers, tc.num_attention_heads * tc.attention_head_dim, image_tokens,
                                    text_tokens)  # fmt: skip
    cfg = 2 if r.guidance != 1.0 or r.guidance_2 not in (None, 1.0) else 1
    backward = 1 if config.model.lora.rank else 2
    transition = cfg * (1 + backward) + (cfg if a.kl_coef > 0 else 0)  # one trained transition, with its KL
    if a.name == "nft":
        train = a.nft_timesteps * (3 + backward)  # v, v_old, v_ref forwards + backward of v
        rollout_fwd = r.steps
    elif a.name == "awm":  # the old log-probs' forward, then v with its backward, and v_ref for the KL
        train = a.awm_timesteps * (1 + (1 + backward) + (1 if a.kl_coef > 0 else 0))
        rollout_fwd = r.steps * cfg
    elif a.name == "dgpo":  # policy and reference forwards before the update (the KL reuses the latter), then v
        train = a.dgpo_timesteps * (2 + (1 + backward))
        rollout_fwd = r.steps * cfg
    elif a.name == "tempflow":  # a trunk runs to its last branch step, each branch on to the end; a leaf trains one
        steps = branch_steps(r)
        rollout_fwd = (max(steps) + 1 + r.branches * sum(r.steps - k - 1 for k in steps)) * cfg / per
        train = transition
    elif a.name == "branchgrpo":  # each node of a tree one forward (its children share it); each kept edge trains
        widths = tree_widths(r)
        rollout_fwd = sum([1, *widths[:-1]]) * cfg / per
        train = tree_rows(config) / per * transition
    elif a.name == "online_dpo":
        train = 2 * (1 + backward) / r.n * 2  # two pair members per prompt, policy + reference
        rollout_fwd = r.steps * cfg
    else:
        train = r.window_size * transition
        rollout_fwd = r.steps * cfg
    flops = images * forward * (rollout_fwd + train)
    unit = "video" if config.model.arch in VIDEO_ARCHS else "image"
    return {
        "recipe": config.recipe, "gpus": world.size, "compile": config.engine.compile, "fp8": config.engine.fp8,
        "fp8_backward": config.engine.fp8_backward,
        "step": step,
        f"{unit}s": images, "step_s": round(seconds, 1),
        f"{unit}s_per_gpu_s": round(images / seconds, 3),
        **{k.removeprefix("timing/") + "_s": round(v, 1) for k, v in phases.items()},
        "peak_alloc_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if torch.cuda.is_available() else None,
        f"tflop_per_{unit}": round(flops / images / 1e12, 1), "mfu": round(flops / seconds / (peak_tflops * 1e12), 3),
        "peak_tflops": peak_tflops,
    }  # fmt: skip
