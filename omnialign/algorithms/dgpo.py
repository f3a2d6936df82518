"""Direct Group Preference Optimization (DGPO, docs/algorithms.md): DPO between the positive and the negative
samples of a prompt group, each weighted by its advantage, on a likelihood surrogate of clean samples (minus the
flow-matching error, as in Diffusion-DPO). No policy gradient: any sampler draws the samples (an ODE, as the paper).

With l = -e the surrogate log-likelihood of a sample at a noise level and l_ref the reference's, the group's
preference margin is z = beta * mean_i A_i (l_i - l_ref,i) (A > 0: the positive group, A < 0: the negative one),
and the loss -log sigmoid(z) has the gradient -sigmoid(-z) * beta * mean_i A_i grad l_i. DGPO trains that gradient
through -w * A_i * l_i with the group weight w = sigmoid(-z) held constant (beta and 1/n left to the learning rate)."""

import torch


def group_weights(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, advantages: torch.Tensor, group: torch.Tensor, beta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The group weight w = sigmoid(-z) and the margin z = beta * mean over the group of A * (l - l_ref), per sample
    and noise level: log_prob, ref_log_prob (B, T) (policy and reference), advantages (B,), group (B,) ids; both
    results (B, T), each sample carrying its group's values. No grad."""
    _, index = torch.unique(group, return_inverse=True)
    terms = (advantages[:, None] * (log_prob - ref_log_prob)).detach().float()
    sums = terms.new_zeros(int(index.max()) + 1, terms.shape[1]).index_add_(0, index, terms)
    z = beta * sums / torch.bincount(index)[:, None]
    return torch.sigmoid(-z)[index], z[index]


def dgpo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    weight: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample loss (B,) -w * A * l, every input (B,): l = log_prob (with grad), w = `group_weights`. The
    reference's PPO-style clip: where the ratio exp(l - old_log_prob) left 1 + clip_high with A > 0, or 1 - clip_low
    with A < 0, l's gradient is stopped (the ratio does not scale the gradient, unlike PPO)."""
    ratio = torch.exp(log_prob.detach() - old_log_prob)
    clipped = torch.where(advantages > 0, ratio > 1 + clip_high, ratio < 1 - clip_low)
    loss = -weight * advantages * torch.where(clipped, log_prob.detach(), log_prob)
    return loss, {"clip_frac": clipped.float(), "dgpo/weight": weight}
