"""Group-relative advantages (GRPO / FlowGRPO), per `ALGORITHMS.md` section 3.

Pure tensor math: callers gather rewards across ranks first when the std is global.
"""

import torch


def group_relative(
    rewards: torch.Tensor, group: torch.Tensor, global_std: bool = True, norm_by_std: bool = True, eps: float = 1e-4
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A_i = (r_i - mean of its group) / (std + eps).

    rewards: (B,) float; group: (B,) int ids, equal for the samples of one prompt. The std is the
    whole batch's (`global_std`) or the group's (unbiased, as torch.std); `norm_by_std=False`
    gives A = r - mean (Dr.GRPO). Returns advantages (B,) float32 and metrics: the zero-std
    ratio (share of groups whose rewards are all equal) and the mean group std.
    """
    rewards = rewards.float()
    _, index, counts = torch.unique(group, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    group_sum = torch.zeros(n_groups, device=rewards.device).index_add_(0, index, rewards)
    group_mean = group_sum / counts
    centred = rewards - group_mean[index]
    group_var = torch.zeros(n_groups, device=rewards.device).index_add_(0, index, centred**2)
    group_std = (group_var / (counts - 1).clamp_min(1)).sqrt()
    if not norm_by_std:
        advantages = centred
    elif global_std:
        advantages = centred / (rewards.std() + eps)
    else:
        advantages = centred / (group_std[index] + eps)
    metrics = {"zero_std_ratio": (group_std == 0).float().mean(), "group_std": group_std.mean()}
    return advantages, metrics
