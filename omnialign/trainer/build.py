"""Build the policy a diffusion trainer trains: load, LoRA, reference/old/teacher contexts, shard.

Order matters: load on the host, add LoRA, make the frozen copies (and take the policy's frozen `transformer_2`),
round the frozen linear layers to float8 (engine.fp8), split their tokens (engine.sequence_parallel), shard (which
places the networks on the device), then move the frozen encoders and decoder.
"""

import copy
import dataclasses

import torch
from torch import nn

from omnialign.config import Config
from omnialign.engine import dist, fp8, fsdp, sequence
from omnialign.models import LOADERS, lora
from omnialign.models.base import DiffusionPolicy
from omnialign.models.reference import Context, Reference, swapped_network


def frozen_copy(net: nn.Module, blocks: list[nn.Module], config: Config, world: dist.World) -> nn.Module:
    """A frozen, sharded copy of a network (the reference of full fine-tuning, or a teacher)."""
    return shard_frozen(copy.deepcopy(net), net, blocks, config, world)


def shard_frozen(frozen: nn.Module, like: nn.Module, blocks: list[nn.Module], config: Config, world: dist.World):
    """Freeze and shard a network of the same architecture as `like`, per its blocks named as `blocks` in `like`."""
    names = {id(m): name for name, m in like.named_modules()}
    frozen.requires_grad_(False).eval()
    split_sequence(frozen, config, world)
    fsdp.shard(frozen, [frozen.get_submodule(names[id(b)]) for b in blocks], fsdp.mesh(world),
               getattr(torch, config.model.dtype), False, config.engine.cpu_offload,
               compile=config.engine.compile, cudnn_attention=config.engine.cudnn_attention)  # fmt: skip
    return frozen


def split_sequence(net: nn.Module, config: Config, world: dist.World) -> None:
    """With engine.sequence_parallel=N > 1, split each sample's tokens of `net` over groups of N consecutive ranks
    (engine/sequence.py; checks that N divides the process count and the attention heads). Before sharding."""
    n = config.engine.sequence_parallel
    if n == 1:
        return
    if net._cp_plan is None:
        raise ValueError(
            f"engine.sequence_parallel={n}: model.arch={config.model.arch}'s network ({type(net).__name__}) has no "
            "context-parallel plan (diffusers' _cp_plan), so its tokens cannot be split: set "
            "engine.sequence_parallel=1, or train an architecture that has one (wan, qwen_image, flux)"
        )
    sequence.split_sequence(net, sequence.mesh(world, n))


def build_policy(
    config: Config, world: dist.World, policy: DiffusionPolicy | None = None
) -> tuple[DiffusionPolicy, dict[str, Context]]:
    """The sharded policy on its device and the contexts its algorithm computes under: `reference`
    (adapters off, or a frozen copy), `old` (the second LoRA adapter) and `teacher`. `policy`
    defaults to loading `config.model` (a benchmark passes one built in memory)."""
    a, spec = config.algorithm, config.model.lora
    policy = policy or LOADERS[config.model.arch](config.model)
    net, blocks, contexts, frozen = policy.transformer, policy.blocks(), {}, None
    need_reference = (
        a.kl_coef > 0 or (a.name == "nft" and a.nft_kappa > 0) or a.name in ("dgpo", "online_dpo", "diffusion_dpo")
    )
    if spec.rank > 0:
        lora_config = lora.apply_lora(net, spec.rank, spec.alpha or spec.rank, spec.targets or policy.lora_targets,
                                      spec.exclude)  # fmt: skip
        contexts["reference"] = lambda: lora.adapters_disabled(net)
        if a.ref_update_every:  # a reference that changes: a second adapter, refreshed from `default`
            lora.add_adapter(net, "reference", lora_config)
            contexts["reference"] = lambda: lora.use_adapter(net, "reference")
        if a.name == "nft":
            lora.add_adapter(net, "old", lora_config)
            contexts["old"] = lambda: lora.use_adapter(net, "old")
    else:
        net.requires_grad_(True).float()  # fp32 master weights; compute runs in model.dtype (FSDP mixed precision)
        if need_reference:
            frozen = frozen_copy(net, blocks, config, world)
            contexts["reference"] = swapped_network(policy, frozen)
    if a.teacher_path:
        teacher = LOADERS[config.model.arch](dataclasses.replace(config.model, path=a.teacher_path)).transformer
        contexts["teacher"] = swapped_network(policy, shard_frozen(teacher.float(), net, blocks, config, world))
    if policy.transformer_2 is not None:  # Wan 2.2's low-noise expert: split and sharded like the reference copy
        shard_frozen(policy.transformer_2, net, blocks, config, world)
    e = config.engine
    if e.fp8:
        fp8.float8_frozen_linears(blocks, world.device, e.fp8_backward)
    split_sequence(net, config, world)
    fsdp.shard(net, blocks, fsdp.mesh(world), getattr(torch, config.model.dtype), e.activation_checkpointing,
               e.cpu_offload, e.reshard_after_forward, e.compile, e.cudnn_attention, e.checkpoint_every)  # fmt: skip
    policy = policy.to(world.device)
    if a.ref_update_every:  # after sharding, which replaces the parameters
        contexts["reference"] = Reference(contexts["reference"], reference_copies(net, frozen))
    return policy, contexts


def reference_copies(net: nn.Module, frozen: nn.Module | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Each tensor of a reference that changes, by name, with the trained tensor a refresh copies into it: the
    frozen copy's parameters from the network's (full fine-tuning), or the `reference` adapter's from `default`."""
    trained = dict(net.named_parameters())
    if frozen is not None:
        return {name: (p, trained[name]) for name, p in frozen.named_parameters()}
    return {name: (p, trained[name.replace(".reference.", ".default.")])
            for name, p in trained.items() if ".reference." in name}  # fmt: skip
