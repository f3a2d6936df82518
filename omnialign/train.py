"""Build a run from a config and train it: `main(config)`. The command line is `omnialign train`.

Order matters: load on the host, add LoRA, make the reference, shard (which places the trained
network on the device), then move the frozen components.
"""

import copy
import dataclasses
import json
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
from torch import nn

from omnialign import rewards
from omnialign.config import LANGUAGE_ALGORITHMS, Config, ConfigError, to_dict
from omnialign.engine import checkpoint, dist, fsdp, optim
from omnialign.models import LOADERS, lora
from omnialign.models.base import DiffusionPolicy
from omnialign.models.reference import swapped_network
from omnialign.trainer import language
from omnialign.trainer.objectives import ALGORITHMS
from omnialign.trainer.online import OnlineTrainer

Context = Callable[[], AbstractContextManager]


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


def frozen_copy(net: nn.Module, blocks: list[nn.Module], config: Config, world: dist.World) -> nn.Module:
    """A frozen, sharded copy of a network (the reference of full fine-tuning, or a teacher)."""
    frozen = copy.deepcopy(net).requires_grad_(False).eval()
    names = {id(m): name for name, m in net.named_modules()}
    e = config.engine
    fsdp.shard(frozen, [frozen.get_submodule(names[id(b)]) for b in blocks], fsdp.mesh(world),
               getattr(torch, config.model.dtype), False, e.cpu_offload)  # fmt: skip
    return frozen


def build_policy(
    config: Config, world: dist.World, policy: DiffusionPolicy | None = None
) -> tuple[DiffusionPolicy, dict[str, Context]]:
    """The sharded policy on its device and the contexts its algorithm computes under: `reference`
    (adapters off, or a frozen copy), `old` (the second LoRA adapter) and `teacher`. `policy`
    defaults to loading `config.model` (a benchmark passes one built in memory)."""
    a, spec = config.algorithm, config.model.lora
    policy = policy or LOADERS[config.model.arch](config.model)
    net, blocks, contexts = policy.transformer, policy.blocks(), {}
    need_reference = a.kl_coef > 0 or (a.name == "nft" and a.nft_kappa > 0) or a.name in ("online_dpo", "diffusion_dpo")
    if spec.rank > 0:
        lora_config = lora.apply_lora(net, spec.rank, spec.alpha or spec.rank, spec.targets or policy.lora_targets)
        contexts["reference"] = lambda: lora.adapters_disabled(net)
        if a.name == "nft":
            lora.add_adapter(net, "old", lora_config)
            contexts["old"] = lambda: lora.use_adapter(net, "old")
    else:
        net.requires_grad_(True).float()  # fp32 master weights; compute runs in model.dtype (FSDP mixed precision)
        if need_reference:
            contexts["reference"] = swapped_network(policy, frozen_copy(net, blocks, config, world))
    if a.teacher_path:
        teacher = LOADERS[config.model.arch](dataclasses.replace(config.model, path=a.teacher_path)).transformer
        contexts["teacher"] = swapped_network(policy, frozen_copy(teacher.float(), teacher_blocks(policy, teacher),
                                                                  config, world))  # fmt: skip
    e = config.engine
    fsdp.shard(net, blocks, fsdp.mesh(world), getattr(torch, config.model.dtype), e.activation_checkpointing,
               e.cpu_offload, e.reshard_after_forward)  # fmt: skip
    return policy.to(world.device), contexts


def teacher_blocks(policy: DiffusionPolicy, teacher: nn.Module) -> list[nn.Module]:
    """The teacher's blocks, found by the names of the student's (same architecture)."""
    names = {id(m): name for name, m in policy.transformer.named_modules()}
    return [teacher.get_submodule(names[id(b)]) for b in policy.blocks()]


def main(config: Config, resume: str | None = None) -> dict:
    """Train `config` (validated) and return the validation summary (before/after)."""
    if config.model.arch not in LOADERS:
        raise ConfigError(f"model.arch={config.model.arch!r}: choose one of {sorted(LOADERS)}")
    if config.algorithm.name not in ALGORITHMS and config.algorithm.name not in LANGUAGE_ALGORITHMS:
        raise ConfigError(
            f"algorithm.name={config.algorithm.name!r} has no trainer yet; choose one of {list(ALGORITHMS)}"
        )
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
    if config.algorithm.name in LANGUAGE_ALGORITHMS:
        return language.main(config, world, run_dir, resume_path)
    reward_worker = rewards.RewardWorker(config.reward)  # resolves every reward before the model loads
    policy, contexts = build_policy(config, world)
    params = [p for p in policy.transformer.parameters() if p.requires_grad]
    optimizer, scheduler = optim.build(params, config.actor)
    algorithm = ALGORITHMS[config.algorithm.name](
        policy, config, contexts.get("reference"), contexts.get("teacher"), contexts.get("old")
    )
    trainer = OnlineTrainer(config, policy, params, optimizer, scheduler, algorithm, world, run_dir, reward_worker,
                            sync=dist.synchronizer(world.device))  # fmt: skip
    with reward_worker:
        return trainer.fit(resume_path)
