"""Build a run from a config and train it: `main(config)`. The command line is `omnialign train`.

Order matters: load on the host, add LoRA, make the reference, shard (which places the trained
network on the device), then move the frozen components.
"""

import copy
import json
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import nn

from omnialign.config import Config, ConfigError, to_dict
from omnialign.engine import checkpoint, dist, fsdp, optim
from omnialign.models import LOADERS, lora
from omnialign.models.base import DiffusionPolicy
from omnialign.models.reference import swapped_network
from omnialign.trainer.actor import flowgrpo_objective
from omnialign.trainer.online import OnlineTrainer


def resolve_resume(run_dir: Path, resume: str | None) -> Path | None:
    """'auto' -> the newest checkpoint of the run (None if there is none); a path -> that checkpoint."""
    if resume is None:
        if checkpoint.latest(run_dir) is not None:
            raise SystemExit(
                f"{run_dir} already holds checkpoints: pass --resume auto to continue it, "
                f"or name=NEW_NAME for a new run (or delete the folder)"
            )
        return None
    if resume == "auto":
        found = checkpoint.latest(run_dir)
        print(f"--resume auto: {'continuing from ' + str(found) if found else 'no checkpoint yet, starting fresh'}")
        return found
    return Path(resume)


def prepare_run_dir(run_dir: Path, config: Config, fresh: bool) -> None:
    if fresh:
        for stale in ("metrics.jsonl", "samples", "tensorboard", "reward_curve.png", "summary.json"):
            path = run_dir / stale
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(to_dict(config), indent=2))


def same_blocks(source: nn.Module, copy_: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The blocks of a deep copy that correspond to `blocks` of its source."""
    names = {id(m): name for name, m in source.named_modules()}
    return [copy_.get_submodule(names[id(b)]) for b in blocks]


def build_policy(
    config: Config, world: dist.World, need_reference: bool
) -> tuple[DiffusionPolicy, Callable[[], AbstractContextManager] | None]:
    """The sharded policy on its device, and the reference context (None when not needed)."""
    policy = LOADERS[config.model.arch](config.model)
    net, blocks = policy.transformer, policy.blocks()
    lora_cfg, reference, frozen = config.model.lora, None, None
    if lora_cfg.rank > 0:
        lora.apply_lora(net, lora_cfg.rank, lora_cfg.alpha or lora_cfg.rank, lora_cfg.targets or policy.lora_targets)
        if need_reference:
            reference = lambda: lora.adapters_disabled(net)  # noqa: E731
    else:
        net.requires_grad_(True)
        if need_reference:
            frozen = copy.deepcopy(net).requires_grad_(False).eval()
    if lora_cfg.rank == 0:
        net.float()  # fp32 master weights; compute runs in model.dtype through FSDP mixed precision
    mesh, dtype, e = fsdp.mesh(world), getattr(torch, config.model.dtype), config.engine
    fsdp.shard(net, blocks, mesh, dtype, e.activation_checkpointing, e.cpu_offload, e.reshard_after_forward)
    if frozen is not None:
        fsdp.shard(frozen, same_blocks(net, frozen, blocks), mesh, dtype, False, e.cpu_offload)
        reference = swapped_network(policy, frozen)
    return policy.to(world.device), reference


def main(config: Config, resume: str | None = None) -> dict:
    """Train `config` (validated) and return the validation summary (before/after)."""
    if config.model.arch not in LOADERS:
        raise ConfigError(f"model.arch={config.model.arch!r}: choose one of {sorted(LOADERS)}")
    if config.algorithm.name != "flowgrpo":
        raise ConfigError(f"algorithm.name={config.algorithm.name!r} has no trainer yet; use flowgrpo")
    world = dist.init()
    if config.data.prompts_per_step % world.size:
        raise ConfigError(
            f"data.prompts_per_step={config.data.prompts_per_step} must be a multiple of the world size "
            f"{world.size}: prompt groups are never split across ranks"
        )
    mini = config.actor.mini_batch_size
    if mini and (mini % world.size or (mini // world.size) % config.actor.micro_batch_size):
        raise ConfigError(
            f"actor.mini_batch_size={mini} must split into world size {world.size} equal shares, each a multiple "
            f"of actor.micro_batch_size={config.actor.micro_batch_size} (samples per device)"
        )
    dist.seed_everything(config.seed)
    run_dir = Path(config.trainer.output_dir) / config.name
    resume_path = resolve_resume(run_dir, resume)
    if world.is_main:
        prepare_run_dir(run_dir, config, fresh=resume_path is None)
    policy, reference = build_policy(config, world, need_reference=config.algorithm.kl_coef > 0)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    objective = flowgrpo_objective(policy, config.rollout, config.algorithm, reference)
    trainer = OnlineTrainer(config, policy, params, optimizer, scheduler, objective, world, run_dir,
                            sync=dist.synchronizer(world.device))  # fmt: skip
    return trainer.fit(resume_path)
