"""Z-Image and Z-Image-Turbo: the `DiffusionPolicy` over diffusers' `ZImagePipeline` components
(`ZImageTransformer2DModel`, a Qwen3 text encoder loaded as `Qwen3Model`, `AutoencoderKL`), loaded from disk. Both
releases are `model.arch=zimage`: they share the pipeline and differ in weights, the scheduler's shift (Z-Image 6,
Z-Image-Turbo 3) and how they are sampled (Z-Image: CFG, 28-50 steps; Turbo, a few-step distilled model: no CFG,
8-9 steps), which the recipes set.

Everything mirrors `diffusers.ZImagePipeline` exactly (a test samples with both and compares):
- prompts: each becomes one user turn of the tokenizer's chat template with the generation prompt appended
  (`enable_thinking=True`, which for Qwen3's template adds no empty think block), tokenized padded (and truncated)
  to `max_sequence_length` tokens (the pipeline's default 512; `model.text_tokens`); the text encoder's
  second-to-last hidden state of the valid tokens is the caption. The pipeline hands the transformer a list of
  these variable-length captions, and the transformer pads each to a multiple of 32 with its learned pad token,
  which is attended to, and numbers the image's positions after it: a caption's length is part of the input. We keep the
  captions padded to `max_sequence_length` with a mask, so that conditions of any two batches concatenate, and
  hand the transformer each caption's valid rows again (`velocity`). The padding length never reaches the network:
  `model.text_tokens` is exact while the prompts fit, and only bounds the text encoder's work.
- latents are the VAE latents (B, 16, H/8, W/8) as the pipeline keeps them (the transformer cuts 2x2 patches
  itself); each sample goes in as (16, 1, H/8, W/8). The transformer pads the token sequences of a batch to the
  longest and masks the rest, so a sample's velocity does not depend on its batch neighbours but for kernel
  rounding (exact in float32; in bfloat16 a rollout and a replay that batch a sample with captions of other lengths
  may round differently).
- time: the transformer receives t = 1 - sigma, computed as the pipeline does, (1000 - 1000 sigma) / 1000 in float32,
  and predicts x0 - noise, the negative of our velocity noise - x0: `velocity` negates it, as the pipeline negates
  it before the scheduler step.
- CFG: the pipeline's `guidance_scale` g guides as pos + g (pos - neg), which is our uncond + w (cond - uncond) with
  rollout.guidance w = 1 + g; the pipeline runs CFG for g > 0, so Turbo's g = 0 is rollout.guidance=1 (no
  unconditional forward). The negative prompt goes through the same template ("" by default, as
  rollout.negative_prompt). Its `cfg_normalization` (clip the guided velocity's norm to the conditional one's) and
  `cfg_truncation` (drop CFG at late steps) are off at their defaults (False, 1.0) and in every released setting
  the recipes take; they are not implemented.
- schedule: linspace(1, 1/N, N) sigmas, the scheduler config's static shift (use_dynamic_shifting is false in both
  releases; a dynamic shift takes mu from the image token count, as the pipeline), then 0.
- decode: divide by the VAE's scaling factor, add its shift factor, decode.
"""

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, ZImageTransformer2DModel
from tensordict import TensorDict
from torch import nn
from transformers import AutoTokenizer, BatchEncoding, PreTrainedTokenizerBase, Qwen3Model

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import pipeline_schedule, train_sigmas
from omnialign.models.base import check_size
from omnialign.models.qwen_image import pipeline_folder

MAX_SEQUENCE_LENGTH = 512  # the pipeline's default `max_sequence_length`
PARTS = ("transformer", "vae", "text_encoder", "tokenizer", "scheduler")

LORA_TARGETS = [
    "attention.to_q",
    "attention.to_k",
    "attention.to_v",
    "attention.to_out.0",
    "feed_forward.w1",
    "feed_forward.w2",
    "feed_forward.w3",
]
"""Flow-Factory's Z-Image default targets (peft `target_modules`): the attention and SwiGLU projections of every
`ZImageTransformerBlock`, the 30 main layers and the noise and context refiners alike."""


class ZImagePolicy:
    """`DiffusionPolicy` over Z-Image / Z-Image-Turbo; latents are the scaled VAE latents (B, C, H/8, W/8)."""

    lora_targets = LORA_TARGETS
    edits = False
    transformer_2 = None

    def __init__(
        self,
        transformer: ZImageTransformer2DModel,
        vae: AutoencoderKL | None,
        text_encoder: Qwen3Model | None,
        tokenizer: PreTrainedTokenizerBase | None,
        scheduler: FlowMatchEulerDiscreteScheduler,
        shift: float | None = None,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
    ):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.vae = vae
        self.text_encoder = text_encoder
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.shift = shift  # None: the scheduler config's
        self.max_sequence_length = max_sequence_length
        self.vae_scale_factor = 8 if vae is None else 2 ** (len(vae.config.block_out_channels) - 1)

    def to(self, device: torch.device) -> "ZImagePolicy":
        for module in (self.vae, self.text_encoder):  # the engine places the transformer
            if module is not None:
                module.to(device)
        return self

    def tokenize(self, prompts: list[str]) -> BatchEncoding:
        """The prompts in the chat template, as the pipeline tokenizes them: ids and mask (B, max_sequence_length)."""
        texts = [
            self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                               add_generation_prompt=True, enable_thinking=True)
            for prompt in prompts
        ]  # fmt: skip
        return self.tokenizer(texts, padding="max_length", max_length=self.max_sequence_length, truncation=True,
                              return_tensors="pt")  # fmt: skip

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: None = None) -> TensorDict:
        """embeds (B, max_sequence_length, D) in the text encoder's dtype, zero past each caption, and mask
        (B, max_sequence_length) bool: a caption is its embeds' rows where the mask is set."""
        tokens = self.tokenize(prompts).to(self.text_encoder.device)
        mask = tokens.attention_mask.bool()
        hidden = self.text_encoder(input_ids=tokens.input_ids, attention_mask=mask,
                                   output_hidden_states=True).hidden_states[-2]  # fmt: skip
        return TensorDict(embeds=hidden.masked_fill(~mask[..., None], 0), mask=mask, batch_size=[len(prompts)])

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        dtype = self.dtype
        captions = [embeds[mask] for embeds, mask in zip(cond["embeds"].to(dtype), cond["mask"])]
        out = self.transformer(
            list(latents.to(dtype).unsqueeze(2).unbind(0)),  # (C, frames=1, h, w) each
            (1000 - sigma.float() * 1000) / 1000,  # the pipeline's t = 1 - sigma from its timestep sigma * 1000
            captions,
            return_dict=False,
        )[0]
        return -torch.stack(out).squeeze(2)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        x = latents.to(self.vae.dtype) / self.vae.config.scaling_factor + self.vae.config.shift_factor
        image = self.vae.decode(x, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        multiple = self.vae_scale_factor * 2
        check_size("Z-Image images", height, width, multiple)
        factor = self.vae_scale_factor
        return (self.transformer.config.in_channels, height // factor, width // factor)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        _, h, w = self.latent_shape(height, width)
        return pipeline_schedule(num_steps, self.scheduler.config, h // 2 * (w // 2), self.shift)

    def train_sigmas(self) -> torch.Tensor:
        config = self.scheduler.config
        return train_sigmas(1.0 if config.use_dynamic_shifting else config.shift, config.num_train_timesteps)

    def blocks(self) -> list[nn.Module]:
        t = self.transformer
        return [*t.noise_refiner, *t.context_refiner, *t.layers]


def load(config: ModelConfig) -> ZImagePolicy:
    """Load from `config.path`, a folder in the diffusers `ZImagePipeline` layout (Z-Image or Z-Image-Turbo);
    encoders frozen, eval."""
    root = pipeline_folder(config, PARTS, "ZImagePipeline", "Tongyi-MAI/Z-Image (or Tongyi-MAI/Z-Image-Turbo)")
    if config.text_tokens is not None and config.text_tokens < 16:
        raise ValueError(
            f"model.text_tokens={config.text_tokens}: Z-Image's chat template alone takes 8 tokens of a prompt's "
            "caption; set at least 16 (captions are truncated to it; the pipeline's default is 512)"
        )
    dtype = getattr(torch, config.dtype)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    transformer = ZImageTransformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype)
    options = dict(shift=config.shift, max_sequence_length=config.text_tokens or MAX_SEQUENCE_LENGTH)
    if config.transformer_only:  # offline training on stored latents and embeddings
        return ZImagePolicy(transformer, None, None, None, scheduler, **options)
    encoder = Qwen3Model.from_pretrained(root / "text_encoder", dtype=dtype)
    vae = AutoencoderKL.from_pretrained(root / "vae", torch_dtype=dtype)
    return ZImagePolicy(transformer, vae.requires_grad_(False).eval(), encoder.requires_grad_(False).eval(),
                        AutoTokenizer.from_pretrained(root / "tokenizer"), scheduler, **options)  # fmt: skip
