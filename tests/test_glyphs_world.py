"""The glyphs world: renderer, tiny policy twin, shipped weights, recognizer."""

import json

import pytest
import torch

from omnialign.config import ModelConfig
from omnialign.worlds.glyphs import model as glyphs
from omnialign.worlds.glyphs.data import PROMPT_SETS, SIZE, render
from omnialign.worlds.glyphs.pretrain import textures
from omnialign.worlds.glyphs.recognizer import glyph_ocr, load_recognizer


def test_render_is_seeded_and_scaled():
    a, b = render(["3", "42"], seed=5), render(["3", "42"], seed=5)
    assert a.shape == (2, 1, SIZE, SIZE) and torch.equal(a, b)
    assert a.min() >= -1 and a.max() <= 1 and a.max() > 0.5  # a glyph was drawn
    assert not torch.equal(render(["3"], seed=6), a[:1])  # jitter depends on the seed


def test_tiny_policy_round_trips_through_save_pretrained(tmp_path):
    torch.manual_seed(0)
    policy = glyphs.GlyphsPolicy(glyphs.tiny_transformer(dim=32, layers=1), glyphs.CharEncoder(dim=32, pooled_dim=32))
    policy.transformer.save_pretrained(tmp_path / "transformer")
    policy.text_encoder.save_pretrained(tmp_path / "text_encoder")
    loaded = glyphs.load(ModelConfig(path=str(tmp_path)))
    x, sigma = torch.randn(2, 1, SIZE, SIZE), torch.tensor([0.3, 0.9])
    cond = loaded.encode_prompts(["7", "12"])
    assert cond["hidden"].shape[0] == 2
    v = loaded.velocity(x, sigma, cond)
    assert v.shape == x.shape
    torch.testing.assert_close(v, policy.velocity(x, sigma, policy.encode_prompts(["7", "12"])))
    assert not any(p.requires_grad for p in loaded.text_encoder.parameters())
    assert len(loaded.blocks()) == 1


def test_bad_prompt_and_missing_model_fail_clearly(tmp_path):
    with pytest.raises(ValueError, match="'x7'"):
        glyphs.CharEncoder().tokenize(["x7"])
    with pytest.raises(FileNotFoundError, match="omnialign prepare glyphs"):
        glyphs.load(ModelConfig(path=str(tmp_path)))


def test_shipped_recognizer_reads_renders_and_rejects_textures():
    texts = PROMPT_SETS["digits"] * 5 + PROMPT_SETS["pairs"][::10]
    images = (render(texts, seed=123) + 1) / 2
    probs = torch.tensor(glyph_ocr(images, texts))
    assert probs[:50].mean() > 0.95 and probs[50:].mean() > 0.9
    wrong = torch.tensor(glyph_ocr(images[:50], [str((int(t) + 1) % 10) for t in texts[:50]]))
    assert wrong.mean() < 0.05
    noise = (textures(40, torch.Generator().manual_seed(9)) + 1) / 2
    assert torch.tensor(glyph_ocr(noise, ["3"] * 40)).mean() < 0.05
    recognizer = load_recognizer()
    assert recognizer.string_log_prob(noise * 2 - 1, [""] * 40).exp().mean() > 0.9


def test_shipped_base_model_is_imperfect_by_design():
    report = json.loads((glyphs.ASSETS / "pretrain.json").read_text())
    assert 0.3 <= report["generator"][-1]["ode_reward"] <= 0.7
    policy = glyphs.load()
    assert sum(p.numel() for p in policy.transformer.parameters()) < 2_000_000
