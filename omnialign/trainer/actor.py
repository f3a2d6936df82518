"""Micro-batched updates and inference over the timesteps of a trajectory.

`update` runs an objective over mini-batches x micro-batches x window steps with gradient
accumulation and one guarded optimizer step per mini-batch; `infer` runs a forward-only
function over the same loop and returns its complete outputs. Objectives (`flowgrpo_objective`)
tie a policy to the pure math of `diffusion/sde.py` and `algorithms/`.
"""

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from tqdm import tqdm

from omnialign.algorithms.policy_gradient import gaussian_mean_kl, ppo_clip
from omnialign.batch import Trajectory
from omnialign.config import ActorConfig, AlgorithmConfig, RolloutConfig
from omnialign.diffusion import sde
from omnialign.diffusion.sampling import guided_velocity
from omnialign.engine import optim
from omnialign.models.base import DiffusionPolicy

# (micro-batch, window step k) -> (per-sample loss (b,), metrics {name: (b,) or () tensor})
Objective = Callable[[Trajectory, int], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def replay(policy: DiffusionPolicy, batch: Trajectory, k: int, rollout: RolloutConfig) -> sde.Transition:
    """Score the stored transition k of each sample under the current policy."""
    x, sigma, sigma_next = batch.latents[:, k], batch.sigmas[:, k], batch.sigmas[:, k + 1]
    v = guided_velocity(policy.velocity, x, sigma, batch.cond, batch.uncond, rollout.guidance, rollout.cfg_rescale)
    return sde.transition(rollout.kind, v, x, sigma, sigma_next, rollout.eta, sample=batch.latents[:, k + 1])


def flowgrpo_objective(
    policy: DiffusionPolicy,
    rollout: RolloutConfig,
    algorithm: AlgorithmConfig,
    reference: Callable[[], AbstractContextManager] | None = None,
) -> Objective:
    """FlowGRPO: PPO clip on the window transitions' log-probs, plus the reference KL if kl_coef > 0."""

    def objective(batch: Trajectory, k: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        tr = replay(policy, batch, k, rollout)
        old = batch.old_log_probs if algorithm.old_log_probs == "recompute" else batch.log_probs
        loss, metrics = ppo_clip(
            tr.log_prob, old[:, k], batch.advantages, algorithm.clip_range, algorithm.clip_range, algorithm.adv_clip
        )
        metrics["clip_frac"] = metrics["clip_frac_low"] + metrics["clip_frac_high"]
        if algorithm.kl_coef > 0:
            with torch.no_grad(), reference():
                ref = replay(policy, batch, k, rollout)
            kl = gaussian_mean_kl(tr.mean, ref.mean, tr.std)
            loss = loss + algorithm.kl_coef * kl
            metrics["kl"] = kl.detach()
        return loss, metrics

    return objective


def _micro_batches(size: int, mini: int, micro: int, order: torch.Tensor) -> list[list[torch.Tensor]]:
    """order split into mini-batches, each a list of micro-batch index tensors."""
    return [[order[m : m + micro] for m in range(lo, lo + mini, micro)] for lo in range(0, size, mini)]


def update(
    objective: Objective,
    traj: Trajectory,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: ActorConfig,
    seed: int,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Train on a trajectory: `config.epochs` passes, one optimizer step per mini-batch.

    The loss of each (micro-batch, step) is scaled so that a mini-batch's gradient is the mean
    over its samples and window steps. Returns metric means as 0-d tensors (no host sync besides
    the finite check of each optimizer step).
    """
    size, window = traj.batch_size[0], traj.window
    mini = config.mini_batch_size or size
    generator = torch.Generator().manual_seed(seed)
    sums: dict[str, torch.Tensor] = {}
    counts: dict[str, int] = {}

    def add(name: str, value: torch.Tensor) -> None:
        sums[name] = sums.get(name, 0) + value.detach().float().mean()
        counts[name] = counts.get(name, 0) + 1

    n_units = config.epochs * size // config.micro_batch_size * window
    bar = tqdm(total=n_units, desc="update", leave=False, disable=not progress, dynamic_ncols=True)
    for _ in range(config.epochs):
        order = torch.randperm(size, generator=generator) if config.shuffle else torch.arange(size)
        for micro_batches in _micro_batches(size, mini, config.micro_batch_size, order):
            for index in micro_batches:
                batch = traj[index.to(traj.device)]
                for k in range(window):
                    loss, metrics = objective(batch, k)
                    (loss.mean() * (len(index) / mini / window)).backward()
                    add("loss", loss)
                    for name, value in metrics.items():
                        add(name, value)
                    bar.update()
            grad_norm, skipped = optim.step(optimizer, scheduler, params, config.max_grad_norm)
            add("grad_norm", grad_norm)
            add("skipped_updates", skipped * 1.0)
    bar.close()
    out = {name: sums[name] / counts[name] for name in sums}
    out["skipped_updates"] = sums["skipped_updates"]  # a count, not a mean
    return out


@torch.no_grad()
def infer(fn: Callable[[Trajectory, int], torch.Tensor], traj: Trajectory, micro_batch_size: int) -> torch.Tensor:
    """Forward-only pass over micro-batches x window steps; fn(batch, k) -> (b, ...) outputs.

    Returns the complete outputs stacked as (B, W, ...) in the trajectory's sample order.
    """
    chunks = []
    for lo in range(0, traj.batch_size[0], micro_batch_size):
        batch = traj[lo : lo + micro_batch_size]
        chunks.append(torch.stack([fn(batch, k) for k in range(traj.window)], dim=1))
    return torch.cat(chunks)
