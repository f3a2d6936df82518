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


def dual_clip(loss: torch.Tensor, advantages: torch.Tensor, c: float) -> torch.Tensor:
    """Dual clip: for A < 0 also cap the clipped loss at -A*c (c > 1, typically 3)."""
    return torch.where(advantages < 0, torch.minimum(loss, -advantages * c), loss)


def grpo_guard(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
    sqrt_neg_dt: torch.Tensor,
    clip_low: float,
    clip_high: float,
    adv_clip: float | None = 5.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GRPO-Guard: ratio normalisation and step reweighting of the FlowGRPO surrogate, per sample.

    log_prob, old_log_prob, advantages, std, sqrt_neg_dt: (B,), one denoising step of each sample (the
    samples may sit at different sigmas, as under per-sample SDE windows); mean, old_mean: (B, *dims)
    transition means. With s = sqrt(-dt) * noise scale, the transition std, and
    b = mean over dims((mu - mu_old)^2) / (2 s^2): rho = exp((logp - logp_old + b) * s), PPO clip on rho,
    and each sample's loss is divided by its sqrt(-dt)^2. For x' drawn from the old policy,
    E[logp - logp_old] = -b for every sample, so E[log rho] = 0 sample by sample (a batch-pooled s would
    leave a bias wherever the sigmas differ). Needs the full Gaussian log-density (sde, dance; not cps).
    """
    s = std.float()
    shift = ((mean.float() - old_mean.float()) ** 2).mean(dim=tuple(range(1, mean.dim()))) / (2 * s**2)
    normalised = (log_prob - old_log_prob + shift) * s
    loss, metrics = ppo_clip(normalised, torch.zeros_like(normalised), advantages, clip_low, clip_high, adv_clip)
    return loss / sqrt_neg_dt**2, metrics


def dppo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    std: torch.Tensor,
    tau: float = 1e-5,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Flow-DPPO: a KL trust region instead of ratio clipping; advantages are not clipped.

    D = mean over dims((mu - mu_old)^2) / (2 std^2) per sample; a sample's term is dropped when
    D >= tau and the step moves away (rho > 1 with A > 0, or rho < 1 with A < 0): L = keep * (-A * rho).
    Shapes as `grpo_guard`. Metrics: the masked share and D.
    """
    ratio = torch.exp(log_prob - old_log_prob)
    divergence = gaussian_mean_kl(mean, old_mean, std)
    away = ((ratio > 1) & (advantages > 0)) | ((ratio < 1) & (advantages < 0))
    keep = ~((divergence >= tau) & away)
    loss = keep * (-advantages * ratio)
    metrics = {"ratio": ratio.detach(), "masked": (~keep).float(), "divergence": divergence.detach(),
               "approx_kl": (old_log_prob - log_prob).detach()}  # fmt: skip
    return loss, metrics


def gspo(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO: the sequence ratio s_i = exp(mean over response tokens of (logp - logp_old)), realised
    per token as sg(s_i) * exp(logp - sg(logp)) so that every token carries the sequence's gradient.

    log_prob, old_log_prob, mask: (B, T) (mask 1 on response tokens); advantages: (B,).
    Returns the per-token loss (B, T) (aggregate with `aggregate(..., "seq-mean-token-mean")`).
    """
    mask = mask.float()
    seq_log_ratio = ((log_prob - old_log_prob) * mask).sum(-1) / mask.sum(-1).clamp_min(1)
    token_ratio = torch.exp(seq_log_ratio.detach().unsqueeze(-1) + log_prob - log_prob.detach())
    adv = advantages.unsqueeze(-1).expand_as(token_ratio)
    loss = torch.maximum(-adv * token_ratio, -adv * token_ratio.clamp(1 - clip_low, 1 + clip_high))
    seq_ratio = seq_log_ratio.detach().exp()
    metrics = {"ratio": seq_ratio, "clip_frac_low": ((seq_ratio < 1 - clip_low) & (advantages < 0)).float(),
               "clip_frac_high": ((seq_ratio > 1 + clip_high) & (advantages > 0)).float()}  # fmt: skip
    return loss, metrics


def aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str, length_norm: float | None = None) -> torch.Tensor:
    """Reduce a per-token loss (B, T) over response tokens (mask (B, T)) to a scalar.

    token-mean: over all tokens of the batch; seq-mean-token-mean: mean per sequence, then over
    sequences; seq-mean-token-sum: sum per sequence (divided by `length_norm`, Dr.GRPO's fixed
    length, when given), then mean over sequences.
    """
    mask = mask.float()
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum().clamp_min(1)
    if mode == "seq-mean-token-mean":
        return ((loss * mask).sum(-1) / mask.sum(-1).clamp_min(1)).mean()
    if mode == "seq-mean-token-sum":
        return ((loss * mask).sum(-1) / (length_norm or 1.0)).mean()
    raise ValueError(f"loss aggregation {mode!r}: choose token-mean, seq-mean-token-mean or seq-mean-token-sum")


def kl_estimate(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL(pi || ref) estimates from sampled tokens: k1 = logp - ref; k3 = e^(ref-logp) - (ref-logp) - 1."""
    if kind == "k1":
        return log_prob - ref_log_prob
    if kind == "k3":
        d = ref_log_prob - log_prob
        return torch.exp(d) - d - 1
    raise ValueError(f"KL estimator {kind!r}: choose k1 or k3")
