"""The glyphs video task: its rewards read every frame, its tiny Wan policy round-trips, the shipped video model is
what RL has to fix, and its pretraining stage writes a loadable model."""

import numpy as np
import pytest
import torch
from PIL import Image

from omnialign.config import ModelConfig
from omnialign.diffusion.sampling import sample
from omnialign.metrics import save_grid
from omnialign.worlds.glyphs import video
from omnialign.worlds.glyphs.data import FRAMES, SIZE, variants
from omnialign.worlds.glyphs.model import CharEncoder
from omnialign.worlds.glyphs.pretrain import PretrainConfig, prepare_glyphs, save_policy
from omnialign.worlds.glyphs.video import GlyphsVideoPolicy, glyph_video, glyph_video_gold, video_transformer

STYLE = 137  # one of the renderer's 250 styles (size, stroke, offset), shared by a clip's frames


def clip(digits: str) -> torch.Tensor:
    """A clip (F, 1, SIZE, SIZE) in [0, 1] drawing one digit per frame ("-": a blank frame) in one style."""
    frames = [torch.full((1, SIZE, SIZE), -1.0) if d == "-" else variants(d)[STYLE] for d in digits]
    return (torch.stack(frames) + 1) / 2


def test_rewards_read_the_prompted_digit_on_every_frame():
    videos = torch.stack([clip("3333"), clip("3553"), clip("----"), clip("7777")])
    prompts, meta = ["3"] * 4, [{}] * 4
    gold = glyph_video_gold(videos, prompts, meta)
    assert list(gold) == [1.0, 0.5, 0.0, 0.0]
    assert [i["reads"] for i in gold.info] == ["3333", "3553", "----", "7777"]
    assert [i["clip"] for i in gold.info] == [1.0, 0.0, 0.0, 0.0]
    assert [i["not_a_digit"] for i in gold.info] == [0, 0, 1, 0]
    assert [i["steady"] for i in gold.info] == [1.0, 0.0, 0.0, 1.0]  # one digit throughout, right or wrong
    videos, prompts, meta = videos[:3], prompts[:3], meta[:3]
    reward = glyph_video(videos, prompts, meta)
    frames = torch.tensor([i["frames"] for i in reward.info])
    torch.testing.assert_close(torch.tensor(list(reward)), frames.mean(1), rtol=1e-6, atol=1e-7)
    assert frames[0].min() > 0.9 and frames[1, 1:3].max() < 0.1 and frames[2].max() < 0.1  # what each frame shows
    assert reward[0] > reward[1] > reward[2]
    with pytest.raises(ValueError, match=r"glyph_video reads the prompt's digit on every frame: prompts \['34'\]"):
        glyph_video(videos[:1], ["34"], [{}])
    with pytest.raises(ValueError, match=r"scores videos \(B, F, 1 or 3, H, W\)"):
        glyph_video_gold(videos[:, 0], prompts, meta)


def test_tiny_video_policy_round_trips_and_decodes_clips(tmp_path):
    torch.manual_seed(0)
    save_policy(GlyphsVideoPolicy(video_transformer(), CharEncoder()), tmp_path)
    policy = video.load(ModelConfig(arch="glyphs_video", path=str(tmp_path)))
    assert policy.latent_shape(SIZE, SIZE) == (1, FRAMES, SIZE, SIZE) and not policy.edits
    x = torch.randn(2, *policy.latent_shape(SIZE, SIZE))
    with torch.no_grad():
        v = policy.velocity(x, torch.tensor([0.3, 0.9]), policy.encode_prompts(["1", "7"]))
    assert v.shape == x.shape and v.isfinite().all()
    videos = policy.decode(x)
    assert videos.shape == (2, FRAMES, 1, SIZE, SIZE) and 0 <= videos.min() and videos.max() <= 1
    torch.testing.assert_close(videos[:, 2, 0], (x[:, 0, 2].clamp(-1, 1) + 1) / 2)
    with pytest.raises(FileNotFoundError, match="--stages video"):
        video.load(ModelConfig(arch="glyphs_video", path=str(tmp_path / "missing")))


def test_shipped_video_model_draws_digits_often_not_the_asked_for_one():
    """What RL has to fix: the base draws digits, the asked-for one on about half of the frames (on 1280 clips at
    pretraining: 0.52 read right, 0.094 no digit; these 20 clips: 0.45 and 0.15)."""
    policy = video.load()
    prompts = [str(d) for d in range(10) for _ in range(2)]
    generators = [torch.Generator().manual_seed(3 + i) for i in range(len(prompts))]
    with torch.no_grad():
        x = sample(policy.velocity, generators, policy.latent_shape(SIZE, SIZE), policy.schedule(10, SIZE, SIZE),
                   policy.encode_prompts(prompts)).final  # fmt: skip
    gold = glyph_video_gold(policy.decode(x), prompts, [{}] * len(prompts))
    accuracy, no_digit = sum(gold) / len(gold), sum(i["not_a_digit"] for i in gold.info) / len(gold)
    assert 0.3 <= accuracy <= 0.7 and no_digit <= 0.25, (accuracy, no_digit)


def test_prepare_video_stage_writes_a_loadable_model(tmp_path):
    for part in ("gold", "recognizer"):  # the judges the stage evaluates with
        (tmp_path / part).symlink_to(video.ASSETS / part)
    config = PretrainConfig(out=str(tmp_path), device="cpu", video_steps=2, video_noisy_steps=2, video_batch=4,
                            eval_every=2, video_eval_seeds=1, stages=["video_teacher", "video"])  # fmt: skip
    report = prepare_glyphs(config)
    for stage in ("video_teacher", "video"):
        assert report[stage][-1]["step"] == 2 and 0 <= report[stage][-1]["gold_accuracy"] <= 1
        assert f"{stage} (cpu)" in report["seconds"]
    policy = video.load(ModelConfig(arch="glyphs_video", path=str(tmp_path / "video")))
    assert policy.encode_prompts(["3"])["hidden"].shape == (1, 4, 64)


def test_video_teacher_stage_continues_a_saved_model(tmp_path):
    """--video-init: the teacher stage starts from the saved video model (its patch too), not from scratch; at a
    vanishing learning rate the written model is the one it started from."""
    for part in ("gold", "recognizer"):
        (tmp_path / part).symlink_to(video.ASSETS / part)
    init = video.ASSETS / "video_teacher"
    config = PretrainConfig(out=str(tmp_path), device="cpu", video_steps=1, video_batch=2, video_lr=1e-12,
                            video_init=str(init), video_patch=2, eval_every=1, video_eval_seeds=1,
                            stages=["video_teacher"])  # fmt: skip
    prepare_glyphs(config)
    before = video.load(ModelConfig(arch="glyphs_video", path=str(init)))
    after = video.load(ModelConfig(arch="glyphs_video", path=str(tmp_path / "video_teacher")))
    assert after.transformer.config.patch_size == before.transformer.config.patch_size
    for a, b in zip(after.transformer.state_dict().values(), before.transformer.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_video_stage_stops_where_its_gold_has_fallen_to_the_target(tmp_path):
    """--video-stop-gold: the video stage ends at the first evaluation at or below the target (every evaluation is,
    at a target of 1) and ships the model evaluated there."""
    for part in ("gold", "recognizer"):
        (tmp_path / part).symlink_to(video.ASSETS / part)
    (tmp_path / "video_teacher").symlink_to(video.ASSETS / "video_teacher")
    config = PretrainConfig(out=str(tmp_path), device="cpu", video_noisy_steps=6, video_batch=2, eval_every=2,
                            video_eval_seeds=1, video_stop_gold=1.0, stages=["video"])  # fmt: skip
    report = prepare_glyphs(config)
    assert [e["step"] for e in report["video"]] == [2]
    assert (tmp_path / "video" / "transformer").is_dir()


def test_grid_shows_each_video_as_a_strip_of_frames(tmp_path):
    videos = torch.stack([clip("3333"), clip("35-3")])
    save_grid(videos, ["a", "b"], 2, tmp_path / "grid.png", scale=1)
    grid = Image.open(tmp_path / "grid.png")
    assert grid.size == (2 * (FRAMES * SIZE + FRAMES - 1 + 4), SIZE + 12 + 4) and grid.mode == "L"  # gray frames
    pixels = torch.from_numpy(np.asarray(grid.convert("L")).astype(np.int64))
    strip = pixels[2 : 2 + SIZE, FRAMES * SIZE + FRAMES - 1 + 4 + 2 :][:, : FRAMES * SIZE + FRAMES - 1]
    assert (strip[:, SIZE] == 255).all()  # the white line between the first two frames
    assert strip[:, 2 * (SIZE + 1) : 3 * SIZE + 2].max() == 0  # the blank third frame of the second clip


def test_grid_keeps_gray_images_gray_and_colour_images_in_colour(tmp_path):
    """One channel makes an 8-bit gray PNG, three an RGB one; each image is pasted at its place, scaled 2x."""
    gray = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])[None]  # (1, 1, 2, 2)
    save_grid(gray, ["x"], 1, tmp_path / "gray.png")
    image = Image.open(tmp_path / "gray.png")
    assert image.mode == "L" and image.size == (4 + 4, 4 + 12 + 4)
    assert np.asarray(image)[2:6, 2:6].tolist() == [[0, 0, 255, 255]] * 2 + [[255, 255, 0, 0]] * 2
    red = torch.zeros(1, 3, 2, 2)
    red[:, 0] = 1
    save_grid(red, ["y"], 1, tmp_path / "red.png")
    image = Image.open(tmp_path / "red.png")
    assert image.mode == "RGB" and (np.asarray(image)[2:6, 2:6] == [255, 0, 0]).all()
