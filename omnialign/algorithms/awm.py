"""Advantage Weighted Matching (AWM, docs/algorithms.md): the flow-matching error of a clean sample at a fresh
noise level serves as its log-likelihood, and a PPO-clipped objective weights it by the sample's advantage. At the
first update (ratio 1) the gradient is exactly the advantage-weighted flow-matching loss of pretraining; any
sampler can draw the samples (an ODE, as DiffusionNFT)."""

import torch

WEIGHTINGS = ("uniform", "t", "ghuber")


def matching_log_prob(
    v: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor, weighting: str, power: float = 0.25
) -> torch.Tensor:
    """AWM's log-likelihood surrogate (B,) of clean samples x0 (B, ...) noised by `noise` (B, ...) at `sigma` (B,),
    from the predicted velocity v (B, ...): with e = mean((v - (noise - x0))^2) over all but the batch dim,
    uniform: -e; t: -e * sigma; ghuber (a generalised Huber): -((e + c)^p - c^p) * sigma / p with c = 1e-10, p =
    `power`. Float32."""
    error = ((v.float() - (noise.float() - x0.float())) ** 2).mean(dim=tuple(range(1, v.dim())))
    if weighting == "uniform":
        return -error
    if weighting == "t":
        return -error * sigma
    c = torch.tensor(1e-10)
    return -((error + c) ** power - c**power) * sigma / power
