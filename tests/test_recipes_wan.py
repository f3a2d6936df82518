"""The Wan recipes: each validates with the released sampling settings; LoRA reaches every projection of the
full-size transformers (built on the meta device by `omnialign bench`'s builder, whose parameter counts are the
released ones); Wan 2.2 A14B's SDE window stays in its high-noise steps; two steps of each algorithm on the tiny
twin (A14B's with two experts and its own 20-step window); `bench recipe --tiny` counts videos."""

import math

import pyarrow.parquet as pq
import pytest
import torch
from diffusers import WanTransformer3DModel
from matrix import recipe_params

from omnialign.bench.models import WAN as WAN_TRANSFORMERS
from omnialign.bench.models import full_wan, wan_flops, wan_tokens
from omnialign.bench.recipe import bench_recipe, write_bench_prompts
from omnialign.config import apply_overrides, validate
from omnialign.metrics import read_metrics
from omnialign.models import lora, tiny
from omnialign.models.wan import LORA_TARGETS
from omnialign.recipes import RECIPES, wan
from omnialign.train import main

WAN = [name for name in RECIPES if name.startswith("wan")]
A14B = [name for name in WAN if name.startswith("wan22_t2v_a14b")]
EXPECTED = {"flowgrpo": "actor/clip_frac", "dppo": "actor/masked", "nft": "actor/nft/positive",
            "online_dpo": "actor/dpo/accuracy"}  # fmt: skip


def test_the_recipes_cover_every_size_and_algorithm():
    algorithms = ("flowgrpo_lora", "flowgrpo_cps_lora", "dppo_lora", "nft_lora", "online_dpo_lora", "flowgrpo_full")
    for size in ("wan21_t2v_1_3b", "wan21_t2v_14b", "wan22_ti2v_5b"):
        assert {f"{size}_ocr_{a}" for a in algorithms} <= set(WAN)
    assert A14B == [f"wan22_t2v_a14b_ocr_{a}" for a in ("flowgrpo_lora", "flowgrpo_cps_lora", "dppo_lora",
                                                         "flowgrpo_full")]  # fmt: skip
    assert len(WAN) == 22


@pytest.mark.parametrize("name", WAN)
def test_recipe_validates_with_the_released_settings(name):
    c = validate(RECIPES[name]())
    assert c.name == c.recipe == name and c.model.arch == "wan"
    assert c.model.path.startswith("models/Wan2.") and c.model.path.endswith("-Diffusers")
    assert c.reward.weights == {"ocr": 1.0} and c.reward.per_frame == {"ocr": "mean"}
    assert c.rollout.negative_prompt == wan.NEGATIVE_PROMPT and c.model.text_tokens == 512
    assert (c.model.lora.rank > 0) == name.endswith("_lora")
    assert c.engine.compile and c.rollout.grad_graph  # regional compile, the replay in the update's own graph
    algorithm = name.split("_ocr_")[1].rsplit("_", 1)[0]  # e.g. flowgrpo_cps
    assert c.algorithm.name == (algorithm if algorithm in ("dppo", "nft", "online_dpo") else "flowgrpo")
    assert c.rollout.kind == ("cps" if "_cps_" in name else "sde")
    size = (c.rollout.height, c.rollout.width, c.model.frames, c.model.shift)
    assert size == ((704, 1280, 121, 5.0) if "ti2v_5b" in name else (480, 832, 81, 12.0 if "a14b" in name else 3.0))
    guidance = (4.0, 3.0) if "a14b" in name else (1.0 if algorithm == "nft" else 5.0, None)
    assert (c.rollout.guidance, c.rollout.guidance_2) == guidance  # A14B: high- / low-noise expert's


@pytest.mark.parametrize("folder, blocks, params", [("Wan2.1-T2V-1.3B-Diffusers", 30, 1_418_996_800),
                                                    ("Wan2.1-T2V-14B-Diffusers", 40, 14_288_491_584)])  # fmt: skip
def test_full_size_builder_and_lora_targets(folder, blocks, params):
    """The released transformer (and UMT5-XXL, the Wan 2.1 VAE) on the meta device; LoRA wraps the 4 projections of
    self- and cross-attention and the 2 MLP layers of every block, 10 per block."""
    c = RECIPES["wan21_t2v_14b_ocr_flowgrpo_lora" if "14B" in folder else "wan21_t2v_1_3b_ocr_flowgrpo_lora"]()
    assert c.model.path == f"models/{folder}"
    policy = full_wan(torch.device("meta"), c.model)
    counts = [sum(p.numel() for p in m.parameters()) for m in (policy.transformer, policy.text_encoder, policy.vae)]
    assert counts == [params, 5_680_910_336, 126_892_531] and len(policy.blocks()) == blocks
    assert wan_tokens(policy, 480, 832) == 21 * 30 * 52  # latent frames x H/16 x W/16
    lora.apply_lora(policy.transformer, 4, 8, LORA_TARGETS)
    wrapped = {n.rsplit(".lora_A", 1)[0] for n, _ in policy.transformer.named_modules() if n.endswith(".lora_A")}
    assert len(wrapped) == 10 * blocks
    assert {n.split(".", 2)[2] for n in wrapped} == {f"{attn}.{p}" for attn in ("attn1", "attn2")
                                                     for p in ("to_q", "to_k", "to_v", "to_out.0")} | {
        "ffn.net.0.proj", "ffn.net.2"}  # fmt: skip


def test_a14b_builder_has_two_experts_and_its_window_stays_in_the_high_noise_steps():
    """Every step an A14B recipe's window can train has sigma >= boundary_ratio (the trained expert's), and the
    window uses them all."""
    policy = full_wan(torch.device("meta"), RECIPES[A14B[0]]().model)
    assert policy.boundary_ratio == wan.A14B_BOUNDARY and policy.transformer_2 is not None and policy.shift == 12.0
    for name in A14B:
        c = RECIPES[name]()
        sigmas = policy.schedule(c.rollout.steps, c.rollout.height, c.rollout.width)
        end = c.rollout.window_end
        assert end == 13 and c.rollout.window_start == 0 and c.rollout.window_size <= end and c.model.shift == 12.0
        assert (sigmas[:end] >= wan.A14B_BOUNDARY).all() and sigmas[end] < wan.A14B_BOUNDARY
    with pytest.raises(ValueError, match="model.path='models/Wan2.1-T2V-13B': .* set model.path=models/NAME"):
        full_wan(torch.device("meta"), apply_overrides(RECIPES[WAN[0]](), ["model.path=models/Wan2.1-T2V-13B"]
                                                       ).model)  # fmt: skip


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("wan")
    write_bench_prompts(root / "prompts.parquet", False, 16, 32)
    pq.write_table(pq.read_table(root / "prompts.parquet").slice(0, 2), root / "val.parquet")  # validation: 2 videos
    return {"prompts": root / "prompts.parquet", "val": root / "val.parquet", "wan21": tiny.wan(root / "wan21"),
            "a14b": tiny.wan(root / "a14b", seed=1, boundary_ratio=wan.A14B_BOUNDARY)}  # fmt: skip


TWIN_RECIPES = ["wan21_t2v_1_3b_ocr_flowgrpo_lora", "wan21_t2v_1_3b_ocr_flowgrpo_cps_lora",
                "wan21_t2v_1_3b_ocr_dppo_lora", "wan21_t2v_1_3b_ocr_nft_lora", "wan21_t2v_1_3b_ocr_online_dpo_lora",
                "wan21_t2v_1_3b_ocr_flowgrpo_full", "wan22_t2v_a14b_ocr_flowgrpo_lora"]  # fmt: skip


@pytest.mark.parametrize("name", recipe_params(TWIN_RECIPES))
def test_recipe_runs_two_steps_on_the_tiny_twin(name, twins, tmp_path):
    """Each algorithm on the tiny twin (the JPEG-size stand-in scores every frame); A14B's on a two-expert twin with
    the recipe's 20 steps and window: a trained step below the boundary would raise."""
    config = RECIPES[name]()
    a14b = name.startswith("wan22_t2v_a14b")
    small = [f"model.path={twins['a14b' if a14b else 'wan21']}", "model.frames=5", "model.text_tokens=16",
             "model.dtype=float32", f"data.prompts={twins['prompts']}", f"data.val_prompts={twins['val']}",
             "data.prompts_per_step=2", "rollout.n=2", "rollout.height=16", "rollout.width=32", "rollout.val_steps=2",
             "rollout.micro_batch_size=4", "actor.mini_batch_size=none", "engine.activation_checkpointing=false",
             "engine.compile=false",
             f"actor.micro_batch_size={2 if config.algorithm.name == 'online_dpo' else 4}",
             "trainer.total_steps=2", "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false",
             f"trainer.output_dir={tmp_path}", 'reward.weights={"jpeg_compressibility": 1}',
             'reward.per_frame={"jpeg_compressibility": "mean"}']  # fmt: skip
    if not a14b:
        small += ["rollout.steps=4", "rollout.window_end=3"]
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    assert EXPECTED[config.algorithm.name] in records[1], sorted(records[1])


@pytest.mark.parametrize(("name", "extra"), [
    ("wan21_t2v_1_3b_ocr_flowgrpo_lora", ["rollout.steps=4", "rollout.window_end=3", "engine.compile=false"]),
    # the two-expert twin (guidance_2 refuses one transformer), 20 steps
    ("wan22_t2v_a14b_ocr_flowgrpo_lora", ["engine.compile=false"]),
])  # fmt: skip
def test_bench_recipe_tiny_counts_videos(name, extra, tmp_path):
    """`omnialign bench recipe --tiny` on a Wan recipe: a row of videos per GPU per second."""
    (row,) = bench_recipe(name, 1, 1, True, 1.0, tmp_path, extra)
    assert row["videos"] == 4 and row["videos_per_gpu_s"] > 0 and row["rollout_s"] > 0 and "images" not in row
    assert row["update_s"] > 0 and "tflop_per_video" in row


def test_wan_flops_count_every_linear_layer_of_a_block():
    """MFU's FLOPs: 2 per multiply-add of each linear layer of a released block (cross-attention's keys and values
    over the text tokens, every other layer over the video tokens), plus the two attentions' products."""
    with torch.device("meta"):
        block = WanTransformer3DModel(**WAN_TRANSFORMERS["Wan2.1-T2V-1.3B-Diffusers"]).blocks[0]
    n, t, d, ffn = 1000, 512, 1536, 8960
    linear = sum(2 * m.in_features * m.out_features * (t if name in ("attn2.to_k", "attn2.to_v") else n)
                 for name, m in block.named_modules() if isinstance(m, torch.nn.Linear))  # fmt: skip
    assert wan_flops(1, d, ffn, n, t) == linear + 4 * n * n * d + 4 * n * t * d
