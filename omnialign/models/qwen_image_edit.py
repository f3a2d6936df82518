"""Qwen-Image-Edit: the editing `DiffusionPolicy` over the components of diffusers' `QwenImageEditPipeline`
(Qwen-Image-Edit, one source image) or `QwenImageEditPlusPipeline` (Qwen-Image-Edit-2509 and -2511, one or more),
loaded from disk; model_index.json's `_class_name` says which.

The transformer call, latents, decoding and schedule are Qwen-Image's (`models/qwen_image.py`: the schedule's
shift counts the noisy tokens only, as in the pipelines). What the edit adds mirrors the pipelines exactly (a
test samples with both and compares):
- source images arrive as float tensors (C, H, W) in [0, 1] and become 8-bit RGB PIL images (exact for images
  read from 8-bit files), resized with the pipelines' own `VaeImageProcessor` (Lanczos).
- for the VAE each source is resized to about 1024x1024 pixels at its aspect ratio, sides multiples of 32
  (`model.source_resize=false` keeps its own size, floored to the latent multiple: cheaper with sources
  prepared small), VAE-encoded (the mode), normalised with latents_mean/std and packed into tokens on their grid
  (B, h/2, w/2, 4*z). The conditions keep them ("sources": "0", "1", ... in order); `velocity` appends them to
  the noisy latent tokens with an image shape each (img_shapes) and keeps the noisy tokens' outputs. A
  transformer with `zero_cond_t` (2511) gives them timestep 0 by itself.
- the instruction goes through the Qwen2.5-VL chat template with the sources as vision input: the Edit pipeline
  shows each prompt its VAE-sized source, the Plus pipeline every source resized to about 384x384 behind
  "Picture i: ". The processor's call is reproduced (its image processor, each `<|image_pad|>` expanded to its
  image's token count, its tokenizer) because transformers' `Qwen2VLProcessor` cannot be built without
  torchvision. Of the last hidden state of the valid tokens the 64 template prefix tokens are dropped; the rest
  (the sources' vision tokens and the instruction) is padded to the vision tokens plus `max_sequence_length`
  (`model.text_tokens`, default 512; longer instructions are cut), so conditions of any two batches whose
  sources come to the same sizes concatenate. The pipelines keep every token and pad to the longest prompt.
- the sources of one batch (source j of every prompt) must come to one size, as their tokens share the
  sequence: sources of other aspect ratios fail with a message. True CFG's negative prompt sees the same
  sources (the rollout passes them) and `rollout.cfg_rescale` is the pipelines' norm rescale.
"""

import json
import math

import torch
from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
from diffusers.image_processor import VaeImageProcessor
from PIL import Image
from tensordict import TensorDict
from transformers import (
    AutoImageProcessor,
    AutoTokenizer,
    BaseImageProcessor,
    PreTrainedTokenizerBase,
    Qwen2_5_VLForConditionalGeneration,
)

from omnialign.config import ModelConfig
from omnialign.models.qwen_image import (
    MAX_SEQUENCE_LENGTH,
    QwenImagePolicy,
    check_template_prefix,
    load_networks,
    pipeline_folder,
)

SYSTEM = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, objects, "
    "background), then explain how the user's text instruction should alter or modify the image. Generate a new "
    "image that meets the user's requirements while maintaining consistency with the original input where "
    "appropriate.<|im_end|>\n<|im_start|>user\n"
)
TEMPLATE_TOKENS = 64  # the system turn and the user header, dropped from the embeddings
IMAGE_PAD = "<|image_pad|>"
EDIT_TEMPLATE = SYSTEM + "<|vision_start|><|image_pad|><|vision_end|>{}<|im_end|>\n<|im_start|>assistant\n"
PLUS_TEMPLATE = SYSTEM + "{}<|im_end|>\n<|im_start|>assistant\n"
PICTURE = "Picture {}: <|vision_start|><|image_pad|><|vision_end|>"  # Plus: one per source, before the instruction
LAYOUTS = {"QwenImageEditPipeline": False, "QwenImageEditPlusPipeline": True}  # model_index _class_name -> plus
SOURCE_PIXELS = 1024 * 1024  # the area sources are resized to for the VAE (and the Edit pipeline's vision input)
CONDITION_PIXELS = 384 * 384  # the Plus pipeline's area of the vision input
PARTS = ("transformer", "vae", "text_encoder", "processor", "scheduler")


def resized_size(width: int, height: int, area: int) -> tuple[int, int]:
    """(width, height) of about `area` pixels at the aspect ratio width/height, sides rounded to multiples of 32."""
    ratio = width / height
    w = math.sqrt(area * ratio)
    return round(w / 32) * 32, round(w / ratio / 32) * 32


def to_pil(image: torch.Tensor) -> Image.Image:
    """A source image (C, H, W) in [0, 1], C = 1 or 3, as an 8-bit RGB PIL image."""
    pixels = (image.detach().float().clamp(0, 1) * 255).round().to(torch.uint8).cpu()
    return Image.fromarray(pixels.expand(3, -1, -1).permute(1, 2, 0).contiguous().numpy())


class QwenImageEditPolicy(QwenImagePolicy):
    """`DiffusionPolicy` over Qwen-Image-Edit (`plus`: 2509/2511); Qwen-Image's latents, source images in cond."""

    edits = True

    def __init__(
        self,
        transformer: QwenImageTransformer2DModel,
        vae: AutoencoderKLQwenImage,
        text_encoder: Qwen2_5_VLForConditionalGeneration,
        tokenizer: PreTrainedTokenizerBase,
        image_processor: BaseImageProcessor,
        scheduler: FlowMatchEulerDiscreteScheduler,
        plus: bool,
        shift: float | None = None,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
        source_resize: bool = True,
    ):
        super().__init__(transformer, vae, text_encoder, tokenizer, scheduler, shift, max_sequence_length)
        self.image_processor = image_processor  # Qwen2.5-VL's, of the processor
        self.plus = plus
        self.template = PLUS_TEMPLATE if plus else EDIT_TEMPLATE
        self.source_resize = source_resize
        self.vae_images = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor * 2)  # the pipelines' own

    def source_sizes(self, width: int, height: int) -> tuple[tuple[int, int], tuple[int, int]]:
        """(width, height) for the VAE, and for the vision input, of a source of the given size."""
        if self.source_resize:
            vae = resized_size(width, height, SOURCE_PIXELS)
        else:
            multiple = self.vae_scale_factor * 2
            vae = (width // multiple * multiple, height // multiple * multiple)
        return vae, resized_size(width, height, CONDITION_PIXELS) if self.plus else vae

    def _check(self, prompts: list[str], sources: list[list[torch.Tensor]] | None) -> list[list[Image.Image]]:
        """The sources as PIL images, after checking that they fit the pipeline and come to one size per index."""
        if sources is None or len(sources) != len(prompts):
            got = "none" if sources is None else f"{len(sources)} lists"
            raise ValueError(
                f"Qwen-Image-Edit edits source images: give one list of them per prompt ({len(prompts)} prompts), "
                f"got {got} (the prompts' metadata 'sources', as `omnialign prepare edit` writes them)"
            )
        images = [[to_pil(s) for s in row] for row in sources]
        count = 1 if not self.plus else len(images[0])
        for i, row in enumerate(images):
            if len(row) != count or not row:
                raise ValueError(
                    f"prompt {i} has {len(row)} source images: Qwen-Image-Edit takes one per prompt (-2509 and -2511 "
                    "take several, the same number for every prompt of a batch)"
                    if not self.plus
                    else f"prompt {i} has {len(row)} source images, prompt 0 {count}: the prompts of a batch must "
                    "have the same number of sources (they share the token sequence)"
                )
            for j, image in enumerate(row):
                sizes, first = self.source_sizes(*image.size), self.source_sizes(*images[0][j].size)
                (width, height), (width0, height0) = image.size, images[0][j].size
                if sizes != first:
                    raise ValueError(
                        f"source {j} of prompt {i} ({width}x{height}) comes to {sizes[0][0]}x{sizes[0][1]} pixels, "
                        f"that of prompt 0 ({width0}x{height0}) to {first[0][0]}x{first[0][1]}: the sources of a "
                        "batch share the token sequence, so they must come to one size; prepare the sources at one "
                        "size or aspect ratio (e.g. `omnialign prepare edit --size 512x512`)"
                    )
                if min(sizes[0]) == 0:
                    raise ValueError(
                        f"source {j} of prompt {i} is {width}x{height} pixels, less than "
                        f"{self.vae_scale_factor * 2} on a side: give larger sources, or set model.source_resize=true"
                    )
        return images

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: list[list[torch.Tensor]] | None = None) -> TensorDict:
        """embeds (B, T, D) and mask (B, T) as Qwen-Image's, with T = the sources' vision tokens +
        max_sequence_length; sources: the packed source latents "0", "1", ... each (B, h_j, w_j, 4*z)."""
        images = self._check(prompts, sources)
        vae_images, vision = [], []
        for row in images:
            sized = [self.source_sizes(*image.size) for image in row]
            vae_images.append([self.vae_images.resize(im, h, w) for im, ((w, h), _) in zip(row, sized)])
            vision += [self.vae_images.resize(im, h, w) for im, (_, (w, h)) in zip(row, sized)]
        out = self.image_processor(images=vision, return_tensors="pt")
        counts = (out["image_grid_thw"].prod(-1) // self.image_processor.merge_size**2).tolist()
        per_prompt = len(images[0])
        texts = []
        for i, prompt in enumerate(prompts):
            pictures = "".join(PICTURE.format(j + 1) for j in range(per_prompt)) if self.plus else ""
            parts = self.template.format(pictures + prompt).split(IMAGE_PAD)
            mine = counts[i * per_prompt : (i + 1) * per_prompt]
            texts.append(parts[0] + "".join(IMAGE_PAD * n + part for n, part in zip(mine, parts[1:])))
        device = self.text_encoder.device
        tokens = self.tokenizer(texts, padding=True, return_tensors="pt").to(device)
        pixels, grids = out["pixel_values"].to(device), out["image_grid_thw"].to(device)
        hidden = self.text_encoder(
            input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, pixel_values=pixels,
            image_grid_thw=grids, output_hidden_states=True, logits_to_keep=1,  # the logits are not used
        ).hidden_states[-1]  # fmt: skip
        length = sum(counts[:per_prompt]) + self.max_sequence_length
        embeds = hidden.new_zeros(len(prompts), length, hidden.shape[-1])
        mask = torch.zeros(len(prompts), length, dtype=torch.long, device=hidden.device)
        for i, (row, valid) in enumerate(zip(hidden, tokens.attention_mask.bool())):
            kept = row[valid][TEMPLATE_TOKENS:][:length]
            embeds[i, : len(kept)], mask[i, : len(kept)] = kept, 1
        latents = {str(j): self.encode_sources([row[j] for row in vae_images]) for j in range(per_prompt)}
        return TensorDict(embeds=embeds, mask=mask, sources=TensorDict(latents, batch_size=[len(prompts)]),
                          batch_size=[len(prompts)])  # fmt: skip

    def encode_sources(self, images: list[Image.Image]) -> torch.Tensor:
        """Same-size source images to packed, normalised VAE latents on their token grid (B, h/2, w/2, 4*z)."""
        width, height = images[0].size
        x = torch.cat([self.vae_images.preprocess(im, height, width) for im in images]).unsqueeze(2)  # (B, 3, 1, H, W)
        z = self.vae.encode(x.to(self.vae.device, self.vae.dtype)).latent_dist.mode()[:, :, 0]  # (B, z, h, w)
        mean, std = (torch.tensor(v, device=z.device, dtype=z.dtype).view(1, -1, 1, 1)
                     for v in (self.vae.config.latents_mean, self.vae.config.latents_std))  # fmt: skip
        z = (z - mean) / std
        batch, channels, h, w = z.shape
        z = z.view(batch, channels, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
        return z.reshape(batch, h // 2, w // 2, channels * 4)

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        sources = cond["sources"]
        return self.transformer_velocity(
            latents, sigma, cond, tuple(sources[str(j)] for j in range(len(sources.keys())))
        )


def load(config: ModelConfig) -> QwenImageEditPolicy:
    """Load from `config.path`, a folder in the diffusers `QwenImageEditPipeline` or `QwenImageEditPlusPipeline`
    layout (model_index.json's `_class_name`); encoders frozen, eval."""
    layouts = "QwenImageEditPipeline or QwenImageEditPlusPipeline"
    root = pipeline_folder(config, PARTS, layouts, "Qwen/Qwen-Image-Edit (or -2509, -2511)")
    index = root / "model_index.json"
    layout = json.loads(index.read_text()).get("_class_name") if index.is_file() else None
    if layout not in LAYOUTS:
        found = f"{index} names _class_name={layout!r}" if index.is_file() else f"{index} is missing"
        hint = "; a QwenImagePipeline folder is model.arch=qwen_image" if layout == "QwenImagePipeline" else ""
        raise ValueError(f"model.path={config.path}: {found}, but model.arch=qwen_image_edit loads a {layouts} "
                         f"folder (Qwen-Image-Edit; -2509, -2511){hint}")  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(root / "processor")
    check_template_prefix(tokenizer, SYSTEM, TEMPLATE_TOKENS, root / "processor")
    return QwenImageEditPolicy(
        **load_networks(root, getattr(torch, config.dtype)), tokenizer=tokenizer,
        image_processor=AutoImageProcessor.from_pretrained(root / "processor"),
        plus=LAYOUTS[layout], shift=config.shift,
        max_sequence_length=config.text_tokens or MAX_SEQUENCE_LENGTH, source_resize=config.source_resize,
    )  # fmt: skip
