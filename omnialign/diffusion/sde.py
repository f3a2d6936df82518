"""Flow-matching schedules and stochastic transitions, model-free and in float32.

Convention (see docs/algorithms.md): x_sigma = (1 - sigma) * x0 + sigma * eps, v = eps - x0,
sigmas decrease from 1 to 0 and one step from sigma to sigma' has dt = sigma' - sigma < 0.
A transition maps (v, x, sigma, sigma') to a Gaussian over x' with a mean, a std and the
log-density of a sample: rollout draws x' from it, training replays a stored x' and scores it.
"""

import math
from typing import NamedTuple

import torch

KINDS = ("ode", "sde", "cps", "dance")


def shifted(sigma: torch.Tensor | float, shift: float) -> torch.Tensor | float:
    """The static shift s*sigma / (1 + (s-1)*sigma) of diffusers' FlowMatchEulerDiscreteScheduler."""
    return shift * sigma / (1.0 + (shift - 1.0) * sigma)


def sigma_schedule(
    num_steps: int, shift: float = 1.0, mu: float | None = None, sigma_min: float | None = None
) -> torch.Tensor:
    """Sigmas for num_steps steps: linspace(1, sigma_min, N), shifted, then a final 0; (N+1,) float32.

    `sigma_min` None gives 1/N: the sigmas the Qwen-Image (and FLUX) pipelines pass to the scheduler.
    SD3's pipeline passes none and the scheduler spaces its own from 1 to `scheduler_sigma_min(shift)`.
    A static `shift` s maps sigma to s*sigma / (1 + (s-1)*sigma) (SD3: 3). A dynamic shift `mu`
    (Qwen-Image, see `dynamic_shift_mu`) maps sigma to e^mu / (e^mu + 1/sigma - 1) instead.
    """
    end = 1.0 / num_steps if sigma_min is None else sigma_min
    sigmas = torch.linspace(1.0, end, num_steps, dtype=torch.float64)
    if mu is not None:
        sigmas = math.exp(mu) / (math.exp(mu) + (1.0 / sigmas - 1.0))
    else:
        sigmas = shifted(sigmas, shift)
    return torch.cat([sigmas, sigmas.new_zeros(1)]).float()


def stretch_to_terminal(sigmas: torch.Tensor, terminal: float) -> torch.Tensor:
    """A schedule (N+1,) ending in 0 with its nonzero sigmas stretched so that the last is `terminal`, keeping the
    first at 1: the scheduler's `shift_terminal` (Qwen-Image 0.02, LTX-2 0.1)."""
    s = sigmas[:-1]
    return torch.cat([1 - (1 - s) * (1 - terminal) / (1 - s[-1]), sigmas[-1:]])


def scheduler_sigma_min(shift: float, num_train_timesteps: int = 1000) -> float:
    """The last of the statically shifted training sigmas of diffusers' FlowMatchEulerDiscreteScheduler,
    shifted(1/T): the end of the linspace its `set_timesteps(N)` spaces (and shifts once more) when a
    pipeline passes no sigmas, as SD3's does. For SD3 (shift 3, T = 1000) it is 0.002994, so the last
    nonzero sigma of 10 steps is 0.0089 (linspace(1, 1/N, N) would give 0.25)."""
    return shifted(1.0 / num_train_timesteps, shift)


def dynamic_shift_mu(
    seq_len: int, base_len: int = 256, max_len: int = 4096, base_shift: float = 0.5, max_shift: float = 1.15
) -> float:
    """mu interpolated linearly in the image sequence length, as diffusers' Qwen-Image pipeline."""
    slope = (max_shift - base_shift) / (max_len - base_len)
    return base_shift + slope * (seq_len - base_len)


def pipeline_schedule(num_steps: int, scheduler: dict, tokens: int, shift: float | None = None) -> torch.Tensor:
    """The sigmas of a pipeline that passes linspace(1, 1/N, N) to its FlowMatchEulerDiscreteScheduler (`scheduler`:
    that scheduler's config; Qwen-Image, FLUX.1, Z-Image, LTX-2), (N+1,): a fixed `shift` if given (model.shift),
    else the scheduler's own, static or, with `use_dynamic_shifting`, exponential with mu from the image's `tokens`
    (dynamic_shift_mu); then stretched to the scheduler's `shift_terminal` where it has one."""
    if shift is None and scheduler["use_dynamic_shifting"]:
        mu = dynamic_shift_mu(tokens, scheduler["base_image_seq_len"], scheduler["max_image_seq_len"],
                              scheduler["base_shift"], scheduler["max_shift"])  # fmt: skip
        sigmas = sigma_schedule(num_steps, mu=mu)
    else:
        sigmas = sigma_schedule(num_steps, shift=scheduler["shift"] if shift is None else shift)
    terminal = scheduler.get("shift_terminal")
    return stretch_to_terminal(sigmas, terminal) if terminal else sigmas


class Transition(NamedTuple):
    sample: torch.Tensor  # (B, *dims) float32: x', drawn or the replayed one
    mean: torch.Tensor  # (B, *dims) float32
    std: torch.Tensor  # (B,) float32
    log_prob: torch.Tensor  # (B,) float32, mean over dims


def _per_sample(value: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """A scalar or (B,) tensor as float32 of shape (B, 1, ..., 1) broadcastable against `like`. A Python scalar is
    filled in on the device: copied from the host, it would wait for the device's queued work."""
    if not isinstance(value, torch.Tensor):
        return torch.full([1] * like.dim(), value, dtype=torch.float32, device=like.device)
    return value.to(like.device, torch.float32).reshape(-1, *([1] * (like.dim() - 1)))


def _gaussian_log_prob(sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    log_density = -((sample - mean) ** 2) / (2 * std**2) - torch.log(std) - 0.5 * math.log(2 * math.pi)
    return log_density.mean(dim=tuple(range(1, sample.dim())))


def transition(
    kind: str,
    v: torch.Tensor,
    x: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    eta: torch.Tensor | float,
    noise: torch.Tensor | None = None,
    sample: torch.Tensor | None = None,
) -> Transition:
    """One step from sigma to sigma_next of the given kind ("ode", "sde", "cps" or "dance").

    v, x: (B, *dims), any dtype (computed in float32); sigma, sigma_next: (B,); eta: noise level,
    a float or (B,) (0 gives the Euler step for "sde" and "dance"). Pass `noise` (standard normal,
    like x) to draw x', or `sample` to score a stored x'. The log-prob is meaningless where the
    std is 0 (ODE steps); callers only read it inside the SDE window.
    """
    v, x = v.float(), x.float()
    s, s_next, eta = _per_sample(sigma, x), _per_sample(sigma_next, x), _per_sample(eta, x)
    dt = s_next - s
    if kind == "ode":
        mean, std = x + v * dt, torch.zeros_like(s)
    elif kind == "sde":
        s_tilde = torch.where(s >= 1.0, s_next, s)
        noise_scale = eta * torch.sqrt(s / (1 - s_tilde))
        mean = x * (1 + noise_scale**2 * dt / (2 * s)) + v * (1 + noise_scale**2 * (1 - s) / (2 * s)) * dt
        std = noise_scale * torch.sqrt(-dt)
    elif kind == "cps":
        std = s_next * torch.sin(eta * math.pi / 2)
        x0_hat, x1_hat = x - s * v, x + (1 - s) * v
        mean = (1 - s_next) * x0_hat + torch.sqrt((s_next**2 - std**2).clamp_min(0)) * x1_hat
    elif kind == "dance":
        x0_hat = x - s * v
        score = -(x - (1 - s) * x0_hat) / s**2
        mean = x + v * dt - 0.5 * eta**2 * score * dt
        std = eta * torch.sqrt(-dt)
    else:
        raise ValueError(f"transition kind {kind!r} is not one of {KINDS}")
    if sample is None:
        sample = mean if noise is None else mean + std * noise.float()
    else:
        sample = sample.float()
    if kind == "cps":  # reference implementations drop every constant; kept so clip ranges transfer
        log_prob = -((sample - mean) ** 2).mean(dim=tuple(range(1, x.dim())))
    else:
        log_prob = _gaussian_log_prob(sample, mean, std)
    return Transition(sample, mean, std.flatten(), log_prob)


def window_starts(seeds: torch.Tensor, size: int, lo: int, hi: int) -> torch.Tensor:
    """Per-sample SDE window starts k in [lo, hi - size], each drawn from its own seeded generator."""
    if not 0 < size <= hi - lo:
        raise ValueError(f"SDE window size {size} does not fit the range [{lo}, {hi}); lower rollout.window_size")
    starts = [
        torch.randint(lo, hi - size + 1, (), generator=torch.Generator().manual_seed(int(seed))) for seed in seeds
    ]
    return torch.stack(starts)


def add_noise(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Forward noising x_sigma = (1 - sigma) * x0 + sigma * noise, sigma (B,)."""
    s = _per_sample(sigma, x0)
    return (1 - s) * x0.float() + s * noise.float()


def velocity_target(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The flow-matching regression target v = noise - x0."""
    return noise.float() - x0.float()


def logit_normal(n: int, generator: torch.Generator, mean: float = 0.0, std: float = 1.0) -> torch.Tensor:
    """n draws u = sigmoid(N(mean, std^2)), float32."""
    return torch.sigmoid(torch.randn(n, generator=generator) * std + mean)


def train_sigmas(shift: float = 1.0, num_train_timesteps: int = 1000) -> torch.Tensor:
    """The training sigmas of diffusers' FlowMatchEulerDiscreteScheduler as constructed, before any
    `set_timesteps`: shifted((T, T-1, ..., 1) / T), (T,) float32 falling from 1. A scheduler that shifts
    dynamically (Qwen-Image) does not shift them at construction: shift 1."""
    steps = torch.arange(num_train_timesteps, 0, -1, dtype=torch.float64) / num_train_timesteps
    return shifted(steps, shift).float()


def logit_normal_sigmas(
    n: int, generator: torch.Generator, table: torch.Tensor, mean: float = 0.0, std: float = 1.0
) -> torch.Tensor:
    """n training sigmas drawn as diffusers' training scripts draw timesteps (SD3 DreamBooth, flow_grpo's
    Diffusion-DPO): u = sigmoid(N(mean, std^2)) indexes the `train_sigmas` table at floor(u * T), so u
    near 1 picks low noise and a static shift moves the mass toward high noise."""
    index = (logit_normal(n, generator, mean, std) * len(table)).long().clamp_max(len(table) - 1)
    return table[index]
