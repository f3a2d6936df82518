"""The SD3.5 OCR recipes: each validates at its published size, and each runs 2 steps end to end on the tiny random
pipeline (on a GPU where there is one), scoring JPEG size: the training path is what this checks (GARDO ranks it
against its opposite, so its gate has samples to pick)."""

import math

import pytest

from omnialign.config import apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.metrics import read_metrics
from omnialign.models import tiny
from omnialign.recipes import RECIPES
from omnialign.train import main

NAMES = [name for name in RECIPES if name.startswith("sd3_ocr")]
EXPECTED = {"flowgrpo": "actor/clip_frac", "awm": "actor/clip_frac", "dgpo": "actor/dgpo/weight",
            "gardo": "gardo/gated", "tempflow": "actor/clip_frac"}  # fmt: skip


@pytest.mark.parametrize("name", NAMES)
def test_recipe_validates_with_its_reference_settings(name):
    c = validate(RECIPES[name]())
    assert c.name == c.recipe == name and c.model.arch == "sd3" and c.model.path == "models/stable-diffusion-3.5-medium"
    assert c.algorithm.name == name.split("_ocr_")[1].removesuffix("_lora") and c.reward.weights["ocr"] == 1.0
    assert (c.rollout.height, c.rollout.width, c.rollout.val_steps, c.model.lora.rank > 0) == (512, 512, 40, True)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("sd3_recipes")
    prompts = root / "ocr"
    prompts.mkdir()
    (prompts / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (prompts / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(prompts, root / "data")
    return tiny.sd3(root / "model"), root / "data"


@pytest.mark.parametrize("name", NAMES)
def test_sd3_recipe_runs_two_steps(name, assets, tmp_path):
    model, data = assets
    config = RECIPES[name]()
    small = [f"model.path={model}", "model.dtype=float32", f"data.prompts={data / 'train.parquet'}",
             f"data.val_prompts={data / 'test.parquet'}", "data.prompts_per_step=2", "rollout.n=2",
             "rollout.height=32", "rollout.width=32", "rollout.steps=4", "rollout.val_steps=4",
             "rollout.micro_batch_size=4", "actor.micro_batch_size=4", "actor.mini_batch_size=none",
             "model.lora.rank=4", "model.lora.alpha=8", "engine.activation_checkpointing=false",
             "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
             "rollout.window_end=3", f"rollout.window_size={min(config.rollout.window_size, 2)}",
             f"trainer.output_dir={tmp_path}", 'reward.weights={"jpeg_compressibility": 1}']  # fmt: skip
    if config.algorithm.name == "awm":
        small.append("algorithm.awm_timesteps=2")  # of the 3 steps after the first
    if config.algorithm.name == "dgpo":
        small += ["algorithm.dgpo_timesteps=2", "algorithm.dgpo_first_steps=3"]  # of the 4 steps
    if config.algorithm.name == "gardo":
        small += ['reward.weights={"jpeg_compressibility": 1, "jpeg_incompressibility": 0}', "reward.options={}",
                  'algorithm.gardo_auxiliary=["jpeg_incompressibility"]']  # fmt: skip
    if config.algorithm.name == "tempflow":  # one prompt's 2 trunks x 2 branches at steps 0 and 1: 8 images and rows
        small += ["data.prompts_per_step=1", "rollout.steps=3", "rollout.branches=2"]
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    assert EXPECTED[config.algorithm.name] in records[1], sorted(records[1])
