"""The FLUX.1-dev and FLUX.1-Kontext adapter on tiny random pipelines: loading, encoding, the schedule,
equivalence of our rollout-level ODE sampling with diffusers' own `FluxPipeline` and `FluxKontextPipeline`, and
every FLUX recipe running two training steps on its tiny twin."""

import copy
import gzip
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxKontextPipeline, FluxPipeline
from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock
from diffusers.pipelines.flux import pipeline_flux_kontext
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from matrix import recipe_params
from peft import LoraConfig, get_peft_model
from PIL import Image

from omnialign.bench.models import flux_layers_and_tokens, full_flux
from omnialign.cli import main as cli
from omnialign.config import ModelConfig, apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.engine.fsdp import dense_attention_grads
from omnialign.metrics import read_metrics
from omnialign.models import LOADERS, flux, tiny
from omnialign.recipes import RECIPES
from omnialign.train import main

PROMPTS = ["a red cat", 'a shop sign that says "OPEN" in the rain, photo']
NEGATIVE = ["blurry, low quality"] * 2
HEIGHT, WIDTH = 32, 48  # tiny VAE factor 2, 2x2 packing: an 8x12 token grid
SEEDS = (11, 12)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux")
    return {"flux": tiny.flux(root / "dev"), "flux_kontext": tiny.flux_kontext(root / "kontext")}


@pytest.fixture(scope="module")
def policy(paths):
    return LOADERS["flux"](ModelConfig(arch="flux", path=str(paths["flux"])))


@pytest.fixture(scope="module")
def kontext(paths):
    return LOADERS["flux_kontext"](
        ModelConfig(arch="flux_kontext", path=str(paths["flux_kontext"]), source_resize=False)
    )


@pytest.fixture(scope="module")
def pipeline(paths):
    pipe = FluxPipeline.from_pretrained(paths["flux"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def kontext_pipeline(paths):
    pipe = FluxKontextPipeline.from_pretrained(paths["flux_kontext"])
    pipe.set_progress_bar_config(disable=True)
    return pipe


def source_arrays(height: int, width: int, count: int = 2, seed: int = 0) -> list[np.ndarray]:
    """Random 8-bit RGB images (H, W, 3), different per index."""
    g = np.random.default_rng(seed)
    return [g.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(count)]


def as_tensor(array: np.ndarray) -> torch.Tensor:
    """An 8-bit image as `data.prompts.source_images` gives it: (C, H, W) float in [0, 1]."""
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255


def ours(policy, guidance: float = 1.0, sources=None, steps: int = 4, height: int = HEIGHT, width: int = WIDTH):
    """Our rollout-level ODE sampling (sampling.sample on policy.velocity and policy.schedule) and decode."""
    generators = [torch.Generator().manual_seed(s) for s in SEEDS]
    cond = policy.encode_prompts(PROMPTS, sources)
    uncond = policy.encode_prompts(NEGATIVE, sources) if guidance != 1.0 else None
    shape = policy.latent_shape(height, width)
    out = sample(policy.velocity, generators, shape, policy.schedule(steps, height, width), cond, uncond,
                 guidance=guidance, window=0)  # fmt: skip
    return policy.decode(out.final)


def noise(policy, height: int = HEIGHT, width: int = WIDTH) -> torch.Tensor:
    """The same seeds' initial noise, packed as the pipelines take `latents`: (B, tokens, channels)."""
    shape = policy.latent_shape(height, width)
    return per_sample_noise([torch.Generator().manual_seed(s) for s in SEEDS], shape).reshape(2, -1, shape[-1])


def test_loads_by_path_with_frozen_encoders_and_lora_targets(policy, kontext):
    encoders = [*policy.text_encoders, policy.vae]
    assert not any(p.requires_grad for m in encoders for p in m.parameters())
    assert not any(m.training for m in encoders)
    assert all(p.requires_grad for p in policy.transformer.parameters())
    assert len(policy.blocks()) == 4  # 2 double-stream + 2 single-stream blocks
    assert not policy.edits and kontext.edits
    assert policy.guidance == 3.5 and kontext.guidance == 2.5  # the defaults of model.embedded_guidance
    lora = get_peft_model(copy.deepcopy(policy.transformer), LoraConfig(r=2, target_modules=policy.lora_targets))
    names = [name for name, _ in lora.named_modules() if name.endswith("lora_A")]
    assert sum(".single_transformer_blocks." in n for n in names) == 4 * 2  # q, k, v, proj_mlp per single block
    assert len(names) == 12 * 2 + 4 * 2  # 12 projections per double block


def test_encode_prompts_match_the_pipeline(policy, pipeline):
    cond = policy.encode_prompts(PROMPTS)
    assert cond.batch_size == torch.Size([2])
    assert cond["embeds"].shape == (2, flux.MAX_SEQUENCE_LENGTH, 32) and cond["pooled"].shape == (2, 32)
    with torch.no_grad():  # as the pipeline's __call__ (under autograd, CPU attention takes another kernel)
        embeds, pooled, _ = pipeline.encode_prompt(PROMPTS, prompt_2=None)
        short_embeds = pipeline.encode_prompt(PROMPTS, None, max_sequence_length=7)[0]
    torch.testing.assert_close(cond["embeds"], embeds)
    torch.testing.assert_close(cond["pooled"], pooled)
    assert (cond["pooled"][0] - cond["pooled"][1]).abs().max() > 1e-3
    short = flux.FluxPolicy(policy.transformer, policy.vae, policy.text_encoders, policy.tokenizers, policy.scheduler,
                            max_sequence_length=7)  # fmt: skip
    torch.testing.assert_close(short.encode_prompts(PROMPTS)["embeds"], short_embeds)


@pytest.mark.parametrize("size", [(HEIGHT, WIDTH), (512, 512), (1024, 768)])
def test_schedule_matches_the_scheduler(policy, paths, size):
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(paths["flux"] / "scheduler")
    tokens = policy.latent_shape(*size)[0] * policy.latent_shape(*size)[1]
    c = scheduler.config
    mu = calculate_shift(tokens, c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift)
    for steps in (4, 28):
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        sigmas = policy.schedule(steps, *size)
        assert sigmas.dtype == torch.float32 and sigmas.shape == (steps + 1,) and sigmas[-1] == 0
        torch.testing.assert_close(sigmas, scheduler.sigmas, rtol=0, atol=1e-6)


def test_train_sigmas_are_the_fresh_schedulers(policy, paths):
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(paths["flux"] / "scheduler")
    torch.testing.assert_close(policy.train_sigmas(), scheduler.sigmas, rtol=0, atol=1e-6)


def test_decode_gives_images_in_unit_range(policy):
    images = policy.decode(torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)) * 3)
    assert images.shape == (2, 3, HEIGHT, WIDTH) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1


@pytest.mark.parametrize("embedded, true_cfg", [(3.5, 1.0), (5.0, 3.0)])
def test_ode_sampler_reproduces_the_flux_pipeline(policy, pipeline, embedded, true_cfg):
    """Our sampler + decode equals FluxPipeline.__call__ for the same noise: embedded guidance, and true CFG on top."""
    tuned = copy.copy(policy)
    tuned.guidance = embedded
    mine = ours(tuned, true_cfg)
    theirs = pipeline(PROMPTS, negative_prompt=NEGATIVE if true_cfg != 1.0 else None, true_cfg_scale=true_cfg,
                      guidance_scale=embedded, height=HEIGHT, width=WIDTH, num_inference_steps=4,
                      latents=noise(policy), output_type="pt").images  # fmt: skip
    assert mine.shape == theirs.shape == (2, 3, HEIGHT, WIDTH)
    assert (mine - mine[:1]).abs().max() > 1e-3  # the two prompts give different images
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_embedded_guidance_changes_the_velocity(policy):
    cond = policy.encode_prompts(PROMPTS)
    latents, sigma = torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)), torch.tensor([0.9, 0.4])
    other = copy.copy(policy)
    other.guidance = 1.0
    assert (policy.velocity(latents, sigma, cond) - other.velocity(latents, sigma, cond)).abs().max() > 1e-4


def test_ode_sampler_reproduces_the_kontext_pipeline(kontext, kontext_pipeline):
    """Sources 35x50 are floored to 32x48 and resized (Lanczos) as the pipeline resizes PIL images
    (`_auto_resize=False`: model.source_resize=false), encoded, appended and sliced off."""
    arrays = source_arrays(35, 50)
    processor = kontext_pipeline.image_processor
    for array in arrays:  # the pixels the pipeline encodes
        expected = processor.preprocess(processor.resize(Image.fromarray(array), 32, 48), 32, 48)[0]
        torch.testing.assert_close(kontext.source_pixels(as_tensor(array)), expected, rtol=0, atol=1e-6)
    cond = kontext.encode_prompts(PROMPTS, [[as_tensor(a)] for a in arrays])
    assert cond["source_latents"].shape == (2, 8 * 12, 16) and cond["source_ids"].shape == (2, 8 * 12, 3)
    assert cond["source_ids"][:, :, 0].eq(1).all() and cond["source_ids"][0, -1].tolist() == [1, 7, 11]
    mine = ours(kontext, sources=[[as_tensor(a)] for a in arrays])
    theirs = kontext_pipeline(image=[Image.fromarray(a) for a in arrays], prompt=PROMPTS, height=HEIGHT, width=WIDTH,
                              max_area=HEIGHT * WIDTH, _auto_resize=False, guidance_scale=2.5, num_inference_steps=4,
                              latents=noise(kontext), output_type="pt").images  # fmt: skip
    assert mine.shape == theirs.shape == (2, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    swapped = ours(kontext, sources=[[as_tensor(a)] for a in arrays[::-1]])
    assert (swapped - mine).abs().max() > 1e-3  # the sources condition the result


def test_kontext_auto_resize_matches_the_pipeline(kontext, kontext_pipeline, monkeypatch):
    """With model.source_resize the source goes to the preferred resolution nearest its aspect ratio. The released
    list is about 1 MP; both sides get the same small list here so that the tiny twin samples in a second."""
    small = [(24, 40), (32, 32), (40, 24)]  # (width, height) as PREFERRED_KONTEXT_RESOLUTIONS
    monkeypatch.setattr(pipeline_flux_kontext, "PREFERRED_KONTEXT_RESOLUTIONS", small)
    resizing = copy.copy(kontext)
    resizing.source_resolutions = small
    arrays = source_arrays(30, 50, seed=1)  # aspect 1.67: the 40x24 bucket
    assert resizing.source_pixels(as_tensor(arrays[0])).shape == (3, 24, 40)
    mine = ours(resizing, sources=[[as_tensor(a)] for a in arrays])
    theirs = kontext_pipeline(image=[Image.fromarray(a) for a in arrays], prompt=PROMPTS, height=HEIGHT, width=WIDTH,
                              max_area=HEIGHT * WIDTH, guidance_scale=2.5, num_inference_steps=4,
                              latents=noise(kontext), output_type="pt").images  # fmt: skip
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_kontext_preferred_resolutions_are_the_pipelines(kontext):
    policy = flux.FluxPolicy(kontext.transformer, None, None, None, None, edits=True,
                             source_resolutions=flux.kontext_resolutions())  # fmt: skip
    assert policy.source_resolutions == pipeline_flux_kontext.PREFERRED_KONTEXT_RESOLUTIONS
    wide = torch.rand(3, 480, 640)  # 4:3 -> 1184x880, the nearest aspect ratio of the released list
    assert policy.source_pixels(wide).shape == (3, 880, 1184)


def test_kontext_sources_must_fit(kontext):
    small, large = source_arrays(32, 48, 1)[0], source_arrays(40, 48, 1)[0]
    with pytest.raises(ValueError, match=r"must prepare to one size, got \[\(32, 48\), \(40, 48\)\].*--size WxH"):
        kontext.encode_prompts(PROMPTS, [[as_tensor(small)], [as_tensor(large)]])
    with pytest.raises(ValueError, match=r"one source image per prompt.*source counts \[1, 2\]"):
        kontext.encode_prompts(PROMPTS, [[as_tensor(small)], [as_tensor(small)] * 2])
    with pytest.raises(ValueError, match="source counts None"):
        kontext.encode_prompts(PROMPTS)
    multiple = kontext.vae_scale_factor * 2  # a source thinner than this floors to nothing
    with pytest.raises(ValueError, match=rf"is \({multiple - 1}, 48\) pixels .*at least {multiple} pixels per side"):
        kontext.encode_prompts(PROMPTS, [[as_tensor(small)], [as_tensor(small)[:, : multiple - 1]]])
    gray = as_tensor(small)[:1]  # a grayscale source becomes RGB, as PIL's convert("RGB")
    torch.testing.assert_close(kontext.source_pixels(gray), kontext.source_pixels(gray.expand(3, -1, -1)))


def test_bad_inputs_fail_clearly(policy, tmp_path):
    with pytest.raises(ValueError, match="model.path is required for model.arch=flux_kontext"):
        flux.load(ModelConfig(arch="flux_kontext"))
    with pytest.raises(FileNotFoundError, match="not a FluxPipeline folder: missing transformer/, vae/"):
        flux.load(ModelConfig(arch="flux", path=str(tmp_path / "nowhere")))
    for part in flux.PARTS[1:]:
        (tmp_path / part).mkdir()
    with pytest.raises(FileNotFoundError, match=r"missing transformer/\. Point model.path"):
        flux.load(ModelConfig(arch="flux", path=str(tmp_path)))
    (tmp_path / "transformer").mkdir()
    with pytest.raises(ValueError, match="model.text_tokens=600: the FLUX pipelines take 1 to 512"):
        flux.load(ModelConfig(arch="flux", path=str(tmp_path), text_tokens=600))
    with pytest.raises(ValueError, match="divisible by 4, got 30x48"):
        policy.latent_shape(30, 48)


# --------------------------------------------------------------------------- recipes

RECIPE_NAMES = [name for name in RECIPES if name.startswith("flux_")]  # FLUX.1 and Kontext; flux2_*: FLUX.2
EXPECTED = {"flowgrpo": "actor/clip_frac", "grpo_guard": "actor/clip_frac", "dppo": "actor/masked",
            "nft": "actor/nft/positive", "online_dpo": "actor/dpo/accuracy", "awm": "actor/clip_frac",
            "gardo": "gardo/gated", "tempflow": "actor/clip_frac", "branchgrpo": "actor/clip_frac"}  # fmt: skip


@pytest.fixture(scope="module")
def recipe_data(tmp_path_factory, paths):
    """OCR prompt parquets for FLUX.1-dev; an edit prompt .jsonl whose "sources" are PNG paths for Kontext."""
    root = tmp_path_factory.mktemp("flux_recipes")
    (root / "ocr").mkdir()
    (root / "ocr" / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (root / "ocr" / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(root / "ocr", root / "data")
    edits = root / "edit"
    edits.mkdir()
    lines = []
    for i, array in enumerate(source_arrays(32, 32, 3, seed=5)):
        Image.fromarray(array).save(edits / f"source_{i}.png")
        lines.append(json.dumps({"prompt": f'Make the sign say "{i}{i}"', "sources": [f"source_{i}.png"]}))
    (edits / "train.jsonl").write_text("\n".join(lines[:2]) + "\n")
    (edits / "test.jsonl").write_text(lines[2] + "\n")
    return {"flux": (root / "data" / "train.parquet", root / "data" / "test.parquet"),
            "flux_kontext": (edits / "train.jsonl", edits / "test.jsonl")}  # fmt: skip


@pytest.mark.parametrize("name", recipe_params(RECIPE_NAMES))
def test_flux_recipe_runs_two_steps(name, paths, recipe_data, tmp_path):
    """Each FLUX recipe, 2 steps on its tiny twin (on a GPU where there is one), scoring JPEG size: the training
    path is what this checks. Kontext reads its sources from the prompt file (source_resize off: 32x32)."""
    config = RECIPES[name]()
    arch = config.model.arch
    train, val = recipe_data[arch]
    pairs = config.algorithm.name == "online_dpo"
    small = [f"model.path={paths[arch]}", "model.dtype=float32", "model.text_tokens=32", "model.source_resize=false",
             f"data.prompts={train}", f"data.val_prompts={val}", "data.prompts_per_step=2", "rollout.n=2",
             "rollout.height=32", "rollout.width=32", "rollout.steps=4", "rollout.val_steps=4",
             "rollout.micro_batch_size=4", f"actor.micro_batch_size={2 if pairs else 4}", "actor.mini_batch_size=none",
             "model.lora.rank=4", "model.lora.alpha=8", "engine.activation_checkpointing=false",
             "engine.compile=false", "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2",
             "trainer.progress=false", "rollout.window_shift_every=1", f"trainer.output_dir={tmp_path}",
             'reward.weights={"jpeg_compressibility": 1}']  # fmt: skip
    if config.rollout.window_end is not None:
        small += ["rollout.window_end=3", f"rollout.window_size={min(config.rollout.window_size, 2)}"]
    if config.algorithm.name == "awm":
        small.append("algorithm.awm_timesteps=2")  # of the 3 steps after the first
    if config.algorithm.name == "gardo":  # JPEG size ranked against its opposite: the gate has samples to pick
        small += ['reward.weights={"jpeg_compressibility": 1, "jpeg_incompressibility": 0}', "reward.options={}",
                  'algorithm.gardo_auxiliary=["jpeg_incompressibility"]']  # fmt: skip
    if config.algorithm.name == "tempflow":  # one prompt's 2 trunks x 2 branches at steps 0 and 1: 8 images and rows
        small += ["data.prompts_per_step=1", "rollout.steps=3", "rollout.branches=2"]
    if config.algorithm.name == "branchgrpo":  # one prompt's tree split at steps 0 and 2 of 4: 4 leaves, 12 edges
        small += ["data.prompts_per_step=1", "rollout.n=1", "rollout.split_steps=[0,2]"]
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    assert EXPECTED[config.algorithm.name] in records[1], sorted(records[1])


def test_full_size_flux_has_the_released_parameter_counts():
    """`omnialign bench recipe`'s FLUX.1 builder on the meta device: the released transformer, CLIP-L, T5-XXL encoder
    and VAE parameter counts."""
    policy = full_flux(torch.device("meta"), 128, ModelConfig(arch="flux_kontext"))
    counts = [sum(p.numel() for p in m.parameters()) for m in (policy.transformer, *policy.text_encoders, policy.vae)]
    assert counts == [11_901_408_320, 123_060_480, 4_762_310_656, 83_819_683]
    assert policy.edits and policy.guidance == 2.5 and len(policy.blocks()) == 57
    # MFU's FLUX shape: 57 blocks; 512x512 gives 1024 tokens, and a 512x512 source 4096 more resized to 1024x1024
    assert flux_layers_and_tokens(policy, 512, 512) == (57, 1024 + 4096)
    policy.source_resolutions = None  # model.source_resize=false: the source keeps its size
    assert flux_layers_and_tokens(policy, 512, 512) == (57, 1024 + 1024)


def test_bench_recipe_tiny_rows_for_kontext(tmp_path):
    """`omnialign bench recipe --tiny` on a Kontext recipe: the bench's edit prompts carry sources; MFU counts them.
    `--profile` runs the step under the profiler: its trace and its kernels' summary show the trainer's phases."""
    out = tmp_path / "kontext.json"
    cli(["bench", "recipe", "--tiny", "--recipe", "flux_kontext_edit_flowgrpo_lora", "--prompts", "2", "--steps", "1",
         "--work", str(tmp_path / "work"), "--out", str(out), "--set", "engine.compile=false",
         "--profile", str(tmp_path / "profile")])  # fmt: skip
    (row,) = json.loads(out.read_text())["rows"]
    assert row["recipe"] == "flux_kontext_edit_flowgrpo_lora" and row["images"] == 8 and row["images_per_gpu_s"] > 0
    assert row["rollout_s"] > 0 and row["update_s"] > 0
    assert row["profiled"] and 0 < row["busy_share"] <= 1
    trace = json.loads(gzip.decompress((tmp_path / "profile" / "trace.json.gz").read_bytes()))
    phases = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("phase/")}
    assert {"phase/rollout", "phase/update"} <= phases
    kernels = json.loads((tmp_path / "profile" / "kernels.json").read_text())
    assert kernels["kinds"]["matmul"]["ms"] > 0 and kernels["phases"]["update"]["kinds"]["matmul"]["ms"] > 0
    assert list(kernels["phases"])[0] == "rollout"


def test_judge_knows_a_flux_pipeline_folder(paths):
    from omnialign.judge import detect_arch

    assert detect_arch(paths["flux"]) == "flux"
    with pytest.raises(ValueError, match="holds a FluxKontextPipeline; judge reads"):
        detect_arch(paths["flux_kontext"])  # an editing model needs source images, which judge does not give


def test_dense_attention_grads_hands_the_attention_kernel_a_dense_gradient_in_a_single_block(monkeypatch):
    """FLUX's single blocks concatenate the attention output with the MLP's, so the gradient reaching SDPA is a slice
    of a wider row, which cuDNN's backward fails on (engine.fsdp.dense_attention_grads); with the hooks it is dense,
    in the output's own layout, and the block's gradients are unchanged."""
    torch.manual_seed(0)
    block = FluxSingleTransformerBlock(dim=32, num_attention_heads=2, attention_head_dim=16)
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        out = sdpa(*args, **kwargs)
        out.register_hook(lambda grad: seen.append((grad.stride(), out.stride())))
        return out

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    inputs = (torch.randn(2, 6, 32), torch.randn(2, 4, 32), torch.randn(2, 32))
    reference = torch.autograd.grad(sum(t.square().sum() for t in block(*inputs)), list(block.parameters()))
    assert seen[-1][0] != seen[-1][1]  # the slice of the concatenation's gradient
    dense_attention_grads(block)
    grads = torch.autograd.grad(sum(t.square().sum() for t in block(*inputs)), list(block.parameters()))
    assert seen[-1][0] == seen[-1][1]
    assert all(torch.equal(a, b) for a, b in zip(grads, reference))


def test_importing_the_models_leaves_the_kontext_pipeline_unloaded():
    """Its module imports transformers' image processors, which warn on every run without torchvision (`omnialign
    train glyphs` printed two such lines); `flux.kontext_resolutions` imports it when a Kontext source is resized."""
    code = "import sys, omnialign.models; print('diffusers.pipelines.flux.pipeline_flux_kontext' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False" and "torchvision" not in done.stderr, done.stderr
