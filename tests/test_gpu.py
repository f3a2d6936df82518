"""The GPU tier's full-size checks (`make test-gpu`, docs/testing.md): each released architecture built at its
full size with random weights on the GPU, then one training step through the recipe's own code. Each asserts
what goes wrong on a GPU: a non-finite loss, a rollout/replay log-prob gap on an exact path, trained parameters
that do not move or frozen ones that do, memory over the card. Plus: the same seeds validate on the same
images on the CPU and the GPU.
"""

import contextlib
import gc
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from torch.distributed.tensor import DTensor

from omnialign.bench.language import language_trainer
from omnialign.bench.models import SD35, wan_tokens
from omnialign.bench.recipe import recipe_trainer
from omnialign.config import ModelConfig, apply_overrides, training_batch, validate
from omnialign.diffusion import sde
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.engine import dist, optim
from omnialign.metrics import read_metrics, without_timing
from omnialign.models import LOADERS, tiny
from omnialign.recipes import RECIPES
from omnialign.recipes.wan import A14B_BOUNDARY
from omnialign.trainer import actor

pytestmark = pytest.mark.gpu
CARD_GB = 139  # an H200's usable memory


@pytest.fixture(autouse=True)
def fresh_memory():
    """Each test starts with the card empty and its peak reset, and leaves nothing behind: a failed test's traceback,
    which pytest keeps in sys.last_* until the next test's call, holds its tensors (on an H100 a GSPO test that ran
    out of memory took the next one down with it), so it is dropped first."""
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    yield
    sys.last_type = sys.last_value = sys.last_traceback = sys.last_exc = None
    gc.collect()
    torch.cuda.empty_cache()


def local(p: torch.Tensor) -> torch.Tensor:
    """A parameter's shard: FSDP's are DTensors; over one rank the frozen ones in the compute dtype stay plain."""
    return p.to_local() if isinstance(p, DTensor) else p


def snapshot(net: torch.nn.Module, count: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    """Copies of the first `count` trained and frozen parameters (their shards) by name. LoRA A matrices are left
    out: their gradient is zero while B is, so the first step leaves them (but for weight decay) where they are."""
    out = {"trained": {}, "frozen": {}}
    for name, p in net.named_parameters():
        kind = out["trained" if p.requires_grad else "frozen"]
        if len(kind) < count and ".lora_A." not in name:
            kind[name] = local(p).detach().clone()
    return out


def skip_under(gib: float, why: str) -> None:
    """Skip a full-size test on a card with less memory than its measured peak needs (an 80 GB H100 under an H200)."""
    if torch.cuda.get_device_properties(0).total_memory < gib * 2**30:
        pytest.skip(why)


def two_steps(trainer) -> None:
    """Two training steps of a tiny twin's trainer: finite losses, no skipped update, and the rollout's log-probs
    given back by the replay (algorithm.old_log_probs=recompute)."""
    for step in (1, 2):
        metrics = trainer.train_step(step)
        assert math.isfinite(float(metrics["actor/loss"])) and float(metrics["actor/skipped_updates"]) == 0
        assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])


def assert_stepped(net: torch.nn.Module, before: dict, metrics: dict[str, torch.Tensor]) -> None:
    """Finite loss, no skipped update, trained parameters moved, frozen ones did not, memory under the card."""
    assert math.isfinite(float(metrics["actor/loss"])), metrics
    assert float(metrics["actor/skipped_updates"]) == 0
    now = dict(net.named_parameters())
    assert before["trained"]
    for name, old in before["trained"].items():
        assert not torch.equal(local(now[name]).detach(), old), f"{name} did not change"
    for name, old in before["frozen"].items():
        assert torch.equal(local(now[name]).detach(), old), f"frozen {name} changed"
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"peak {peak:.1f} GiB", {k: round(float(v), 6) for k, v in metrics.items() if k.startswith("actor/")})
    assert peak < CARD_GB


@contextlib.contextmanager
def no_host_sync() -> Iterator[None]:
    """CUDA's sync debug mode at "error" inside: a copy to the card that waits for its queued work, or a read back,
    raises."""
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_noise_on_cuda_is_the_hosts_draw_bit_for_bit():
    """`per_sample_noise` copies to the card from pinned memory without waiting for the queued work: what lands is
    still each generator's host draw, also when each copy is queued behind a long product and the host draws the
    next one before it ran."""
    shape, seeds = (16, 64, 64), range(4)
    host = [per_sample_noise([torch.Generator().manual_seed(s + k) for s in seeds], shape) for k in range(3)]
    generators = [[torch.Generator().manual_seed(s + k) for s in seeds] for k in range(3)]
    a = torch.randn(8192, 8192, device="cuda")
    drawn = []
    for g in generators:
        a = a @ a / 100  # queued ahead of the copy
        drawn.append(per_sample_noise(g, shape, torch.device("cuda")))
    for h, d in zip(host, drawn):
        assert torch.equal(d.cpu(), h)


def test_noise_on_cuda_and_every_sampler_step_without_a_host_sync():
    """The SDE sampler copies nothing to the card that waits for it (sigmas, window, noise, window indices), nor
    does the update's replay of a transition (its eta a float): with CUDA's sync debug mode at "error" a pageable
    copy or a read back would raise. The velocity here is a product on the card, so the host runs ahead of it."""
    device, shape, batch = torch.device("cuda"), (16, 64, 64), 4
    w = torch.randn(64, 64, device=device) / 8
    cond = TensorDict(scale=torch.ones(batch, device=device), batch_size=[batch])
    sigmas = torch.linspace(1, 0, 7)
    with no_host_sync():
        out = sample(lambda x, sigma, c: (x @ w) * c["scale"].view(-1, 1, 1, 1), [torch.Generator().manual_seed(s)
                     for s in range(batch)], shape, sigmas, cond, eta=0.9, starts=torch.tensor([0, 1, 2, 3]),
                     window=2, device=device)  # fmt: skip
        x, x_next = out.latents[:, 0], out.latents[:, 1]  # the update's replay: eta a float, x' given
        replayed = sde.transition("sde", (x @ w), x, out.sigmas[:, 0], out.sigmas[:, 1], 0.9, sample=x_next)
    assert out.log_probs.shape == (batch, 2) and torch.isfinite(out.log_probs).all()
    torch.testing.assert_close(replayed.log_prob, out.log_probs[:, 0], rtol=0, atol=1e-5)
    assert torch.equal(out.sigmas.cpu(), sigmas[torch.tensor([0, 1, 2, 3])[:, None] + torch.arange(3)])


@pytest.mark.parametrize("arch", ["qwen_image", "flux_kontext", "wan21"])
def test_transformer_forward_and_backward_without_a_host_sync(arch, tmp_path):
    """A velocity and its backward, on the tiny twins of the models of issue 32's MFU goal, copy nothing to the card
    that waits for it and read nothing back (CUDA's sync debug mode at "error" raises), so the host runs ahead of the
    card through the denoising steps and the update's micro-batches. Qwen-Image's needs `qwen_image.text_lengths`:
    diffusers' copies the text length to the card in every forward."""
    build = {"qwen_image": tiny.qwen_image, "flux_kontext": tiny.flux_kontext, "wan21": tiny.wan}[arch]
    name = arch.removesuffix("21")
    device = torch.device("cuda")
    policy = LOADERS[name](ModelConfig(arch=name, path=str(build(tmp_path / arch)))).to(device)
    policy.transformer.to(device)
    sources = [[torch.rand(3, 32, 32)], [torch.rand(3, 32, 32)]] if policy.edits else None
    cond = policy.encode_prompts(["a red cat", 'a sign that says "OPEN"'], sources)
    latents = torch.randn(2, *policy.latent_shape(32, 32), device=device)
    sigma = torch.tensor([0.9, 0.4], device=device)
    with torch.no_grad():
        policy.velocity(latents, sigma, cond)  # a first forward caches diffusers' RoPE tables on the card, once
    torch.cuda.synchronize()
    with no_host_sync():
        with torch.no_grad():
            policy.velocity(latents, sigma, cond)  # the rollout's
        v = policy.velocity(latents, sigma, cond)  # the update's
        v.float().square().mean().backward()
    assert v.shape == latents.shape and torch.isfinite(v).all()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.transformer.parameters())  # it ran


def test_validation_draws_the_same_images_on_cpu_and_gpu():
    """Validation noise comes from host generators: the glyphs base gives the same images on either device."""
    from omnialign.rollout.diffusion import generate_ode
    from omnialign.worlds.glyphs.recognizer import glyph_ocr

    config = RECIPES["glyphs"]()
    prompts = [str(d) for d in range(10) for _ in range(4)]
    seeds = torch.arange(len(prompts)) + 2**40
    images = {}
    for device in (torch.device("cpu"), torch.device("cuda")):
        policy = LOADERS["glyphs"](config.model)
        policy.transformer.to(device)
        images[device.type] = generate_ode(policy.to(device), prompts, seeds, config.rollout, device).cpu()
    assert (images["cpu"] - images["cuda"]).abs().mean() < 2e-3  # fresh noise would differ by about 0.3
    rewards = {k: torch.tensor(glyph_ocr(v, prompts, [{}] * len(prompts))) for k, v in images.items()}
    assert (rewards["cpu"] - rewards["cuda"]).abs().mean() < 0.01, rewards


def test_qwen_image_flowgrpo_lora_at_full_size(tmp_path):
    """Qwen-Image (20.4 B transformer, Qwen2.5-VL-7B encoder, VAE): rollout with true CFG, replay, update."""
    extra = ["rollout.n=4", "engine.compile=false", "algorithm.old_log_probs=recompute"]
    with recipe_trainer("qwen_image_ocr_flowgrpo_lora", 1, False, tmp_path, extra) as trainer:
        before = snapshot(trainer.policy.transformer)
        metrics = trainer.train_step(1)
    assert_stepped(trainer.policy.transformer, before, metrics)
    # the rollout's log-probs are exact: the replay under the same weights gives them back
    assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])


def test_qwen_image_edit_flowgrpo_lora_at_full_size(tmp_path):
    """Qwen-Image-Edit-2509 (Qwen-Image's 20.4 B transformer, Qwen2.5-VL-7B with its vision tower, VAE): edits of
    512x512 sources (their 1024 tokens beside the image's) with true CFG: rollout, replay, update."""
    extra = ["rollout.n=4", "engine.compile=false", "algorithm.old_log_probs=recompute"]
    with recipe_trainer("qwen_image_edit_ocr_flowgrpo_lora", 1, False, tmp_path, extra) as trainer:
        assert trainer.policy.edits and trainer.policy.plus
        before = snapshot(trainer.policy.transformer)
        metrics = trainer.train_step(1)
    assert_stepped(trainer.policy.transformer, before, metrics)
    assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])


@pytest.mark.parametrize("recipe", ["flux_ocr_flowgrpo_lora", "flux_kontext_edit_flowgrpo_lora"])
def test_flux_recipe_two_steps_on_the_tiny_twin(recipe, tmp_path):
    """FLUX.1-dev and FLUX.1-Kontext recipes (regional compile on) on their tiny twins on the GPU: two steps,
    the rollout's log-probs given back by the replay; Kontext's source latents live on the GPU with the step."""
    extra = ["algorithm.old_log_probs=recompute"]
    with recipe_trainer(recipe, 2, True, tmp_path, extra) as trainer:
        two_steps(trainer)
        cond = trainer.policy.encode_prompts(["a"], [[torch.rand(3, 32, 32)]] if trainer.policy.edits else None)
        assert cond["embeds"].is_cuda and ("source_latents" not in cond or cond["source_latents"].is_cuda)


@pytest.mark.parametrize("recipe", ["flux_ocr_flowgrpo_lora", "flux_kontext_edit_flowgrpo_lora"])
def test_flux_flowgrpo_lora_at_full_size(recipe, tmp_path):
    """FLUX.1-dev / FLUX.1-Kontext-dev (11.9 B transformer: 19 double- and 38 single-stream blocks of 3072 with the
    guidance embedding; CLIP-L, T5-XXL, VAE) at 512x512, Kontext editing 512x512 sources (their 1024 tokens beside
    the image's): rollout with the embedded guidance, replay, update."""
    extra = ["rollout.n=4", "engine.compile=false", "algorithm.old_log_probs=recompute"]
    with recipe_trainer(recipe, 1, False, tmp_path, extra) as trainer:
        config = trainer.policy.transformer.config
        assert (config.num_layers, config.num_single_layers, config.guidance_embeds) == (19, 38, True)
        before = snapshot(trainer.policy.transformer)
        metrics = trainer.train_step(1)
    assert_stepped(trainer.policy.transformer, before, metrics)
    assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])


def test_flux_compiled_fp8_step_replays_its_rollout_exactly_at_full_size(tmp_path):
    """FLUX.1-dev compiled as the recipe ships it, in fp8, with rollout.grad_graph: the rollout runs the update's
    compiled graph, so the first update's ratio is exactly 1 (without it the no-grad graph's outputs differ: 1-2 of
    64 samples clipped at clip range 1e-5, BENCHMARKS.md)."""
    extra = ["rollout.n=4", "engine.fp8=true", "rollout.grad_graph=true"]
    with recipe_trainer("flux_ocr_flowgrpo_lora", 1, False, tmp_path, extra) as trainer:
        before = snapshot(trainer.policy.transformer)
        metrics = trainer.train_step(1)
    assert_stepped(trainer.policy.transformer, before, metrics)
    assert float(metrics["actor/ratio"]) == 1.0 and float(metrics["actor/approx_kl"]) == 0.0


@pytest.mark.parametrize("recipe", ["flux2_ocr_flowgrpo_lora", "flux2_klein_ocr_flowgrpo_lora"])
def test_flux2_recipe_two_steps_on_the_tiny_twin(recipe, tmp_path):
    """FLUX.2-dev and FLUX.2-klein recipes (regional compile on) on their tiny twins on the GPU: two steps, the
    rollout's log-probs given back by the replay; the prompt embeddings live on the GPU with the step."""
    extra = ["algorithm.old_log_probs=recompute"]
    with recipe_trainer(recipe, 2, True, tmp_path, extra) as trainer:
        two_steps(trainer)
        assert trainer.policy.encode_prompts(["a"])["embeds"].is_cuda


@pytest.mark.parametrize("recipe, path, blocks", [
    ("flux2_ocr_flowgrpo_lora", "models/FLUX.2-dev", (8, 48, 6144)),
    ("flux2_klein_ocr_flowgrpo_lora", "models/FLUX.2-klein-4B", (5, 20, 3072)),
    ("flux2_klein_ocr_flowgrpo_lora", "models/FLUX.2-klein-9B", (8, 24, 4096)),
])  # fmt: skip
def test_flux2_flowgrpo_lora_at_full_size(recipe, path, blocks, tmp_path):
    """FLUX.2-dev (32.2 B transformer with the guidance embedding; Mistral Small 3.1's text stack up to the 30th of its
    40 layers, 17.9 B, on the GPU beside it) at 512x512 with 512 text tokens, and FLUX.2-klein 4B and 9B (3.9 B and
    9.1 B; Qwen3-4B's and Qwen3-8B's first 27 layers) at 384x384: rollout, replay, update (micro-batches of 4)."""
    if path == "models/FLUX.2-dev":
        skip_under(110, "FLUX.2-dev with its text stack peaks at 103.7 GiB allocated (H200), over an H100")
    extra = ["rollout.n=4", "engine.compile=false", "algorithm.old_log_probs=recompute", f"model.path={path}"]
    with recipe_trainer(recipe, 1, False, tmp_path, extra) as trainer:
        config = trainer.policy.transformer.config
        assert (config.num_layers, config.num_single_layers, config.num_attention_heads * 128) == blocks
        before = snapshot(trainer.policy.transformer)
        metrics = trainer.train_step(1)
    assert_stepped(trainer.policy.transformer, before, metrics)
    assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])


def test_zimage_recipe_two_steps_on_the_tiny_twin(tmp_path):
    """Z-Image's base recipe (CFG, an SDE window) on its tiny twin on the GPU: two steps, the rollout's log-probs given
    back by the replay; the captions live on the GPU with the step, and a batch of captions of different lengths (the
    transformer pads them to the longest, masked) gives each sample's velocity as it gets alone."""
    extra = ["algorithm.old_log_probs=recompute"]
    with recipe_trainer("zimage_ocr_flowgrpo_lora", 2, True, tmp_path, extra) as trainer:
        two_steps(trainer)
        policy = trainer.policy
        cond = policy.encode_prompts(["a", 'a sign that says "OPEN" in the rain, at night, in neon letters'])
        assert cond["embeds"].is_cuda and cond["mask"].is_cuda and cond["mask"].sum(1).unique().numel() == 2
        x = torch.randn(2, *policy.latent_shape(32, 32), device=cond["embeds"].device)
        sigma = torch.tensor([0.7, 0.3], device=cond["embeds"].device)
        with torch.no_grad():
            both = policy.velocity(x, sigma, cond)
            alone = torch.cat([policy.velocity(x[i : i + 1], sigma[i : i + 1], cond[i : i + 1]) for i in range(2)])
        torch.testing.assert_close(both, alone, rtol=1e-4, atol=1e-5)


def test_zimage_flowgrpo_lora_at_full_size(tmp_path):
    """Z-Image (6.15 B transformer: 30 single-stream layers of 3840 and 2 noise and 2 context refiners; Qwen3-4B;
    FLUX.1's VAE) at 512x512 with CFG 4 (rollout.guidance 5): rollout, replay, update."""
    extra = ["rollout.n=4", "engine.compile=false", "algorithm.old_log_probs=recompute"]
    with recipe_trainer("zimage_ocr_flowgrpo_lora", 1, False, tmp_path, extra) as trainer:
        config = trainer.policy.transformer.config
        assert (config.n_layers, config.n_refiner_layers, config.dim, config.n_heads) == (30, 2, 3840, 30)
        before = snapshot(trainer.policy.transformer)
        metrics = trainer.train_step(1)
    assert_stepped(trainer.policy.transformer, before, metrics)
    assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])


def test_wan21_1_3b_flowgrpo_lora_at_full_size(tmp_path):
    """Wan 2.1 T2V 1.3B (1.42 B transformer: 30 blocks of 1536, ffn 8960; UMT5-XXL, the Wan VAE) at 832x480 with 33
    frames (9 latent frames, 14040 tokens a video): two steps of rollout with true CFG 5, replay, update; every
    frame scored."""
    extra = ["rollout.n=4", "model.frames=33", "engine.compile=false", "algorithm.old_log_probs=recompute"]
    with recipe_trainer("wan21_t2v_1_3b_ocr_flowgrpo_lora", 1, False, tmp_path, extra) as trainer:
        config = trainer.policy.transformer.config
        assert (config.num_layers, config.num_attention_heads * config.attention_head_dim, config.ffn_dim) == (
            30, 1536, 8960)  # fmt: skip
        assert wan_tokens(trainer.policy, 480, 832) == 9 * 30 * 52
        before = snapshot(trainer.policy.transformer)
        for step in (1, 2):
            metrics = trainer.train_step(step)
            assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])
    assert_stepped(trainer.policy.transformer, before, metrics)


def test_wan22_a14b_recipe_two_steps_on_the_tiny_twin(tmp_path):
    """Wan 2.2 A14B's recipe on its two-expert tiny twin on the GPU (issue 33): the recipe's 20 steps at shift 12,
    CFG 4 on the high-noise expert's steps and 3 on the low-noise expert's, the SDE window in the high-noise steps;
    two steps with the rollout's log-probs given back by the replay, the high-noise expert trained and the low-noise
    one (sharded beside it) unmoved."""
    extra = ["algorithm.old_log_probs=recompute"]
    with recipe_trainer("wan22_t2v_a14b_ocr_flowgrpo_lora", 2, True, tmp_path, extra) as trainer:
        policy, rollout = trainer.policy, trainer.config.rollout
        assert policy.boundary_ratio == A14B_BOUNDARY and (rollout.guidance, rollout.guidance_2) == (4.0, 3.0)
        sigmas = policy.schedule(rollout.steps, rollout.height, rollout.width)
        assert (sigmas[: rollout.window_end] >= A14B_BOUNDARY).all() and (sigmas[:-1] < A14B_BOUNDARY).any()
        before, frozen = snapshot(policy.transformer), snapshot(policy.transformer_2)
        assert not frozen["trained"] and all(p.is_cuda for p in frozen["frozen"].values())
        for step in (1, 2):
            metrics = trainer.train_step(step)
            assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])
    assert_stepped(policy.transformer, before, metrics)
    now = dict(policy.transformer_2.named_parameters())
    for name, old in frozen["frozen"].items():
        assert torch.equal(local(now[name]).detach(), old), f"transformer_2's {name} changed"


def test_ltx2_recipe_two_steps_on_the_tiny_twin(tmp_path):
    """LTX-2's base recipe (CPS window, the audio riding in the latents) on its tiny twin on the GPU: two steps, the
    rollout's log-probs given back by the replay; the text conditions and decoded videos live on the GPU."""
    extra = ["algorithm.old_log_probs=recompute"]
    with recipe_trainer("ltx2_t2v_ocr_flowgrpo_lora", 2, True, tmp_path, extra) as trainer:
        two_steps(trainer)
        policy = trainer.policy
        cond = policy.encode_prompts(["a", 'a sign that says "OPEN"'])
        assert cond["video"].is_cuda and cond["audio"].is_cuda and cond["mask"].is_cuda
        x = torch.randn(2, *policy.latent_shape(64, 64), device=cond["video"].device)
        with torch.no_grad():
            v = policy.velocity(x, torch.tensor([0.7, 0.3], device=x.device), cond)
            video = policy.decode(x)
        assert v.shape == x.shape and video.is_cuda and video.shape == (2, 9, 3, 64, 64)


def test_ltx2_flowgrpo_lora_at_full_size(tmp_path):
    """LTX-2 (18.9 B audio-video transformer: 48 blocks, video 4096 and audio 2048 wide; its text connectors, video VAE
    and Gemma-3-12B on the GPU beside it, about 67 GB) at 768x512 with 25 frames (4 latent frames of 16x24: 1536 video
    tokens, 26 audio tokens) and the pipeline's 1024 text tokens: rollout, replay, update of the LoRA on the video
    stream; every frame scored."""
    skip_under(90, "LTX-2 with Gemma-3-12B peaks at 75.2 GiB allocated (H200); an 80 GB H100 ran out in its connectors")
    extra = ["rollout.n=4", "model.frames=25", "engine.compile=false", "algorithm.old_log_probs=recompute"]
    with recipe_trainer("ltx2_t2v_ocr_flowgrpo_lora", 1, False, tmp_path, extra) as trainer:
        policy, config = trainer.policy, trainer.policy.transformer.config
        assert (config.num_layers, config.num_attention_heads * config.attention_head_dim) == (48, 4096)
        assert policy.latent_shape(512, 768) == (4 * 16 * 24 + 26, 128)
        before = snapshot(policy.transformer)
        metrics = trainer.train_step(1)
    assert_stepped(trainer.policy.transformer, before, metrics)
    assert float(metrics["actor/rollout_logprob_gap"]) < 1e-3, float(metrics["actor/rollout_logprob_gap"])


@pytest.mark.parametrize("size", SD35)
def test_sd35_offline_dpo_lora_at_full_size(size):
    """SD3.5 medium (2.5 B) and large (8.1 B) transformers: one offline Diffusion-DPO step at 512x512."""
    from diffusers import SD3Transformer2DModel

    from omnialign.models.sd3 import SD3Policy
    from omnialign.trainer.build import build_policy
    from omnialign.trainer.objectives import dpo_objective, pair_batch

    world = dist.init()
    config = validate(apply_overrides(RECIPES["sd3_offline_dpo"](), ["data.prompts_per_step=4"]))
    with torch.device(world.device):
        net = SD3Transformer2DModel(sample_size=128, patch_size=2, in_channels=16, out_channels=16,
                                    attention_head_dim=64, joint_attention_dim=4096, pooled_projection_dim=2048,
                                    qk_norm="rms_norm", **SD35[size]).to(torch.bfloat16)  # fmt: skip
    policy, contexts = build_policy(config, world, SD3Policy(net, None, None, None))
    params = [p for p in net.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    g = torch.Generator().manual_seed(0)
    pairs = 2 * config.data.prompts_per_step
    embeds, pooled = torch.randn(pairs, 77 + 256, 4096, generator=g), torch.randn(pairs, 2048, generator=g)
    cond = TensorDict({"embeds": embeds, "pooled": pooled}, batch_size=[pairs]).to(world.device)
    latents = torch.randn(pairs, 16, 64, 64, generator=g).to(world.device)
    batch = pair_batch(latents, cond, torch.arange(pairs, dtype=torch.float32).flip(0), g, config,
                       policy.train_sigmas())  # fmt: skip
    before = snapshot(net)
    local = actor.local_config(config.actor, *training_batch(config)[:2], world.size)
    result = actor.update(dpo_objective(policy, config, contexts["reference"]), batch, params, optimizer, scheduler,
                          local, seed=0, device=world.device)  # fmt: skip
    metrics = {f"actor/{k}": v for k, v in result.metrics.items()}
    assert_stepped(net, before, metrics)
    # at the first step the policy is the reference: every implicit reward is 0 and the loss is log 2
    assert float(metrics["actor/loss"]) == pytest.approx(math.log(2), abs=1e-3)


def test_qwen3_omni_thinker_dpo_at_full_size(tmp_path):
    """The Qwen3-Omni-30B-A3B thinker at its released size (31.7 B: the text stack and the vision and audio towers)
    on image rows (a 448 x 448 image first in every prompt): offline DPO, LoRA."""
    trainer, policy, head = language_trainer("qwen3_omni_dpo", 2, False, tmp_path, seq_len=1024, media="image")
    before = snapshot(policy.transformer)
    metrics = trainer.train_step(1)
    assert head["params_b"] > 31.5 and head["towers"] == "full" and head["media"] == "image"
    assert_stepped(policy.transformer, before, metrics)
    assert float(metrics["actor/loss"]) == pytest.approx(math.log(2), abs=1e-3)  # policy = reference at step 1


@pytest.mark.parametrize("recipe, size, lora, decoder", [("qwen3_omni_gspo", "30b-a3b", True, "transformers"),
                                                         ("qwen3_omni_gspo", "30b-a3b", True, "compiled"),
                                                         ("choice_gspo", "4b", False, "static"),
                                                         ("choice_gspo", "4b", True, "static")])  # fmt: skip
def test_gspo_at_full_size(recipe, size, lora, decoder, tmp_path):
    """GSPO with generation on the thinker (LoRA; transformers' `generate`, and omnialign's decoder compiled, which
    gathers only the adapters over one rank: the 30B-A3B's weights gathered beside them ran out of memory on an H100)
    and on Qwen3-4B in bf16 (full fine-tuning with fp32 master weights, and LoRA), one mini-batch per step, with the
    default old log-probs (algorithm.old_log_probs=auto: replayed for bf16 language models): at the first update
    every sequence's ratio is 1 and none is clipped. The rollout's own log-probs (float32 head, as training) differ from
    the training forward by the bf16 layers' rounding: printed."""
    if recipe == "choice_gspo" and not lora:
        skip_under(90, "Qwen3-4B's full fine-tuning peaks at 76.9 GiB allocated (H200); an 80 GB H100 ran out in AdamW")
    random_rewards = f'reward.weights={{"{Path(__file__).parent / "reward_fns.py"}:random_scores": 1}}'
    extra = ["rollout.n=8", "actor.mini_batch_size=32", random_rewards, f"generation.decoder={decoder}"]
    if lora and recipe == "choice_gspo":
        extra += ["model.lora.rank=32"]
    trainer, policy, _ = language_trainer(recipe, 4, False, tmp_path, extra, model_size=size, max_new_tokens=64)
    assert trainer.config.algorithm.old_log_probs == "auto"
    before = snapshot(policy.transformer)
    metrics = trainer.train_step(1)
    assert_stepped(policy.transformer, before, metrics)
    assert float(metrics["rollout/response_length"]) > 0
    gaps = {k: float(metrics[f"actor/rollout_{k}"]) for k in ("logprob_gap", "seq_gap")}
    print(f"{recipe} {size} lora={lora} {decoder}: the rollout's log-probs vs the training forward's: {gaps}")
    assert float(metrics["actor/clip_frac"]) == 0 and abs(float(metrics["actor/ratio"]) - 1) < 1e-4


def start_run(recipe: str, out: Path, name: str, *overrides: str) -> subprocess.Popen:
    """`omnialign train RECIPE` in its own process, its stderr in OUT/NAME.log."""
    command = [sys.executable, "-m", "omnialign", "train", recipe, f"name={name}", "trainer.progress=false",
               f"trainer.output_dir={out}", *overrides]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=(out / f"{name}.log").open("w"))


def finish(run: subprocess.Popen, log: Path) -> None:
    assert run.wait(timeout=600) == 0, log.read_text()[-3000:]


def test_deterministic_glyphs_runs_agree_on_cuda(tmp_path):
    """trainer.deterministic on the GPU: two 20-step glyphs runs, one alone on the card and then one beside another
    process (a glyphs_online_dpo run without it), give metrics.jsonl equal in every entry but the timings."""
    settings = ["trainer.total_steps=20", "trainer.deterministic=true"]
    finish(start_run("glyphs", tmp_path, "alone", *settings), tmp_path / "alone.log")
    beside = start_run("glyphs", tmp_path, "beside", *settings)
    other = start_run("glyphs_online_dpo", tmp_path, "other", "trainer.total_steps=20")
    finish(beside, tmp_path / "beside.log")
    finish(other, tmp_path / "other.log")
    alone, beside = (without_timing(read_metrics(tmp_path / name / "metrics.jsonl")) for name in ("alone", "beside"))
    assert len(alone) == 21 and alone == beside
