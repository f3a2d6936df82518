"""Branched rollouts (TempFlow-GRPO; docs/algorithms.md): the images are the leaves of a branched rollout, the trained
transitions its rows. A row's reward is the mean reward of the leaves it leads to; its advantage is that reward
against the other rows of its row group (TempFlow: the branches of one trunk state). TempFlow weights each row's
policy loss by its transition's noise, normalised to mean 1 over the rows."""

import torch


def row_rewards(leaf_rewards: torch.Tensor, leaf_range: torch.Tensor) -> torch.Tensor:
    """Each row's reward (R,) float32: the mean of leaf_rewards (L,) over its leaves [first, last) = leaf_range[r]
    (R, 2) int64 (TempFlow: the one leaf of its branch)."""
    total = torch.cat([leaf_rewards.new_zeros(1), leaf_rewards.float().cumsum(0)])
    first, last = leaf_range.to(total.device).unbind(1)
    return (total[last] - total[first]) / (last - first)


def noise_weights(std: torch.Tensor) -> torch.Tensor:
    """TempFlow-GRPO's noise-aware step weights (R,): each row's transition std (R,) over their mean, so that they
    average 1 (the reference's constant, 2.25 for SD3 at 10 steps, is 1 / that mean). Every step must hold the same
    number of rows, as TempFlow's do."""
    return std.float() / std.float().mean()
