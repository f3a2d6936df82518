"""Micro-batched updates and inference over the steps of a trajectory.

An `Objective` names what it reads: `resident` fields (one per sample, such as prompt conditions
and advantages) and `per_step` inputs (slices `field[:, k + offset]` of step-indexed fields such
as latents). The actor feeds it micro-batch by micro-batch and step by step:

- `update` accumulates gradients over mini-batches x micro-batches x steps, with one guarded
  optimizer step per mini-batch. Per-step model outputs are discarded after each backward
  unless `return_model_output=True`; losses and metrics are aggregated either way.
- `infer` runs a forward-only objective and always returns its complete outputs.
- Timestep staging (`stage=True`): the trajectory stays in host memory, resident fields are
  copied to the device once per micro-batch, and each step's inputs are copied just before
  its forward and released after its backward; fields the objective does not name never
  reach the device. With `prefetch=True` (CUDA), step k+1's copy runs on a side stream from
  pinned memory while step k computes.
"""

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import torch
from tensordict import TensorDictBase
from tqdm import tqdm

from omnialign.config import ActorConfig
from omnialign.engine import optim
from omnialign.engine.stage import Stager, to_device

Inputs = dict[str, Any]  # name -> (b, ...) tensor or TensorDict for one micro-batch and step
StepFn = Callable[[Inputs], tuple[torch.Tensor, dict[str, torch.Tensor], dict[str, torch.Tensor]]]


@dataclass
class Objective:
    """fn(inputs) -> (per-sample loss (b,), metrics {name: tensor}, model outputs {name: (b, ...)})."""

    fn: StepFn
    resident: tuple[str, ...]
    """Per-sample batch fields the step reads, copied once per micro-batch (e.g. cond, advantages)."""
    per_step: dict[str, tuple[str, int]] = field(default_factory=dict)
    """Input name -> (batch field, offset): the input of step k is field[:, k + offset]. Empty: one step
    per micro-batch on the resident fields alone (language models)."""


class UpdateResult(NamedTuple):
    metrics: dict[str, torch.Tensor]  # means over micro-batches and steps, 0-d tensors
    model_output: dict[str, torch.Tensor]  # {} unless retained: name -> (epochs*B, steps, ...), plus "index"


def local_config(config: ActorConfig, batch: int, multiple: int, world_size: int) -> ActorConfig:
    """One device's actor settings for a training batch of `batch` rows across `world_size` devices: its
    share of the mini-batch, and micro-batches of `config.micro_batch_size` rows at most, rounded down to a
    multiple of `multiple`; where they do not divide the share, its last micro-batch is smaller. The gradient of a
    mini-batch does not depend on the micro-batch."""
    mini = (config.mini_batch_size or batch) // world_size
    micro = min(config.micro_batch_size, mini) // multiple * multiple
    return dataclasses.replace(config, mini_batch_size=mini, micro_batch_size=micro)


def steps_of(batch: Any, objective: Objective) -> int:
    """Number of steps an objective runs over a batch; a field read at offsets up to o needs steps + o entries.
    An objective without per-step inputs (language models) runs once per micro-batch."""
    if not objective.per_step:
        return 1
    reach: dict[str, int] = {}
    for f, off in objective.per_step.values():
        reach[f] = max(reach.get(f, 0), off)
    entries = {f: getattr(batch, f).shape[1] for f in reach}
    sizes = {entries[f] - off for f, off in reach.items()}
    if len(sizes) != 1:
        raise ValueError(
            f"batch fields disagree on the number of steps: entries {entries}, read at offsets up to {reach} "
            "(latents need steps + 1 entries, per-step loss fields steps entries)"
        )
    return sizes.pop()


def validate_batch(batch: Any, objective: Objective, stage: bool) -> int:
    """Check a batch against an objective before any forward; returns the number of steps."""
    names = {f.name for f in dataclasses.fields(batch)}
    for name in objective.resident + tuple(f for f, _ in objective.per_step.values()):
        if name not in names or (getattr(batch, name) is None and name != "uncond"):
            raise ValueError(f"the objective reads batch field {name!r}, which is missing or None")
    steps = steps_of(batch, objective)
    if steps < 1:
        raise ValueError("the trajectory window is empty: rollout.window_size must be at least 1")
    if stage:
        for name in objective.resident + tuple(f for f, _ in objective.per_step.values()):
            value = getattr(batch, name)
            if value is None:
                continue
            leaves = list(value.values(True, True)) if isinstance(value, TensorDictBase) else [value]
            if any(t.device.type != "cpu" for t in leaves):
                raise ValueError(
                    f"timestep staging needs the batch on the host; field {name!r} is on {leaves[0].device}"
                )
            if any(t.requires_grad for t in leaves):
                raise ValueError(f"timestep staging: batch field {name!r} requires grad; detach it first")
    return steps


def _step_inputs(host: Any, objective: Objective, k: int) -> Inputs:
    return {name: getattr(host, f)[:, k + off] for name, (f, off) in objective.per_step.items()}


def _run(
    objective: Objective,
    batch: Any,
    micro_batch_size: int,
    device: torch.device,
    order: torch.Tensor,
    stage: bool,
    prefetch: bool,
    step_fn: Callable[[Inputs, int], None],
    after_micro_batch: Callable[[torch.Tensor], None] = lambda index: None,
) -> None:
    """Feed `objective` micro-batch by micro-batch (in `order`) and step by step to `step_fn`."""
    steps = steps_of(batch, objective)
    stager = Stager(device, prefetch) if stage else None
    order = to_device(order, batch.device)  # once, without waiting: micro-batches index the batch where it lives
    for lo in range(0, len(order), micro_batch_size):
        index = order[lo : lo + micro_batch_size]
        micro = batch[index]
        if stager is None:
            micro = micro.to(device)  # a no-op where the batch already lives on the device
        resident = {name: getattr(micro, name) for name in objective.resident}
        if stager is None:
            for k in range(steps):
                step_fn({**resident, **_step_inputs(micro, objective, k)}, k)
        else:
            resident = stager.resident(resident)
            for k, inputs in enumerate(stager.steps(steps, partial(_step_inputs, micro, objective))):
                step_fn({**resident, **inputs}, k)
                del inputs
        after_micro_batch(index)


class _Mean:
    """Running means of metric tensors over all their elements, so that a smaller last micro-batch counts for its
    rows only; on the device, without host syncs."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.counts: dict[str, int] = {}

    def add(self, name: str, value: torch.Tensor) -> None:
        self.sums[name] = self.sums.get(name, 0) + value.detach().float().sum()
        self.counts[name] = self.counts.get(name, 0) + value.numel()

    def result(self) -> dict[str, torch.Tensor]:
        return {name: total / self.counts[name] for name, total in self.sums.items()}


def update(
    objective: Objective,
    batch: Any,
    params: list[torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    config: ActorConfig,
    seed: int,
    device: torch.device | None = None,
    return_model_output: bool = False,
    progress: bool = False,
    grad_scale: float = 1.0,
) -> UpdateResult:
    """Train on a batch: `config.epochs` passes, one optimizer step per mini-batch.

    Each (micro-batch, step) loss is scaled so that a mini-batch's gradient is the mean over its
    samples and steps, times `grad_scale` (the group size under sequence parallelism: FSDP2 averages
    gradients over every process, while each process of a group holds a part of its samples' gradient,
    the parts summing to it). Metrics come back as 0-d tensor means (no host sync besides the finite
    check of each optimizer step); `skipped_updates` and `updates` are counts. A non-finite loss or
    gradient raises `optim.NonFiniteUpdate` unless `config.skip_nonfinite`.
    """
    size = batch.batch_size[0]
    steps = validate_batch(batch, objective, config.timestep_staging)
    device = device or batch.device
    mini, micro = config.mini_batch_size or size, config.micro_batch_size
    generator = torch.Generator().manual_seed(seed)
    means = _Mean()
    retained: dict[str, list[torch.Tensor]] = {}
    per_micro: dict[str, list[torch.Tensor]] = {}
    bar = tqdm(total=config.epochs * -(-size // micro) * steps, desc="update", leave=False, disable=not progress)

    mini_loss = torch.zeros(())  # the loss of the mini-batch being accumulated, checked at its optimizer step

    def step_fn(inputs: Inputs, k: int) -> None:
        nonlocal mini_loss
        loss, metrics, outputs = objective.fn(inputs)
        n = len(loss)
        scaled = loss.mean() * (n / mini / steps)
        (scaled * grad_scale).backward()
        mini_loss = mini_loss + scaled.detach()  # the host's zero is a scalar to the kernel: no copy that waits
        means.add("loss", loss)
        for name, value in metrics.items():
            means.add(name, value)
        if return_model_output:
            for name, value in outputs.items():
                per_micro.setdefault(name, []).append(value.detach())
        bar.update()

    def keep(index: torch.Tensor) -> None:
        for name, values in per_micro.items():
            retained.setdefault(name, []).append(torch.stack(values, dim=1))
        retained.setdefault("index", []).append(index)
        per_micro.clear()

    skipped, updates = torch.zeros(()), 0
    for _ in range(config.epochs):
        order = torch.randperm(size, generator=generator) if config.shuffle else torch.arange(size)
        for lo in range(0, size, mini):
            _run(objective, batch, micro, device, order[lo : lo + mini], config.timestep_staging,
                 config.prefetch, step_fn, keep if return_model_output else lambda index: None)  # fmt: skip
            grad_norm, was_skipped = optim.step(optimizer, scheduler, params, mini_loss, config.max_grad_norm,
                                                config.skip_nonfinite)  # fmt: skip
            mini_loss = torch.zeros(())
            means.add("grad_norm", grad_norm)
            skipped, updates = skipped + was_skipped, updates + 1
    bar.close()
    metrics = means.result()
    metrics["skipped_updates"], metrics["updates"] = skipped, torch.tensor(float(updates))
    return UpdateResult(metrics, {name: torch.cat(values) for name, values in retained.items()})


@torch.no_grad()
def infer(
    objective: Objective,
    batch: Any,
    micro_batch_size: int,
    device: torch.device | None = None,
    stage: bool = False,
    prefetch: bool = False,
) -> dict[str, torch.Tensor]:
    """Forward-only pass; returns every output stacked as (B, steps, ...) in batch order."""
    validate_batch(batch, objective, stage)
    outputs: dict[str, list[torch.Tensor]] = {}
    per_micro: dict[str, list[torch.Tensor]] = {}

    def step_fn(inputs: Inputs, k: int) -> None:
        for name, value in objective.fn(inputs)[2].items():
            per_micro.setdefault(name, []).append(value)

    def keep(index: torch.Tensor) -> None:
        for name, values in per_micro.items():
            outputs.setdefault(name, []).append(torch.stack(values, dim=1))
        per_micro.clear()

    order = torch.arange(batch.batch_size[0])
    _run(objective, batch, micro_batch_size, device or batch.device, order, stage, prefetch, step_fn, keep)
    return {name: torch.cat(values) for name, values in outputs.items()}
