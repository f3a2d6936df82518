"""The Z-Image adapter on a tiny random pipeline: loading, prompt encoding and the schedule against the pipeline's
own, our rollout-level ODE sampling (with and without CFG) equal to diffusers' `ZImagePipeline` on the same seeds,
two training steps of the base recipe, a variant and a Z-Image-Turbo recipe, the full-size builder's sizes."""

import copy
import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline
from diffusers.pipelines.z_image.pipeline_z_image import calculate_shift
from peft import LoraConfig, get_peft_model

from omnialign.bench.models import full_zimage, zimage_flops, zimage_tokens
from omnialign.config import ModelConfig, apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.metrics import read_metrics
from omnialign.models import LOADERS, tiny, zimage
from omnialign.recipes import RECIPES
from omnialign.train import main

# captions of one and two multiples of 32 tokens (the negative's: two): the transformer pads a batch's sequences to
# the longest and masks the rest
PROMPTS = ["a red cat", 'a shop sign that says "OPEN" in the rain, photo, at night, with neon lights and people']
NEGATIVE = ["blurry, low quality"] * 2
HEIGHT, WIDTH = 32, 48  # tiny VAE factor 2, 2x2 patches: an 8x12 token grid
SEEDS = (11, 12)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny.zimage(tmp_path_factory.mktemp("zimage") / "base")


@pytest.fixture(scope="module")
def policy(path):
    return LOADERS["zimage"](ModelConfig(arch="zimage", path=str(path)))


@pytest.fixture(scope="module")
def pipeline(policy):
    """The real pipeline over the policy's own components (what from_pretrained on the folder would assemble)."""
    pipe = ZImagePipeline(scheduler=copy.deepcopy(policy.scheduler), vae=policy.vae, text_encoder=policy.text_encoder,
                          tokenizer=policy.tokenizer, transformer=policy.transformer)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    return pipe


def ours(policy, guidance: float = 1.0, steps: int = 4) -> torch.Tensor:
    """Our rollout-level ODE sampling (sampling.sample on policy.velocity and policy.schedule) and decode."""
    generators = [torch.Generator().manual_seed(s) for s in SEEDS]
    cond = policy.encode_prompts(PROMPTS)
    uncond = policy.encode_prompts(NEGATIVE) if guidance != 1.0 else None
    out = sample(policy.velocity, generators, policy.latent_shape(HEIGHT, WIDTH), policy.schedule(steps, HEIGHT, WIDTH),
                 cond, uncond, guidance=guidance, window=0)  # fmt: skip
    return policy.decode(out.final)


def test_loads_by_path_with_frozen_encoders_and_lora_targets(policy):
    assert not any(p.requires_grad for m in (policy.text_encoder, policy.vae) for p in m.parameters())
    assert not policy.text_encoder.training and not policy.vae.training
    assert all(p.requires_grad for p in policy.transformer.parameters())
    assert type(policy.text_encoder).__name__ == "Qwen3Model" and not policy.edits
    assert len(policy.blocks()) == 4  # a noise refiner, a context refiner, 2 layers
    lora = get_peft_model(copy.deepcopy(policy.transformer), LoraConfig(r=2, target_modules=policy.lora_targets))
    names = [name for name, _ in lora.named_modules() if name.endswith("lora_A")]
    assert len(names) == 7 * 4 and sum(".noise_refiner." in n or ".context_refiner." in n for n in names) == 14


def test_encode_prompts_match_the_pipeline(policy, pipeline):
    """The pipeline's list of variable-length captions is our padded embeds' masked rows, at its default length and
    truncated to a short one; what lies past a caption is zero."""
    cond = policy.encode_prompts(PROMPTS)
    assert cond["embeds"].shape == (2, zimage.MAX_SEQUENCE_LENGTH, 16) and cond["mask"].dtype == torch.bool
    text = policy.tokenizer.decode(policy.tokenize(PROMPTS[:1]).input_ids[0][: int(cond["mask"][0].sum())])
    assert text == "<|im_start|>user\na red cat<|im_end|>\n<|im_start|>assistant\n"  # Qwen3's, thinking enabled
    short = copy.copy(policy)
    short.max_sequence_length = 24
    with torch.no_grad():  # as the pipeline's __call__ (it rewrites the prompt list it is given: pass copies)
        theirs = pipeline.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False)[0]
        truncated = pipeline.encode_prompt(list(PROMPTS), do_classifier_free_guidance=False, max_sequence_length=24)[0]
    for mine, expected in ((cond, theirs), (short.encode_prompts(PROMPTS), truncated)):
        lengths = mine["mask"].sum(1).tolist()
        assert lengths == [len(e) for e in expected] and lengths[0] < lengths[1]
        for embeds, mask, caption in zip(mine["embeds"], mine["mask"], expected):
            torch.testing.assert_close(embeds[mask], caption)
            assert not embeds[~mask].any()
    assert len(truncated[1]) == 24


@pytest.mark.parametrize("scheduler", [tiny.ZIMAGE_SCHEDULER, tiny.ZIMAGE_TURBO_SCHEDULER,
                                       dict(use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15)])  # fmt: skip
def test_schedule_matches_the_scheduler(policy, scheduler):
    """The pipeline's sigmas (linspace(1, 1/N, N), mu from the image tokens) through each scheduler config."""
    reference = FlowMatchEulerDiscreteScheduler(**scheduler)
    mine = copy.copy(policy)
    mine.scheduler = reference
    for size, steps in (((HEIGHT, WIDTH), 4), ((1024, 768), 8), ((512, 512), 50)):
        _, h, w = mine.latent_shape(*size)
        c = reference.config
        mu = calculate_shift(h // 2 * (w // 2), c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift)
        reference.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps).tolist(), mu=mu)
        sigmas = mine.schedule(steps, *size)
        assert sigmas.dtype == torch.float32 and sigmas.shape == (steps + 1,) and sigmas[-1] == 0
        torch.testing.assert_close(sigmas, reference.sigmas, rtol=0, atol=1e-6)
    torch.testing.assert_close(mine.train_sigmas(), FlowMatchEulerDiscreteScheduler(**scheduler).sigmas, rtol=0,
                               atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("guidance_scale", [0.0, 4.0])
def test_ode_sampler_reproduces_the_zimage_pipeline(policy, pipeline, guidance_scale):
    """Our sampler + decode equals ZImagePipeline.__call__ for the same noise: no CFG (Turbo's guidance_scale 0) and
    the pipeline's CFG pos + g (pos - neg), our rollout.guidance 1 + g."""
    mine = ours(policy, 1 + guidance_scale)
    noise = per_sample_noise([torch.Generator().manual_seed(s) for s in SEEDS], policy.latent_shape(HEIGHT, WIDTH))
    theirs = pipeline(list(PROMPTS), negative_prompt=list(NEGATIVE), guidance_scale=guidance_scale, height=HEIGHT,
                      width=WIDTH, num_inference_steps=4, latents=noise, output_type="pt").images  # fmt: skip
    assert mine.shape == theirs.shape == (2, 3, HEIGHT, WIDTH)
    assert (mine - mine[:1]).abs().max() > 1e-3  # the two prompts give different images
    torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
    if guidance_scale:
        assert (mine - ours(policy)).abs().max() > 1e-3  # the guidance acts


def test_bad_inputs_fail_clearly(policy, tmp_path):
    with pytest.raises(ValueError, match="model.path is required for model.arch=zimage"):
        zimage.load(ModelConfig(arch="zimage"))
    for part in zimage.PARTS[1:]:
        (tmp_path / part).mkdir()
    with pytest.raises(FileNotFoundError, match=r"not a ZImagePipeline folder: missing transformer/\. .*Z-Image-Turbo"):
        zimage.load(ModelConfig(arch="zimage", path=str(tmp_path)))
    (tmp_path / "transformer").mkdir()
    with pytest.raises(ValueError, match="model.text_tokens=8: Z-Image's chat template alone takes 8 tokens"):
        zimage.load(ModelConfig(arch="zimage", path=str(tmp_path), text_tokens=8))
    with pytest.raises(ValueError, match="divisible by 4, got 30x48"):
        policy.latent_shape(30, 48)


# --------------------------------------------------------------------------- recipes

EXPECTED = {"flowgrpo": "actor/clip_frac", "nft": "actor/nft/positive", "awm": "actor/clip_frac"}


@pytest.fixture(scope="module")
def ocr(tmp_path_factory):
    root = tmp_path_factory.mktemp("zimage_ocr")
    (root / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (root / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(root, root / "data")
    return root / "data" / "train.parquet", root / "data" / "test.parquet"


@pytest.mark.parametrize("name", ["zimage_ocr_flowgrpo_lora", "zimage_ocr_nft_lora", "zimage_turbo_ocr_awm_lora"])
def test_zimage_recipe_runs_two_steps(name, path, ocr, tmp_path):
    """The base recipe (SDE window, CFG), a variant (NFT: ODE rollouts with CFG, the old adapter) and a Turbo recipe
    (AWM: the 8-step ODE without CFG) two steps on the tiny twin, scoring JPEG size: the training path is what this
    checks. The other recipes validate (tests/test_config.py)."""
    config = RECIPES[name]()
    small = [f"model.path={path}", "model.dtype=float32", "model.text_tokens=32", f"data.prompts={ocr[0]}",
             f"data.val_prompts={ocr[1]}", "data.prompts_per_step=2", "rollout.n=2", "rollout.height=32",
             "rollout.width=32", "rollout.steps=4", "rollout.val_steps=2", "rollout.micro_batch_size=4",
             "actor.micro_batch_size=4", "actor.mini_batch_size=none", "model.lora.rank=4", "model.lora.alpha=8",
             "engine.activation_checkpointing=false", "trainer.total_steps=2", "trainer.val_every=2",
             "trainer.save_every=2", "trainer.progress=false", f"trainer.output_dir={tmp_path}",
             'reward.weights={"jpeg_compressibility": 1}', "algorithm.awm_timesteps=2"]  # fmt: skip
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    assert EXPECTED[config.algorithm.name] in records[1], sorted(records[1])


def test_turbo_recipes_sample_the_distilled_steps_without_cfg():
    for name in ("zimage_turbo_ocr_nft_lora", "zimage_turbo_ocr_awm_lora"):
        config = validate(RECIPES[name]())
        assert config.model.path.endswith("Z-Image-Turbo") and config.rollout.guidance == 1.0
        assert config.rollout.steps == 8 and config.rollout.window_size == 0
    assert RECIPES["zimage_ocr_flowgrpo_lora"]().rollout.guidance == 5.0  # the pipeline's guidance_scale 4


def test_full_size_zimage_has_the_released_parameter_counts():
    """`omnialign bench recipe`'s Z-Image builder on the meta device: the released transformer (6.15 B), Qwen3-4B as
    `Qwen3Model` and FLUX.1's VAE; MFU's tokens at 512x512 (1024 image patches, a caption padded to 32)."""
    policy = full_zimage(torch.device("meta"), 128, ModelConfig(arch="zimage", path="models/Z-Image-Turbo"))
    counts = [sum(p.numel() for p in m.parameters()) for m in (policy.transformer, policy.text_encoder, policy.vae)]
    assert counts == [6_154_908_736, 4_022_468_096, 83_819_683]
    assert len(policy.blocks()) == 34 and policy.scheduler.config.shift == 3.0
    image, caption = zimage_tokens(policy, 512, 512, ['A storefront sign that says "OPEN"'])
    assert (image, caption) == (1024, 32)
    dense = 24 * 3840**2 * (30 * (1024 + 32) + 2 * 1024 + 2 * 32)
    assert zimage_flops(policy, image, caption) == dense + 4 * 3840 * (30 * 1056**2 + 2 * 1024**2 + 2 * 32**2)
    with pytest.raises(ValueError, match="model.path='models/zimage': .*one of \\['Z-Image', 'Z-Image-Turbo'\\]"):
        full_zimage(torch.device("meta"), 128, ModelConfig(arch="zimage", path="models/zimage"))


def test_judge_knows_a_zimage_pipeline_folder(path):
    from omnialign.judge import detect_arch

    assert detect_arch(path) == "zimage"
