"""Every Qwen-Image recipe runs 2 steps end to end on the tiny random pipeline with the OCR reward."""

import pytest

from omnialign.config import apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.metrics import read_metrics
from omnialign.models import tiny
from omnialign.recipes import RECIPES
from omnialign.train import main

NAMES = [name for name in RECIPES if name.startswith("qwen_image")]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen_image_recipes")
    prompts = root / "ocr"
    prompts.mkdir()
    (prompts / "train.txt").write_text('A sign that says "OPEN"\nA mug printed with "42"\n')
    (prompts / "test.txt").write_text('A poster reading "HELLO"\n')
    prepare_ocr(prompts, root / "data")
    return tiny.qwen_image(root / "model"), root / "data"


@pytest.mark.parametrize("name", NAMES)
def test_qwen_image_recipe_runs_two_steps(name, assets, tmp_path):
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
             f"trainer.output_dir={tmp_path}"]  # fmt: skip
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert 0.0 <= records[1]["reward/mean"] <= 1.0 and records[2]["actor/skipped_updates"] == 0
