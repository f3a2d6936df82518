"""The vocabulary trainers use to talk to a model: the `DiffusionPolicy` and `LanguagePolicy` protocols.

An adapter turns (model, batch) into a few tensors; everything else (transitions, losses) is
model-free math in `diffusion/` and `algorithms/`. Parallelism and LoRA are applied to
`policy.transformer` from outside (`engine/`, `models/lora.py`), never inside an adapter.
"""

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from tensordict import TensorDict
from torch import nn


class DiffusionPolicy(Protocol):
    transformer: nn.Module
    """The trained network. Trainers may wrap or shard it; adapters call it by this name."""
    lora_targets: list[str]
    """Default LoRA target module names of the trained network."""
    dtype: torch.dtype
    """The compute dtype: `transformer`'s as loaded (model.dtype). `velocity` casts latents and conditions to it;
    `transformer.dtype` reads float32 once the engine keeps float32 master weights."""
    transformer_2: nn.Module | None
    """A second network of `transformer`'s architecture that the policy runs frozen (Wan 2.2 A14B's low-noise
    expert, as diffusers names it), split and sharded by the engine like the trained one; None for most models."""
    edits: bool
    """An editing model (Qwen-Image-Edit, FLUX.1-Kontext, the glyphs edit model): its prompts are instructions,
    and each brings source images (`sources` of `encode_prompts`; the prompt metadata's "sources")."""

    def to(self, device: torch.device) -> "DiffusionPolicy":
        """Move the frozen components (encoders, decoder) to the device; returns self. The trained network and
        `transformer_2` are placed by the engine (sharding moves them, or keeps them in host memory when offloaded)."""
        ...

    def encode_prompts(self, prompts: list[str], sources: list[list[torch.Tensor]] | None = None) -> TensorDict:
        """Prompt conditions with batch size len(prompts) (embeddings, masks, pooled vectors). An editing model
        takes `sources[i]`, the source images of prompt i (each (C, H, W) float in [0, 1], C = 1 or 3), encodes
        them as its pipeline does and keeps what its network reads of them (the source latents) in the
        conditions, so that replaying a stored transition needs nothing else. Text-to-image models take None."""
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

    def train_sigmas(self) -> torch.Tensor:
        """The sigmas the model's scheduler was trained on, (T,) float32 falling from 1 (`sde.train_sigmas`):
        Diffusion-DPO draws its training sigma from them, as the reference scripts do."""
        ...

    def blocks(self) -> list[nn.Module]:
        """The repeated blocks of `transformer`, the units for sharding and checkpointing."""
        ...


@dataclass
class Prefill:
    """Prompts (B, P) run through a network's own forward, for the static decoder (`rollout.decode.generate`)
    to continue."""

    logits: torch.Tensor
    """(B, V) float32 logits of the first new token (`qwen3.head_logits`)."""
    keys: list[torch.Tensor]
    """Per layer (B, KV, P, D): the cached keys (normed and rotated), in the cache's dtype. `generate` empties this
    list and `values` once it has copied them."""
    values: list[torch.Tensor]
    """Per layer (B, KV, P, D): the cached values."""
    position: torch.Tensor
    """The first new token's rotary position ids, shaped as the network's rotary embedding takes them: (B, 1), or
    (3, B, 1) for M-RoPE (one per axis)."""


class LanguagePolicy(Protocol):
    """A causal language model (plain or omni-modal) as trainers see it. Prompts are chat messages:
    `[{"role": "user", "content": "text" or [{"type": "text"|"image"|"audio"|"video", ...}]}]`, media
    items naming a file (`"image": path`) or holding the decoded data (PIL image, float waveform at 16 kHz,
    frames array (T, H, W, 3))."""

    transformer: nn.Module
    """The trained network (the causal LM, or the omni thinker). Named as in `DiffusionPolicy`, so LoRA,
    sharding, checkpoints, export and the frozen reference treat both families alike."""
    lora_targets: list[str]
    """Default LoRA target module names (full paths where a short name would also hit frozen towers)."""
    tokenizer: Any
    """The transformers tokenizer (chat template, decoding, stop strings)."""
    stop_token_ids: list[int]
    """Token ids that end a response (end of turn, end of text)."""
    pad_token_id: int
    """Padding id of prompts (left) and responses (right)."""
    frozen: list[nn.Module]
    """Parts of `transformer` that never train (media towers); kept frozen under full fine-tuning too."""

    def to(self, device: torch.device) -> "LanguagePolicy":
        """Move the frozen components (media towers of an unsharded model) to the device; returns self.
        The trained network is placed by the engine."""
        ...

    def encode(self, messages: list[list[dict]]) -> tuple[list[list[int]], list[dict | None]]:
        """Chat-format each prompt with the generation prompt appended: its token ids (media placeholders
        expanded) and its encoded media tensors (None for a text-only prompt)."""
        ...

    def token_logprobs(
        self, ids: torch.Tensor, mask: torch.Tensor, media: list | None, start: int, temperature: float = 1.0
    ) -> torch.Tensor:
        """log pi(ids[:, t] | ids[:, :t]) for t >= start, (B, T - start) float32, from ids and mask (B, T)
        (left-padded prompt, then response); logits divided by `temperature`; float32 head, in chunks."""
        ...

    def generate(
        self, ids: torch.Tensor, mask: torch.Tensor, media: list | None, options: dict
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Continue left-padded prompts (B, P): response ids (B, R) (pad after each stop) and the sampling
        log-probs of every generated position (B, R) float32. `options`: transformers generation kwargs
        (do_sample, temperature, top_p, top_k, max_new_tokens, stop_strings)."""
        ...

    def blocks(self) -> list[nn.Module]:
        """The decoder layers of `transformer`, the units for sharding and checkpointing."""
        ...

    def generating(self) -> AbstractContextManager:
        """Settings that hold while a batch is generated, by either decoder (the omni thinker's decode experts)."""
        ...

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, media: list | None) -> Prefill | None:
        """For the static decoder: left-padded prompts (B, P) through the network's own forward where the decoder
        cannot run them (media, 3-D rotary positions); None where it can (text-only dense models)."""
        ...


def check_size(what: str, height: int, width: int, multiple: int) -> None:
    """ValueError naming rollout.height / rollout.width when they are not multiples of `multiple` (VAE factor x
    patch size); `what` names the model's outputs ("FLUX images", "Wan videos")."""
    if height % multiple or width % multiple:
        raise ValueError(
            f"{what} must have height and width divisible by {multiple}, got {height}x{width}: "
            "change rollout.height / rollout.width"
        )
