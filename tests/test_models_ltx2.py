"""The LTX-2 text-to-video adapter on a tiny random `LTX2Pipeline`: loading, prompt encoding (Gemma-3 and the text
connectors) and the schedule against the pipeline's own, our rollout-level ODE sampling (with and without CFG) equal
to the pipeline's decoded video on the same seeds (the audio denoised alongside, as the pipeline does), bad inputs,
two training steps of the base recipe and the NFT variant, the full-size builder's sizes and FLOP count."""

import copy
import math

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, LTX2Pipeline, LTX2VideoTransformer3DModel
from diffusers.pipelines.ltx2.pipeline_ltx2 import calculate_shift
from peft import LoraConfig, get_peft_model

from omnialign.bench.models import LTX2_TRANSFORMER, full_ltx2, ltx2_flops
from omnialign.config import ConfigError, ModelConfig, apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.metrics import read_metrics
from omnialign.models import LOADERS, ltx2, tiny
from omnialign.recipes import RECIPES
from omnialign.train import main

PROMPTS = ["  a red cat ", 'a sign that says "OPEN"']  # the pipeline strips them
NEGATIVE = ["blurry, jittery"] * 2
HEIGHT, WIDTH, FRAMES = 64, 96, 9  # 2 latent frames of 2x3 video tokens (12), and 9 audio tokens
SEEDS = (11, 12)
TEXT = 16  # a multiple of the tiny connectors' 8 registers (the pipeline's 1024 is exact too, only slower)
STEPS = 3
# the pipeline's extra guidance off (its defaults turn on STG, modality guidance and rescale for both streams)
PLAIN = dict(stg_scale=0.0, audio_stg_scale=0.0, modality_scale=1.0, audio_modality_scale=1.0, guidance_rescale=0.0,
             audio_guidance_rescale=0.0, audio_guidance_scale=None)  # fmt: skip


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny.ltx2(tmp_path_factory.mktemp("ltx2") / "base")


def load(path, **fields):
    return LOADERS["ltx2"](ModelConfig(**{"arch": "ltx2", "path": str(path), "frames": FRAMES, "text_tokens": TEXT,
                                          **fields}))  # fmt: skip


@pytest.fixture(scope="module")
def policy(path):
    return load(path)


@pytest.fixture(scope="module")
def pipeline(path):
    pipe = LTX2Pipeline.from_pretrained(path)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_loads_by_path_with_frozen_parts_shapes_and_lora_targets(policy, path):
    frozen = [policy.text_encoder, policy.connectors, policy.vae]
    assert not any(p.requires_grad for m in frozen for p in m.parameters()) and not any(m.training for m in frozen)
    assert all(p.requires_grad for p in policy.transformer.parameters())
    assert len(policy.blocks()) == 2 and not policy.edits and policy.tokenizer.padding_side == "left"
    assert policy.latent_shape(HEIGHT, WIDTH) == (2 * 2 * 3 + 9, 4) and policy.grid == (2, 2, 3)
    released = load(path, frames=121)  # 121 frames at 768x512: 16 latent frames of 16x24, 5.04 s of audio
    assert released.latent_shape(512, 768) == (16 * 16 * 24 + 126, 4)
    for size, message in (((48, 96), "divisible by 32"), ((32, 64), "at least 64")):
        with pytest.raises(ValueError, match=message):
            policy.video_grid(*size)
    lora = get_peft_model(copy.deepcopy(policy.transformer), LoraConfig(r=2, target_modules=policy.lora_targets))
    names = [name for name, _ in lora.named_modules() if name.endswith("lora_A")]
    assert len(names) == 14 * 2  # the video stream's 14 projections in each block, none of the audio stream's
    assert not any(part in n for n in names for part in ("audio_attn", "audio_ff", "video_to_audio"))
    assert LOADERS["ltx2"] is ltx2.load


def test_encode_prompts_match_the_pipeline(policy, pipeline):
    """Gemma-3's stacked hidden states through the connectors, as the pipeline encodes them: exactly its conditions,
    left-padded with BOS first; the registers fill the padding, so every position is attended. Gemma-3's LM head
    runs for the last position only (its logits are not used)."""
    heads = []
    hook = policy.text_encoder.get_output_embeddings().register_forward_hook(lambda m, i, o: heads.append(o.shape[1]))
    cond = policy.encode_prompts(PROMPTS)
    hook.remove()
    assert heads == [1]
    assert cond["video"].shape == cond["audio"].shape == (2, TEXT, 16) and cond["mask"].all()
    ids = policy.tokenizer("a red cat", padding="max_length", max_length=TEXT).input_ids
    assert ids[0] == policy.tokenizer.pad_token_id and ids[-10] == policy.tokenizer.bos_token_id
    with torch.no_grad():
        embeds, mask, negative, negative_mask = pipeline.encode_prompt(PROMPTS, NEGATIVE, max_sequence_length=TEXT)
        video, audio, connector_mask = pipeline.connectors(embeds, mask, padding_side="left")
    torch.testing.assert_close(cond["video"], video, rtol=0, atol=0)
    torch.testing.assert_close(cond["audio"], audio, rtol=0, atol=0)
    assert torch.equal(cond["mask"], connector_mask.bool())
    assert (cond["video"][0] - cond["video"][1]).abs().max() > 1e-3


def test_schedule_matches_the_scheduler(policy, path):
    """The pipeline's sigmas (linspace(1, 1/N, N), mu from the video's tokens, the terminal stretch to 0.1) through
    the released scheduler config, at the tiny size and at the released one (mu past its 4096-token maximum)."""
    released = load(path, frames=121)
    for mine, (height, width), steps in ((policy, (HEIGHT, WIDTH), 4), (released, (512, 768), 30)):
        f, h, w = mine.video_grid(height, width)
        scheduler = FlowMatchEulerDiscreteScheduler(**tiny.LTX2_SCHEDULER)
        scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=calculate_shift(f * h * w, 1024, 4096,
                                                                                               0.95, 2.05))  # fmt: skip
        sigmas = mine.schedule(steps, height, width)
        assert sigmas.dtype == torch.float32 and sigmas[-1] == 0 and math.isclose(float(sigmas[-2]), 0.1, rel_tol=1e-5)
        torch.testing.assert_close(sigmas, scheduler.sigmas, rtol=0, atol=1e-6)
    torch.testing.assert_close(policy.train_sigmas(), FlowMatchEulerDiscreteScheduler(**tiny.LTX2_SCHEDULER).sigmas,
                               rtol=0, atol=1e-6)  # fmt: skip


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_ode_sampling_matches_the_pipeline(policy, pipeline, guidance):
    """Same noise (video tokens as the pipeline's packed latents, the audio's given denormalised, as the pipeline
    normalises them), the same steps: our sampling and decode give the pipeline's video, without and with CFG."""
    shape = policy.latent_shape(HEIGHT, WIDTH)
    cond = policy.encode_prompts(PROMPTS)
    uncond = policy.encode_prompts(NEGATIVE) if guidance != 1.0 else None
    out = sample(policy.velocity, [torch.Generator().manual_seed(s) for s in SEEDS], shape,
                 policy.schedule(STEPS, HEIGHT, WIDTH), cond, uncond, guidance=guidance, window=0)  # fmt: skip
    video = policy.decode(out.final)
    noise = per_sample_noise([torch.Generator().manual_seed(s) for s in SEEDS], shape)
    audio_vae, n = pipeline.audio_vae, 2 * 2 * 3
    with torch.no_grad():
        expected = pipeline(PROMPTS, negative_prompt=NEGATIVE, height=HEIGHT, width=WIDTH, num_frames=FRAMES,
                            num_inference_steps=STEPS, guidance_scale=guidance, latents=noise[:, :n],
                            audio_latents=noise[:, n:] * audio_vae.latents_std + audio_vae.latents_mean,
                            max_sequence_length=TEXT, output_type="pt", **PLAIN).frames  # fmt: skip
    assert video.shape == expected.shape == (2, FRAMES, 3, HEIGHT, WIDTH)
    torch.testing.assert_close(video, expected, rtol=1e-4, atol=1e-4)
    assert (video[0] - video[1]).abs().max() > 1e-3  # different seeds and prompts, different videos


def test_bad_inputs_fail_clearly(policy, path, tmp_path):
    with pytest.raises(ValueError, match="model.path is required for model.arch=ltx2"):
        ltx2.load(ModelConfig(arch="ltx2"))
    (tmp_path / "transformer").mkdir()
    with pytest.raises(FileNotFoundError, match=r"not a LTX2Pipeline folder: missing vae/, audio_vae/"):
        ltx2.load(ModelConfig(arch="ltx2", path=str(tmp_path)))
    with pytest.raises(ValueError, match=r"model.frames=12: \(frames - 1\) must be divisible by .* 8 \(e.g. 9\)"):
        load(path, frames=12)
    with pytest.raises(ValueError, match="model.text_tokens=12: .* 8 learned registers .* multiple of 8"):
        load(path, text_tokens=12)
    other = copy.copy(policy)
    other.latent_shape(64, 64)
    with pytest.raises(ValueError, match="latents of 21 tokens do not match the video grid"):
        other.velocity(torch.zeros(1, 21, 4), torch.ones(1), policy.encode_prompts(PROMPTS[:1]))
    with pytest.raises(ConfigError, match="engine.sequence_parallel=2: .* not the audio tokens"):
        validate(apply_overrides(RECIPES["ltx2_t2v_ocr_flowgrpo_lora"](), ["engine.sequence_parallel=2"]))


@pytest.fixture(scope="module")
def ocr(tmp_path_factory):
    root = tmp_path_factory.mktemp("ltx2_ocr")
    (root / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (root / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(root, root / "data")
    return root / "data" / "train.parquet", root / "data" / "test.parquet"


@pytest.mark.parametrize("name", ["ltx2_t2v_ocr_flowgrpo_lora", "ltx2_t2v_ocr_nft_lora"])
def test_recipe_runs_two_steps(name, path, ocr, tmp_path):
    """The base recipe (CPS window, LoRA on the video stream) and the NFT variant two steps on the tiny twin, scoring
    each frame's JPEG size: the training path is what this checks (tests/test_config.py validates the recipes)."""
    config = RECIPES[name]()
    small = [f"model.path={path}", "model.dtype=float32", f"model.frames={FRAMES}", f"model.text_tokens={TEXT}",
             f"data.prompts={ocr[0]}", f"data.val_prompts={ocr[1]}", "data.prompts_per_step=2", "rollout.n=2",
             "rollout.height=64", "rollout.width=64", "rollout.steps=4", "rollout.val_steps=2",
             "actor.micro_batch_size=4", "actor.mini_batch_size=none", "model.lora.rank=4", "model.lora.alpha=8",
             "engine.activation_checkpointing=false", "trainer.total_steps=2", "trainer.val_every=2",
             "trainer.save_every=2", "trainer.progress=false", f"trainer.output_dir={tmp_path}",
             'reward.weights={"jpeg_compressibility": 1}', 'reward.per_frame={"jpeg_compressibility": "mean"}',
             "rollout.window_end=3", "algorithm.nft_timesteps=2"]  # fmt: skip
    if config.rollout.window_size:
        small.append("rollout.window_size=2")
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    assert ("actor/clip_frac" if config.algorithm.name == "flowgrpo" else "actor/nft/positive") in records[1]


def test_full_size_ltx2_has_the_released_parameter_counts():
    """`omnialign bench recipe`'s LTX-2 builder on the meta device: the released transformer (18.88 B), connectors,
    video VAE and Gemma-3-12B with its SigLIP tower; 126 audio tokens for 121 frames; the FLOP count equals a block's
    linear layers over their streams' tokens plus the six attentions' products."""
    policy = full_ltx2(torch.device("meta"), ModelConfig(arch="ltx2", frames=121))
    parts = (policy.transformer, policy.connectors, policy.vae, policy.text_encoder)
    assert [sum(p.numel() for p in m.parameters()) for m in parts] == [18_876_174_592, 1_431_475_200, 1_222_479_601,
                                                                       12_187_325_040]  # fmt: skip
    assert len(policy.blocks()) == 48 and policy.audio_tokens == 126 and policy.video_grid(512, 768) == (16, 16, 24)
    with torch.device("meta"):
        block = LTX2VideoTransformer3DModel(**LTX2_TRANSFORMER, num_layers=1).transformer_blocks[0]
    n, m, t, d, a = 6144, 126, 1024, 4096, 2048
    tokens = {
        "attn1": (n, n),
        "attn2": (n, t),
        "ff": (n, n),
        "audio_attn1": (m, m),
        "audio_attn2": (m, t),
        "audio_ff": (m, m),
        "audio_to_video_attn": (n, m),
        "video_to_audio_attn": (m, n),
    }  # (queries, keys)
    linear = 0
    for name, module in block.named_modules():
        if isinstance(module, torch.nn.Linear):
            queries, keys = tokens[name.split(".")[0]]
            linear += 2 * module.in_features * module.out_features * (keys if name.endswith(("to_k", "to_v")) else
                                                                      queries)  # fmt: skip
    products = 4 * (n * n * d + n * t * d + m * m * a + m * t * a + 2 * n * m * a)
    assert ltx2_flops(1, d, a, n, m, t) == linear + products
