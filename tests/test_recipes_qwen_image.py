"""Every Qwen-Image recipe runs 2 steps end to end on the tiny random pipeline (on a GPU where there is one);
one also with the recipes' own OCR reward (Tesseract). The others score JPEG size: the training path is what
they check, and Tesseract is not on every GPU machine."""

import math

import pytest
from matrix import recipe_params

from omnialign.config import apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.metrics import read_metrics
from omnialign.models import tiny
from omnialign.recipes import RECIPES
from omnialign.train import main

NAMES = [name for name in RECIPES if name.startswith("qwen_image_ocr")]  # the edit recipes: test_models_qwen_image_edit


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_image_recipes")
    prompts = root / "ocr"
    prompts.mkdir()
    (prompts / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (prompts / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(prompts, root / "data")
    return tiny.qwen_image(root / "model"), root / "data"


def run_two_steps(name, assets, tmp_path, reward: str) -> list[dict]:
    model, data = assets
    config = RECIPES[name]()
    pairs = config.algorithm.name == "online_dpo"
    small = [f"model.path={model}", "model.dtype=float32", f"data.prompts={data / 'train.parquet'}",
             f"data.val_prompts={data / 'test.parquet'}", "data.prompts_per_step=2", "rollout.n=2",
             "rollout.height=32", "rollout.width=32", "rollout.steps=4", "rollout.val_steps=4",
             "rollout.micro_batch_size=4", f"actor.micro_batch_size={2 if pairs else 4}",
             "actor.mini_batch_size=none", "model.lora.rank=4" if config.model.lora.rank else "model.lora.rank=0",
             "model.lora.alpha=8", "engine.activation_checkpointing=false", "engine.compile=false",
             "trainer.total_steps=2",
             "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false", "rollout.window_end=3",
             f"trainer.output_dir={tmp_path}", f'reward.weights={{"{reward}": 1}}']  # fmt: skip
    if config.algorithm.name == "tempflow":  # one prompt's 2 trunks x 2 branches at steps 0 and 1: 8 images and rows
        small += ["data.prompts_per_step=1", "rollout.steps=3", "rollout.branches=2"]
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    return records


@pytest.mark.parametrize("name", recipe_params(NAMES))
def test_qwen_image_recipe_runs_two_steps(name, assets, tmp_path):
    run_two_steps(name, assets, tmp_path, "jpeg_compressibility")


@pytest.mark.tesseract
def test_qwen_image_recipe_runs_with_its_ocr_reward(assets, tmp_path):
    assert RECIPES[NAMES[0]]().reward.weights == {"ocr": 1.0}
    records = run_two_steps(NAMES[0], assets, tmp_path, "ocr")
    assert 0.0 <= records[1]["reward/mean"] <= 1.0
