"""The Qwen-Image-Edit adapter on tiny random pipelines (Qwen-Image-Edit, and the multi-image -2509/-2511 layout):
loading by layout, prompt and source encoding, equivalence with diffusers' `QwenImageEditPipeline` and
`QwenImageEditPlusPipeline`, clear failures, and every Qwen-Image-Edit recipe's two training steps.

Two things of the reference are adjusted, and only these: transformers' `Qwen2VLProcessor` is built without its
video processor (which needs torchvision, absent beside the CPU torch; its class check is skipped for that), and
the pipelines' source area for the VAE (about 1024x1024, 16 to 36 s per image through the tiny VAE on these CPUs)
is patched to the sources' own size, so they pass unresized, as under our `model.source_resize=false`.
"""

import copy
import json
import math
from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
import torch
from diffusers import QwenImageEditPipeline, QwenImageEditPlusPipeline
from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit, pipeline_qwenimage_edit_plus
from matrix import recipe_params
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer, Qwen2VLProcessor
from transformers.processing_utils import ProcessorMixin

from omnialign.bench.models import qwen_image_edit_tokens
from omnialign.bench.recipe import bench_recipe
from omnialign.config import ModelConfig, apply_overrides, validate
from omnialign.diffusion.sampling import per_sample_noise, sample
from omnialign.metrics import read_metrics
from omnialign.models import LOADERS, qwen_image, qwen_image_edit, tiny
from omnialign.recipes import RECIPES
from omnialign.train import main

PROMPTS = ['Make the sign say "OPEN"', "Turn the sky purple and add a small red kite in the top left corner"]
HEIGHT, WIDTH = 32, 48  # tiny VAE factor 4, 2x2 packing: a 4x6 token grid
TEXT_TOKENS = 48
EDIT_RECIPES = [name for name in RECIPES if name.startswith("qwen_image_edit")]


def source(seed: int, channels: int, height: int, width: int) -> torch.Tensor:
    """A random 8-bit image (C, H, W) in [0, 1], as `data.prompts.source_images` decodes one."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (channels, height, width), generator=g).float() / 255


def pil(image: torch.Tensor) -> Image.Image:
    """What a user hands the pipeline: the 8-bit image as RGB (grayscale converted by PIL)."""
    array = (image * 255).round().byte().permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if image.shape[0] == 1 else array).convert("RGB")


# Prompt i's sources: the Edit pipeline takes one, the Plus pipeline here two of different aspect ratios (one
# grayscale). Sides are multiples of 32 so that the patched area passes them unresized.
SOURCES = {
    False: [[source(1, 3, 64, 96)], [source(2, 3, 64, 96)]],
    True: [[source(3, 3, 64, 96), source(4, 1, 64, 64)], [source(5, 3, 64, 96), source(6, 3, 64, 64)]],
}


@pytest.fixture(scope="module", params=[False, True], ids=["edit", "plus"])
def plus(request):
    return request.param


@pytest.fixture(scope="module")
def path(tmp_path_factory, plus):
    return tiny.qwen_image_edit(tmp_path_factory.mktemp("plus" if plus else "edit"), plus=plus)


@pytest.fixture(scope="module")
def policy(path):
    return LOADERS["qwen_image_edit"](
        ModelConfig(arch="qwen_image_edit", path=str(path), source_resize=False, text_tokens=TEXT_TOKENS)
    )


def vl_processor(path) -> Qwen2VLProcessor:
    """transformers' `Qwen2VLProcessor` of the folder's processor/, without the video processor (see the doc)."""
    with mock.patch.object(ProcessorMixin, "check_argument_for_proper_class", lambda self, name, arg: None):
        folder = path / "processor"
        return Qwen2VLProcessor(image_processor=AutoImageProcessor.from_pretrained(folder),
                                tokenizer=AutoTokenizer.from_pretrained(folder), video_processor=None)  # fmt: skip


@pytest.fixture(scope="module")
def pipeline(path, plus):
    pipe = (QwenImageEditPlusPipeline if plus else QwenImageEditPipeline).from_pretrained(
        path, processor=vl_processor(path)
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


@contextmanager
def vae_area(plus: bool, area: int):
    """The pipelines with their source area for the VAE (1024*1024) patched to `area`."""
    if plus:
        with mock.patch.object(pipeline_qwenimage_edit_plus, "VAE_IMAGE_SIZE", area):
            yield
    else:
        dimensions = pipeline_qwenimage_edit.calculate_dimensions
        with mock.patch.object(
            pipeline_qwenimage_edit, "calculate_dimensions", lambda _, ratio: dimensions(area, ratio)
        ):
            yield


def test_loads_by_layout_with_frozen_encoders(policy, plus, path):
    assert json.loads((path / "model_index.json").read_text())["processor"] == ["transformers", "Qwen2VLProcessor"]
    assert policy.edits and policy.plus == plus
    assert not any(p.requires_grad for p in [*policy.text_encoder.parameters(), *policy.vae.parameters()])
    assert all(p.requires_grad for p in policy.transformer.parameters()) and len(policy.blocks()) == 2
    assert policy.lora_targets == qwen_image.LORA_TARGETS


def test_conditions_match_the_pipelines_encoders(policy, pipeline, plus):
    """Embeddings of the instruction with its sources in view, and the packed source latents, per prompt."""
    cond = policy.encode_prompts(PROMPTS, SOURCES[plus])
    merge = policy.image_processor.merge_size**2
    for i, prompt in enumerate(PROMPTS):
        images = [pil(s) for s in SOURCES[plus][i]]
        if plus:  # the vision input: each source at about 384x384, sides multiples of 32
            sizes = [
                pipeline_qwenimage_edit_plus.calculate_dimensions(384 * 384, im.width / im.height) for im in images
            ]
            vision = [pipeline.image_processor.resize(im, h, w) for im, (w, h) in zip(images, sizes)]
        else:  # the VAE-sized source, here its own size
            vision = images[0]
        embeds, mask = pipeline.encode_prompt(prompt, image=vision, device=torch.device("cpu"))
        n = embeds.shape[1]
        assert mask is None  # one prompt: no padding
        grids = policy.image_processor(images=vision, return_tensors="pt")["image_grid_thw"]
        assert cond["embeds"].shape[1] == int(grids.prod(-1).sum()) // merge + TEXT_TOKENS > n
        assert cond["mask"][i].sum() == n and cond["mask"][i, :n].all()
        torch.testing.assert_close(cond["embeds"][i, :n], embeds[0], rtol=1e-5, atol=1e-5)
        assert not cond["embeds"][i, n:].any()
        vae_images = [pipeline.image_processor.preprocess(im, im.height, im.width).unsqueeze(2) for im in images]
        _, latents = pipeline.prepare_latents(vae_images if plus else vae_images[0], 1, 4, HEIGHT, WIDTH,
                                              torch.float32, torch.device("cpu"), None)  # fmt: skip
        ours = torch.cat([cond["sources", str(j)][i].reshape(-1, 16) for j in range(len(images))])
        torch.testing.assert_close(ours, latents[0], rtol=1e-5, atol=1e-5)
    shapes = [tuple(cond["sources", str(j)].shape) for j in range(len(SOURCES[plus][0]))]
    assert shapes == [(2, 8, 12, 16), (2, 8, 8, 16)][: len(shapes)]  # 64x96 and 64x64 pixels, 8 per token


def test_ode_sampler_reproduces_the_pipeline(policy, pipeline, plus):
    """Our sampler (true CFG with the norm rescale, the negative prompt seeing the same sources) + decode equals
    the pipeline's __call__ for the same noise; the pipelines take one prompt at a time."""
    steps, negative, guidance = 4, " ", 4.0
    seeds = (11, 12)
    shape = policy.latent_shape(HEIGHT, WIDTH)
    cond = policy.encode_prompts(PROMPTS, SOURCES[plus])
    uncond = policy.encode_prompts([negative] * 2, SOURCES[plus])
    out = sample(policy.velocity, [torch.Generator().manual_seed(s) for s in seeds], shape,
                 policy.schedule(steps, HEIGHT, WIDTH), cond, uncond, guidance=guidance, cfg_rescale=True)  # fmt: skip
    ours = policy.decode(out.final)
    noise = per_sample_noise([torch.Generator().manual_seed(s) for s in seeds], shape)
    theirs = []
    with vae_area(plus, 64 * 96):
        for i, prompt in enumerate(PROMPTS):
            images = [pil(s) for s in SOURCES[plus][i]]
            theirs.append(pipeline(
                image=images if plus else images[0], prompt=prompt, negative_prompt=negative,
                true_cfg_scale=guidance, height=HEIGHT, width=WIDTH, num_inference_steps=steps,
                latents=noise[i : i + 1].reshape(1, -1, shape[-1]), output_type="pt",
            ).images)  # fmt: skip
    theirs = torch.cat(theirs)
    assert ours.shape == theirs.shape == (2, 3, HEIGHT, WIDTH)
    assert (ours - ours[:1]).abs().max() > 1e-3  # the two prompts give different images
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_conditions_of_two_batches_concatenate(policy, plus):
    """A fixed length: conditions of batches with instructions of other lengths concatenate, and the velocity of
    the concatenation is each batch's (the sources' outputs are cut off)."""
    first = policy.encode_prompts(PROMPTS[:1], SOURCES[plus][:1])
    second = policy.encode_prompts(["a much longer instruction " * 4], SOURCES[plus][1:])
    both = torch.cat([first, second])
    assert both["embeds"].shape[:2] == (2, first["embeds"].shape[1])
    latents, sigma = torch.randn(2, *policy.latent_shape(HEIGHT, WIDTH)), torch.tensor([0.9, 0.4])
    with torch.no_grad():
        v = policy.velocity(latents, sigma, both)
        parts = [policy.velocity(latents[i : i + 1], sigma[i : i + 1], c) for i, c in enumerate((first, second))]
    assert v.shape == latents.shape
    torch.testing.assert_close(v, torch.cat(parts), rtol=1e-4, atol=1e-5)


def test_default_source_sizes_are_the_pipelines(policy, plus):
    """model.source_resize=true (the default) sizes sources as the pipelines do (about 1024x1024 for the VAE,
    384x384 for the Plus pipeline's vision input); only the size is checked (a 1 MP tiny VAE pass is slow)."""
    resizing = copy.copy(policy)
    resizing.source_resize = True
    for ratio in (1.0, 4 / 3, 16 / 9, 0.5, 2.37):
        width = round(700 * ratio)
        vae, vision = resizing.source_sizes(width, 700)
        ratio = width / 700
        assert vae == pipeline_qwenimage_edit.calculate_dimensions(1024 * 1024, ratio)[:2]
        assert vae == pipeline_qwenimage_edit_plus.calculate_dimensions(pipeline_qwenimage_edit_plus.VAE_IMAGE_SIZE,
                                                                        ratio)  # fmt: skip
        condition = pipeline_qwenimage_edit_plus.CONDITION_IMAGE_SIZE
        assert vision == (pipeline_qwenimage_edit_plus.calculate_dimensions(condition, ratio) if plus else vae)


def test_bad_sources_fail_clearly(policy, plus):
    with pytest.raises(ValueError, match="come to one size; prepare the sources at one size or aspect ratio"):
        policy.encode_prompts(PROMPTS, [SOURCES[plus][0], [source(7, 3, 64, 64)] + SOURCES[plus][1][1:]])
    with pytest.raises(ValueError, match="give one list of them per prompt"):
        policy.encode_prompts(PROMPTS)
    three = [[source(8, 3, 64, 96)] * 3, [source(9, 3, 64, 96)] * 2]
    with pytest.raises(ValueError, match="the same number of sources" if plus else "takes one per prompt"):
        policy.encode_prompts(PROMPTS, three)
    with pytest.raises(ValueError, match="less than 8 on a side"):
        policy.encode_prompts(PROMPTS[:1], [[source(10, 3, 6, 40)] * len(SOURCES[plus][0])])


def test_bad_folders_fail_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"missing processor/\. Point model.path at a local copy of"):
        qwen_image_edit.load(ModelConfig(arch="qwen_image_edit", path=str(tiny.qwen_image(tmp_path / "qwen_image"))))
    (tmp_path / "qwen_image" / "processor").mkdir()
    with pytest.raises(ValueError, match="_class_name='QwenImagePipeline'.*is model.arch=qwen_image"):
        qwen_image_edit.load(ModelConfig(arch="qwen_image_edit", path=str(tmp_path / "qwen_image")))
    with pytest.raises(ValueError, match="model.path is required for model.arch=qwen_image_edit"):
        qwen_image_edit.load(ModelConfig(arch="qwen_image_edit"))


# --------------------------------------------------------------------------- recipes


@pytest.fixture(scope="module")
def edit_prompts(tmp_path_factory):
    """An edit prompt file as users write one: instructions, PNG sources beside it, the text to render."""
    root = tmp_path_factory.mktemp("edit_prompts")
    rows = []
    for i, (text, color) in enumerate([("OPEN", (200, 40, 40)), ("42", (30, 90, 200)), ("CAFE", (20, 160, 60))]):
        Image.fromarray(np.full((32, 32, 3), color, dtype=np.uint8)).save(root / f"source{i}.png")
        Image.fromarray(np.full((32, 48), 40 * i, dtype=np.uint8)).save(root / f"second{i}.png")  # grayscale
        rows.append({"prompt": f'Write "{text}" on it', "sources": [f"source{i}.png", f"second{i}.png"],
                     "target_text": text})  # fmt: skip
    (root / "edits.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    (root / "val.jsonl").write_text(json.dumps(rows[2]) + "\n")
    return root


@pytest.fixture(scope="module")
def plus_path(tmp_path_factory):
    return tiny.qwen_image_edit(tmp_path_factory.mktemp("recipes_plus"), plus=True)


def run_two_steps(name, model, prompts, tmp_path, reward: str) -> list[dict]:
    config = RECIPES[name]()
    pairs = config.algorithm.name == "online_dpo"
    small = [f"model.path={model}", "model.dtype=float32", f"model.text_tokens={TEXT_TOKENS}",
             f"data.prompts={prompts / 'edits.jsonl'}", f"data.val_prompts={prompts / 'val.jsonl'}",
             "data.prompts_per_step=2", "rollout.n=2", "rollout.height=32", "rollout.width=32", "rollout.steps=4",
             "rollout.val_steps=4", "rollout.micro_batch_size=4", f"actor.micro_batch_size={2 if pairs else 4}",
             "actor.mini_batch_size=none", "model.lora.rank=4", "model.lora.alpha=8",
             "engine.activation_checkpointing=false", "engine.compile=false", "trainer.total_steps=2",
             "trainer.val_every=2", "trainer.save_every=2", "trainer.progress=false", "rollout.window_end=3",
             f"trainer.output_dir={tmp_path}", f'reward.weights={{"{reward}": 1}}']  # fmt: skip
    main(validate(apply_overrides(config, small)))
    records = read_metrics(tmp_path / config.name / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert math.isfinite(records[1]["reward/mean"]) and records[2]["actor/skipped_updates"] == 0
    return records


@pytest.mark.parametrize("name", recipe_params(EDIT_RECIPES))
def test_qwen_image_edit_recipe_runs_two_steps(name, plus_path, edit_prompts, tmp_path):
    """Each recipe on the multi-image layout: two sources per prompt (one grayscale, another aspect ratio)."""
    run_two_steps(name, plus_path, edit_prompts, tmp_path, "jpeg_compressibility")


@pytest.mark.tesseract
def test_qwen_image_edit_recipe_runs_with_its_ocr_reward_on_the_single_image_layout(
    edit_prompts, tmp_path_factory, tmp_path
):
    assert RECIPES[EDIT_RECIPES[0]]().reward.weights == {"ocr_edit": 1.0}
    model = tiny.qwen_image_edit(tmp_path_factory.mktemp("recipes_edit"))
    single = tmp_path / "single"
    single.mkdir()
    for split in ("edits", "val"):  # one source per prompt
        rows = [json.loads(line) for line in (edit_prompts / f"{split}.jsonl").read_text().splitlines()]
        lines = [json.dumps({**r, "sources": [str(edit_prompts / r["sources"][0])]}) + "\n" for r in rows]
        (single / f"{split}.jsonl").write_text("".join(lines))
    records = run_two_steps(EDIT_RECIPES[0], model, single, tmp_path, "ocr_edit")
    assert 0.0 <= records[1]["reward/mean"] <= 1.0


def test_bench_recipe_runs_the_tiny_twin_and_counts_the_source_tokens(tmp_path):
    """`omnialign bench recipe --tiny` on the edit recipe; its FLOPs count each sample's source tokens among the
    image tokens and their vision tokens among the text tokens, as a condition of the policy holds them."""
    rows = bench_recipe(EDIT_RECIPES[0], 1, 1, True, 1.0, tmp_path, ["engine.compile=false"])
    assert rows[0]["images"] == 4 and rows[0]["images_per_gpu_s"] > 0 and rows[0]["rollout_s"] > 0
    config = ModelConfig(arch="qwen_image_edit", path=str(tmp_path / "tiny"), source_resize=False, text_tokens=128)
    policy = LOADERS["qwen_image_edit"](config)
    cond = policy.encode_prompts(["x"], [[source(0, 3, 32, 32)]])  # the bench's sources are of the rollout size
    image_tokens, text_tokens = qwen_image_edit_tokens(policy, 32, 32)
    assert image_tokens == 16 + cond["sources", "0"].shape[1] * cond["sources", "0"].shape[2] == 32
    assert text_tokens == cond["embeds"].shape[1] > 128
