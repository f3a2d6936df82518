"""The glyphs edit task: its data, reward, gold judge, edit model, and how the trainer hands sources around."""

import numpy as np
import pytest
import torch

from omnialign.config import ModelConfig, apply_overrides, validate
from omnialign.data.prompts import load_prompt_set, source_images
from omnialign.diffusion.sampling import sample
from omnialign.recipes import RECIPES
from omnialign.train import main
from omnialign.trainer.online import with_sources
from omnialign.worlds.glyphs.data import ASSETS, CHARSET, SIZE, draw, edit_set, ink_box
from omnialign.worlds.glyphs.edit import glyph_edit, glyph_edit_gold
from omnialign.worlds.glyphs.gold import load_gold
from omnialign.worlds.glyphs.model import GlyphsPolicy, edit_transformer, load


def test_ink_box_of_a_drawn_rectangle():
    image = torch.zeros(2, 1, SIZE, SIZE)
    image[0, 0, 4:10, 20:23] = 1.0  # rows 4..9, columns 20..22
    box = ink_box(image)
    assert box[0].tolist() == [21.0, 6.5, 6.0]
    assert box[1].tolist() == [SIZE / 2, SIZE / 2, 0.0]  # empty


def test_edit_set_sources_show_another_digit_where_the_requested_one_belongs():
    prompts, metadata = edit_set(40, seed=3)
    assert sorted(set(prompts)) == list(CHARSET) and prompts.count("0") == 4
    sources = torch.stack([m["sources"][0] for m in metadata])  # (40, 1, SIZE, SIZE) in [0, 1]
    assert sources.shape == (40, 1, SIZE, SIZE) and 0 <= sources.min() and sources.max() <= 1
    assert all(m["source_digit"] != p for p, m in zip(prompts, metadata))
    reads = load_gold()(sources * 2 - 1).argmax(-1).tolist()
    assert [CHARSET[r] for r in reads] == [m["source_digit"] for m in metadata]
    # the requested digit drawn at the source's geometry has the source's box height and vertical centre
    boxes = torch.tensor([m["target_box"] for m in metadata])
    assert torch.equal(boxes[:, 1:], ink_box(sources)[:, 1:])
    assert (boxes[:, 0] - ink_box(sources)[:, 0]).abs().max() <= 1.5


def _renders(texts: list[str], geometry: tuple[int, int, int, int]) -> torch.Tensor:
    return torch.from_numpy(np.stack([draw(t, *geometry) for t in texts])).float().div(255).unsqueeze(1)


def test_edit_reward_and_gold_judge_reward_the_requested_digit_in_place():
    geometry = (22, 0, 3, -2)
    meta = [{"sources": [_renders(["4"], geometry)[0]], "source_digit": "4",
             "target_box": ink_box(_renders(["7"], geometry))[0].tolist()}]  # fmt: skip
    right = _renders(["7"], geometry)
    moved = _renders(["7"], (22, 0, -1, -2))  # 4 px to the left
    copied = _renders(["4"], geometry)
    reward = glyph_edit(torch.cat([right, moved, copied]), ["7"] * 3, meta * 3)
    keep = [i["keep"] for i in reward.info]
    assert keep[0] == pytest.approx(np.exp(-0.5 / 4), abs=1e-6)  # the box of the 7 is centred 0.5 px off the 4's
    assert reward[0] > 0.95 * keep[0]
    assert keep[1] == pytest.approx(np.exp(-3.5 / 4), abs=1e-6)
    assert reward[1] == pytest.approx(reward[0] * np.exp(-3 / 4), rel=0.05)
    assert reward[2] < 0.01
    gold = glyph_edit_gold(torch.cat([right, moved, copied]), ["7"] * 3, meta * 3)
    assert list(gold) == [1.0, 1.0, 0.0]
    assert [(i["kept"], i["copied"], i["edited"]) for i in gold.info] == [(1, 0, 1), (0, 0, 0), (1, 1, 0)]
    with pytest.raises(ValueError, match="target_box"):
        glyph_edit_gold(right, ["7"], [{"sources": meta[0]["sources"]}])
    with pytest.raises(ValueError, match="sources"):
        glyph_edit(right, ["7"], [{}])


def test_edit_transformer_starts_as_the_text_to_image_model():
    base = load()
    edit = GlyphsPolicy(edit_transformer(base.transformer), base.text_encoder)
    assert edit.edits and not base.edits
    prompts, metadata = edit_set(4, seed=0)
    cond = edit.encode_prompts(prompts, [m["sources"] for m in metadata])
    x, sigma = torch.randn(4, 1, SIZE, SIZE), torch.tensor([0.9, 0.6, 0.4, 0.1])
    with torch.no_grad():
        assert torch.equal(edit.velocity(x, sigma, cond), base.velocity(x, sigma, base.encode_prompts(prompts)))
    with pytest.raises(ValueError, match="one grayscale"):
        edit.encode_prompts(prompts[:1], [[torch.zeros(3, SIZE, SIZE)]])


@torch.no_grad()
def test_shipped_edit_model_keeps_the_place_but_edits_only_part_of_the_time():
    """What RL has to fix: the shipped edit model draws in the source's place, often redrawing the source digit."""
    policy = load(ModelConfig(path=str(ASSETS / "edit")))
    prompts, metadata = load_prompt_set("edits_val")
    texts, meta = prompts * 3, metadata * 3
    generators = [torch.Generator().manual_seed(7 + i) for i in range(len(texts))]
    cond = policy.encode_prompts(texts, [m["sources"] for m in meta])
    images = policy.decode(sample(policy.velocity, generators, (1, SIZE, SIZE), policy.schedule(10, SIZE, SIZE),
                                  cond).final)  # fmt: skip
    gold = glyph_edit_gold(images, texts, meta)
    rate = {k: sum(i[k] for i in gold.info) / len(texts) for k in ("kept", "copied")}
    assert rate["kept"] >= 0.9, rate
    assert 0.2 <= rate["copied"] and sum(gold) / len(texts) <= 0.7, (rate, sum(gold) / len(texts))


def test_source_images_decode_paths_bytes_and_tensors(tmp_path):
    from PIL import Image

    Image.fromarray(np.full((6, 8, 3), 200, np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "bad.png").write_bytes(b"not an image")
    data = (tmp_path / "a.png").read_bytes()
    images = source_images({"sources": [str(tmp_path / "a.png"), data, torch.zeros(1, 4, 4)]})
    assert [tuple(i.shape) for i in images] == [(3, 6, 8), (3, 6, 8), (1, 4, 4)]
    assert images[0].max().item() == pytest.approx(200 / 255)
    with pytest.raises(ValueError, match="item 5: source 0 .*bad.png.* not a readable image"):
        source_images({"sources": [str(tmp_path / "bad.png")]}, "item 5")
    with pytest.raises(ValueError, match='no "sources"'):
        source_images({}, "item 1")


def test_validation_grid_puts_each_source_before_its_results():
    images = torch.rand(4, 3, 16, 16)
    grid, captions, columns = with_sources(
        images, ["a", "b", "c", "d"], [torch.ones(1, 8, 8), torch.zeros(3, 32, 32)], 2
    )
    assert grid.shape == (6, 3, 16, 16) and columns == 3
    assert captions == ["source", "a", "b", "source", "c", "d"]
    assert torch.allclose(grid[0], torch.ones(3, 16, 16)) and torch.equal(grid[4], images[2])


@pytest.mark.parametrize("recipe, prompts", [("glyphs", "edits"), ("glyphs_edit", "digits")])
def test_trainer_refuses_prompts_that_do_not_fit_the_model(recipe, prompts, tmp_path):
    config = validate(apply_overrides(RECIPES[recipe](), [f"data.prompts={prompts}", f"trainer.output_dir={tmp_path}"]))
    with pytest.raises(ValueError, match="data.prompts=.*prompts have source images"):
        main(config)


def test_a_bad_source_among_the_training_prompts_fails_at_the_start_naming_it(tmp_path):
    """A source that only a training prompt uses, and that is unreadable (a truncated PNG), fails when the trainer
    starts, naming the prompt and the file, not at the step that first draws it (hours later)."""
    import json

    from PIL import Image

    Image.fromarray(draw("3", 24, 0, 0, 0)).save(tmp_path / "good.png")
    (tmp_path / "bad.png").write_bytes((tmp_path / "good.png").read_bytes()[:100])
    rows = [{"prompt": "7", "sources": ["good.png"]}, {"prompt": "5", "sources": ["good.png"]},
            {"prompt": "1", "sources": ["bad.png"]}]  # fmt: skip
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = validate(apply_overrides(RECIPES["glyphs_edit"](), [f"data.prompts={tmp_path / 'train.jsonl'}",
                                                                 f"trainer.output_dir={tmp_path}"]))  # fmt: skip
    with pytest.raises(ValueError, match=r"data.prompts item 2: source 0 \(.*bad.png\) is not a readable image"):
        main(config)
    assert not (tmp_path / "glyphs_edit" / "metrics.jsonl").exists()
