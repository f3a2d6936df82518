"""Checkpoints with torch.distributed.checkpoint: atomic, keep-last-k, resumable.

A checkpoint is `{run}/checkpoints/step_XXXXXX/`: the DCP shards of the trained parameters and
the optimizer state, plus `trainer_rank{r}.pt` (scheduler, RNG states, step, data position).
It is written to a hidden `.tmp` folder and renamed when complete, so a crash mid-save leaves
the previous checkpoint intact; older checkpoints are pruned only after the rename, each renamed hidden before it is
deleted (as is a checkpoint of the same step saved again), so that a crash mid-delete leaves no `step_*` folder
holding part of its files. The next save clears the hidden leftovers.
"""

import re
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from omnialign.engine.dist import World, barrier, rng_state, set_rng_state

_NAME = re.compile(r"^step_(\d{6,})$")
# only trained parameters are saved; loading them leaves the frozen ones as loaded from the base model
# (DCP itself fails on a trained parameter missing from the checkpoint)
_OPTIONS = StateDictOptions(ignore_frozen_params=True, strict=False)
# a single process without a process group is the intended world-size-1 path, not a mistake
warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")


def checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = [p for p in root.glob("step_*") if _NAME.match(p.name) and (p / ".metadata").exists()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest(run_dir: Path) -> Path | None:
    found = checkpoints(run_dir)
    return found[-1] if found else None


def set_aside_after(path: Path) -> list[Path]:
    """Move the checkpoints of `path`'s run newer than `path` into `checkpoints/abandoned/`: resuming from an
    older checkpoint starts a new branch, and `--resume auto` must continue that branch, not the old one."""
    path = Path(path)
    step = int(_NAME.match(path.name).group(1))
    newer = [p for p in checkpoints(path.parent.parent) if int(_NAME.match(p.name).group(1)) > step]
    aside = path.parent / "abandoned"
    for p in newer:
        aside.mkdir(exist_ok=True)
        target = aside / p.name
        while target.exists():
            target = target.with_name(target.name + "_")
        p.rename(target)
    return newer


def _hide(path: Path) -> Path:
    """`path` renamed `.NAME.deleting`, out of `checkpoints`' sight, to be deleted."""
    return path.rename(path.with_name(f".{path.name}.deleting"))


def save(
    run_dir: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    trainer_state: dict,
    keep_last: int,
    world: World,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Save atomically and prune to the newest `keep_last` (0 keeps all); every rank calls this. `tensors` are
    kept beside the trained parameters (frozen state an algorithm changes, e.g. an old-policy adapter)."""
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step_{step:06d}", root / f".step_{step:06d}.tmp"
    if keep_last < 0:
        raise ValueError(f"trainer.keep_last={keep_last} must be >= 0 (0 keeps every checkpoint)")
    if world.is_main:
        for leftover in root.glob(".step_*"):  # a crashed save's or delete's
            shutil.rmtree(leftover)
        tmp.mkdir(parents=True)
    barrier()
    model_state, optim_state = get_state_dict(model, optimizer, options=_OPTIONS)
    state = {"model": model_state, "optim": optim_state, **({"tensors": tensors} if tensors else {})}
    dcp.save(state, checkpoint_id=tmp, no_dist=not dist.is_initialized())
    extra = {"scheduler": scheduler.state_dict(), "rng": rng_state(), "world_size": world.size, **trainer_state}
    torch.save(extra, tmp / f"trainer_rank{world.rank}.pt")
    barrier()
    if world.is_main:
        replaced = [_hide(final)] if final.exists() else []  # the same step saved again (another run's resumed)
        tmp.rename(final)
        for old in replaced + ([_hide(p) for p in checkpoints(run_dir)[:-keep_last]] if keep_last else []):
            shutil.rmtree(old)
    barrier()
    return final


def load(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    world: World,
    tensors: dict[str, torch.Tensor] | None = None,
) -> dict:
    """Restore model, optimizer, scheduler and RNG states (any world size) and `tensors` in place; returns the
    trainer state."""
    path = Path(path)
    if not (path / ".metadata").exists():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no .metadata); pick one of {path.parent}/step_*")
    model_state, optim_state = get_state_dict(model, optimizer, options=_OPTIONS)
    state = {"model": model_state, "optim": optim_state, **({"tensors": tensors} if tensors else {})}
    own = path / f"trainer_rank{world.rank}.pt"
    try:
        dcp.load(state, checkpoint_id=path, no_dist=not dist.is_initialized())
        extra = torch.load(own if own.exists() else path / "trainer_rank0.pt", weights_only=False)
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException
        earlier = [p.name for p in checkpoints(path.parent.parent) if p.name < path.name]
        # DCP's exception is its ranks' tracebacks, the reason on the last line
        reason = str(e).strip().splitlines()[-1] if isinstance(e, CheckpointException) else f"{type(e).__name__}: {e}"
        raise RuntimeError(
            f"{path} could not be read into this run ({reason[:300]}). A checkpoint copied in "
            "part or damaged fails here, as does one of another model or adapter rank; earlier checkpoints of its "
            f"run: {', '.join(earlier) or 'none'} (--resume takes one of them)"
        ) from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=_OPTIONS)
    scheduler.load_state_dict(extra.pop("scheduler"))
    set_rng_state(extra.pop("rng"))
    return extra
