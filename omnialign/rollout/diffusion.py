"""Colocated diffusion rollout: the training module generates under no_grad and returns a Trajectory."""

from collections.abc import Callable

import torch
from tensordict import TensorDict
from tqdm import tqdm

from omnialign.batch import Trajectory
from omnialign.config import RolloutConfig
from omnialign.diffusion import sde
from omnialign.diffusion.sampling import Guidance, VelocityFn, per_sample_noise, sample
from omnialign.engine.stage import to_device
from omnialign.models.base import DiffusionPolicy
from omnialign.models.flux2 import Flux2Policy
from omnialign.models.wan import WanPolicy

SHARED_INIT_OFFSET = 50_000
"""`rollout.shared_init_noise` draws a group's initial noise from its first sample's seed plus this: a seed of no sample
(a step's samples take seeds + 0 ... count - 1), so the shared noise is not also any sample's first SDE noise."""


def sample_seeds(seed: int, step: int, count: int) -> torch.Tensor:
    """Per-sample seeds of a step, distinct across steps and runs with different seeds."""
    return torch.arange(count, dtype=torch.long) + (seed * 1_000_003 + step) * 100_000


def _generators(seeds: torch.Tensor) -> list[torch.Generator]:
    """Host generators, one per sample: the same seed draws the same noise on any device."""
    return [torch.Generator().manual_seed(int(s)) for s in seeds]


def high_noise(policy: DiffusionPolicy, sigma: torch.Tensor) -> torch.Tensor | None:
    """Where Wan 2.2 A14B's trained high-noise expert runs, per sample (B,) bool (`WanPolicy.high_noise`); None for a
    model with one network."""
    return policy.high_noise(sigma) if isinstance(policy, WanPolicy) else None


def rollout_velocity(policy: DiffusionPolicy, config: RolloutConfig) -> VelocityFn:
    """`policy.velocity`; with `rollout.grad_graph`, a call made without grad runs with it and returns its output
    detached, so that a compiled network runs the update's graph (a call with grad, the update's, is unchanged).
    Wan 2.2's low-noise expert is frozen and never replayed: its steps stay without grad (its velocity refuses a
    low-noise step with grad, which would train nothing)."""
    if not config.grad_graph:
        return policy.velocity

    def velocity(latents: torch.Tensor, sigma: torch.Tensor, cond: TensorDict) -> torch.Tensor:
        if torch.is_grad_enabled():
            return policy.velocity(latents, sigma, cond)
        high = high_noise(policy, sigma)
        if high is not None and not high.all():  # Wan 2.2's frozen low-noise expert, never replayed
            return policy.velocity(latents, sigma, cond)
        with torch.enable_grad():
            return policy.velocity(latents, sigma, cond).detach()

    return velocity


def window_starts(seeds: torch.Tensor, config: RolloutConfig, step: int, seed: int) -> torch.Tensor:
    """Window start of every sample (B,): per sample from its seed (`per_sample`, Flow-GRPO), or one
    start for the whole step (MixGRPO) drawn from (seed, step) (`random`, the same on every rank)
    or sliding one step every `window_shift_every` steps (`progressive`)."""
    lo = config.window_start
    hi = config.steps if config.window_end is None else config.window_end
    if config.window_size == 0:
        return torch.zeros(len(seeds), dtype=torch.long)
    if config.window_schedule == "per_sample":
        return sde.window_starts(seeds, config.window_size, lo, hi)
    positions = hi - config.window_size - lo + 1
    if config.window_schedule == "random":
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        start = lo + int(torch.randint(positions, (), generator=g))
    else:
        start = lo + (max(step, 1) - 1) // config.window_shift_every % positions
    return torch.full((len(seeds),), start, dtype=torch.long)


def uses_cfg(config: RolloutConfig) -> bool:
    """Whether any step runs CFG (an unconditional forward): rollout.guidance or rollout.guidance_2 not 1."""
    return config.guidance != 1.0 or config.guidance_2 not in (None, 1.0)


def step_guidance(policy: DiffusionPolicy, sigma: torch.Tensor, config: RolloutConfig) -> Guidance:
    """The CFG scale of each sample at sigma (B,): rollout.guidance, or with rollout.guidance_2 set (Wan 2.2 A14B)
    one per sample, guidance_2 where the policy's low-noise expert runs (its `high_noise(sigma)` False), as the
    pipeline's guidance_scale_2. Rollout, replay and validation all take it from here, so replayed log-probs
    equal the rollout's. A step-distilled FLUX.2-klein, whose pipeline ignores guidance_scale, refuses CFG."""
    if isinstance(policy, Flux2Policy) and policy.distilled and uses_cfg(config):
        raise ValueError(
            f"rollout.guidance={config.guidance}: this FLUX.2-klein is step-distilled (is_distilled in its "
            "model_index.json) and its pipeline ignores guidance_scale: set rollout.guidance=1 (CFG needs a base klein)"
        )
    if config.guidance_2 is None:
        return config.guidance
    high = high_noise(policy, sigma)
    if high is None:
        raise ValueError(
            f"rollout.guidance_2={config.guidance_2} is the guidance of Wan 2.2 A14B's low-noise expert, and this "
            f"model ({type(policy).__name__}) has one network: unset rollout.guidance_2 (rollout.guidance applies)"
        )
    return torch.where(high, config.guidance, config.guidance_2).float()


def _conditions(
    policy: DiffusionPolicy, prompts: list[str], sources: list[list[torch.Tensor]] | None, config: RolloutConfig
) -> tuple:
    """Prompt conditions, and the negative prompt's when CFG is on (else None); an editing model's negative
    conditions see the same source images, as its pipeline's do."""
    uncond = None
    if uses_cfg(config):
        uncond = policy.encode_prompts([config.negative_prompt] * len(prompts), sources)
    return policy.encode_prompts(prompts, sources), uncond


def group_heads(group: torch.Tensor) -> dict[int, int]:
    """Each group's first sample: {group id: its index}, in order of first appearance."""
    first: dict[int, int] = {}
    for i, g in enumerate(group.tolist()):
        first.setdefault(g, i)
    return first


def group_conditions(
    policy: DiffusionPolicy,
    prompts: list[str],
    sources: list[list[torch.Tensor]] | None,
    group: torch.Tensor,
    config: RolloutConfig,
) -> tuple[TensorDict, TensorDict | None, torch.Tensor]:
    """The conditions of each group (and the negative ones), encoded once for all its samples, which share their
    prompt and sources (a group is one prompt's samples), `config.micro_batch_size` groups at a time, with each
    sample's row in them (B,) on their device."""
    first = group_heads(group)
    heads = list(first.values())
    parts = [
        _conditions(policy, [prompts[i] for i in chunk], sources and [sources[i] for i in chunk], config)
        for chunk in (heads[lo : lo + config.micro_batch_size] for lo in range(0, len(heads), config.micro_batch_size))
    ]
    cond = torch.cat([c for c, _ in parts])
    uncond = None if parts[0][1] is None else torch.cat([u for _, u in parts])
    row = {g: k for k, g in enumerate(first)}  # each group's row in the conditions
    return cond, uncond, to_device(torch.tensor([row[g] for g in group.tolist()]), cond.device)


@torch.no_grad()
def generate(
    policy: DiffusionPolicy,
    prompts: list[str],
    group: torch.Tensor,
    seeds: torch.Tensor,
    config: RolloutConfig,
    device: torch.device,
    progress: bool = False,
    step: int = 0,
    seed: int = 0,
    on_chunk: Callable[[torch.Tensor, slice], None] = lambda images, rows: None,
    sources: list[list[torch.Tensor]] | None = None,
) -> tuple[Trajectory, torch.Tensor]:
    """Sample one image per prompt with an SDE window per sample; returns (Trajectory, images (B, C, H, W)).

    prompts, group and seeds are per sample (B,); batches of `config.micro_batch_size` go through
    the network together. `step` and `seed` place the window of the shared schedules (MixGRPO).
    With `config.window_size=0` the whole path is the ODE and only the clean samples are kept.
    `on_chunk(images, rows)` runs as soon as a chunk is decoded (to score it while the next one
    is generated). An editing model takes each sample's source images `sources` (B lists of (C, H, W) in
    [0, 1]). The samples of a group share their prompt and sources, whose conditions are encoded once
    (`group_conditions`). The trajectory stays on `device`.
    """
    sigmas = policy.schedule(config.steps, config.height, config.width)
    shape = policy.latent_shape(config.height, config.width)
    starts = window_starts(seeds, config, step, seed)
    if config.shared_init_noise:  # DanceGRPO: a group starts from one noise, drawn from its first sample's seed
        first = group_heads(group)
        init_seeds = seeds[[first[g] for g in group.tolist()]] + SHARED_INIT_OFFSET
    parts, images, velocity = [], [], rollout_velocity(policy, config)
    conds, unconds, rows = group_conditions(policy, prompts, sources, group, config)
    chunks = range(0, len(prompts), config.micro_batch_size)
    for lo in tqdm(chunks, desc="rollout", leave=False, disable=not progress, dynamic_ncols=True):
        sl = slice(lo, lo + config.micro_batch_size)
        cond, uncond = conds[rows[sl]], None if unconds is None else unconds[rows[sl]]
        out = sample(
            velocity, _generators(seeds[sl]), shape, sigmas, cond, uncond,
            guidance=lambda sigma: step_guidance(policy, sigma, config), cfg_rescale=config.cfg_rescale,
            kind=config.kind, eta=config.eta,
            starts=starts[sl], window=config.window_size, device=device,
            initial=per_sample_noise(_generators(init_seeds[sl]), shape, device) if config.shared_init_noise else None,
        )  # fmt: skip
        images.append(policy.decode(out.final))
        on_chunk(images[-1], sl)
        parts.append(
            Trajectory(
                final=out.final,
                latents=out.latents,
                log_probs=out.log_probs,
                means=out.means,
                sigmas=out.sigmas,
                cond=cond,
                uncond=uncond,
                group=to_device(group[sl], device),
                seeds=to_device(seeds[sl], device),
                batch_size=[len(out.final)],
            )  # fmt: skip
        )
    return torch.cat(parts), torch.cat(images)


@torch.no_grad()
def generate_ode(
    policy: DiffusionPolicy,
    prompts: list[str],
    seeds: torch.Tensor,
    config: RolloutConfig,
    device: torch.device,
    sources: list[list[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """Deterministic ODE samples for validation: images (B, C, H, W) in [0, 1], one per prompt (and its
    source images for an editing model)."""
    sigmas = policy.schedule(config.val_steps, config.height, config.width)
    shape = policy.latent_shape(config.height, config.width)
    images = []
    for lo in range(0, len(prompts), config.micro_batch_size):
        sl = slice(lo, lo + config.micro_batch_size)
        cond, uncond = _conditions(policy, prompts[sl], sources and sources[sl], config)
        out = sample(policy.velocity, _generators(seeds[sl]), shape, sigmas, cond, uncond,
                     guidance=lambda sigma: step_guidance(policy, sigma, config), cfg_rescale=config.cfg_rescale,
                     device=device)  # fmt: skip
        images.append(policy.decode(out.final))
    return torch.cat(images)
