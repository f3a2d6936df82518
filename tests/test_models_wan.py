"""The Wan 2.1 / 2.2 text-to-video adapter on tiny random `WanPipeline` folders: loading, prompt encoding, shapes,
equivalence of our rollout-level ODE sampling and `decode` with diffusers' own `WanPipeline` (run with a
`FlowMatchEulerDiscreteScheduler` of the same shift swapped in for the released UniPC), Wan 2.2's two experts,
Wan 2.2 A14B's two guidance scales (rollout.guidance_2) against the pipeline's and in replay, bad folders and
frame counts, and a FlowGRPO run of two steps."""

import json
import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline

from omnialign.config import ModelConfig, RolloutConfig, apply_overrides, validate
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.metrics import read_metrics
from omnialign.models import LOADERS, tiny, wan
from omnialign.recipes import RECIPES
from omnialign.rollout.diffusion import step_guidance
from omnialign.train import main
from omnialign.trainer.objectives import replay

PROMPTS = ["a red cat  running at noon ", "waves &amp; sand"]  # the pipeline cleans spaces and HTML escapes
NEGATIVE = ["blurry, static"] * 2
HEIGHT, WIDTH, FRAMES = 16, 32, 5  # latents (4, 2, 2, 4): 2 latent frames of a 2x4 grid, 1x2 tokens each
SEEDS = (11, 12)
TEXT = 32  # max_sequence_length of these tests (the default 512 is exact too, only slower)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan")
    paths = {
        "wan21": tiny.wan(root / "wan21"),
        "wan22": tiny.wan(root / "wan22", seed=1, boundary_ratio=0.9),
        "ti2v": tiny.wan(root / "ti2v", seed=2),
    }
    index = json.loads((paths["ti2v"] / "model_index.json").read_text())  # Wan 2.2 TI2V: a timestep per token
    (paths["ti2v"] / "model_index.json").write_text(json.dumps({**index, "expand_timesteps": True}))
    return paths


def load(path, **fields):
    return LOADERS["wan"](ModelConfig(**{"arch": "wan", "path": str(path), "frames": FRAMES, "text_tokens": TEXT,
                                         **fields}))  # fmt: skip


@pytest.fixture(scope="module")
def policy(paths):
    return load(paths["wan21"])


def pipeline(path):
    pipe = WanPipeline.from_pretrained(path)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=pipe.scheduler.config.flow_shift)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def ours(policy, guidance: float, steps: int) -> torch.Tensor:
    """Our rollout-level ODE sampling (sampling.sample on policy.velocity and policy.schedule), decoded."""
    cond = policy.encode_prompts(PROMPTS)
    uncond = policy.encode_prompts(NEGATIVE) if guidance != 1.0 else None
    out = sample(policy.velocity, [torch.Generator().manual_seed(s) for s in SEEDS],
                 policy.latent_shape(HEIGHT, WIDTH), policy.schedule(steps, HEIGHT, WIDTH), cond, uncond,
                 guidance=guidance, window=0)  # fmt: skip
    return policy.decode(out.final)


def theirs(pipe, policy, guidance: float, steps: int) -> torch.Tensor:
    noise = per_sample_noise([torch.Generator().manual_seed(s) for s in SEEDS], policy.latent_shape(HEIGHT, WIDTH))
    return pipe(PROMPTS, negative_prompt=NEGATIVE, height=HEIGHT, width=WIDTH, num_frames=FRAMES,
                num_inference_steps=steps, guidance_scale=guidance, latents=noise, output_type="pt",
                max_sequence_length=TEXT).frames  # fmt: skip


def test_loads_by_path_with_frozen_parts_shapes_and_lora_targets(policy, paths):
    frozen = [policy.text_encoder, policy.vae]
    assert not any(p.requires_grad for m in frozen for p in m.parameters()) and not any(m.training for m in frozen)
    assert all(p.requires_grad for p in policy.transformer.parameters())
    assert policy.transformer_2 is None and len(policy.blocks()) == 2 and not policy.edits
    assert policy.shift == 3.0  # the UniPC scheduler's flow_shift
    assert policy.latent_shape(HEIGHT, WIDTH) == (4, 2, 2, 4)
    assert load(paths["wan21"], frames=81).latent_shape(480, 832) == (4, 21, 60, 104)  # Wan 2.1 at 480p
    with pytest.raises(ValueError, match="divisible by 16, got 24x32"):
        policy.latent_shape(24, 32)
    names = [n for n, m in policy.transformer.named_modules() if n.split(".")[-1] in ("to_q", "ffn")]
    assert len(names) == 2 * 3  # self- and cross-attention queries and the MLP of each block
    assert LOADERS["wan"] is wan.load


def test_encode_prompts_match_the_pipeline(policy, paths):
    cond = policy.encode_prompts(PROMPTS)
    assert cond["embeds"].shape == (2, TEXT, 32)
    with torch.no_grad():
        embeds, negative = pipeline(paths["wan21"]).encode_prompt(PROMPTS, NEGATIVE, max_sequence_length=TEXT)
    torch.testing.assert_close(cond["embeds"], embeds, rtol=0, atol=0)
    torch.testing.assert_close(policy.encode_prompts(NEGATIVE)["embeds"], negative, rtol=0, atol=0)
    lengths = (cond["embeds"].abs().sum(-1) > 0).sum(-1)
    assert lengths.tolist() == [27, 14]  # each prompt zero-padded past its own (cleaned) tokens


@pytest.mark.parametrize("steps", [4, 30])
def test_schedule_is_the_euler_scheduler(policy, steps):
    scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    scheduler.set_timesteps(steps)
    torch.testing.assert_close(policy.schedule(steps, HEIGHT, WIDTH), scheduler.sigmas.float())


@pytest.mark.parametrize(("name", "guidance"), [("wan21", 1.0), ("wan21", 4.0), ("ti2v", 4.0)])
def test_sampling_and_decode_match_the_pipeline(paths, name, guidance):
    """Same noise, the Euler scheduler of the same shift: our frames equal WanPipeline's.
    (ti2v: the pipeline with Wan 2.2 TI2V's `expand_timesteps`, a timestep per token, equals one per sample.)"""
    policy = load(paths[name])
    video = ours(policy, guidance, steps=4)
    with torch.no_grad():
        expected = theirs(pipeline(paths[name]), policy, guidance, steps=4)
    assert video.shape == expected.shape == (2, FRAMES, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(video, expected, rtol=1e-4, atol=1e-4)
    assert (video[0] - video[1]).abs().max() > 1e-3  # different seeds and prompts, different videos


def test_two_experts_match_the_pipeline_and_only_the_first_trains(paths):
    """Wan 2.2: transformer above the boundary sigma, transformer_2 below, as the pipeline switches them."""
    policy = load(paths["wan22"])
    assert policy.boundary_ratio == 0.9 and not any(p.requires_grad for p in policy.transformer_2.parameters())
    sigmas = policy.schedule(4, HEIGHT, WIDTH)
    assert (sigmas[:-1] >= 0.9).any() and (sigmas[:-1] < 0.9).any()  # both experts run
    video = ours(policy, 4.0, steps=4)
    with torch.no_grad():
        expected = theirs(pipeline(paths["wan22"]), policy, 4.0, steps=4)
    torch.testing.assert_close(video, expected, rtol=1e-4, atol=1e-4)
    x = torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH))
    cond = policy.encode_prompts(PROMPTS)
    mixed = torch.tensor([0.95, 0.5])
    with torch.no_grad():
        v = policy.velocity(x, mixed, cond)
        torch.testing.assert_close(v[:1], policy._expert(policy.transformer, x[:1], mixed[:1], cond[:1]["embeds"]))
        torch.testing.assert_close(v[1:], policy._expert(policy.transformer_2, x[1:], mixed[1:], cond[1:]["embeds"]))
    assert policy.velocity(x, torch.tensor([0.95, 0.91]), cond).requires_grad
    with pytest.raises(ValueError, match="sigma=0.500.*rollout.window_end"):
        policy.velocity(x, mixed, cond)


def test_two_guidance_scales_match_the_pipeline_and_replay(paths):
    """Wan 2.2 A14B's guidance_scale_2: CFG 4 on transformer's steps, 3 on transformer_2's, per sample. ODE latents
    equal WanPipeline(guidance_scale=4, guidance_scale_2=3)'s; stored SDE transitions whose batch mixes both
    experts' steps replay to the rollout's log-probs; a one-transformer model refuses guidance_2."""
    policy = load(paths["wan22"])
    config = RolloutConfig(guidance=4.0, guidance_2=3.0, kind="sde", eta=0.7)
    cond, uncond = policy.encode_prompts(PROMPTS), policy.encode_prompts(NEGATIVE)
    sigmas, shape = policy.schedule(4, HEIGHT, WIDTH), policy.latent_shape(HEIGHT, WIDTH)
    generators = [torch.Generator().manual_seed(s) for s in SEEDS]
    out = sample(policy.velocity, generators, shape, sigmas, cond, uncond,
                 guidance=lambda sigma: step_guidance(policy, sigma, config), window=0)  # fmt: skip
    noise = per_sample_noise([torch.Generator().manual_seed(s) for s in SEEDS], shape)
    with torch.no_grad():
        expected = pipeline(paths["wan22"])(
            PROMPTS,
            negative_prompt=NEGATIVE,
            height=HEIGHT,
            width=WIDTH,
            num_frames=FRAMES,
            num_inference_steps=4,
            guidance_scale=4.0,
            guidance_scale_2=3.0,
            latents=noise,
            output_type="latent",
            max_sequence_length=TEXT,
        ).frames
    torch.testing.assert_close(out.final, expected, rtol=1e-4, atol=1e-5)
    one = sample(policy.velocity, [torch.Generator().manual_seed(s) for s in SEEDS], shape, sigmas, cond, uncond,
                 guidance=4.0, window=0)  # fmt: skip
    assert (one.final - out.final).abs().max() > 1e-3  # guidance_2 changes the low-noise steps

    starts = torch.tensor([0, 1])  # sample 0 stores steps 0-2, sample 1 steps 1-3: each replayed batch mixes sigmas
    rollout = sample(policy.velocity, [torch.Generator().manual_seed(s) for s in SEEDS], shape, sigmas, cond, uncond,
                     guidance=lambda sigma: step_guidance(policy, sigma, config), kind="sde", eta=0.7, starts=starts,
                     window=3)  # fmt: skip
    highs = []
    for j in range(3):
        inputs = {"x": rollout.latents[:, j], "x_next": rollout.latents[:, j + 1], "sigma": rollout.sigmas[:, j],
                  "sigma_next": rollout.sigmas[:, j + 1], "cond": cond, "uncond": uncond}  # fmt: skip
        highs.append(policy.high_noise(inputs["sigma"]).tolist())
        with torch.no_grad():
            torch.testing.assert_close(replay(policy, inputs, config).log_prob, rollout.log_probs[:, j])
    assert [True, False] in highs  # a replayed batch with both guidance scales
    with pytest.raises(ValueError, match=r"rollout.guidance_2=3.0 .* \(WanPolicy\) has one network"):
        step_guidance(load(paths["wan21"]), sigmas[:2], config)


def test_bad_folder_and_frames_fail_clearly(paths, tmp_path):
    with pytest.raises(ValueError, match="model.path is required for model.arch=wan"):
        wan.load(ModelConfig(arch="wan"))
    (tmp_path / "transformer").mkdir()
    with pytest.raises(FileNotFoundError, match=r"not a WanPipeline folder: missing vae/, text_encoder/"):
        wan.load(ModelConfig(arch="wan", path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"model.frames=8: \(frames - 1\) must be divisible by .* 4 \(e.g. 5\)"):
        load(paths["wan21"], frames=8)
    with pytest.raises(ValueError, match="model.frames=0"):
        load(paths["wan21"], frames=0)


def test_flowgrpo_runs_two_steps(paths, tmp_path):
    """The glyphs FlowGRPO recipe on the Wan twin (LoRA, tiny sizes) scoring each frame's JPEG size (per_frame)."""
    config = RECIPES["glyphs"]()
    small = ["model.arch=wan", f"model.path={paths['wan21']}", f"model.frames={FRAMES}", f"model.text_tokens={TEXT}",
             "model.lora.rank=4", "model.lora.alpha=8", "data.prompts_per_step=2", "data.val_seeds=1",
             "rollout.n=2", f"rollout.height={HEIGHT}", f"rollout.width={WIDTH}", "rollout.steps=4",
             "rollout.val_steps=2", "rollout.window_size=2", "actor.micro_batch_size=4", "actor.mini_batch_size=4",
             "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
             f"trainer.output_dir={tmp_path}", "reward.gold=none", 'reward.weights={"jpeg_compressibility": 1}',
             'reward.per_frame={"jpeg_compressibility": "mean"}',
             "algorithm.kl_coef=0"]  # fmt: skip
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and np.isfinite(records[1]["actor/clip_frac"])
    assert records[2]["actor/skipped_updates"] == 0


def test_twin_folder_is_the_released_layout(paths):
    index = json.loads((paths["wan22"] / "model_index.json").read_text())
    assert index["scheduler"] == ["diffusers", "UniPCMultistepScheduler"] and index["boundary_ratio"] == 0.9
    assert index["text_encoder"] == ["transformers", "UMT5EncoderModel"] and (paths["wan22"] / "transformer_2").is_dir()
