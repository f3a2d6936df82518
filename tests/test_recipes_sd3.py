"""The SD3.5 OCR recipes: each validates at its published size, and each runs 2 steps end to end on the tiny random
pipeline (on a GPU where there is one), scoring JPEG size: the training path is what this checks (GARDO ranks it
against its opposite, so its gate has samples to pick); `bench recipe` builds SD3.5 at its released sizes and counts
a branched rollout's images and forwards."""

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from matrix import recipe_params

from omnialign.bench.models import SD35, full_sd3, transformer_flops
from omnialign.bench.recipe import recipe_row
from omnialign.config import ModelConfig, apply_overrides, validate
from omnialign.data.ocr import prepare_ocr
from omnialign.metrics import read_metrics
from omnialign.models import LOADERS, tiny
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


@pytest.mark.parametrize("name", recipe_params(NAMES))
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


def test_bench_builds_sd35_at_the_released_sizes():
    """`bench recipe`'s SD3.5 pipelines, built on the meta device: the released parameter counts (the transformer's
    learned position table is a buffer: medium 2.47 B and large 8.15 B with it), CLIP-L, CLIP-G, T5-XXL, the VAE."""
    counts = {}
    for name in SD35:
        policy = full_sd3(torch.device("meta"), ModelConfig(arch="sd3", path=f"models/{name}"))
        net = policy.transformer
        counts[name] = round(sum(t.numel() for t in (*net.parameters(), *net.buffers())) / 1e9, 2)
        encoders = [round(sum(p.numel() for p in e.parameters()) / 1e6) for e in policy.text_encoders]
        assert encoders == [124, 695, 4762] and round(sum(p.numel() for p in policy.vae.parameters()) / 1e6) == 84
    assert counts == {"stable-diffusion-3.5-medium": 2.47, "stable-diffusion-3.5-large": 8.15}


@pytest.mark.parametrize("algorithm", ["tempflow", "branchgrpo"])
def test_bench_row_counts_every_image_and_forward_of_a_branched_rollout(algorithm, assets):
    """`bench recipe`'s images and FLOPs for TempFlow-GRPO and BranchGRPO, counted by hand on a 4-step rollout.
    TempFlow: 2 branches at steps 0 and 1 give 4 leaves a trunk; the trunk runs steps 0-1 (2 forwards), its branches
    of step 0 run 3 steps on and those of step 1 two: 2 + 2 x (3 + 2) = 12 forwards, and each leaf trains its branch
    transition (forward and LoRA backward: 2). BranchGRPO: splits in two at steps 0 and 2 give 4 leaves a tree; its
    nodes before each step are 1, 2, 2, 4 (9 forwards) and its edges 2 + 2 + 4 + 4 = 12, each trained (2)."""
    model, data = assets
    policy = LOADERS["sd3"](ModelConfig(arch="sd3", path=str(model), dtype="float32"))
    common = ["data.prompts_per_step=2", "rollout.n=3", "rollout.steps=4", "rollout.height=32", "rollout.width=32",
              "rollout.guidance=1.0", "algorithm.kl_coef=0", "model.text_tokens=16"]  # fmt: skip
    if algorithm == "tempflow":
        config = apply_overrides(RECIPES["sd3_ocr_tempflow_lora"](), [*common, "rollout.branches=2",
                                                                       "rollout.branch_steps=[0, 1]"])  # fmt: skip
        forwards, trained = 12, 4 * 2
    else:
        config = apply_overrides(RECIPES["flux_ocr_branchgrpo_lora"](), [*common, "rollout.split_steps=[0, 2]",
                                                                          "rollout.split_factor=2"])  # fmt: skip
        forwards, trained = 9, 12 * 2
    tc = policy.transformer.config
    forward = transformer_flops(tc.num_layers, tc.num_attention_heads * tc.attention_head_dim, 4, 77 + 16)
    samples = 2 * 3
    flops = samples * forward * (forwards + trained)
    row = recipe_row(replace(config, model=replace(config.model, arch="sd3")), 1, {"timing/rollout": 2.0},
                     flops / 2 / 1e12, policy, SimpleNamespace(size=1))  # fmt: skip
    assert row["images"] == samples * 4 and row["images_per_gpu_s"] == samples * 4 / 2
    assert row["mfu"] == 1.0
