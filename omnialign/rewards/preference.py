"""Image preference reward models from local weights: CLIP score, PickScore, LAION aesthetics, HPS v2, ImageReward.

Each reward is a plain function over a batch (images (B, C, H, W) in [0, 1], B prompts), scored in one
forward pass, on `device` (default: the images' device); the model loads once per (path, device) and stays
cached. Nothing is downloaded: `path` is a local folder. Preprocessing is the published one, done by
transformers' PIL image processor (`CLIPImageProcessorPil`, whatever torchvision is installed): each image as
8-bit RGB, resized with PIL bicubic so that its shorter side is the model's input size, centre-cropped to a
square, scaled to [0, 1] and normalised with the OpenAI CLIP mean and std (read from the folder's
`preprocessor_config.json`, or, for ImageReward, the constants of its `_transform`). Sign and range of each
are in docs/rewards.md; all are higher-is-better.

- `clip_score`: 100 * max(cos(image, text), 0) of a transformers `CLIPModel` (torchmetrics' CLIPScore).
- `pickscore`: logit_scale.exp() * cos(image, text) (PickScore_v1's published scoring).
- `aesthetic`: the LAION aesthetic predictor v2: an MLP head (768-1024-128-64-16-1) over the L2-normalised
  CLIP ViT-L/14 image embedding.
- `hps`: HPS v2 / v2.1: cos(image, text) of the HPS-tuned open_clip ViT-H-14, converted to a transformers
  `CLIPModel` once with `convert_open_clip` (open_clip itself needs torchvision, which does not import beside
  every torch build). Its preprocessing is HPS v2's own, not the above (`hps_pixels`): the longer side resized to
  the input size and the rest padded with zeros to a square, in tensors on the images' device.
- `image_reward`: ImageReward: BLIP ViT-L image tokens cross-attended by the BLIP text encoder, the [CLS]
  feature through the published MLP head, (r - 0.16717362830052426) / 1.0333394966054072; the released
  checkpoint converted to `ImageRewardModel` (transformers' BLIP modules) once with `convert_image_reward`
  (the `image-reward` package pins timm 0.6 and torchvision, and downloads its config at load time).
"""

import json
import math
import re
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from transformers import (
    AutoTokenizer,
    BlipConfig,
    BlipPreTrainedModel,
    BlipTextConfig,
    BlipTextModel,
    BlipVisionConfig,
    BlipVisionModel,
    CLIPConfig,
    CLIPImageProcessorPil,
    CLIPModel,
    PreTrainedTokenizerBase,
)

from omnialign.rewards.base import Outputs, images_of, to_pil

# ImageReward.py (THUDM/ImageReward, v1.0): the reward model's output is standardised with these
IMAGE_REWARD_MEAN, IMAGE_REWARD_STD = 0.16717362830052426, 1.0333394966054072
IMAGE_REWARD_MAX_TOKENS = 35  # its tokenizer call: padding="max_length", truncation=True, max_length=35
# open_clip's OPENAI_DATASET_MEAN / STD, with which HPS v2's preprocess_val normalises
HPS_MEAN, HPS_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


class MLPHead(nn.Module):
    """The aesthetic predictor's MLP (improved-aesthetic-predictor, also ImageReward's `MLP`): linear layers
    width-1024-128-64-16-1 with dropout between and no activation; state-dict keys `layers.{0,2,4,6,7}.*`."""

    def __init__(self, width: int):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Linear(width, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1),
        )  # fmt: skip

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.layers(features).squeeze(-1)


class ImageRewardModel(BlipPreTrainedModel):
    """ImageReward on transformers' BLIP: a BLIP ViT (`vision_model`), the BLIP text encoder with cross-attention
    to the image tokens (`text_encoder`, no pooler) and the MLP head (`mlp`) on the text [CLS] feature."""

    config_class = BlipConfig

    def __init__(self, config: BlipConfig):
        super().__init__(config)
        self.vision_model = BlipVisionModel(config.vision_config)
        self.text_encoder = BlipTextModel(config.text_config, add_pooling_layer=False)
        self.mlp = MLPHead(config.text_config.hidden_size)
        self.post_init()

    def forward(
        self, pixel_values: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """The raw reward (before standardisation) of each (image, text) pair, (B,)."""
        image_embeds = self.vision_model(pixel_values=pixel_values).last_hidden_state
        image_mask = torch.ones(image_embeds.shape[:-1], dtype=torch.long, device=image_embeds.device)
        text = self.text_encoder(input_ids=input_ids, attention_mask=attention_mask,
                                 encoder_hidden_states=image_embeds, encoder_attention_mask=image_mask)  # fmt: skip
        return self.mlp(text.last_hidden_state[:, 0].float())


def _folder(path: str, reward: str, option: str = "path") -> str:
    if not Path(path).is_dir():
        raise ValueError(f"reward {reward!r}: {option}={path!r} is not a folder; set reward.options[{reward!r}]"
                         f"[{option!r}] to a local folder of the model (docs/rewards.md says which)")  # fmt: skip
    return path


def _pretrained(cls: type, path: str, device: str) -> nn.Module:
    """`cls.from_pretrained(path)` in float32 on `device`, frozen; ValueError when weights are missing."""
    try:
        model, info = cls.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    except (OSError, RuntimeError) as e:
        raise ValueError(f"{path} does not load as {cls.__name__} ({str(e)[-300:]}); is it the right folder for this "
                         "reward (docs/rewards.md)?") from None  # fmt: skip
    if info["missing_keys"]:
        missing = sorted(info["missing_keys"])
        raise ValueError(f"{path} lacks {len(missing)} weights of {cls.__name__} ({missing[:4]}...); is it the "
                         "right folder for this reward (docs/rewards.md)?")  # fmt: skip
    return model.to(device).requires_grad_(False).eval()


@lru_cache(maxsize=8)
def load_clip(
    path: str, processor: str | None, device: str
) -> tuple[CLIPModel, PreTrainedTokenizerBase, CLIPImageProcessorPil]:
    """A CLIPModel from `path` and its tokenizer and image processor from `processor` (default `path`)."""
    source = processor or path
    tokenizer, image_processor = AutoTokenizer.from_pretrained(source), CLIPImageProcessorPil.from_pretrained(source)
    return _pretrained(CLIPModel, path, device), tokenizer, image_processor


def _clip(reward: str, path: str, processor: str | None, device: str) -> tuple:
    """`load_clip` of a reward's options, checked first."""
    return load_clip(_folder(path, reward), processor and _folder(processor, reward, "processor"), device)


@lru_cache(maxsize=4)
def load_head(head: str, width: int, device: str) -> MLPHead:
    """The aesthetic MLP head from a .pth/.pt (a state dict) or .safetensors file."""
    if not Path(head).is_file():
        raise ValueError(f"reward 'aesthetic': head={head!r} is not a file; give the LAION aesthetic predictor "
                         "head, e.g. sac+logos+ava1-l14-linearMSE.pth")  # fmt: skip
    model = MLPHead(width)
    try:
        model.load_state_dict(_load_checkpoint(head))
    except RuntimeError as e:
        raise ValueError(f"reward 'aesthetic': head={head!r} is not an MLP head over {width}-wide CLIP image "
                         f"embeddings: {e}") from None  # fmt: skip
    return model.to(device).requires_grad_(False).eval()


@lru_cache(maxsize=4)
def load_image_reward(
    path: str, device: str
) -> tuple[ImageRewardModel, PreTrainedTokenizerBase, CLIPImageProcessorPil]:
    """An ImageRewardModel folder (from `convert_image_reward`), its tokenizer and ImageReward's preprocessing."""
    model = _pretrained(ImageRewardModel, path, device)
    size = model.config.vision_config.image_size  # Resize(size, bicubic), CenterCrop(size), OpenAI CLIP mean/std
    processor = CLIPImageProcessorPil(size={"shortest_edge": size}, crop_size={"height": size, "width": size})
    return model, AutoTokenizer.from_pretrained(path), processor


def pixels(images: torch.Tensor, processor: CLIPImageProcessorPil, device: torch.device | str) -> torch.Tensor:
    """The published preprocessing of a batch (B, C, H, W) in [0, 1]: 8-bit RGB through the PIL image processor."""
    pil = [to_pil(image).convert("RGB") for image in images]
    return processor(images=pil, return_tensors="pt")["pixel_values"].to(device)


def hps_pixels(images: torch.Tensor, size: int, device: torch.device | str) -> torch.Tensor:
    """HPS v2's preprocessing of a batch (B, C, H, W) in [0, 1], in tensors on `device`: `preprocess_val` of
    hpsv2/img_score.py, open_clip's `image_transform(size, is_train=False, resize_longest_max=True)` (hpsv2's copy):
    the image as 8-bit RGB to [0, 1] (ToTensor of a PIL image), its longer side resized to `size` and the other to
    round(side * size / longer) with torchvision's tensor bicubic (antialiased, align_corners=False, unclamped),
    padded with 0 to a square, the odd pixel of a margin after the image (bottom, right), then normalised with
    the OpenAI CLIP mean and std. The reference leaves an image whose longer side is already `size` unpadded (its
    ViT then fails on a non-square one); here it is padded as any other."""
    x = images.to(device).float().clamp(0, 1).mul(255).round().div(255)
    x = x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x
    h, w = x.shape[-2:]
    new_h, new_w = round(h * size / max(h, w)), round(w * size / max(h, w))
    if (new_h, new_w) != (h, w):
        x = F.interpolate(x, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True)
    pad_h, pad_w = size - new_h, size - new_w
    x = F.pad(x, (pad_w // 2, pad_w - pad_w // 2, pad_h // 2, pad_h - pad_h // 2), value=0.0)
    mean, std = (torch.tensor(v, dtype=x.dtype, device=x.device).view(3, 1, 1) for v in (HPS_MEAN, HPS_STD))
    return (x - mean) / std


def _cosines(images: torch.Tensor, prompts: list[str], path: str, processor: str | None, device: str | None,
             reward: str) -> tuple[torch.Tensor, CLIPModel]:  # fmt: skip
    """cos(image embedding, text embedding) of each pair (B,) with the published preprocessing, and the model."""
    device = str(device or images.device)
    model, tokenizer, image_processor = _clip(reward, path, processor, device)
    return _pair_cosines(model, tokenizer, pixels(images, image_processor, device), prompts), model


def _pair_cosines(
    model: CLIPModel, tokenizer: PreTrainedTokenizerBase, pixel_values: torch.Tensor, prompts: list[str]
) -> torch.Tensor:
    """cos(image embedding, text embedding) of each (preprocessed image, prompt) pair, (B,)."""
    text = tokenizer(prompts, padding=True, truncation=True, return_tensors="pt",
                     max_length=model.config.text_config.max_position_embeddings).to(pixel_values.device)  # fmt: skip
    image_features = model.get_image_features(pixel_values=pixel_values).pooler_output
    text_features = model.get_text_features(**text).pooler_output
    return torch.cosine_similarity(image_features.float(), text_features.float(), dim=-1)


def clip_score(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    path: str,
    processor: str | None = None,
    device: str | None = None,
) -> list[float]:
    """Reward: CLIP score 100 * max(cos(image, text), 0), in [0, 100]; higher is better."""
    cos, _ = _cosines(images_of(outputs, "clip_score"), prompts, path, processor, device, "clip_score")
    return (100 * cos).clamp(min=0).tolist()


def pickscore(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    path: str,
    processor: str | None = None,
    device: str | None = None,
) -> list[float]:
    """Reward: PickScore, logit_scale.exp() * cos(image, text) (about 100 * cos); higher is better."""
    cos, model = _cosines(images_of(outputs, "pickscore"), prompts, path, processor, device, "pickscore")
    return (model.logit_scale.exp().float() * cos).tolist()


def hps(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    path: str,
    processor: str | None = None,
    device: str | None = None,
) -> list[float]:
    """Reward: HPS v2 score cos(image, text) of the HPS CLIP (converted by `convert_open_clip`), on images
    preprocessed as HPS v2 does (`hps_pixels`: no crop, padded to a square); higher is better."""
    images = images_of(outputs, "hps")
    device = str(device or images.device)
    model, tokenizer, _ = _clip("hps", path, processor, device)
    pixel_values = hps_pixels(images, model.config.vision_config.image_size, device)
    return _pair_cosines(model, tokenizer, pixel_values, prompts).tolist()


def aesthetic(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    path: str,
    head: str,
    processor: str | None = None,
    device: str | None = None,
) -> list[float]:
    """Reward: the LAION aesthetic predictor v2 (about 1-10 on the AVA scale); the prompt is not used."""
    images = images_of(outputs, "aesthetic")
    device = str(device or images.device)
    model, _, image_processor = _clip("aesthetic", path, processor, device)
    features = model.get_image_features(pixel_values=pixels(images, image_processor, device)).pooler_output.float()
    mlp = load_head(head, features.shape[-1], device)
    return mlp(features / features.norm(dim=-1, keepdim=True)).tolist()


def image_reward(
    outputs: Outputs, prompts: list[str], metadata: list[dict], *, path: str, device: str | None = None
) -> list[float]:
    """Reward: ImageReward, standardised (about N(0, 1) over its training data); higher is better."""
    images = images_of(outputs, "image_reward")
    device = str(device or images.device)
    model, tokenizer, processor = load_image_reward(_folder(path, "image_reward"), device)
    text = tokenizer(prompts, padding="max_length", truncation=True, max_length=IMAGE_REWARD_MAX_TOKENS,
                     return_tensors="pt").to(device)  # fmt: skip
    raw = model(pixels(images, processor, device), text.input_ids, text.attention_mask)
    return ((raw - IMAGE_REWARD_MEAN) / IMAGE_REWARD_STD).tolist()


# Conversion of released checkpoints (run once, offline, on files you have).

_OPEN_CLIP = {
    "logit_scale": "logit_scale",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
}
_OPEN_CLIP_T = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight"}  # x @ W
_OPEN_CLIP_BLOCK = {"ln_1": "layer_norm1", "ln_2": "layer_norm2", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
                    "attn.out_proj": "self_attn.out_proj"}  # fmt: skip


def open_clip_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An open_clip CLIP state dict (OpenAI layout: `visual.*`, `transformer.resblocks.*`, ...) renamed to
    transformers' CLIPModel: fused in_proj split into q, k, v; projections transposed. ValueError on unknown keys."""
    out, unknown = {}, []
    for key, value in state.items():
        value = value.float()
        block = re.fullmatch(r"(visual\.)?transformer\.resblocks\.(\d+)\.(.+?)[._](weight|bias)", key)
        if key in _OPEN_CLIP:
            out[_OPEN_CLIP[key]] = value
        elif key in _OPEN_CLIP_T:
            out[_OPEN_CLIP_T[key]] = value.T.contiguous()
        elif block and (block[3] == "attn.in_proj" or block[3] in _OPEN_CLIP_BLOCK):
            visual, layer, name, kind = block.groups()
            prefix = f"{'vision' if visual else 'text'}_model.encoder.layers.{layer}."
            if name == "attn.in_proj":  # nn.MultiheadAttention's fused q, k, v
                for part, tensor in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3)):
                    out[f"{prefix}self_attn.{part}.{kind}"] = tensor.contiguous()
            else:
                out[f"{prefix}{_OPEN_CLIP_BLOCK[name]}.{kind}"] = value
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(f"not an open_clip CLIP (ViT) state dict: unknown keys {unknown[:6]} ({len(unknown)} in all)")
    return out


def _load_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """A state dict from .safetensors or a torch file (a bare state dict or {"state_dict": ...}), "module." removed."""
    path = str(path)
    state = (
        load_file(path) if path.endswith(".safetensors") else torch.load(path, map_location="cpu", weights_only=True)
    )
    state = state.get("state_dict", state)
    return {k.removeprefix("module."): v for k, v in state.items() if isinstance(v, torch.Tensor)}


def _save(model: nn.Module, state: dict[str, torch.Tensor], out: str | Path) -> None:
    """Load `state` into `model` strictly (ValueError naming what does not fit), then save_pretrained to `out`."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"the checkpoint does not fit {type(model).__name__}: {e}") from None
    model.save_pretrained(out)


def convert_open_clip(checkpoint: str | Path, base: str | Path, out: str | Path) -> Path:
    """Write an open_clip CLIP checkpoint (HPS v2: HPS_v2_compressed.pt, HPS v2.1: HPS_v2.1_compressed.pt) as a
    transformers CLIPModel folder at `out`, for the `hps` reward. `base` is a transformers CLIP folder of the same
    architecture (HPS: laion/CLIP-ViT-H-14-laion2B-s32B-b79K), whose config, tokenizer and image processor are
    used and copied."""
    model = CLIPModel(CLIPConfig.from_pretrained(base))
    _save(model, open_clip_state_dict(_load_checkpoint(checkpoint)), out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)
    CLIPImageProcessorPil.from_pretrained(base).save_pretrained(out)
    return Path(out)


_BLIP_VIT = [("visual_encoder.cls_token", "vision_model.embeddings.class_embedding"),
             ("visual_encoder.pos_embed", "vision_model.embeddings.position_embedding"),
             ("visual_encoder.patch_embed.proj.", "vision_model.embeddings.patch_embedding."),
             ("visual_encoder.blocks.", "vision_model.encoder.layers."),
             ("visual_encoder.norm.", "vision_model.post_layernorm."),
             (".norm1.", ".layer_norm1."), (".norm2.", ".layer_norm2."), (".attn.qkv.", ".self_attn.qkv."),
             (".attn.proj.", ".self_attn.projection.")]  # fmt: skip


def image_reward_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ImageReward's released state dict (`blip.visual_encoder.*` (BLIP ViT), `blip.text_encoder.*` (BLIP's BERT),
    `mlp.layers.*`) renamed to ImageRewardModel's; BLIP's unused contrastive projections and position-id buffers
    are dropped."""
    out = {}
    for key, value in state.items():
        if key.startswith(("blip.vision_proj.", "blip.text_proj.")) or key.endswith("position_ids"):
            continue
        key = key.removeprefix("blip.")
        if key.startswith("visual_encoder."):
            for old, new in _BLIP_VIT:
                key = key.replace(old, new)
        out[key] = value.float()
    return out


def convert_image_reward(
    checkpoint: str | Path, med_config: str | Path, tokenizer: str | Path, out: str | Path
) -> Path:
    """Write ImageReward's release (THUDM/ImageReward: ImageReward.pt and med_config.json) as an ImageRewardModel
    folder at `out`, for the `image_reward` reward. `tokenizer` is a bert-base-uncased tokenizer folder; BLIP's
    `[DEC]` and `[ENC]` tokens are added as BLIP's `init_tokenizer` does. The ViT's shape is read from the
    checkpoint (64-wide heads, as BLIP's base and large ViTs have)."""
    state = image_reward_state_dict(_load_checkpoint(checkpoint))
    med = json.loads(Path(med_config).read_text())
    cls, patch = (
        state["vision_model.embeddings.class_embedding"],
        state["vision_model.embeddings.patch_embedding.weight"],
    )
    width, tokens = cls.shape[-1], state["vision_model.embeddings.position_embedding"].shape[1] - 1
    vision = BlipVisionConfig(
        hidden_size=width,
        intermediate_size=state["vision_model.encoder.layers.0.mlp.fc1.weight"].shape[0],
        num_hidden_layers=len({k.split(".")[3] for k in state if k.startswith("vision_model.encoder.layers.")}),
        num_attention_heads=width // 64,
        patch_size=patch.shape[-1],
        image_size=patch.shape[-1] * math.isqrt(tokens),
        layer_norm_eps=1e-6,  # BLIP's ViT: partial(nn.LayerNorm, eps=1e-6)
    )
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "max_position_embeddings", "hidden_act", "layer_norm_eps", "pad_token_id")  # fmt: skip
    text = BlipTextConfig(encoder_hidden_size=width, **{k: med[k] for k in keys if k in med})
    _save(ImageRewardModel(BlipConfig(text_config=text.to_dict(), vision_config=vision.to_dict())), state, out)
    bert = AutoTokenizer.from_pretrained(tokenizer)
    bert.add_special_tokens({"bos_token": "[DEC]"})
    bert.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    bert.save_pretrained(out)
    return Path(out)
