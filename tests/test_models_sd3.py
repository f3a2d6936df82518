"""The SD3 adapter on a tiny random pipeline: loading, encoding, schedule, and equivalence with
diffusers' own `StableDiffusion3Pipeline`."""

import copy

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline
from peft import LoraConfig, get_peft_model

from omnialign.config import ModelConfig
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.models import LOADERS, sd3, tiny

PROMPTS = ["a red cat", 'a shop sign that says "OPEN" in the rain, photo']
HEIGHT, WIDTH = 32, 48  # tiny VAE factor 2, patch 2


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny.sd3(tmp_path_factory.mktemp("sd3"))


@pytest.fixture(scope="module")
def policy(path):
    return LOADERS["sd3"](ModelConfig(arch="sd3", path=str(path)))


@pytest.fixture(scope="module")
def pipeline(path):
    pipe = StableDiffusion3Pipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_loads_by_path_with_frozen_encoders_and_lora_targets(policy):
    frozen = [policy.vae, *policy.text_encoders]
    assert not any(p.requires_grad for m in frozen for p in m.parameters()) and not any(m.training for m in frozen)
    assert all(p.requires_grad for p in policy.transformer.parameters())
    assert policy.shift == 3.0
    assert len(policy.blocks()) == 2
    lora = get_peft_model(copy.deepcopy(policy.transformer), LoraConfig(r=2, target_modules=policy.lora_targets))
    assert sum(name.endswith("lora_A") for name, _ in lora.named_modules()) == 8 + 7  # the last block has no to_add_out


def test_encode_prompts_match_the_pipeline(policy, pipeline):
    cond = policy.encode_prompts(PROMPTS)
    assert cond.batch_size == torch.Size([2])
    assert cond["embeds"].shape == (2, 77 + sd3.MAX_SEQUENCE_LENGTH, 96) and cond["pooled"].shape == (2, 80)
    embeds, _, pooled, _ = pipeline.encode_prompt(PROMPTS, None, None, do_classifier_free_guidance=False)
    torch.testing.assert_close(cond["embeds"], embeds)
    torch.testing.assert_close(cond["pooled"], pooled)
    assert torch.cat([cond, policy.encode_prompts(["", ""])]).shape == (4,)  # fixed lengths: CFG concatenates


def test_velocity_matches_the_pipelines_transformer_call(policy, pipeline):
    cond = policy.encode_prompts(PROMPTS)
    shape = policy.latent_shape(HEIGHT, WIDTH)
    assert shape == (4, 16, 24)
    latents, sigma = torch.randn(2, *shape), torch.tensor([0.93, 0.41])
    v = policy.velocity(latents, sigma, cond)
    assert v.shape == latents.shape
    embeds, _, pooled, _ = pipeline.encode_prompt(PROMPTS, None, None, do_classifier_free_guidance=False)
    with torch.no_grad():
        expected = pipeline.transformer(
            hidden_states=latents,
            timestep=sigma * 1000,
            encoder_hidden_states=embeds,
            pooled_projections=pooled,
            return_dict=False,
        )[0]
    torch.testing.assert_close(v.detach(), expected, rtol=1e-5, atol=1e-5)


def test_schedule_matches_the_scheduler_without_explicit_sigmas(policy, path):
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path / "scheduler")
    for steps in (4, 10):
        scheduler.set_timesteps(num_inference_steps=steps)  # what StableDiffusion3Pipeline does by default
        sigmas = policy.schedule(steps, HEIGHT, WIDTH)
        assert sigmas.dtype == torch.float32 and sigmas.shape == (steps + 1,)
        torch.testing.assert_close(sigmas, scheduler.sigmas, rtol=0, atol=1e-6)
    # the last nonzero sigma of 10 steps: shift 3 applied to linspace(1, 3e-3/1.002, 10)[-1], not to 1/10
    assert policy.schedule(10, HEIGHT, WIDTH)[-2].item() == pytest.approx(0.008929, abs=1e-6)
    override = sd3.load(ModelConfig(arch="sd3", path=str(path), shift=1.0))  # linspace(1, 1/1000, 4), unshifted
    torch.testing.assert_close(override.schedule(4, HEIGHT, WIDTH), torch.tensor([1.0, 0.667, 0.334, 0.001, 0.0]))


def test_train_sigmas_are_the_fresh_schedulers(policy, path):
    """The static shift applies at construction: the table Diffusion-DPO draws from is shifted(k/1000)."""
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path / "scheduler")
    torch.testing.assert_close(policy.train_sigmas(), scheduler.sigmas, rtol=0, atol=1e-6)
    assert policy.train_sigmas()[500].item() == pytest.approx(0.75)  # k = 500: 3 * .5 / (1 + 2 * .5)


def test_decode_gives_images_in_unit_range(policy):
    images = policy.decode(torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)) * 3)
    assert images.shape == (2, 3, HEIGHT, WIDTH) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1


@pytest.mark.parametrize("guidance", [1.0, 4.5])
def test_ode_sampler_reproduces_the_pipeline(policy, pipeline, guidance):
    """Our sampler (plain CFG) + decode equals StableDiffusion3Pipeline.__call__ called as users call it:
    prompts and num_inference_steps, the scheduler spacing its own sigmas."""
    steps, negative = 10, ["blurry, low quality"] * 2
    generators = [torch.Generator().manual_seed(s) for s in (11, 12)]
    shape = policy.latent_shape(HEIGHT, WIDTH)
    cond = policy.encode_prompts(PROMPTS)
    uncond = policy.encode_prompts(negative) if guidance != 1.0 else None
    out = sample(
        policy.velocity, generators, shape, policy.schedule(steps, HEIGHT, WIDTH), cond, uncond,
        guidance=guidance, window=0,
    )  # fmt: skip
    ours = policy.decode(out.final)
    noise = per_sample_noise([torch.Generator().manual_seed(s) for s in (11, 12)], shape, torch.device("cpu"))
    theirs = pipeline(
        PROMPTS, negative_prompt=negative, guidance_scale=guidance, height=HEIGHT, width=WIDTH,
        num_inference_steps=steps, latents=noise, output_type="pt",
    ).images  # fmt: skip
    assert ours.shape == theirs.shape == (2, 3, HEIGHT, WIDTH)
    assert (ours - ours[:1]).abs().max() > 1e-3  # the two prompts give different images
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_bad_inputs_fail_clearly(policy, tmp_path):
    with pytest.raises(ValueError, match="model.path is required"):
        sd3.load(ModelConfig(arch="sd3"))
    with pytest.raises(FileNotFoundError, match="missing transformer/, vae/"):
        sd3.load(ModelConfig(arch="sd3", path=str(tmp_path / "nowhere")))
    for part in sd3.PARTS[1:]:
        (tmp_path / part).mkdir()
    with pytest.raises(FileNotFoundError, match=r"missing transformer/\. Point model.path"):
        sd3.load(ModelConfig(arch="sd3", path=str(tmp_path)))
    with pytest.raises(ValueError, match="divisible by 4, got 32x50"):
        policy.latent_shape(32, 50)
