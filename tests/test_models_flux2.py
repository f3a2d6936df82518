"""The FLUX.2 adapter (FLUX.2-dev and FLUX.2-klein) on tiny random pipelines: loading, encoding, the schedule,
equivalence of our rollout-level ODE sampling with diffusers' own `Flux2Pipeline` and `Flux2KleinPipeline`, the base
recipe and one variant of each running two training steps on its tiny twin, the other recipes validating."""

import copy
import inspect
import json
import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu
from peft import LoraConfig, get_peft_model

from omnialign.bench.models import flux2_flops, full_flux2
from omnialign.config import ModelConfig, RolloutConfig, apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.metrics import read_metrics
from omnialign.models import LOADERS, flux2, tiny
from omnialign.recipes import RECIPES
from omnialign.rollout.diffusion import step_guidance
from omnialign.train import main

PROMPTS = ["a red cat", 'a shop sign that says "OPEN" in the rain, photo']
HEIGHT, WIDTH = 32, 48  # tiny VAE factor 2, 2x2 packing: an 8x12 token grid
SEEDS = (11, 12)
TOKENS = 48  # the text length of the tests (the pipelines' default is 512)
ARCHS = ("flux2", "flux2_klein")
PIPELINES = {"flux2": Flux2Pipeline, "flux2_klein": Flux2KleinPipeline}


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    """The tiny twins; klein's is a base model (`is_distilled` false) so that its pipeline runs true CFG."""
    root = tmp_path_factory.mktemp("flux2")
    return {"flux2": tiny.flux2(root / "dev"), "flux2_klein": tiny.flux2_klein(root / "klein", distilled=False)}


@pytest.fixture(scope="module")
def policies(paths):
    return {arch: LOADERS[arch](ModelConfig(arch=arch, path=str(paths[arch]))) for arch in ARCHS}


@pytest.fixture(scope="module")
def pipelines(paths):
    out = {arch: PIPELINES[arch].from_pretrained(paths[arch]) for arch in ARCHS}
    for pipe in out.values():
        pipe.set_progress_bar_config(disable=True)
    return out


def short(policy: flux2.Flux2Policy, length: int = TOKENS) -> flux2.Flux2Policy:
    out = copy.copy(policy)
    out.max_sequence_length = length
    return out


def ours(policy, guidance: float = 1.0, steps: int = 4) -> torch.Tensor:
    """Our rollout-level ODE sampling (sampling.sample on policy.velocity and policy.schedule) and decode; CFG against
    the empty prompt, as Flux2KleinPipeline."""
    generators = [torch.Generator().manual_seed(s) for s in SEEDS]
    cond = policy.encode_prompts(PROMPTS)
    uncond = policy.encode_prompts([""] * len(PROMPTS)) if guidance != 1.0 else None
    shape = policy.latent_shape(HEIGHT, WIDTH)
    out = sample(policy.velocity, generators, shape, policy.schedule(steps, HEIGHT, WIDTH), cond, uncond,
                 guidance=guidance, window=0)  # fmt: skip
    return policy.decode(out.final)


def noise(policy) -> torch.Tensor:
    """The same seeds' initial noise as the pipelines take `latents`: (B, channels, H/4, W/4) before packing."""
    shape = policy.latent_shape(HEIGHT, WIDTH)
    return per_sample_noise([torch.Generator().manual_seed(s) for s in SEEDS], shape).permute(0, 3, 1, 2)


def test_loads_by_path_with_frozen_encoders_and_lora_targets(policies):
    dev, klein = policies["flux2"], policies["flux2_klein"]
    for policy, layers in ((dev, 31), (klein, 28)):  # the decoder up to the last layer read: 30 of 32, 27 of 29
        assert not any(p.requires_grad for m in (policy.text_encoder, policy.vae) for p in m.parameters())
        assert not policy.text_encoder.training and not policy.vae.training
        assert all(p.requires_grad for p in policy.transformer.parameters())
        assert len(policy.blocks()) == 4 and not policy.edits  # 2 double-stream + 2 single-stream blocks
        assert len(policy.text_encoder.layers) == layers and not hasattr(policy.text_encoder, "lm_head")
    assert dev.transformer.config.guidance_embeds and not klein.transformer.config.guidance_embeds
    assert dev.guidance == 4.0 and (dev.layers, klein.layers) == ((10, 20, 30), (9, 18, 27))
    lora = get_peft_model(copy.deepcopy(dev.transformer), LoraConfig(r=2, target_modules=dev.lora_targets))
    names = [name for name, _ in lora.named_modules() if name.endswith("lora_A")]
    assert sum(n.endswith("attn.to_qkv_mlp_proj.lora_A") for n in names) == 2  # one per single-stream block
    assert len(names) == 12 * 2 + 2  # 12 projections per double-stream block


@pytest.mark.parametrize("arch", ARCHS)
def test_encode_prompts_match_the_pipeline(arch, policies, pipelines):
    """At the tests' 48 tokens and at 7 (the prompt truncated inside the chat template); the default length is the
    pipelines' 512."""
    policy, pipe = policies[arch], pipelines[arch]
    default = inspect.signature(pipe.encode_prompt).parameters["max_sequence_length"].default
    assert policy.max_sequence_length == flux2.MAX_SEQUENCE_LENGTH == default
    for length in (TOKENS, 7):
        cond = short(policy, length).encode_prompts(PROMPTS)
        assert cond.batch_size == torch.Size([2]) and cond["embeds"].shape == (2, length, 48)
        with torch.no_grad():
            embeds, text_ids = pipe.encode_prompt(PROMPTS, max_sequence_length=length)
        torch.testing.assert_close(cond["embeds"], embeds, rtol=0, atol=0)
        assert text_ids[0, -1].tolist() == [0, 0, 0, length - 1]
        assert length == 7 or (cond["embeds"][0] - cond["embeds"][1]).abs().max() > 1e-3  # 7: dev's system turn


@pytest.mark.parametrize("size", [(HEIGHT, WIDTH), (512, 512), (1024, 768), (1536, 1536)])
def test_schedule_matches_the_scheduler(policies, paths, size):
    """The pipelines' sigmas: the empirical mu of the token count and steps (its plain fit past 4300 tokens)."""
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(paths["flux2"] / "scheduler")
    policy = policies["flux2"]
    tokens = policy.latent_shape(*size)[0] * policy.latent_shape(*size)[1]
    for steps in (4, 28):
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=compute_empirical_mu(tokens, steps))
        sigmas = policy.schedule(steps, *size)
        assert sigmas.dtype == torch.float32 and sigmas.shape == (steps + 1,) and sigmas[-1] == 0
        torch.testing.assert_close(sigmas, scheduler.sigmas, rtol=0, atol=1e-6)
    torch.testing.assert_close(policy.train_sigmas(), FlowMatchEulerDiscreteScheduler.from_pretrained(
        paths["flux2"] / "scheduler").sigmas, rtol=0, atol=1e-6)  # fmt: skip


def test_decode_gives_images_in_unit_range(policies):
    policy = policies["flux2_klein"]
    images = policy.decode(torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)) * 3)
    assert images.shape == (2, 3, HEIGHT, WIDTH) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1


@pytest.mark.parametrize("arch, guidance", [("flux2", 2.5), ("flux2_klein", 1.0), ("flux2_klein", 4.0)])
def test_ode_sampler_reproduces_the_pipeline(arch, guidance, policies, pipelines):
    """Our sampler + decode equals the pipeline's __call__ for the same noise: FLUX.2-dev's embedded guidance (not its
    default 4.0: the value reaches the transformer), and FLUX.2-klein without CFG (the distilled kleins' step) and with
    true CFG against the empty prompt (a base model: `is_distilled` false)."""
    policy = short(policies[arch])
    if arch == "flux2":
        policy.guidance = guidance
    mine = ours(policy, 1.0 if arch == "flux2" else guidance)
    theirs = pipelines[arch](prompt=PROMPTS, height=HEIGHT, width=WIDTH, num_inference_steps=4, guidance_scale=guidance,
                             latents=noise(policy), max_sequence_length=TOKENS, output_type="pt").images  # fmt: skip
    assert mine.shape == theirs.shape == (2, 3, HEIGHT, WIDTH)
    assert (mine - mine[:1]).abs().max() > 1e-3  # the two prompts give different images
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_embedded_guidance_changes_the_velocity(policies):
    policy = short(policies["flux2"], 8)
    cond = policy.encode_prompts(PROMPTS)
    latents, sigma = torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)), torch.tensor([0.9, 0.4])
    other = copy.copy(policy)
    other.guidance = 1.0
    assert (policy.velocity(latents, sigma, cond) - other.velocity(latents, sigma, cond)).abs().max() > 1e-4


def test_bad_inputs_fail_clearly(policies, paths, tmp_path):
    with pytest.raises(ValueError, match="model.path is required for model.arch=flux2_klein"):
        flux2.load(ModelConfig(arch="flux2_klein"))
    with pytest.raises(FileNotFoundError, match="not a Flux2Pipeline folder: missing transformer/, vae/.*FLUX.2-dev"):
        flux2.load(ModelConfig(arch="flux2", path=str(tmp_path / "nowhere")))
    with pytest.raises(ValueError, match="holds a Flux2KleinPipeline, not the Flux2Pipeline.*set model.arch=flux2_kl"):
        flux2.load(ModelConfig(arch="flux2", path=str(paths["flux2_klein"])))
    with pytest.raises(ValueError, match="model.embedded_guidance=3.0: FLUX.2-klein-4B's transformer has no guidance"):
        flux2.load(ModelConfig(arch="flux2_klein", path=str(paths["flux2_klein"]), embedded_guidance=3.0))
    with pytest.raises(ValueError, match="divisible by 4, got 30x48"):
        policies["flux2"].latent_shape(30, 48)
    with pytest.raises(ValueError, match="read hidden state 30 of the text encoder, which has only 2 layers"):
        flux2.decoder_layers(tiny.Qwen3ForCausalLM(tiny.Qwen3Config(**tiny.qwen3_sizes(16, 2))), 30)


def test_a_step_distilled_klein_refuses_cfg(policies, paths, tmp_path):
    """The distilled kleins' pipeline ignores guidance_scale (`is_distilled` in model_index.json): a rollout with CFG
    on one is refused, naming the fix; a base klein (the twin) takes CFG."""
    for part in paths["flux2_klein"].iterdir():
        if part.name != "model_index.json":
            (tmp_path / part.name).symlink_to(part)
    index = json.loads((paths["flux2_klein"] / "model_index.json").read_text())
    (tmp_path / "model_index.json").write_text(json.dumps({**index, "is_distilled": True}))
    distilled = flux2.load(ModelConfig(arch="flux2_klein", path=str(tmp_path), transformer_only=True))
    assert distilled.distilled and not policies["flux2_klein"].distilled
    sigma = torch.tensor([0.9, 0.4])
    with pytest.raises(
        ValueError, match=r"rollout.guidance=4.0: this FLUX.2-klein is step-distilled .*set rollout.guidance=1"
    ):
        step_guidance(distilled, sigma, RolloutConfig(guidance=4.0))
    assert step_guidance(distilled, sigma, RolloutConfig(guidance=1.0)) == 1.0
    assert step_guidance(policies["flux2_klein"], sigma, RolloutConfig(guidance=4.0)) == 4.0


# --------------------------------------------------------------------------- recipes

NAMES = [name for name in RECIPES if name.startswith("flux2")]
TRAINED = ("flux2_ocr_flowgrpo_lora", "flux2_ocr_nft_lora", "flux2_klein_ocr_flowgrpo_lora",
           "flux2_klein_ocr_online_dpo_lora")  # fmt: skip
EXPECTED = {"flowgrpo": "actor/clip_frac", "nft": "actor/nft/positive", "online_dpo": "actor/dpo/accuracy"}


@pytest.fixture(scope="module")
def ocr_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("flux2_recipes")
    (root / "ocr").mkdir()
    (root / "ocr" / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (root / "ocr" / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(root / "ocr", root / "data")
    return root / "data" / "train.parquet", root / "data" / "test.parquet"


def small(name: str, path, data, out) -> list[str]:
    """Overrides that run a FLUX.2 recipe on its tiny twin in seconds, scoring JPEG size."""
    config = RECIPES[name]()
    pairs = config.algorithm.name == "online_dpo"
    overrides = [f"model.path={path}", "model.dtype=float32", f"model.text_tokens={TOKENS}",
                 f"data.prompts={data[0]}", f"data.val_prompts={data[1]}", "data.prompts_per_step=2", "rollout.n=2",
                 "rollout.height=32", "rollout.width=32", "rollout.steps=4", "rollout.val_steps=4",
                 "rollout.micro_batch_size=4", f"actor.micro_batch_size={2 if pairs else 4}",
                 "actor.mini_batch_size=none", "model.lora.rank=4", "model.lora.alpha=8",
                 "engine.activation_checkpointing=false", "engine.compile=false", "trainer.total_steps=2",
                 "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false", f"trainer.output_dir={out}",
                 "trainer.loggers=[]", 'reward.weights={"jpeg_compressibility": 1}']  # fmt: skip
    if config.algorithm.name == "nft":
        overrides.append("algorithm.nft_timesteps=2")
    return overrides


@pytest.mark.parametrize("name", TRAINED)
def test_flux2_recipe_runs_two_steps(name, paths, ocr_data, tmp_path):
    """The base recipe and one variant of FLUX.2-dev and FLUX.2-klein, 2 steps on the tiny twin (on a GPU where there
    is one): the training path is what this checks."""
    config = RECIPES[name]()
    main(validate(apply_overrides(config, small(name, paths[config.model.arch], ocr_data, tmp_path))))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    assert EXPECTED[config.algorithm.name] in records[1], sorted(records[1])


def test_every_flux2_recipe_validates_at_its_own_and_tiny_sizes(paths, ocr_data, tmp_path):
    assert len(NAMES) == 10 and set(TRAINED) < set(NAMES)
    for name in NAMES:
        config = validate(RECIPES[name]())
        arch = config.model.arch
        assert arch == name.split("_ocr_")[0] and config.name == config.recipe == name
        assert config.rollout.guidance == 1.0 and config.model.text_tokens == flux2.MAX_SEQUENCE_LENGTH
        assert config.model.path == ("models/FLUX.2-dev" if arch == "flux2" else "models/FLUX.2-klein-4B")
        validate(apply_overrides(RECIPES[name](), small(name, paths[arch], ocr_data, tmp_path)))


# --------------------------------------------------------------------------- full size


@pytest.mark.parametrize("arch, path, counts", [
    ("flux2", "models/FLUX.2-dev", (32_223_281_152, 17_899_514_880)),
    ("flux2_klein", "models/FLUX.2-klein-4B", (3_875_544_576, 3_215_021_568)),
    ("flux2_klein", "models/FLUX.2-klein-base-9B", (9_078_581_248, 6_024_834_048)),
])  # fmt: skip
def test_full_size_flux2_has_the_released_sizes(arch, path, counts):
    """`omnialign bench recipe`'s FLUX.2 builder on the meta device: the released transformer's parameters and the
    text encoder's up to the last layer the pipeline reads (Mistral Small 3.1's 30 of 40, Qwen3-4B's and Qwen3-8B's
    27 of 36), and the MFU's forward FLOPs: 26 d^2 per token and block (13 d^2 weights each), 4 N d per token and
    block in attention."""
    policy = full_flux2(torch.device("meta"), 512, ModelConfig(arch=arch, path=path))
    transformer, encoder = (sum(p.numel() for p in m.parameters()) for m in (policy.transformer, policy.text_encoder))
    assert (transformer, encoder) == counts
    c = policy.transformer.config
    dim, layers = c.num_attention_heads * c.attention_head_dim, c.num_layers + c.num_single_layers
    assert len(policy.blocks()) == layers and policy.klein == (arch == "flux2_klein")
    tokens = 1024 + 512  # 512x512 and the recipes' 512 text tokens
    assert flux2_flops(policy, 512, 512, 512) == 26 * layers * dim**2 * tokens + 4 * layers * dim * tokens**2
    double = policy.transformer.transformer_blocks[0]
    assert sum(p.numel() for p in double.parameters()) == 2 * 13 * dim**2 + 4 * c.attention_head_dim  # + QK norms


def test_judge_knows_the_flux2_pipeline_folders(paths):
    from omnialign.judge import detect_arch

    assert detect_arch(paths["flux2"]) == "flux2" and detect_arch(paths["flux2_klein"]) == "flux2_klein"
    assert json.loads((paths["flux2_klein"] / "model_index.json").read_text())["is_distilled"] is False
