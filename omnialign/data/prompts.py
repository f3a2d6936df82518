"""Prompt sampling: each step takes B prompts from an endless stream of seeded permutations.

The stream depends only on (seed, step), so resuming at a step needs no saved state beyond the
step itself, and every rank computes the same global list before taking its share of groups.
"""

import torch

from omnialign.data.glyphs import PROMPT_SETS


def load_prompts(name: str) -> list[str]:
    """A prompt set by name (the glyphs sets: digits, pairs)."""
    if name not in PROMPT_SETS:
        raise ValueError(f"data.prompts={name!r} is not a prompt set; choose one of {sorted(PROMPT_SETS)}")
    return list(PROMPT_SETS[name])


def prompts_for_step(prompts: list[str], per_step: int, seed: int, step: int) -> list[int]:
    """Indices of the `per_step` prompts of a step (1-based steps), drawn without replacement
    within each pass over the data; a pass is a permutation seeded by (seed, pass)."""
    first = (step - 1) * per_step
    out = []
    for i in range(first, first + per_step):
        epoch, pos = divmod(i, len(prompts))
        perm = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
        out.append(int(perm[pos]))
    return out
