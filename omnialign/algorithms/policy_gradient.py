"""Policy-gradient losses, per `ALGORITHMS.md` section 4; one function serves diffusion steps and tokens.

Every function takes tensors and scalars, returns a per-element loss and metrics as tensors,
and never syncs with the host.
"""

import torch


def ppo_clip(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    adv_clip: float | None = 5.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate per element: max(-A*rho, -A*clip(rho, 1-clip_low, 1+clip_high)).

    log_prob, old_log_prob, advantages: (N,) (one element per sample and step, or per token).
    Advantages are first clipped to [-adv_clip, adv_clip] (None: no clip). Returns the loss (N,)
    and metrics (N,)-means: ratio, clip fractions below and above, approx KL mean(-log rho).
    """
    if adv_clip is not None:
        advantages = advantages.clamp(-adv_clip, adv_clip)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - clip_low, 1 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    with torch.no_grad():
        metrics = {
            "ratio": ratio.detach(),
            "clip_frac_low": ((ratio < 1 - clip_low) & (advantages < 0)).float(),
            "clip_frac_high": ((ratio > 1 + clip_high) & (advantages > 0)).float(),
            "approx_kl": -log_ratio.detach(),
        }
    return loss, metrics


def gaussian_mean_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL between two Gaussians of equal std: mean over dims of (mu - mu_ref)^2 / (2 std^2), (B,).

    mean, ref_mean: (B, *dims); std: (B,).
    """
    sq = ((mean.float() - ref_mean.float()) ** 2).mean(dim=tuple(range(1, mean.dim())))
    return sq / (2 * std.float() ** 2)
