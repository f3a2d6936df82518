"""The loop every trainer runs: validate, then train_step / validate / save to trainer.total_steps.

A trainer has `config`, `world`, `run_dir`, `optimizer`, `scheduler`, `timer`, `log` (None off the
main rank), `train_step(step)` and `validate(step)`, both returning metric tensors. The loop resumes
from a checkpoint, reduces each step's metrics once across ranks, and ends with a summary of every
validation metric before and after training (`summary.json`).
"""

import json
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm import tqdm

from omnialign.engine import checkpoint, dist
from omnialign.metrics import failed_rewards, grid_path, plot_curves, read_metrics, to_host
from omnialign.trainer.ema import ParameterAverage


def run_loop(
    trainer, model: torch.nn.Module, resume: Path | None, key: str, tensors: dict[str, torch.Tensor] | None = None
) -> dict:
    """Train `model` to trainer.total_steps; `key` is the headline validation metric of the summary; `tensors`
    are checkpointed beside the trained parameters. With `trainer.ema_decay`, validation runs on the trained
    parameters' moving average (trainer/ema.py), which is checkpointed too."""
    c, world = trainer.config.trainer, trainer.world
    average = ParameterAverage(model, c.ema_decay, c.ema_every) if c.ema_decay else None
    tensors = {**(tensors or {}), **(average.tensors() if average else {})}
    start = 0
    if resume is not None:
        start = checkpoint.load(resume, model, trainer.optimizer, trainer.scheduler, world, tensors)["step"]
        if trainer.log:
            trainer.log.truncate_after(start)
            print(f"resumed from {resume} at step {start}")

    def validate(step: int) -> dict[str, torch.Tensor]:
        with trainer.timer.phase("validate"), average.applied() if average else nullcontext():
            return trainer.validate(step)

    if start == 0:
        record(trainer, 0, validate(0), key, validated=True)
    for step in range(start + 1, c.total_steps + 1):
        metrics = trainer.train_step(step)
        if average:
            average.update(step)
        validated = step % c.val_every == 0 or step == c.total_steps
        if validated:
            metrics.update(validate(step))
        record(trainer, step, metrics, key, validated)
        if step % c.save_every == 0 or step == c.total_steps:
            with trainer.timer.phase("save"):
                checkpoint.save(trainer.run_dir, step, model, trainer.optimizer, trainer.scheduler, {"step": step},
                                c.keep_last, world, tensors)  # fmt: skip
    return summarise(trainer, key)


def record(trainer, step: int, metrics: dict[str, torch.Tensor], key: str, validated: bool) -> None:
    values = to_host({**metrics, **trainer.timer.pop()}, reduce=dist.mean_across, device=trainer.world.device)
    if trainer.log:
        grid = grid_path(trainer.run_dir, step)
        images = {"val/samples": grid} if validated and grid.exists() else {}
        trainer.log.log(step, values, echo=tqdm.write, images=images)
        if key in values and step > 0:  # from the first validation after the base's: a curve, not a point
            plot_curves(read_metrics(trainer.log.path), trainer.run_dir / "reward_curve.png")


def number(value: float | None) -> str:
    """A metric for a summary line; None is a NaN or infinity that metrics.jsonl holds as null."""
    return "nan" if value is None else f"{value:.3f}"


def summarise(trainer, key: str) -> dict:
    """{metric, steps, val_before, val_after (of `key`), NAME_before / NAME_after of every val/ metric, skipped and
    applied updates, and the steps in which each optional reward failed}. A run whose every update was skipped
    as non-finite learned nothing: it ends with an error, not a summary."""
    if not trainer.log:
        return {}
    trainer.log.close()
    records = read_metrics(trainer.log.path)
    val = [r for r in records if key in r]
    first, last = val[0], val[-1]
    summary = {"metric": key, "steps": last["step"], "val_before": first[key], "val_after": last[key],
               "skipped_updates": sum(r.get("actor/skipped_updates", 0) for r in records),
               "updates": sum(r.get("actor/updates", 0) for r in records),
               "steps_without_update": sum(r.get("actor/grad_norm") == 0 for r in records),
               "failed_rewards": {name: sum(name in failed_rewards(r) for r in records)
                                  for name in trainer.config.reward.optional}}  # fmt: skip
    changes = []
    for name in sorted(k for k in last if k.startswith("val/") and k in first):
        summary[f"{name}_before"], summary[f"{name}_after"] = first[name], last[name]
        if name != key and not name.endswith("std"):
            changes.append(f"{name.removeprefix('val/')} {number(first[name])} -> {number(last[name])}")
    (trainer.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    detail = f" ({', '.join(changes)})" if changes else ""
    steps = f"{last['step']} step{'s' * (last['step'] != 1)}"
    print(f"{key}: {number(first[key])} before -> {number(last[key])} after {steps}{detail}; "
          f"outputs in {trainer.run_dir}")  # fmt: skip
    trained, empty = sum("actor/grad_norm" in r for r in records), summary["steps_without_update"]
    if empty:
        warning = "WARNING: no step" if empty == trained else f"{empty} of {trained} steps"
        print(f"{warning} had anything to learn and took no optimizer step (a zero gradient: every reward of each "
              "prompt's group tied, or online DPO pairs all closer than algorithm.dpo_min_gap="
              f"{trainer.config.algorithm.dpo_min_gap})")  # fmt: skip
    for name, steps in summary["failed_rewards"].items():
        if steps:
            print(f"WARNING: optional reward {name} failed in {steps} of {len(records)} steps and scored 0 there")
    if summary["skipped_updates"]:
        print(f"WARNING: {summary['skipped_updates']:.0f} of {summary['updates']:.0f} updates were skipped as "
              "non-finite (actor.skip_nonfinite)")  # fmt: skip
        if summary["skipped_updates"] >= summary["updates"]:
            raise RuntimeError(f"every update of {trainer.run_dir} was skipped as non-finite: nothing was learned")
    return summary
