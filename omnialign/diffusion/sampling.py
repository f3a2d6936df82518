"""The unrolled denoising loop: classifier-free guidance, per-sample seeds, trajectory capture.

`sample` knows nothing of the model: it calls `velocity_fn(latents, sigma, cond)` and the
transitions of `sde.py`. Each sample owns a host generator seeded from its own seed, so a sample's
noise and SDE window do not depend on its batch neighbours, on the batch size, or on the device:
noise is drawn on the host and copied, so the same seeds give the same noise on a CPU and a GPU.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
from tensordict import TensorDict

from omnialign.diffusion import sde
from omnialign.engine.stage import to_device

VelocityFn = Callable[[torch.Tensor, torch.Tensor, TensorDict], torch.Tensor]
Guidance = float | torch.Tensor
"""A CFG scale: one for the batch, or one per sample (B,)."""


def guided_velocity(
    velocity_fn: VelocityFn,
    latents: torch.Tensor,
    sigma: torch.Tensor,
    cond: TensorDict,
    uncond: TensorDict | None = None,
    guidance: Guidance = 1.0,
    rescale: bool = False,
) -> torch.Tensor:
    """v = v_u + g*(v_c - v_u) in one batched forward; g a float or one per sample (B,) (Wan 2.2 A14B's two
    guidance scales), broadcast over the latent dims. `rescale` (Qwen-Image true CFG) then scales v to the norm
    of v_c over the last (channel) dim of packed latents."""
    if uncond is None or (not isinstance(guidance, torch.Tensor) and guidance == 1.0):
        return velocity_fn(latents, sigma, cond)
    both = velocity_fn(torch.cat([latents, latents]), torch.cat([sigma, sigma]), torch.cat([cond, uncond]))
    v_cond, v_uncond = both.float().chunk(2)
    if isinstance(guidance, torch.Tensor):
        guidance = guidance.to(v_cond.device, torch.float32).view(-1, *[1] * (v_cond.ndim - 1))
    v = v_uncond + guidance * (v_cond - v_uncond)
    if rescale:
        v = v * (v_cond.norm(dim=-1, keepdim=True) / v.norm(dim=-1, keepdim=True))
    return v


def per_sample_noise(
    generators: list[torch.Generator], shape: tuple[int, ...], device: torch.device | None = None
) -> torch.Tensor:
    """Standard normal noise (len(generators), *shape) in float32 on `device`, row i drawn from the host
    generator generators[i]. It goes to a GPU without waiting for the queued work (`to_device`), so the host draws
    the next step's noise while the device computes."""
    return to_device(torch.stack([torch.randn(shape, generator=g) for g in generators]), device)


class Sampled(NamedTuple):
    final: torch.Tensor  # (B, *latent) float32: the last latent
    latents: torch.Tensor  # (B, W+1, *latent) float32: x_k .. x_{k+W} inside each sample's window
    log_probs: torch.Tensor  # (B, W) float32: log-prob of each window transition
    means: torch.Tensor  # (B, W, *latent) float32: transition means inside the window
    sigmas: torch.Tensor  # (B, W+1) float32: the sigma of each stored latent


@torch.no_grad()
def sample(
    velocity_fn: VelocityFn,
    generators: list[torch.Generator],
    latent_shape: tuple[int, ...],
    sigmas: torch.Tensor,
    cond: TensorDict,
    uncond: TensorDict | None = None,
    guidance: Guidance | Callable[[torch.Tensor], Guidance] = 1.0,
    cfg_rescale: bool = False,
    kind: str = "sde",
    eta: float = 0.0,
    starts: torch.Tensor | None = None,
    window: int = 0,
    device: torch.device | None = None,
    initial: torch.Tensor | None = None,
) -> Sampled:
    """Denoise from per-sample noise along `sigmas` (N+1,) on `device` (None: the host); steps k in
    [starts_b, starts_b + window) of sample b use the `kind` transition with noise level eta, all others
    the ODE (Euler) step. `generators` are host generators, one per sample. `guidance` is a scale or a function
    of the step's sigma (B,) giving one (Wan 2.2 A14B: a scale per expert).

    With window=0 this is plain ODE sampling (validation) and the captured tensors are empty. `initial` (B,
    *latent_shape) is the starting noise; None draws it from the generators first.
    """
    batch = len(generators)
    x = per_sample_noise(generators, latent_shape, device) if initial is None else initial.to(device)
    starts = torch.zeros(batch, dtype=torch.long) if starts is None else starts
    steps = torch.arange(len(sigmas) - 1)[:, None]
    in_window = to_device((starts <= steps) & (steps < starts + window), device)  # (N, B)
    on_device = to_device(sigmas, device)
    index = to_device(starts.unsqueeze(1) + torch.arange(window + 1), device)  # (B, W+1): each sample's window
    latents, log_probs, means = [x], [], []
    for k in range(len(sigmas) - 1):
        sigma, sigma_next = on_device[k].expand(batch), on_device[k + 1].expand(batch)
        scale = guidance(sigma) if callable(guidance) else guidance
        v = guided_velocity(velocity_fn, x, sigma, cond, uncond, scale, cfg_rescale)
        if window:
            noise = per_sample_noise(generators, latent_shape, device)
            tr = sde.transition(kind, v, x, sigma, sigma_next, eta * in_window[k], noise=noise)
            log_probs.append(tr.log_prob)
            means.append(tr.mean)
        else:
            tr = sde.transition("ode", v, x, sigma, sigma_next, 0.0)
        x = tr.sample
        latents.append(x)
    if not window:
        empty = x.new_zeros(batch, 0)
        return Sampled(x, empty, empty, empty, empty)
    rows = torch.arange(batch, device=device).unsqueeze(1)
    return Sampled(
        final=x,
        latents=torch.stack(latents, 1)[rows, index],
        log_probs=torch.stack(log_probs, 1)[rows, index[:, :-1]],
        means=torch.stack(means, 1)[rows, index[:, :-1]],
        sigmas=on_device[index],
    )
