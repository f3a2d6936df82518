"""Stable Diffusion 3 / 3.5: the `DiffusionPolicy` over diffusers' `StableDiffusion3Pipeline` components.

Everything mirrors `diffusers.StableDiffusion3Pipeline` exactly (a test samples with both and
compares): prompts go through CLIP-L and CLIP-G (penultimate hidden states, 77 tokens, padded to
T5's width) and T5 (`max_sequence_length` tokens), concatenated along the sequence; the pooled
vector is both CLIPs' projections side by side. Every text length is fixed, so conditions of any
two batches concatenate (CFG). Latents are the VAE's (B, C, H/8, W/8) scaled by its
scaling/shift factors; the transformer receives sigma*1000; the schedule is the scheduler's own
when the pipeline is called with `num_inference_steps` alone: linspace(1, shifted(1/1000), N), then
the static shift of the scheduler config (3.0).
"""

import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel
from tensordict import TensorDict
from torch import nn
from transformers import AutoTokenizer, CLIPTextModelWithProjection, PreTrainedTokenizerBase, T5EncoderModel

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import scheduler_sigma_min, sigma_schedule, train_sigmas
from omnialign.models.base import check_size
from omnialign.models.qwen_image import pipeline_folder

MAX_SEQUENCE_LENGTH = 256  # the pipeline's default T5 length
PARTS = (
    "transformer", "vae", "scheduler", "text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2",
    "tokenizer_3",
)  # fmt: skip

LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]
"""The joint-attention projections of each `JointTransformerBlock` (peft `target_modules`, as Flow-GRPO)."""


class SD3Policy:
    """`DiffusionPolicy` over SD3 / SD3.5; latents are the scaled VAE latents (B, C, H/8, W/8)."""

    lora_targets = LORA_TARGETS
    edits = False
    transformer_2 = None

    def __init__(
        self,
        transformer: SD3Transformer2DModel,
        vae: AutoencoderKL | None,
        text_encoders: tuple[CLIPTextModelWithProjection, CLIPTextModelWithProjection, T5EncoderModel] | None,
        tokenizers: tuple[PreTrainedTokenizerBase, PreTrainedTokenizerBase, PreTrainedTokenizerBase] | None,
        shift: float = 3.0,
        max_sequence_length: int = MAX_SEQUENCE_LENGTH,
        num_train_timesteps: int = 1000,
    ):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.vae = vae
        self.text_encoders = text_encoders  # CLIP-L, CLIP-G, T5
        self.tokenizers = tokenizers
        self.shift = shift
        self.num_train_timesteps = num_train_timesteps
        self.max_sequence_length = max_sequence_length
        self.vae_scale_factor = 8 if vae is None else 2 ** (len(vae.config.block_out_channels) - 1)

    def to(self, device: torch.device) -> "SD3Policy":
        for module in (self.vae, *(self.text_encoders or ())):  # the engine places the transformer
            if module is not None:
                module.to(device)
        return self

    def _tokens(self, index: int, prompts: list[str], length: int) -> torch.Tensor:
        tokens = self.tokenizers[index](prompts, padding="max_length", max_length=length, truncation=True)
        return torch.tensor(tokens.input_ids, device=self.text_encoders[index].device)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: None = None) -> TensorDict:
        """embeds (B, 77 + max_sequence_length, T5 width), pooled (B, CLIP-L + CLIP-G projection width)."""
        clip_length = self.tokenizers[0].model_max_length  # the pipeline uses the first tokenizer's for both
        hidden, pooled = [], []
        for index in (0, 1):
            out = self.text_encoders[index](self._tokens(index, prompts, clip_length), output_hidden_states=True)
            hidden.append(out.hidden_states[-2].to(self.text_encoders[0].dtype))
            pooled.append(out.text_embeds)
        t5 = self.text_encoders[2](self._tokens(2, prompts, self.max_sequence_length))[0]
        clip = torch.cat(hidden, dim=-1)
        clip = nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        embeds = torch.cat([clip, t5.to(clip.dtype)], dim=-2)
        return TensorDict(embeds=embeds, pooled=torch.cat(pooled, dim=-1), batch_size=[len(prompts)])

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        dtype = self.dtype
        return self.transformer(
            hidden_states=latents.to(dtype),
            timestep=sigma * 1000,
            encoder_hidden_states=cond["embeds"].to(dtype),
            pooled_projections=cond["pooled"].to(dtype),
            return_dict=False,
        )[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        config = self.vae.config
        x = latents.to(self.vae.dtype) / config.scaling_factor + config.shift_factor
        image = self.vae.decode(x, return_dict=False)[0]
        return (image.float() / 2 + 0.5).clamp(0, 1)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        multiple = self.vae_scale_factor * self.transformer.config.patch_size
        check_size("SD3 images", height, width, multiple)
        f = self.vae_scale_factor
        return (self.transformer.config.in_channels, height // f, width // f)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        end = scheduler_sigma_min(self.shift, self.num_train_timesteps)
        return sigma_schedule(num_steps, shift=self.shift, sigma_min=end)

    def train_sigmas(self) -> torch.Tensor:
        return train_sigmas(self.shift, self.num_train_timesteps)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.transformer_blocks)


def load(config: ModelConfig) -> SD3Policy:
    """Load from `config.path`, a folder in the diffusers `StableDiffusion3Pipeline` layout; encoders frozen, eval."""
    root = pipeline_folder(config, PARTS, "StableDiffusion3Pipeline",
                           "stabilityai/stable-diffusion-3(.5) (T5 included)")  # fmt: skip
    dtype = getattr(torch, config.dtype)
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    transformer = SD3Transformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype)
    if config.transformer_only:  # offline training on stored latents and embeddings
        return SD3Policy(transformer, None, None, None, shift=config.shift or scheduler.config.shift,
                         num_train_timesteps=scheduler.config.num_train_timesteps)  # fmt: skip
    encoders = (
        CLIPTextModelWithProjection.from_pretrained(root / "text_encoder", dtype=dtype),
        CLIPTextModelWithProjection.from_pretrained(root / "text_encoder_2", dtype=dtype),
        T5EncoderModel.from_pretrained(root / "text_encoder_3", dtype=dtype),
    )
    return SD3Policy(
        transformer=transformer,
        vae=AutoencoderKL.from_pretrained(root / "vae", torch_dtype=dtype).requires_grad_(False).eval(),
        text_encoders=tuple(e.requires_grad_(False).eval() for e in encoders),
        tokenizers=tuple(AutoTokenizer.from_pretrained(root / name) for name in PARTS[-3:]),
        shift=config.shift or scheduler.config.shift,
        max_sequence_length=config.text_tokens or MAX_SEQUENCE_LENGTH,
        num_train_timesteps=scheduler.config.num_train_timesteps,
    )
