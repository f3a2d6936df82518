"""Rewards: plain functions `(images, prompts, metadata) -> list[float]` and their weighted sum.

images: float tensor (B, C, H, W) in [0, 1]; prompts: B strings; metadata: B dicts.
Add a reward by writing such a function and naming it in `REWARDS`.
"""

from collections.abc import Callable

import torch

from omnialign.rewards.glyphs import glyph_ocr

RewardFn = Callable[[torch.Tensor, list[str], list[dict]], list[float]]

REWARDS: dict[str, RewardFn] = {"glyph_ocr": glyph_ocr}


def check_names(weights: dict[str, float]) -> None:
    unknown = sorted(set(weights) - set(REWARDS))
    if unknown:
        raise ValueError(f"reward.weights names unknown rewards {unknown}; available: {sorted(REWARDS)}")


def score(
    images: torch.Tensor, prompts: list[str], metadata: list[dict], weights: dict[str, float]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The weighted sum of the named rewards (B,) float32, and each reward on its own."""
    parts = {}
    for name in weights:
        values = REWARDS[name](images, prompts, metadata)
        if len(values) != len(prompts):
            raise ValueError(f"reward {name!r} returned {len(values)} scores for {len(prompts)} samples")
        parts[name] = torch.tensor(values, dtype=torch.float32)
    total = sum(weights[name] * parts[name] for name in weights)
    if not torch.isfinite(total).all():
        bad = {k: v[~torch.isfinite(v)].tolist() for k, v in parts.items()}
        raise ValueError(f"non-finite rewards {bad} for prompts {prompts}")
    return total, parts
