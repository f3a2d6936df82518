"""The Qwen-Image adapter on a tiny random pipeline: loading, encoding, packing, schedule, and
equivalence with diffusers' own `QwenImagePipeline`."""

import copy
from collections.abc import Callable

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline
from diffusers.models.autoencoders import autoencoder_kl_qwenimage
from diffusers.models.transformers import transformer_qwenimage
from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift
from peft import LoraConfig, get_peft_model

from omnialign.config import ModelConfig
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.models import LOADERS, qwen_image, tiny

PROMPTS = ["a red cat", 'a shop sign that says "OPEN" in the rain, photo']
HEIGHT, WIDTH = 32, 48  # tiny VAE factor 4, 2x2 packing: a 4x6 token grid


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny.qwen_image(tmp_path_factory.mktemp("qwen_image"))


@pytest.fixture(scope="module")
def policy(path):
    return LOADERS["qwen_image"](ModelConfig(arch="qwen_image", path=str(path)))


@pytest.fixture(scope="module")
def pipeline(path):
    pipe = QwenImagePipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_loads_by_path_with_frozen_encoders_and_lora_targets(policy):
    assert not any(p.requires_grad for p in [*policy.text_encoder.parameters(), *policy.vae.parameters()])
    assert not policy.text_encoder.training and not policy.vae.training
    assert all(p.requires_grad for p in policy.transformer.parameters())
    assert len(policy.blocks()) == 2
    lora = get_peft_model(copy.deepcopy(policy.transformer), LoraConfig(r=2, target_modules=policy.lora_targets))
    assert sum(name.endswith("lora_A") for name, _ in lora.named_modules()) == 12 * 2  # 12 projections per block


def test_encode_prompts_match_the_pipeline(policy, pipeline):
    heads = []  # positions the LM head ran for: its logits are not used, so the last one only
    hook = policy.text_encoder.get_output_embeddings().register_forward_hook(lambda m, i, o: heads.append(o.shape[1]))
    cond = policy.encode_prompts(PROMPTS)
    hook.remove()
    assert heads == [1]
    assert cond.batch_size == torch.Size([2])
    assert cond["embeds"].shape == (2, qwen_image.MAX_SEQUENCE_LENGTH, 16)
    assert cond["mask"].shape == (2, qwen_image.MAX_SEQUENCE_LENGTH)
    embeds, mask = pipeline.encode_prompt(PROMPTS)
    lengths = mask.sum(1)
    assert cond["mask"].sum(1).tolist() == lengths.tolist() and lengths[0] < lengths[1]
    for i, n in enumerate(lengths):
        assert cond["mask"][i, :n].all() and not cond["mask"][i, n:].any()
        torch.testing.assert_close(cond["embeds"][i, :n], embeds[i, :n])
        assert not cond["embeds"][i, n:].any()
    short = qwen_image.QwenImagePolicy(
        policy.transformer, policy.vae, policy.text_encoder, policy.tokenizer, policy.scheduler, max_sequence_length=3
    )
    assert short.encode_prompts(PROMPTS)["mask"].tolist() == [[1, 1, 1]] * 2  # truncated like the pipeline


def test_velocity_matches_the_pipelines_transformer_call(policy, pipeline):
    cond = policy.encode_prompts(PROMPTS)
    shape = policy.latent_shape(HEIGHT, WIDTH)
    assert shape == (4, 6, 16)
    latents, sigma = torch.randn(2, *shape), torch.tensor([0.93, 0.41])
    v = policy.velocity(latents, sigma, cond)
    assert v.shape == latents.shape
    embeds, mask = pipeline.encode_prompt(PROMPTS)
    with torch.no_grad():
        expected = pipeline.transformer(
            hidden_states=latents.reshape(2, 24, 16),
            timestep=(sigma * 1000) / 1000,
            encoder_hidden_states_mask=mask,
            encoder_hidden_states=embeds,
            img_shapes=[[(1, 4, 6)]] * 2,
            return_dict=False,
        )[0]
    torch.testing.assert_close(v.detach(), expected.reshape(v.shape), rtol=1e-5, atol=1e-5)


def fixed_velocity(policy) -> Callable[[], torch.Tensor]:
    """The velocity at fixed latents, sigmas and prompts, without grad: to compare the adapter's replacements of
    diffusers' functions with diffusers' own, installed in turn."""
    cond = policy.encode_prompts(PROMPTS)
    torch.manual_seed(0)
    latents, sigma = torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)), torch.tensor([0.93, 0.41])
    return torch.no_grad()(lambda: policy.velocity(latents, sigma, cond))


def test_the_rotary_embedding_in_real_arithmetic_gives_the_complex_multiplys_bits(policy, monkeypatch):
    """The attention's rotary embedding runs through `qwen_image.real_rotary` (installed in diffusers on import): the
    same velocity, bit for bit, as diffusers' complex multiply."""
    assert transformer_qwenimage.apply_rotary_emb_qwen is qwen_image.real_rotary
    velocity = fixed_velocity(policy)
    real_v = velocity()
    monkeypatch.setattr(transformer_qwenimage, "apply_rotary_emb_qwen", qwen_image.complex_rotary)
    complex_v = velocity()
    assert torch.equal(real_v, complex_v)
    monkeypatch.setattr(transformer_qwenimage, "apply_rotary_emb_qwen", lambda x, freqs, use_real: x)
    assert not torch.equal(velocity(), complex_v)  # the rotary reaches the attention


def test_the_text_lengths_without_a_host_copy_are_diffusers_values(policy, monkeypatch):
    """`qwen_image.text_lengths` (installed in diffusers on import) returns what diffusers' function does, a row
    with no valid token included, and the velocity is the same bit for bit (GPU: `test_gpu.py`'s forward without a
    host sync)."""
    assert transformer_qwenimage.compute_text_seq_len_from_mask is qwen_image.text_lengths
    text = torch.randn(3, 5, 4)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0], [1, 0, 1, 1, 0]])
    (length, lengths, bools), (stock_length, stock_lengths, stock_bools) = (
        f(text, mask) for f in (qwen_image.text_lengths, qwen_image.library_text_lengths)
    )
    assert length == stock_length == 5 and lengths.tolist() == stock_lengths.tolist() == [2, 5, 4]
    assert lengths.dtype == stock_lengths.dtype and torch.equal(bools, stock_bools) and bools.dtype == torch.bool
    assert qwen_image.text_lengths(text, None) == qwen_image.library_text_lengths(text, None)
    velocity = fixed_velocity(policy)
    ours = velocity()
    monkeypatch.setattr(transformer_qwenimage, "compute_text_seq_len_from_mask", qwen_image.library_text_lengths)
    assert torch.equal(ours, velocity())


def test_the_vae_runs_an_image_through_2d_convolutions_with_the_3d_ones_sums(policy, monkeypatch):
    """`qwen_image.one_frame_conv` (installed in diffusers on import) decodes and encodes an image as diffusers' causal
    3D convolutions do, to float32 rounding; a two-frame video takes diffusers' own path, bit for bit."""
    conv = autoencoder_kl_qwenimage.QwenImageCausalConv3d
    assert conv.forward is qwen_image.one_frame_conv
    vae = copy.deepcopy(policy.vae).float()
    torch.manual_seed(0)
    z, image, video = torch.randn(2, vae.config.z_dim, 1, 4, 6), torch.rand(2, 3, 1, 16, 24), torch.randn(1, 4, 2, 6, 6)
    video_conv = vae.decoder.conv_in
    with torch.no_grad():
        ours = vae.decode(z).sample, vae.encode(image).latent_dist.mean, video_conv(video)
        monkeypatch.setattr(conv, "forward", qwen_image.causal_conv)
        stock = vae.decode(z).sample, vae.encode(image).latent_dist.mean, video_conv(video)
    torch.testing.assert_close(ours[0], stock[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1], stock[1], rtol=1e-5, atol=1e-5)
    assert torch.equal(ours[2], stock[2])
    assert not torch.equal(ours[0], torch.zeros_like(ours[0]))


@pytest.mark.parametrize("size", [(HEIGHT, WIDTH), (512, 512)])
def test_schedule_matches_the_scheduler(policy, path, size):
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path / "scheduler")
    tokens = policy.latent_shape(*size)[0] * policy.latent_shape(*size)[1]
    c = scheduler.config
    mu = calculate_shift(tokens, c.base_image_seq_len, c.max_image_seq_len, c.base_shift, c.max_shift)
    for steps in (4, 10):
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
        sigmas = policy.schedule(steps, *size)
        assert sigmas.dtype == torch.float32 and sigmas.shape == (steps + 1,)
        torch.testing.assert_close(sigmas, scheduler.sigmas, rtol=0, atol=1e-6)
        assert abs(sigmas[-2] - 0.02) < 1e-6 and sigmas[-1] == 0  # the terminal stretch


def test_train_sigmas_are_the_fresh_schedulers(policy, path):
    """The dynamically shifting scheduler leaves its training sigmas unshifted: k/1000 for k = 1000 ... 1."""
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(path / "scheduler")
    torch.testing.assert_close(policy.train_sigmas(), scheduler.sigmas, rtol=0, atol=1e-6)
    assert policy.train_sigmas()[-1].item() == pytest.approx(1e-3)


def test_decode_gives_images_in_unit_range(policy):
    images = policy.decode(torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)) * 3)
    assert images.shape == (2, 3, HEIGHT, WIDTH) and images.dtype == torch.float32
    assert images.min() >= 0 and images.max() <= 1


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_ode_sampler_reproduces_the_pipeline(policy, pipeline, guidance):
    """Our sampler (true CFG with norm rescale) + decode equals QwenImagePipeline.__call__ for the same noise."""
    steps, negative = 4, ["blurry, low quality"] * 2
    generators = [torch.Generator().manual_seed(s) for s in (11, 12)]
    shape = policy.latent_shape(HEIGHT, WIDTH)
    cond = policy.encode_prompts(PROMPTS)
    uncond = policy.encode_prompts(negative) if guidance != 1.0 else None
    out = sample(
        policy.velocity, generators, shape, policy.schedule(steps, HEIGHT, WIDTH), cond, uncond,
        guidance=guidance, cfg_rescale=True, window=0,
    )  # fmt: skip
    ours = policy.decode(out.final)
    noise = per_sample_noise([torch.Generator().manual_seed(s) for s in (11, 12)], shape, torch.device("cpu"))
    theirs = pipeline(
        PROMPTS, negative_prompt=negative if guidance != 1.0 else None, true_cfg_scale=guidance, height=HEIGHT,
        width=WIDTH, num_inference_steps=steps, latents=noise.reshape(2, -1, shape[-1]), output_type="pt",
    ).images  # fmt: skip
    assert ours.shape == theirs.shape == (2, 3, HEIGHT, WIDTH)
    assert (ours - ours[:1]).abs().max() > 1e-3  # the two prompts give different images
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_bad_inputs_fail_clearly(policy, tmp_path):
    with pytest.raises(ValueError, match="model.path is required"):
        qwen_image.load(ModelConfig(arch="qwen_image"))
    with pytest.raises(FileNotFoundError, match="missing transformer/, vae/"):
        qwen_image.load(ModelConfig(arch="qwen_image", path=str(tmp_path / "nowhere")))
    for part in ("vae", "text_encoder", "tokenizer", "scheduler"):
        (tmp_path / part).mkdir()
    with pytest.raises(FileNotFoundError, match=r"missing transformer/\. Point model.path"):
        qwen_image.load(ModelConfig(arch="qwen_image", path=str(tmp_path)))
    with pytest.raises(ValueError, match="divisible by 8, got 30x48"):
        policy.latent_shape(30, 48)
