"""Preference reward models on tiny random twins (real loading and preprocessing), behind serve-reward over
loopback HTTP, the checkpoint converters, and group-wise pairwise win rates (a Python judge, a VLM judge over a
real loopback HTTP server, and the online trainer handing rewards whole groups)."""

import base64
import io
import json
import math
import re
import string
import subprocess
import sys
from collections import Counter, OrderedDict
from http.server import ThreadingHTTPServer

import numpy as np
import pytest
import torch
from http_stub import JSONHandler, serving
from PIL import Image
from torch import nn
from transformers import AutoTokenizer, BertTokenizer, BlipConfig, CLIPConfig, CLIPImageProcessorPil, CLIPModel

from omnialign.config import apply_overrides, validate
from omnialign.metrics import read_metrics
from omnialign.models.tiny import clip_tokenizer
from omnialign.recipes import RECIPES
from omnialign.rewards import lookup
from omnialign.rewards.base import to_pil
from omnialign.rewards.client import RemoteReward
from omnialign.rewards.pairwise import group_spans, pairwise_vlm, pairwise_win_rate, parse_preference
from omnialign.rewards.preference import (
    ImageRewardModel,
    MLPHead,
    aesthetic,
    clip_score,
    convert_image_reward,
    convert_open_clip,
    hps,
    hps_pixels,
    image_reward,
    load_clip,
    pickscore,
    pixels,
)
from omnialign.rewards.server import RewardServer
from omnialign.train import main

OPENAI_MEAN, OPENAI_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)  # CLIP's
SIZE = 32  # the twins' input size (224 in the released models)


# ---------------------------------------------------------------------------------------------- tiny twins


def clip_config(tokenizer, logit_scale: float) -> CLIPConfig:
    return CLIPConfig(
        text_config=dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=40, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=77, hidden_act="gelu",
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id),
        vision_config=dict(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                           image_size=SIZE, patch_size=8, hidden_act="gelu"),
        projection_dim=16, logit_scale_init_value=logit_scale,
    )  # fmt: skip


def jitter(model: nn.Module) -> nn.Module:
    """Random layer norms (they start as ones and zeros, so that any two would be interchangeable)."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.LayerNorm):
                module.weight.add_(torch.randn_like(module.weight) / 4)
                module.bias.add_(torch.randn_like(module.bias) / 4)
    return model


def build_clip(path, seed: int, logit_scale: float = 2.6592):
    """A tiny random CLIPModel with an offline byte-level tokenizer and a 32-pixel CLIP image processor."""
    torch.manual_seed(seed)
    tokenizer = clip_tokenizer()
    jitter(CLIPModel(clip_config(tokenizer, logit_scale))).save_pretrained(path)
    tokenizer.save_pretrained(path)
    CLIPImageProcessorPil(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE}).save_pretrained(path)
    return str(path)


def bert_tokenizer() -> BertTokenizer:
    """A character-level lowercase WordPiece tokenizer (bert-base-uncased's special tokens), built offline."""
    chars = string.ascii_lowercase + string.digits + string.punctuation
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    return BertTokenizer(vocab={token: i for i, token in enumerate(vocab)})


def blip_config(vocab: int) -> BlipConfig:
    text = dict(
        vocab_size=vocab,
        hidden_size=32,
        encoder_hidden_size=128,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=40,
        pad_token_id=0,
        bos_token_id=None,
        sep_token_id=None,
        layer_norm_eps=1e-12,
    )
    vision = dict(
        hidden_size=128,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=SIZE,
        patch_size=8,
        layer_norm_eps=1e-6,
        initializer_range=0.02,
    )
    return BlipConfig(text_config=text, vision_config=vision)  # fmt: skip


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("twins")
    clip, pick = build_clip(root / "clip", seed=3), build_clip(root / "pick", seed=4, logit_scale=math.log(60))
    torch.manual_seed(2)
    torch.save(MLPHead(16).state_dict(), root / "head.pth")  # the published head's layout (layers.{0,2,4,6,7})
    tokenizer = bert_tokenizer()
    tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    torch.manual_seed(3)
    jitter(ImageRewardModel(blip_config(len(tokenizer)))).save_pretrained(root / "image_reward")
    tokenizer.save_pretrained(root / "image_reward")
    return {"clip": clip, "pick": pick, "head": str(root / "head.pth"), "image_reward": str(root / "image_reward"),
            "root": root}  # fmt: skip


def batch(seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """Four images (3, 40, 60) in [0, 1], already 8-bit (as they travel to a server), and their prompts."""
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(4, 3, 40, 60, generator=g).mul(255).round().div(255)
    return images, ["a red cat", "two dogs on a beach", "a blue square", "Sunset, over the sea!"]


def hand_pixels(image: torch.Tensor, size: int, mean, std) -> torch.Tensor:
    """Resize (PIL bicubic, shorter side to `size`), centre crop, /255, normalise: by hand, as torchvision's
    Resize(size, BICUBIC) + CenterCrop(size) + ToTensor + Normalize do it (even margins: no rounding question)."""
    array = np.round(image.clamp(0, 1).numpy() * 255).astype(np.uint8)
    pil = Image.fromarray(array[0] if len(array) == 1 else array.transpose(1, 2, 0)).convert("RGB")
    w, h = pil.size
    new = (size, int(size * h / w)) if w <= h else (int(size * w / h), size)
    resized = np.asarray(pil.resize(new, Image.BICUBIC), dtype=np.float64)
    top, left = (resized.shape[0] - size) // 2, (resized.shape[1] - size) // 2
    x = resized[top : top + size, left : left + size] / 255
    return torch.tensor((x - np.array(mean)) / np.array(std), dtype=torch.float32).permute(2, 0, 1)


# ---------------------------------------------------------------------------------------------- preprocessing


def test_preprocessing_is_a_bicubic_resize_centre_crop_and_clip_normalisation(twins):
    images, _ = batch()
    gray = torch.rand(1, 1, 50, 44, generator=torch.Generator().manual_seed(5))
    processor = CLIPImageProcessorPil.from_pretrained(twins["clip"])
    for x in (images, gray):
        got = pixels(x, processor, "cpu")
        expected = torch.stack([hand_pixels(image, SIZE, OPENAI_MEAN, OPENAI_STD) for image in x])
        assert got.shape == (len(x), 3, SIZE, SIZE)
        assert torch.allclose(got, expected, atol=1e-5)


def hps_reference(image: torch.Tensor, size: int) -> torch.Tensor:
    """HPS v2's `preprocess_val` of one image (C, H, W) in [0, 1], written here in torch ops (torchvision is not
    installed) from its source, tgxs002/HPSv2: hpsv2/img_score.py builds it with create_model_and_transforms(
    'ViT-H-14', ..., light_augmentation=True), which is open_clip's image_transform(model.visual.image_size,
    is_train=False, resize_longest_max=True) in hpsv2/src/open_clip/transform.py: Compose([_convert_to_rgb_or_rgba,
    ToTensor(), ResizeMaxSize(image_size, fill=0), MaskAwareNormalize(OPENAI_DATASET_MEAN, OPENAI_DATASET_STD)])."""
    # img_score.score() is given a PIL image (a file); _convert_to_rgb_or_rgba: image.convert('RGB')
    pil = to_pil(image).convert("RGB")
    # ToTensor(): the 8-bit image as float32 (C, H, W), divided by 255
    img = torch.from_numpy(np.array(pil)).permute(2, 0, 1).float().div(255)
    # ResizeMaxSize.forward on a tensor: `height, width = img.shape[1:]`, `scale = self.max_size / float(max(height,
    # width))`, and only `if scale != 1.0:` ...
    height, width = img.shape[1:]
    scale = size / float(max(height, width))
    if scale != 1.0:
        # `new_size = tuple(round(dim * scale) for dim in (height, width))`
        new_size = tuple(round(dim * scale) for dim in (height, width))
        # `img = F.resize(img, new_size, self.interpolation)`, BICUBIC, on a float tensor: torchvision's
        # _functional_tensor.resize calls interpolate(mode="bicubic", align_corners=False, antialias=True (the
        # default of torchvision >= 0.17)) and clamps only uint8 images
        img = nn.functional.interpolate(img[None], size=new_size, mode="bicubic", align_corners=False,
                                        antialias=True)[0]  # fmt: skip
        # `pad_h = self.max_size - new_size[0]`, `pad_w = self.max_size - new_size[1]`, `F.pad(img, padding=[pad_w//2,
        # pad_h//2, pad_w - pad_w//2, pad_h - pad_h//2], fill=self.fill)`: torchvision's [left, top, right, bottom],
        # constant fill 0, here as the resized image written into a canvas of zeros
        pad_h, pad_w = size - new_size[0], size - new_size[1]
        left, top, right, bottom = pad_w // 2, pad_h // 2, pad_w - pad_w // 2, pad_h - pad_h // 2
        canvas = torch.zeros(3, top + new_size[0] + bottom, left + new_size[1] + right)
        canvas[:, top : top + new_size[0], left : left + new_size[1]] = img
        img = canvas
    # MaskAwareNormalize of 3 channels: Normalize(mean, std), (x - mean) / std per channel
    return (img - torch.tensor(OPENAI_MEAN).view(3, 1, 1)) / torch.tensor(OPENAI_STD).view(3, 1, 1)


def test_hps_preprocessing_is_hps_v2s_resize_longest_side_and_pad_for_any_aspect_ratio():
    g = torch.Generator().manual_seed(8)
    wide, _ = batch()  # (3, 40, 60): resized to (21, 32), 11 rows of padding: 5 above, 6 below
    tall = torch.rand(2, 3, 61, 30, generator=g)  # resized to (32, 16) (15.7 rounds up): 8 columns each side
    gray = torch.rand(2, 1, 9, 14, generator=g)  # upsampled to (21, 32), from one channel
    wan = torch.rand(1, 3, 480, 832, generator=g)  # a Wan frame at HPS's 224: (129, 224), 47 rows above, 48 below
    for x, size in ((wide, SIZE), (tall, SIZE), (gray, SIZE), (wan, 224)):
        got = hps_pixels(x, size, "cpu")
        expected = torch.stack([hps_reference(image, size) for image in x])
        assert got.shape == (len(x), 3, size, size)
        assert torch.allclose(got, expected, atol=1e-6), (x.shape, (got - expected).abs().max())
    pad = ((0 - torch.tensor(OPENAI_MEAN)) / torch.tensor(OPENAI_STD)).view(1, 3, 1, 1)  # 0 before normalisation
    got = hps_pixels(wide, SIZE, "cpu")
    assert torch.allclose(got[:, :, :5], pad.expand(4, 3, 5, SIZE), atol=1e-6)
    assert torch.allclose(got[:, :, 26:], pad.expand(4, 3, 6, SIZE), atol=1e-6)
    assert not torch.isclose(got[:, :, 5], pad[..., 0]).all() and not torch.isclose(got[:, :, 25], pad[..., 0]).all()
    # the whole width is kept: the former centre crop lost a third of it
    assert not torch.allclose(got, pixels(wide, CLIPImageProcessorPil(size={"shortest_edge": SIZE}, crop_size={
        "height": SIZE, "width": SIZE}), "cpu"), atol=0.1)  # fmt: skip


def test_hps_scores_square_images_as_before(twins):
    """The change is limited to non-square images. At the input size both preprocessings leave the pixels alone:
    the same scores. A larger square is resized by both, PIL's bicubic before (which rounds each of its two passes
    to 8 bits) and torch's antialiased bicubic now (the reference's): within those roundings."""
    g = torch.Generator().manual_seed(9)
    prompts = ["a red cat", "two dogs on a beach"] * 2
    at_size = torch.rand(2, 3, SIZE, SIZE, generator=g).mul(255).round().div(255)
    lo = torch.rand(2, 3, 6, 6, generator=g)  # a smooth 48 x 48 square (the former bicubic clamps overshoots)
    smooth = nn.functional.interpolate(lo, size=(48, 48), mode="bilinear", align_corners=True)
    processor = CLIPImageProcessorPil.from_pretrained(twins["clip"])
    assert torch.allclose(hps_pixels(at_size, SIZE, "cpu"), pixels(at_size, processor, "cpu"), atol=1e-6)
    bound = 1.2 / 255 / min(OPENAI_STD)  # 1.2 steps of 8 bits, normalised
    assert (hps_pixels(smooth, SIZE, "cpu") - pixels(smooth, processor, "cpu")).abs().max() < bound
    before, _ = clip_cosines(twins["clip"], [*at_size, *smooth], prompts)  # the former hps: hand_pixels, the towers
    now = hps(at_size, prompts[:2], [{}] * 2, path=twins["clip"]) + hps(smooth, prompts[2:], [{}] * 2,
                                                                       path=twins["clip"])  # fmt: skip
    assert now[:2] == pytest.approx(before[:2].tolist(), abs=1e-5)
    assert now[2:] == pytest.approx(before[2:].tolist(), abs=2e-3)


# ---------------------------------------------------------------------------------------------- the rewards


def clip_cosines(path: str, images: torch.Tensor, prompts: list[str]) -> tuple[torch.Tensor, CLIPModel]:
    """cos(image, text) computed here: hand preprocessing, the CLIP tokenizer, the model's towers."""
    model, tokenizer = CLIPModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    pix = torch.stack([hand_pixels(image, SIZE, OPENAI_MEAN, OPENAI_STD) for image in images])
    with torch.no_grad():
        img = model.get_image_features(pixel_values=pix).pooler_output
        txt = model.get_text_features(**tokenizer(prompts, padding=True, return_tensors="pt")).pooler_output
    return (img / img.norm(dim=-1, keepdim=True) * (txt / txt.norm(dim=-1, keepdim=True))).sum(-1), model


def test_clip_score_and_pickscore_follow_their_published_formulas(twins):
    images, prompts = batch()
    cos, _ = clip_cosines(twins["clip"], images, prompts)
    assert (cos > 0).any() and (cos < 0).any()  # both sides of the clamp are exercised
    got = clip_score(images, prompts, [{}] * 4, path=twins["clip"])
    assert got == pytest.approx((100 * cos).clamp(min=0).tolist(), abs=1e-4)
    cos, model = clip_cosines(twins["pick"], images, prompts)
    assert model.logit_scale.exp().item() == pytest.approx(60, rel=1e-5)
    got = pickscore(images, prompts, [{}] * 4, path=twins["pick"], processor=twins["pick"])
    assert got == pytest.approx((60 * cos).tolist(), abs=1e-4)


def test_aesthetic_is_the_mlp_head_on_the_l2_normalised_image_embedding(twins):
    images, prompts = batch(1)
    model = CLIPModel.from_pretrained(twins["clip"]).eval()
    pix = torch.stack([hand_pixels(image, SIZE, OPENAI_MEAN, OPENAI_STD) for image in images])
    with torch.no_grad():
        x = model.get_image_features(pixel_values=pix).pooler_output
    x = x / x.norm(dim=-1, keepdim=True)
    head = torch.load(twins["head"])
    for layer in (0, 2, 4, 6, 7):  # linear layers without activations: the released predictor
        x = x @ head[f"layers.{layer}.weight"].T + head[f"layers.{layer}.bias"]
    got = aesthetic(images, prompts, [{}] * 4, path=twins["clip"], head=twins["head"])
    assert got == pytest.approx(x[:, 0].tolist(), abs=1e-5)
    assert len(set(got)) == 4


def test_image_reward_standardises_the_head_on_the_text_cls_feature(twins):
    images, prompts = batch(2)
    model = ImageRewardModel.from_pretrained(twins["image_reward"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(twins["image_reward"])
    text = tokenizer(prompts, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    assert text.input_ids.shape == (4, 35) and (text.input_ids[:, 0] == tokenizer.cls_token_id).all()
    pix = torch.stack([hand_pixels(image, SIZE, OPENAI_MEAN, OPENAI_STD) for image in images])
    with torch.no_grad():
        tokens = model.vision_model(pixel_values=pix).last_hidden_state
        cls = model.text_encoder(input_ids=text.input_ids, attention_mask=text.attention_mask,
                                 encoder_hidden_states=tokens).last_hidden_state[:, 0]  # fmt: skip
        raw = model.mlp(cls)
    expected = (raw - 0.16717362830052426) / 1.0333394966054072  # ImageReward.py's mean and std
    got = image_reward(images, prompts, [{}] * 4, path=twins["image_reward"])
    assert got == pytest.approx(expected.tolist(), abs=1e-5) and len(set(got)) == 4


def test_models_load_once_per_path_and_device(twins):
    images, prompts = batch()
    clip_score(images, prompts, [{}] * 4, path=twins["clip"])
    before = load_clip.cache_info()
    clip_score(images, prompts, [{}] * 4, path=twins["clip"], device="cpu")
    after = load_clip.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 1


def test_a_wrong_path_names_the_option_and_a_wrong_folder_names_the_missing_weights(twins, tmp_path):
    images, prompts = batch()
    with pytest.raises(ValueError, match=r"reward 'hps': path='/no/such' is not a folder; set reward.options"):
        hps(images, prompts, [{}] * 4, path="/no/such")
    with pytest.raises(ValueError, match=r"reward 'aesthetic': head='/no/head.pth' is not a file"):
        aesthetic(images, prompts, [{}] * 4, path=twins["clip"], head="/no/head.pth")
    with pytest.raises(ValueError, match=r"does not load as ImageRewardModel .*is it the right folder"):
        image_reward(images, prompts, [{}] * 4, path=twins["clip"])
    model = CLIPModel.from_pretrained(twins["clip"])
    vision = {k: v for k, v in model.state_dict().items() if k.startswith("vision_model.")}
    model.save_pretrained(tmp_path / "half", state_dict=vision)
    AutoTokenizer.from_pretrained(twins["clip"]).save_pretrained(tmp_path / "half")
    CLIPImageProcessorPil.from_pretrained(twins["clip"]).save_pretrained(tmp_path / "half")
    with pytest.raises(ValueError, match=r"half lacks \d+ weights of CLIPModel \(\['logit_scale', 'text_model"):
        clip_score(images, prompts, [{}] * 4, path=str(tmp_path / "half"))


OPTIONS = {
    "clip_score": lambda t: {"path": t["clip"]},
    "pickscore": lambda t: {"path": t["pick"]},
    "aesthetic": lambda t: {"path": t["clip"], "head": t["head"]},
    "hps": lambda t: {"path": t["clip"]},
    "image_reward": lambda t: {"path": t["image_reward"]},
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_reward_scores_the_same_behind_a_reward_server(twins, name):
    images, prompts = batch(3)
    fn = lookup(name, OPTIONS[name](twins))
    expected = fn(images, prompts, [{}] * 4)
    with RewardServer(fn, name, port=0) as server:
        got = RemoteReward(server.url, chunk=3)(images, prompts, [{}] * 4)  # two requests, batched or not
    assert got == pytest.approx(expected, abs=1e-4)


def test_serve_reward_command_serves_a_preference_model(twins):
    images, prompts = batch(4)
    options = json.dumps(OPTIONS["image_reward"](twins))
    process = subprocess.Popen([sys.executable, "-m", "omnialign", "serve-reward", "image_reward", "--port", "0",
                                "--options", options], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = process.stdout.readline()
        assert "serving reward 'image_reward'" in line, line
        got = RemoteReward(line.split(" at ")[1].split()[0])(images, prompts, [{}] * 4)
    finally:
        process.kill()
    assert got == pytest.approx(image_reward(images, prompts, [{}] * 4, path=twins["image_reward"]), abs=1e-4)


# ---------------------------------------------------------------------------------------------- converters


class Block(nn.Module):
    """open_clip's ResidualAttentionBlock: pre-norm nn.MultiheadAttention and a GELU MLP (c_fc, c_proj)."""

    def __init__(self, width: int, heads: int, hidden: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(OrderedDict(c_fc=nn.Linear(width, hidden), gelu=nn.GELU(),
                                             c_proj=nn.Linear(hidden, width)))  # fmt: skip

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        h = self.ln_1(x)
        x = x + self.attn(h, h, h, need_weights=False, attn_mask=mask)[0]
        return x + self.mlp(self.ln_2(x))


class Tower(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int, layers: int):
        super().__init__()
        self.resblocks = nn.ModuleList(Block(width, heads, hidden) for _ in range(layers))


class OpenClip(nn.Module):
    """open_clip's CLIP (ViT image tower, causal text tower) in its own parameter names, written from its source."""

    def __init__(self, c: CLIPConfig):
        super().__init__()
        v, t, e = c.vision_config, c.text_config, c.projection_dim
        self.visual = nn.Module()
        self.visual.conv1 = nn.Conv2d(3, v.hidden_size, v.patch_size, v.patch_size, bias=False)
        self.visual.class_embedding = nn.Parameter(torch.randn(v.hidden_size))
        self.visual.positional_embedding = nn.Parameter(torch.randn((v.image_size // v.patch_size) ** 2 + 1,
                                                                    v.hidden_size))  # fmt: skip
        self.visual.ln_pre, self.visual.ln_post = nn.LayerNorm(v.hidden_size), nn.LayerNorm(v.hidden_size)
        self.visual.transformer = Tower(v.hidden_size, v.num_attention_heads, v.intermediate_size,
                                        v.num_hidden_layers)  # fmt: skip
        self.visual.proj = nn.Parameter(torch.randn(v.hidden_size, e) / 7)
        self.token_embedding = nn.Embedding(t.vocab_size, t.hidden_size)
        self.positional_embedding = nn.Parameter(torch.randn(t.max_position_embeddings, t.hidden_size) / 5)
        self.transformer = Tower(t.hidden_size, t.num_attention_heads, t.intermediate_size, t.num_hidden_layers)
        self.ln_final = nn.LayerNorm(t.hidden_size)
        self.text_projection = nn.Parameter(torch.randn(t.hidden_size, e) / 6)
        self.logit_scale = nn.Parameter(torch.tensor(math.log(1 / 0.07)))
        jitter(self)

    def encode_image(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.visual.conv1(pixels).flatten(2).transpose(1, 2)
        x = torch.cat([self.visual.class_embedding.expand(len(x), 1, -1), x], dim=1) + self.visual.positional_embedding
        x = self.visual.ln_pre(x)
        for block in self.visual.transformer.resblocks:
            x = block(x)
        return self.visual.ln_post(x[:, 0]) @ self.visual.proj

    def encode_text(self, ids: torch.Tensor) -> torch.Tensor:  # ids padded with 0 to the context, as open_clip's
        x = self.token_embedding(ids) + self.positional_embedding
        mask = torch.full((ids.shape[1], ids.shape[1]), float("-inf")).triu(1)
        for block in self.transformer.resblocks:
            x = block(x, mask)
        return self.ln_final(x)[torch.arange(len(ids)), ids.argmax(-1)] @ self.text_projection


def test_open_clip_conversion_scores_as_the_open_clip_forward(twins, tmp_path):
    """HPS: an open_clip checkpoint ({"state_dict": ...}, as HPS ships it) converted against a base folder scores
    cos(image, text) exactly as the open_clip forward computes it."""
    config = CLIPConfig.from_pretrained(twins["clip"])
    torch.manual_seed(7)
    reference = OpenClip(config).eval()
    torch.save({"state_dict": {f"module.{k}": v.half() for k, v in reference.state_dict().items()}},
               tmp_path / "hps.pt")  # fmt: skip
    reference = reference.half().float()  # the checkpoint is stored in half precision, as HPS_v2_compressed.pt
    out = convert_open_clip(tmp_path / "hps.pt", twins["clip"], tmp_path / "hps")
    images, prompts = batch(5)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = torch.zeros(4, 77, dtype=torch.long)
    for i, row in enumerate(tokenizer(prompts).input_ids):
        ids[i, : len(row)] = torch.tensor(row)
    pix = torch.stack([hps_reference(image, SIZE) for image in images])  # HPS v2's preprocessing, non-square
    with torch.no_grad():
        expected = torch.cosine_similarity(reference.encode_image(pix), reference.encode_text(ids), dim=-1)
    got = hps(images, prompts, [{}] * 4, path=str(out))
    assert got == pytest.approx(expected.tolist(), abs=1e-5) and len(set(got)) == 4
    torch.save({"visual.extra": torch.zeros(1), **reference.state_dict()}, tmp_path / "bad.pt")
    with pytest.raises(ValueError, match=r"unknown keys \['visual.extra'\]"):
        convert_open_clip(tmp_path / "bad.pt", twins["clip"], tmp_path / "bad")


# BLIP's own names (BLIP/models/vit.py, med.py), written here from its source: this model's name -> BLIP's
TO_BLIP = [("vision_model.embeddings.class_embedding", "visual_encoder.cls_token"),
           ("vision_model.embeddings.position_embedding", "visual_encoder.pos_embed"),
           ("vision_model.embeddings.patch_embedding.", "visual_encoder.patch_embed.proj."),
           ("vision_model.post_layernorm.", "visual_encoder.norm."),
           ("vision_model.encoder.layers.", "visual_encoder.blocks."),
           (".layer_norm1.", ".norm1."), (".layer_norm2.", ".norm2."), (".self_attn.qkv.", ".attn.qkv."),
           (".self_attn.projection.", ".attn.proj.")]  # fmt: skip


def test_image_reward_conversion_from_the_released_layout(twins, tmp_path):
    """ImageReward.pt's layout (blip.visual_encoder.*, blip.text_encoder.*, mlp.layers.*, plus BLIP's unused
    projections and position ids) and its med_config.json convert to the same model, scoring the same."""
    model = ImageRewardModel.from_pretrained(twins["image_reward"])
    released = {}
    for key, value in model.state_dict().items():
        for ours, blip in TO_BLIP:
            key = key.replace(ours, blip)
        released[key if key.startswith("mlp.") else f"blip.{key}"] = value.clone()
    released["blip.text_encoder.embeddings.position_ids"] = torch.arange(40)[None]
    released["blip.vision_proj.weight"], released["blip.text_proj.weight"] = torch.zeros(8, 128), torch.zeros(8, 32)
    assert any(k.startswith("blip.visual_encoder.blocks.1.attn.qkv") for k in released)
    torch.save(released, tmp_path / "ImageReward.pt")
    text = model.config.text_config
    med = {"architectures": ["BertModel"], "hidden_act": "gelu", "hidden_size": text.hidden_size, "model_type": "bert",
           "intermediate_size": text.intermediate_size, "layer_norm_eps": 1e-12, "max_position_embeddings": 40,
           "num_attention_heads": text.num_attention_heads, "num_hidden_layers": text.num_hidden_layers,
           "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": text.vocab_size, "encoder_width": 768,
           "add_cross_attention": True}  # fmt: skip
    (tmp_path / "med_config.json").write_text(json.dumps(med))
    bert_tokenizer().save_pretrained(tmp_path / "bert-base-uncased")
    out = convert_image_reward(tmp_path / "ImageReward.pt", tmp_path / "med_config.json",
                               tmp_path / "bert-base-uncased", tmp_path / "converted")  # fmt: skip
    converted = ImageRewardModel.from_pretrained(out)
    assert converted.config.vision_config.num_attention_heads == 2 and converted.config.vision_config.image_size == 32
    assert converted.state_dict().keys() == model.state_dict().keys()
    assert all(torch.equal(converted.state_dict()[k], v) for k, v in model.state_dict().items())
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.bos_token == "[DEC]" and tokenizer.tokenize("a [ENC] b") == ["a", "[ENC]", "b"]
    images, prompts = batch(6)
    got = image_reward(images, prompts, [{}] * 4, path=str(out))
    assert got == pytest.approx(image_reward(images, prompts, [{}] * 4, path=twins["image_reward"]), abs=1e-6)


# ---------------------------------------------------------------------------------------------- group-wise rewards


def flat(values: list[float]) -> torch.Tensor:
    """Images (len, 3, 4, 4), each one grey level."""
    return torch.tensor(values).view(-1, 1, 1, 1).expand(-1, 3, 4, 4).clone()


def test_pairwise_win_rate_by_hand():
    """Groups interleaved in the batch; a judge P(a better) = table[a, b] by grey level."""
    table = {(0.1, 0.2): 0.3, (0.2, 0.1): 0.6, (0.1, 0.3): 0.8, (0.3, 0.1): 0.4, (0.2, 0.3): 1.0, (0.3, 0.2): 0.2,
             (0.5, 0.6): 0.9, (0.6, 0.5): 0.3}  # fmt: skip
    judge = lambda a, b, prompt: table[round(float(a.mean()), 1), round(float(b.mean()), 1)]
    images = flat([0.1, 0.5, 0.2, 0.6, 0.3, 0.7])
    meta = [{"group": g} for g in ("x", "y", "x", "y", "x", "z")]
    one_way = pairwise_win_rate(judge, images, ["p"] * 6, meta, both_orders=False)
    # x: pairs (0.1,0.2)=0.3, (0.1,0.3)=0.8, (0.2,0.3)=1.0 -> 0.1: (0.3+0.8)/2, 0.2: (0.7+1.0)/2, 0.3: (0.2+0.0)/2
    assert one_way == pytest.approx([0.55, 0.9, 0.85, 0.1, 0.1, 0.5])
    both = pairwise_win_rate(judge, images, ["p"] * 6, meta)
    # P(0.1 beats 0.2) = (0.3 + 1 - 0.6) / 2 = 0.35; (0.1 vs 0.3) = (0.8 + 0.6) / 2 = 0.7; (0.2 vs 0.3) = 0.9;
    # y: (0.9 + 0.7) / 2 = 0.8; z alone: 0.5
    assert both == pytest.approx([(0.35 + 0.7) / 2, 0.8, (0.65 + 0.9) / 2, 0.2, (0.3 + 0.1) / 2, 0.5])
    assert both.info[0] == {"win_rate": pytest.approx(0.525), "opponents": 2} and both.info[5]["opponents"] == 0
    with pytest.raises(ValueError, match=r'metadata\[1\] has no "group"'):
        pairwise_win_rate(judge, images[:2], ["p"] * 2, [{"group": 0}, {}])
    with pytest.raises(ValueError, match=r"values outside \[0, 1\]"):
        pairwise_win_rate(lambda a, b, p: 2.0, images[:2], ["p"] * 2, [{"group": 0}] * 2)


def test_group_spans_cut_only_between_groups():
    assert group_spans([0, 0, 0, 1, 1, 1, 2, 2, 2], 4) == [slice(0, 6), slice(6, 9)]
    assert group_spans([0, 0, 1, 1, 2], 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert group_spans([5, 5, 5], 1) == [slice(0, 3)]


def test_parse_preference():
    assert parse_preference("Image 1 has a cat.\nBetter Image: 2") == 2
    assert parse_preference("**Better image:** Image 1") == 1
    assert parse_preference("I think Image 2 is better.") == 2
    assert parse_preference("Both are fine.") is None


class PairJudge(JSONHandler):
    """An OpenAI-compatible chat endpoint that prefers the brighter of its two images (or, with bias, always the
    first); it checks the request's shape and counts requests."""

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        content = body["messages"][0]["content"]
        urls = [part["image_url"]["url"] for part in content if part["type"] == "image_url"]
        assert len(urls) == 2 and content[-1]["type"] == "text" and "Text caption: a cat" in content[-1]["text"]
        means = [np.asarray(Image.open(io.BytesIO(base64.b64decode(u.split(",", 1)[1])))).mean() for u in urls]
        self.server.requests += 1
        choice = {"first": "1", "none": "neither"}.get(self.server.mode, "1" if means[0] > means[1] else "2")
        self.answer(200, {"choices": [{"message": {"content": f"Reasoning...\nBetter Image: {choice}"}}]})


@pytest.fixture
def pair_judge():
    server = ThreadingHTTPServer(("127.0.0.1", 0), PairJudge)
    server.requests, server.mode = 0, "brighter"
    with serving(server):
        yield server


def test_pairwise_vlm_win_rates_from_a_judge_over_http(pair_judge, caplog):
    url = f"http://127.0.0.1:{pair_judge.server_port}/v1"
    images = flat([0.2, 0.9, 0.5, 0.4, 0.1])
    meta = [{"group": 0}] * 3 + [{"group": 1}] * 2
    got = pairwise_vlm(images, ["a cat"] * 5, meta, url=url, model="judge")
    assert got == pytest.approx([0.0, 1.0, 0.5, 1.0, 0.0]) and pair_judge.requests == 2 * (3 + 1)
    pair_judge.mode = "first"  # a judge that always picks the first image: both orders cancel it
    assert pairwise_vlm(images, ["a cat"] * 5, meta, url=url, model="judge") == pytest.approx([0.5] * 5)
    assert pairwise_vlm(images, ["a cat"] * 5, meta, url=url, model="judge", both_orders=False) == pytest.approx(
        [1.0, 0.5, 0.0, 1.0, 0.0]
    )
    pair_judge.mode = "none"
    with caplog.at_level("WARNING", logger="omnialign.rewards.pairwise"):
        assert pairwise_vlm(images, ["a cat"] * 5, meta, url=url, model="judge") == pytest.approx([0.5] * 5)
    assert re.search(r"8 of the judge's replies named no better image", caplog.text)


def test_the_online_trainer_hands_group_wise_rewards_whole_groups(tmp_path):
    """Rollout chunks of 6 with groups of 4: the rewards see rows 0-11 (groups 0-2) and 12-15 (group 3), never a
    split group; win rates average 0.5 in every group, so the step's mean reward is exactly 0.5."""
    (tmp_path / "group_reward.py").write_text(
        "from omnialign.rewards.pairwise import pairwise_win_rate\n"
        "calls = []\n"
        "def brighter_wins(outputs, prompts, metadata):\n"
        "    calls.append([m['group'] for m in metadata])\n"
        "    judge = lambda a, b, prompt: float(a.mean() > b.mean())\n"
        "    return pairwise_win_rate(judge, outputs, prompts, metadata)\n"
    )
    spec = f"{tmp_path / 'group_reward.py'}:brighter_wins"
    config = validate(apply_overrides(RECIPES["debug"](), [
        f"trainer.output_dir={tmp_path}", "trainer.total_steps=1", "data.prompts_per_step=4", "data.val_seeds=2",
        "rollout.micro_batch_size=6", f'reward.weights={{"{spec}": 1.0}}']))  # fmt: skip
    main(config)
    calls = lookup(spec).__globals__["calls"]
    train = [c for c in calls if set(Counter(c).values()) == {4}]  # validation's groups have 2 samples
    assert train == [[0] * 4 + [1] * 4 + [2] * 4, [3] * 4]
    records = read_metrics(tmp_path / "debug" / "metrics.jsonl")
    assert records[1]["reward/mean"] == pytest.approx(0.5, abs=1e-6) and records[1]["reward/std"] > 0
    assert records[0]["val/reward/mean"] == pytest.approx(0.5, abs=1e-6)
