"""The glyphs world: renderer, augmentation and negatives, tiny policy twin, shipped weights, the reward's
recognizer, the gold judge and the pretraining script."""

import json
from pathlib import Path

import pytest
import torch

from omnialign.cli import main as cli
from omnialign.config import ModelConfig
from omnialign.diffusion.sampling import sample
from omnialign.worlds.glyphs import model as glyphs
from omnialign.worlds.glyphs.data import (
    ASSETS,
    NEGATIVE_KINDS,
    PROMPT_SETS,
    SIZE,
    augment,
    bold_or_hazy,
    negatives,
    render,
    variants,
)
from omnialign.worlds.glyphs.gold import glyph_gold
from omnialign.worlds.glyphs.pretrain import PretrainConfig, prepare_glyphs
from omnialign.worlds.glyphs.recognizer import glyph_ocr
from omnialign.worlds.glyphs.shape import shape_accepts


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


def test_variants_are_every_render():
    """`render` only ever draws one of `variants` (what pretraining samples from), and every variant is distinct."""
    bank = variants("7")
    assert bank.shape == (250, 1, SIZE, SIZE) and len(torch.unique(bank.flatten(1), dim=0)) == 250
    drawn = render(["7"] * 20, seed=3)
    assert all((bank == image).flatten(1).all(1).any() for image in drawn)


def test_augment_and_negatives_are_seeded_images():
    g = torch.Generator().manual_seed(0)
    images = augment(render(list("0123"), seed=1), g)
    assert images.shape == (4, 1, SIZE, SIZE) and images.min() >= -1 and images.max() <= 1
    torch.testing.assert_close(images, augment(render(list("0123"), seed=1), torch.Generator().manual_seed(0)))
    neg, kind = negatives(90, torch.Generator().manual_seed(1))
    assert neg.shape == (90, 1, SIZE, SIZE) and set(kind.tolist()) == set(range(len(NEGATIVE_KINDS)))


def test_shipped_gold_judge_reads_renders_and_rejects_negatives():
    """The issue's bar: at least 0.97 on the renderer's images, at least 95% of negatives not a digit."""
    texts = PROMPT_SETS["digits"] * 30
    images = (render(texts, seed=4242) + 1) / 2
    verdict = glyph_gold(images, texts)
    assert sum(verdict) / len(texts) >= 0.97 and sum(i["strict"] for i in verdict.info) / len(texts) >= 0.97
    hazy = (bold_or_hazy(render(texts, seed=4244), torch.Generator().manual_seed(4244)) + 1) / 2
    verdict = glyph_gold(hazy, texts)  # bold or on a haze, but legible: still a digit, of its shape too
    assert sum(verdict) / len(texts) >= 0.95 and sum(i["strict"] for i in verdict.info) / len(texts) >= 0.95
    digits = torch.tensor([int(t) for t in texts])  # the shape check alone, on another digit's renders (0.083)
    assert shape_accepts(images, (digits + 3) % 10).float().mean() <= 0.15
    wrong = [str((int(t) + 3) % 10) for t in texts]
    assert sum(glyph_gold(images, wrong)) == 0
    neg, kind = negatives(600, torch.Generator().manual_seed(4243))
    verdict = glyph_gold((neg + 1) / 2, ["8"] * 600)
    not_a_digit = torch.tensor([i["not_a_digit"] for i in verdict.info])
    assert not_a_digit.mean() >= 0.95 and {i["reads"] for i in verdict.info} >= {"-"}
    with pytest.raises(ValueError, match="single digits"):
        glyph_gold(images[:1], ["12"])


def judged(folder: Path) -> tuple[list[str], list[float], list[dict]]:
    """glyph_gold on a person-labelled folder of benchmarks/glyphs: each image's mark ("yes" readable, "no"
    unreadable, "unsure"), the gold judge's scores and their info, in the labels' order."""
    marks, right, info = [], [], []
    for name, labels in json.loads((folder / "labels.json").read_text()).items():
        saved = torch.load(folder / f"{name}.pt")
        verdict = glyph_gold(saved["images"].float() / 255, saved["prompts"])
        right += verdict
        info += verdict.info
        marks += ["no" if i in labels["no"] else "unsure" if i in labels["unsure"] else "yes" for i in range(80)]
    return marks, right, info


def test_shipped_gold_judge_against_a_persons_reading():
    """Issue 29: on 320 step-300 RL samples that a person labelled (benchmarks/glyphs/judged: readable as the
    prompted digit, unreadable, unsure), the gold judge with its confidence floor (MIN_PROB) accepts at most a
    quarter of the unreadable ones (by its plain argmax it accepted 34 of 52) and at least 93% of the readable ones,
    and each run's gold accuracy lies within what the person read (readable, up to readable or unsure). Its `strict`
    verdict (the shape check too) accepts at most 6 unreadable ones (5 on 2026-12-02, the network alone 10) and at
    least 90% of the readable ones (93.6%)."""
    marks, right, info = judged(Path(__file__).parents[1] / "benchmarks" / "glyphs" / "judged")
    strict = [i["strict"] for i in info]
    assert marks.count("no") == 52 and marks.count("yes") == 219
    rate = {m: sum(r for r, k in zip(right, marks) if k == m) / marks.count(m) for m in ("yes", "no")}
    assert rate["no"] <= 0.25 and rate["yes"] >= 0.93, rate
    strict_rate = {m: sum(r for r, k in zip(strict, marks) if k == m) / marks.count(m) for m in ("yes", "no")}
    assert strict_rate["no"] <= 6 / 52 and strict_rate["yes"] >= 0.9, strict_rate
    for run in range(4):
        part = slice(80 * run, 80 * run + 80)
        low, high = marks[part].count("yes") / 80, 1 - marks[part].count("no") / 80
        assert low <= sum(right[part]) / 80 <= high, (run, low, sum(right[part]) / 80, high)


def test_shipped_person_judge_accepts_no_unreadable_image_of_three_labelled_sets():
    """Issue 29, item 3: `val/gold/person` (the gold judge fine-tuned on 640 RL samples a person labelled, read at
    probability 0.9) on the three labelled sets it was not trained on (960 step-300 samples of twelve runs): under 2%
    of the images a person would not read as the prompted digit (none of 165 on 2026-12-04), at least 97% of clean
    renders (98.5%), and still most readable images (at least 60% of each set's; 65-81%)."""
    folders = [Path(__file__).parents[1] / "benchmarks" / "glyphs" / name
               for name in ("judged", "judged_84a7a35", "judged_24")]  # fmt: skip
    for folder in folders:
        marks, _, info = judged(folder)
        person = [i["person"] for i in info]
        rate = {m: sum(r for r, k in zip(person, marks) if k == m) / marks.count(m) for m in ("yes", "no")}
        assert rate["no"] < 0.02 and rate["yes"] >= 0.6, (folder.name, rate)
    texts = PROMPT_SETS["digits"] * 30
    verdict = glyph_gold((render(texts, seed=4242) + 1) / 2, texts)
    assert sum(i["person"] for i in verdict.info) / len(texts) >= 0.97


def test_shipped_recognizer_reads_renders_and_rejects_negatives():
    """Blobs, ovals with dots, textures and superposed digits score near 0 for every digit."""
    texts = PROMPT_SETS["digits"] * 5 + PROMPT_SETS["pairs"][::10]
    images = (render(texts, seed=123) + 1) / 2
    probs = torch.tensor(glyph_ocr(images, texts))
    assert probs[:50].mean() > 0.95 and probs[50:].mean() > 0.9
    wrong = torch.tensor(glyph_ocr(images[:50], [str((int(t) + 1) % 10) for t in texts[:50]]))
    assert wrong.mean() < 0.05
    neg, _ = negatives(200, torch.Generator().manual_seed(9))
    best = torch.stack([torch.tensor(glyph_ocr((neg + 1) / 2, [d] * 200)) for d in PROMPT_SETS["digits"]]).amax(0)
    assert best.mean() < 0.05


def test_shipped_base_model_is_legible_and_imperfect_by_design():
    """ODE samples of the shipped base: the gold judge reads most as digits (at most 20% not a digit) but the
    prompted digit only part of the time (the issue's floor 0.35), as its pretraining report says."""
    policy = glyphs.load()
    assert sum(p.numel() for p in policy.transformer.parameters()) < 2_000_000
    texts = [d for d in PROMPT_SETS["digits"] for _ in range(8)]
    generators = [torch.Generator().manual_seed(2**40 + i) for i in range(len(texts))]
    with torch.no_grad():
        out = sample(policy.velocity, generators, (1, SIZE, SIZE), policy.schedule(10, SIZE, SIZE),
                     policy.encode_prompts(texts))  # fmt: skip
    verdict = glyph_gold(policy.decode(out.final), texts)
    accuracy, not_a_digit = sum(verdict) / len(texts), sum(i["not_a_digit"] for i in verdict.info) / len(texts)
    assert 0.35 <= accuracy <= 0.75 and not_a_digit <= 0.2, (accuracy, not_a_digit)
    report = json.loads((ASSETS / "pretrain.json").read_text())
    final = report["final_judges"]["base"]  # the base judged by the shipped gold judge and recognizer
    assert 0.35 <= final["gold_accuracy"] <= 0.75 and final["not_a_digit"] <= 0.2
    assert report["gold"]["accuracy/renders"] >= 0.97 and report["gold"]["not_a_digit/all_negatives"] >= 0.95


@pytest.mark.slow
def test_prepare_glyphs_stages_write_loadable_models(tmp_path):
    """A few steps of each model stage (the full run is documented in pretrain.py): everything loads back. Slow: 50 s
    on CI's two cores, for a script that builds the shipped weights (the video stages' test runs in CI)."""
    stages = ["gold", "recognizer", "teacher", "base", "person"]
    config = PretrainConfig(out=str(tmp_path), device="cpu", gold_steps=2, recognizer_steps=2, clean_steps=2,
                            noisy_steps=2, noisy_batch=16, eval_every=2, eval_count=50, person_steps=2,
                            stages=stages)  # fmt: skip
    report = prepare_glyphs(config)
    assert set(report["seconds"]) >= {f"{stage} (cpu)" for stage in stages} | {"total"}
    assert (tmp_path / "gold" / "person_labels.pt").exists() and 0 <= report["person"]["accuracy/renders"] <= 1
    assert report["base"][-1]["step"] == 2 and 0 <= report["base"][-1]["not_a_digit"] <= 1
    policy = glyphs.load(ModelConfig(path=str(tmp_path)))
    assert policy.encode_prompts(["3"])["hidden"].shape[0] == 1
    teacher = glyphs.load(ModelConfig(path=str(tmp_path / "teacher")))
    torch.testing.assert_close(teacher.encode_prompts(["3"])["hidden"], policy.encode_prompts(["3"])["hidden"])
    verdict = glyph_gold(torch.zeros(1, 1, SIZE, SIZE), ["3"], path=str(tmp_path / "gold"),
                         person_path=str(tmp_path / "gold_person"))  # fmt: skip
    assert sum(verdict) in (0.0, 1.0) and verdict.info[0]["person"] in (0.0, 1.0)
    with pytest.raises(ValueError, match="unknown"):
        prepare_glyphs(PretrainConfig(out=str(tmp_path), stages=["nothing"]))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_prepare_glyphs_needs_its_out_folder_and_a_device_that_exists(tmp_path):
    with pytest.raises(SystemExit):  # no --out: the shipped assets are replaced only when named
        cli(["prepare", "glyphs"])
    with pytest.raises(SystemExit, match="--device cuda: this torch .* sees no CUDA device; pass --device cpu"):
        cli(["prepare", "glyphs", "--out", str(tmp_path / "world"), "--device", "cuda"])
    assert not (tmp_path / "world").exists()
