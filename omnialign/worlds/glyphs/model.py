"""The glyphs world's policy: a tiny pixel-space SD3 transformer with a character-level encoder.

The network is diffusers' real `SD3Transformer2DModel` with a tiny config, so the glyphs world
runs the same adapter code path as the large models. Its base weights ship in
`omnialign/worlds/glyphs/assets/` and are made by `omnialign prepare glyphs`.
"""

from pathlib import Path

import torch
from diffusers import ConfigMixin, ModelMixin, SD3Transformer2DModel
from diffusers.configuration_utils import register_to_config
from tensordict import TensorDict
from torch import nn

from omnialign.config import ModelConfig
from omnialign.diffusion.sde import sigma_schedule, train_sigmas
from omnialign.worlds.glyphs.data import ASSETS, CHARSET, SIZE


class CharEncoder(ModelMixin, ConfigMixin):
    """Character embeddings plus positions; a pooled vector from an MLP over the whole string."""

    @register_to_config
    def __init__(self, charset: str = CHARSET, max_len: int = 4, dim: int = 64, pooled_dim: int = 64):
        super().__init__()
        self.embed = nn.Embedding(len(charset) + 1, dim)  # id 0 is padding (the empty prompt)
        self.position = nn.Parameter(torch.randn(max_len, dim) * 0.02)
        self.pool = nn.Sequential(nn.Linear(max_len * dim, pooled_dim), nn.SiLU(), nn.Linear(pooled_dim, pooled_dim))

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        charset, max_len = self.config.charset, self.config.max_len
        for text in texts:
            bad = [c for c in text if c not in charset]
            if bad or len(text) > max_len:
                raise ValueError(
                    f"glyphs prompt {text!r} must be at most {max_len} characters of {charset!r} (offending: {bad})"
                )
        ids = [[charset.index(c) + 1 for c in t] + [0] * (max_len - len(t)) for t in texts]
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.embed(ids) + self.position  # (B, T, dim)
        return hidden, self.pool(hidden.flatten(1))  # (B, T, dim), (B, pooled_dim)


def tiny_transformer(dim: int = 64, layers: int = 3, heads: int = 2) -> SD3Transformer2DModel:
    """The glyphs generator: SD3 MM-DiT on 1-channel 32x32 pixels, patch 2 (256 image tokens)."""
    return SD3Transformer2DModel(
        sample_size=SIZE,
        patch_size=2,
        in_channels=1,
        out_channels=1,
        num_layers=layers,
        num_attention_heads=heads,
        attention_head_dim=dim // heads,
        joint_attention_dim=dim,
        caption_projection_dim=dim,
        pooled_projection_dim=dim,
        pos_embed_max_size=SIZE // 2,
    )


def edit_transformer(base: SD3Transformer2DModel) -> SD3Transformer2DModel:
    """The glyphs edit model made from a text-to-image one: a second input channel for the source image, its
    weights zero, so that it starts out drawing exactly what `base` draws."""
    model = SD3Transformer2DModel.from_config({**base.config, "in_channels": 2})
    state = base.state_dict()
    weight = state["pos_embed.proj.weight"]  # (dim, in_channels, patch, patch)
    state["pos_embed.proj.weight"] = torch.cat([weight, torch.zeros_like(weight)], 1)
    model.load_state_dict(state)
    return model


LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"]


class GlyphsPolicy:
    """`DiffusionPolicy` over the glyphs generator; pixels are the latents (decode is a rescale).

    The edit model (`in_channels=2`) reads the source image as a second input channel beside the noisy
    latent (InstructPix2Pix-style conditioning): the conditions keep the source in [-1, 1] as "source"."""

    lora_targets = LORA_TARGETS
    transformer_2 = None

    def __init__(self, transformer: SD3Transformer2DModel, text_encoder: CharEncoder | None, shift: float = 1.0):
        self.transformer = transformer
        self.dtype = transformer.dtype  # of compute (the engine may keep the trained weights in float32)
        self.text_encoder = text_encoder
        self.shift = shift
        self.edits = transformer.config.in_channels == 2

    def to(self, device: torch.device) -> "GlyphsPolicy":
        if self.text_encoder is not None:
            self.text_encoder.to(device)
        return self

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str], sources: list[list[torch.Tensor]] | None = None) -> TensorDict:
        hidden, pooled = self.text_encoder(self.text_encoder.tokenize(prompts))
        cond = TensorDict(hidden=hidden, pooled=pooled, batch_size=[len(prompts)])
        if self.edits:
            if sources is None or any(len(s) != 1 or s[0].shape != (1, SIZE, SIZE) for s in sources):
                raise ValueError(f"the glyphs edit model takes one grayscale {SIZE}x{SIZE} source image per prompt")
            cond["source"] = torch.stack([s[0] for s in sources]).to(hidden.device) * 2 - 1
        return cond

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        dtype = self.dtype
        if self.edits:
            latents = torch.cat([latents, cond["source"].to(latents.dtype)], dim=1)
        return self.transformer(
            hidden_states=latents.to(dtype),
            encoder_hidden_states=cond["hidden"].to(dtype),
            pooled_projections=cond["pooled"].to(dtype),
            timestep=sigma * 1000,
            return_dict=False,
        )[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return (latents.float().clamp(-1, 1) + 1) / 2

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        return (1, height, width)

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        return sigma_schedule(num_steps, shift=self.shift)

    def train_sigmas(self) -> torch.Tensor:
        return train_sigmas(shift=self.shift)

    def blocks(self) -> list[nn.Module]:
        return list(self.transformer.transformer_blocks)


def load(config: ModelConfig | None = None) -> GlyphsPolicy:
    """Load the glyphs policy from `config.path` (default: the shipped base weights); text encoder frozen."""
    config = config or ModelConfig()
    root = Path(config.path) if config.path else ASSETS
    dtype, shift = getattr(torch, config.dtype), config.shift or 1.0
    if not (root / "transformer").is_dir():
        raise FileNotFoundError(f"no glyphs model at {root}: run `omnialign prepare glyphs --out {root}`")
    transformer = SD3Transformer2DModel.from_pretrained(root / "transformer", torch_dtype=dtype)
    if config.transformer_only:  # offline training on stored prompt conditions
        return GlyphsPolicy(transformer, None, shift=shift)
    text_encoder = CharEncoder.from_pretrained(root / "text_encoder").requires_grad_(False).eval()
    return GlyphsPolicy(transformer, text_encoder, shift=shift)
