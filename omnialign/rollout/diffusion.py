"""Colocated diffusion rollout: the training module generates under no_grad and returns a Trajectory."""

import torch
from tqdm import tqdm

from omnialign.batch import Trajectory
from omnialign.config import RolloutConfig
from omnialign.diffusion import sde
from omnialign.diffusion.sampling import sample
from omnialign.models.base import DiffusionPolicy


def sample_seeds(seed: int, step: int, count: int) -> torch.Tensor:
    """Per-sample seeds of a step, distinct across steps and runs with different seeds."""
    return torch.arange(count, dtype=torch.long) + (seed * 1_000_003 + step) * 100_000


def _generators(seeds: torch.Tensor, device: torch.device) -> list[torch.Generator]:
    return [torch.Generator(device).manual_seed(int(s)) for s in seeds]


def _conditions(policy: DiffusionPolicy, prompts: list[str], config: RolloutConfig) -> tuple:
    """Prompt conditions, and the negative prompt's when CFG is on (else None)."""
    uncond = None
    if config.guidance != 1.0:
        uncond = policy.encode_prompts([config.negative_prompt] * len(prompts))
    return policy.encode_prompts(prompts), uncond


@torch.no_grad()
def generate(
    policy: DiffusionPolicy,
    prompts: list[str],
    group: torch.Tensor,
    seeds: torch.Tensor,
    config: RolloutConfig,
    device: torch.device,
    progress: bool = False,
) -> tuple[Trajectory, torch.Tensor]:
    """Sample one image per prompt with an SDE window per sample; returns (Trajectory, images (B, C, H, W)).

    prompts, group and seeds are per sample (B,); batches of `config.micro_batch_size` go through
    the network together. The trajectory stays on `device`.
    """
    sigmas = policy.schedule(config.steps, config.height, config.width)
    shape = policy.latent_shape(config.height, config.width)
    window_end = config.steps if config.window_end is None else config.window_end
    starts = sde.window_starts(seeds, config.window_size, config.window_start, window_end)
    parts, images = [], []
    chunks = range(0, len(prompts), config.micro_batch_size)
    for lo in tqdm(chunks, desc="rollout", leave=False, disable=not progress, dynamic_ncols=True):
        sl = slice(lo, lo + config.micro_batch_size)
        cond, uncond = _conditions(policy, prompts[sl], config)
        out = sample(
            policy.velocity, _generators(seeds[sl], device), shape, sigmas, cond, uncond,
            guidance=config.guidance, cfg_rescale=config.cfg_rescale, kind=config.kind, eta=config.eta,
            starts=starts[sl], window=config.window_size,
        )  # fmt: skip
        images.append(policy.decode(out.final))
        parts.append(
            Trajectory(
                latents=out.latents,
                log_probs=out.log_probs,
                means=out.means,
                sigmas=out.sigmas,
                cond=cond,
                uncond=uncond,
                group=group[sl].to(device),
                seeds=seeds[sl].to(device),
                batch_size=[len(out.final)],
            )  # fmt: skip
        )
    return torch.cat(parts), torch.cat(images)


@torch.no_grad()
def generate_ode(
    policy: DiffusionPolicy, prompts: list[str], seeds: torch.Tensor, config: RolloutConfig, device: torch.device
) -> torch.Tensor:
    """Deterministic ODE samples for validation: images (B, C, H, W) in [0, 1], one per prompt."""
    sigmas = policy.schedule(config.val_steps, config.height, config.width)
    shape = policy.latent_shape(config.height, config.width)
    images = []
    for lo in range(0, len(prompts), config.micro_batch_size):
        sl = slice(lo, lo + config.micro_batch_size)
        cond, uncond = _conditions(policy, prompts[sl], config)
        out = sample(policy.velocity, _generators(seeds[sl], device), shape, sigmas, cond, uncond,
                     guidance=config.guidance, cfg_rescale=config.cfg_rescale)  # fmt: skip
        images.append(policy.decode(out.final))
    return torch.cat(images)
