"""DiffusionNFT (ALGORITHMS.md section 5): trains on clean samples, no log-probs."""

import torch


def optimality(advantages: torch.Tensor, adv_clip: float = 5.0) -> torch.Tensor:
    """Reward to optimality probability r = clip(clip(A, +-c)/c * 1/2 + 1/2, 0, 1), (B,)."""
    return (advantages.clamp(-adv_clip, adv_clip) / adv_clip * 0.5 + 0.5).clamp(0, 1)


def nft_loss(
    x0: torch.Tensor,
    xt: torch.Tensor,
    t: torch.Tensor,
    v: torch.Tensor,
    v_old: torch.Tensor,
    r: torch.Tensor,
    beta: float,
    adv_clip: float = 5.0,
    v_ref: torch.Tensor | None = None,
    kappa: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-sample NFT loss (B,) at noised xt = (1-t)*x0 + t*eps.

    x0, xt, v (policy, with grad), v_old (adapter `old`), v_ref (adapters off): (B, *dims); t, r: (B,).
    v+ = beta*v + (1-beta)*v_old, v- = (1+beta)*v_old - beta*v, x0± = xt - t*v±;
    w± = max(mean|x0± - x0|, 1e-5) in float64 without grad;
    L = c * [r * mean((x0+ - x0)^2)/w+ + (1-r) * mean((x0- - x0)^2)/w-] / beta + kappa * mean((v - v_ref)^2).
    """
    dims = tuple(range(1, x0.dim()))
    tt = t.float().reshape(-1, *([1] * (x0.dim() - 1)))
    x0, xt, v, v_old = x0.float(), xt.float(), v.float(), v_old.float()
    x0_pos = xt - tt * (beta * v + (1 - beta) * v_old)
    x0_neg = xt - tt * ((1 + beta) * v_old - beta * v)
    with torch.no_grad():
        w_pos = (x0_pos.double() - x0.double()).abs().mean(dims).clamp_min(1e-5)
        w_neg = (x0_neg.double() - x0.double()).abs().mean(dims).clamp_min(1e-5)
    pos = ((x0_pos - x0) ** 2).mean(dims) / w_pos.float()
    neg = ((x0_neg - x0) ** 2).mean(dims) / w_neg.float()
    loss = adv_clip * (r * pos + (1 - r) * neg) / beta
    metrics = {"nft/positive": pos.detach(), "nft/negative": neg.detach()}
    if kappa > 0:
        kl = ((v - v_ref.float()) ** 2).mean(dims)
        loss = loss + kappa * kl
        metrics["kl"] = kl.detach()
    return loss, metrics


def old_decay(step: int, schedule: str) -> float:
    """Decay d of the `old` adapter refresh old <- d*old + (1-d)*default once `step` optimizer steps have run
    (DiffusionNFT's global_step; a training step with several mini-batches or epochs takes several).

    copy: 0. delayed_linear: 0 for step < 75, then min(0.0075 * (step - 75), 0.999).
    """
    if schedule == "copy":
        return 0.0
    if schedule == "delayed_linear":
        return 0.0 if step < 75 else min(0.0075 * (step - 75), 0.999)
    raise ValueError(f"algorithm.old_schedule={schedule!r}: choose copy or delayed_linear")
