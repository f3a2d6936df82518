"""The vocabulary trainers use to talk to a model: the `DiffusionPolicy` protocol.

An adapter turns (model, batch) into a few tensors; everything else (transitions, losses) is
model-free math in `diffusion/` and `algorithms/`. Parallelism and LoRA are applied to
`policy.transformer` from outside (`engine/`, `models/lora.py`), never inside an adapter.
"""

from typing import Protocol

import torch
from tensordict import TensorDict
from torch import nn


class DiffusionPolicy(Protocol):
    transformer: nn.Module
    """The trained network. Trainers may wrap or shard it; adapters call it by this name."""
    lora_targets: list[str]
    """Default LoRA target module names of the trained network."""

    def to(self, device: torch.device) -> "DiffusionPolicy":
        """Move the frozen components (encoders, decoder) to the device; returns self. The trained
        network is placed by the engine (sharding moves it, or keeps it in host memory when offloaded)."""
        ...

    def encode_prompts(self, prompts: list[str]) -> TensorDict:
        """Prompt conditions with batch size len(prompts) (embeddings, masks, pooled vectors)."""
        ...

    def velocity(self, latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        """Flow velocity v = eps - x0 predicted at latents (B, *latent_shape) and sigma (B,)."""
        ...

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, *latent_shape) to images (B, C, H, W) as float in [0, 1]."""
        ...

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """Shape of one latent for an image of the given size."""
        ...

    def schedule(self, num_steps: int, height: int, width: int) -> torch.Tensor:
        """The model's sigma schedule of num_steps + 1 entries (from 1 down to 0), float32."""
        ...

    def blocks(self) -> list[nn.Module]:
        """The repeated blocks of `transformer`, the units for sharding and checkpointing."""
        ...
