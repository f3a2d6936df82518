"""Branched rollouts (TempFlow-GRPO, BranchGRPO; docs/algorithms.md): the images are the leaves of a branched rollout,
the trained transitions its rows. A row's reward is the mean reward of the leaves it leads to; its advantage is that
reward against the other rows of its row group (TempFlow: the branches of one trunk state; BranchGRPO: the nodes of
one depth of a tree). TempFlow weights each row's policy loss by its transition's noise, normalised to mean 1 over
the rows; BranchGRPO may leave some rows untrained (pruning)."""

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


def prune(advantages: torch.Tensor, step: torch.Tensor, depths: list[int], after: int, share: float) -> torch.Tensor:
    """BranchGRPO's pruning: which of the rows (T, E) of T trees of E rows each are trained, (T, E) bool. Depth
    pruning drops the rows whose child depth, step (T, E) + 1, is in `depths`; width pruning then drops, among each
    tree's remaining rows of step > `after` (the last split step), int(share * their count) whose advantages
    (T, E) lie in the middle: the top half (rounded down) and the bottom half of the kept ones remain, ties in row
    order (the reference's width-pruning mode 2)."""
    keep = ~torch.isin(step + 1, torch.tensor(depths, dtype=step.dtype, device=step.device))
    late = keep & (step > after)
    count = int(late[0].sum())  # the same in every tree
    kept = count - int(share * count)
    order = torch.where(late, advantages.float(), -torch.inf).argsort(dim=1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(
        1, order, torch.arange(order.shape[1], device=order.device).expand_as(order)
    )
    return keep & (~late | (rank < kept // 2) | (rank >= count - (kept - kept // 2)))
