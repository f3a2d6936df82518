"""Sequence parallelism (Ulysses) applied from outside: diffusers' own context-parallel hooks split each sample's
tokens over the processes of a group, and attention exchanges sequence shards for head shards with one all-to-all
(and back), so each process runs attention over the whole sequence for its share of the heads.

The split follows the transformer's `_cp_plan` (diffusers ships one for Wan, Qwen-Image, FLUX and others); its
output is gathered again, so the network's callers see whole tensors. `ModelMixin.enable_parallelism` does the same
but cannot run on the CPU (diffusers 0.42 picks the device as `rank % torch.accelerator.device_count()`, a division
by zero without an accelerator), so `split_sequence` sets up the same configuration itself: one code path for
gloo on CPUs and NCCL on GPUs.

Gradients: every process of a group computes the same loss from the gathered output and backpropagates its own
token shard, so a parameter's gradient is the sum over the group of the processes' gradients (an average over the
group, as FSDP2 reduces, is that sum divided by the group size).
"""

import torch
from diffusers import ContextParallelConfig, ModelMixin
from diffusers.hooks.context_parallel import apply_context_parallel
from diffusers.models._modeling_parallel import ParallelConfig
from diffusers.models.attention import AttentionModuleMixin
from diffusers.models.attention_processor import Attention, MochiAttention
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from omnialign.engine.dist import World


def mesh(world: World, degree: int) -> DeviceMesh:
    """The (dp, ring, ulysses) mesh of `world.size // degree` groups of `degree` consecutive ranks each; the ranks
    of a group hold the same samples and split their tokens."""
    if degree < 1 or world.size % degree:
        raise ValueError(
            f"a sequence-parallel group of {degree} must be a positive divisor of the number of processes "
            f"({world.size}): start a multiple of {degree} processes (torchrun --nproc-per-node) or pick a divisor "
            f"of {world.size}"
        )
    shape, names = (world.size // degree, 1, degree), ("dp", "ring", "ulysses")
    return init_device_mesh(world.device.type, shape, mesh_dim_names=names)


def split_sequence(network: ModelMixin, device_mesh: DeviceMesh) -> None:
    """Split `network`'s tokens over the mesh's "ulysses" dimension (Ulysses attention, in place).

    The network's attention runs on PyTorch's SDPA (diffusers' "native" backend). Its number of attention heads
    and the token count of every input the plan splits must be multiples of the group size (diffusers checks the
    latter at the first forward).
    """
    degree, heads = device_mesh["ulysses"].size(), network.config.num_attention_heads
    if heads % degree:
        raise ValueError(
            f"a sequence-parallel group of {degree} must divide the network's {heads} attention heads (Ulysses gives "
            "each process a share of the heads): pick a divisor of the head count"
        )
    network.set_attention_backend("native")
    context = ContextParallelConfig(ulysses_degree=degree, mesh=device_mesh)
    config = ParallelConfig(context_parallel_config=context)
    config.setup(device_mesh.get_rank(), device_mesh.size(), torch.device(device_mesh.device_type), mesh=device_mesh)
    network._parallel_config = config
    for module in network.modules():
        if isinstance(module, (Attention, MochiAttention, AttentionModuleMixin)):  # as enable_parallelism finds them
            module.processor._parallel_config = config
    apply_context_parallel(network, context, network._cp_plan)
