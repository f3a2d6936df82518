"""FSDP2 applied from outside: `fully_shard` per block, then the root; mixed precision, activation
checkpointing and CPU offload. World size 1 takes the same path with a mesh of one device, where FSDP leaves the
frozen weights in the compute dtype alone (`shard`).
"""

import torch
from diffusers.models.attention import AttentionModuleMixin
from torch import nn
from torch._inductor import config as inductor_config
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._pytree import tree_map_only
from torch.utils.checkpoint import checkpoint

from omnialign.engine.dist import World


def mesh(world: World) -> DeviceMesh:
    return init_device_mesh(world.device.type, (world.size,), mesh_dim_names=("dp",))


def checkpoint_activations(block: nn.Module) -> None:
    """Recompute the block's activations in backward instead of storing them (names unchanged)."""
    forward = block.forward

    def checkpointed(*args, **kwargs):
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    block.forward = checkpointed


# graphs a compiled block may hold (one per batch shape, grad mode and input layout) before dynamo runs it eagerly; its
# default 8 ran BranchGRPO's FLUX.1 training steps eagerly (the rollout's chunks of 1, 2, 4, 8 and 16 tree nodes,
# with and without grad, used them up): 0.200 images/GPU/s at MFU 0.161 on one H200
RECOMPILE_LIMIT = 64


def compile_forward(block: nn.Module) -> None:
    """Compile the block's computation alone; FSDP hooks and checkpointing stay outside the graph. Inductor keeps
    eager's bf16 roundings between fused ops (`emulate_precision_casts`, for the whole process): without them the
    rollout's no-grad graph and the update's graph fuse differently and round differently, and the replayed
    log-probs drift from the recorded ones (engine.fp8's row scaling of a fused bf16 input: first ratio 0.99986 on
    an H200; on the CPU even bf16). Inductor's CPU code honours it from torch 2.13 on; on 2.11 the CPU replay
    drifts. On CUDA, inductor also times each reduction kernel's block sizes and keeps the fastest; the rollout's
    LayerNorm kernel and the update's are different kernels, so they summed rows in different orders (a FLUX.1-wide
    block: 2,005 of 9.4M outputs apart in bf16). Its reduction-config filter picks the block size by rule instead
    (a test config in torch 2.11-2.13; FLUX.1's fp8 step gained or lost nothing measurable, docs/engine.md)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    inductor_config.emulate_precision_casts = True
    inductor_config.test_configs.force_filter_reduction_configs = True
    block.forward = torch.compile(block.forward, dynamic=False)


NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def without_cudnn_attention(block: nn.Module) -> None:
    """Keep cuDNN's kernel out of the block's scaled_dot_product_attention (`engine.cudnn_attention=false`): a context
    around its forward (and so around its recomputation under activation checkpointing; the backward follows the
    forward's kernel), nothing process-wide, so other models and later runs in the process are unaffected."""
    forward = block.forward

    def restricted(*args, **kwargs):
        with sdpa_kernel(NO_CUDNN):
            return forward(*args, **kwargs)

    block.forward = restricted


class _DenseGrad(torch.autograd.Function):
    """The identity, whose backward hands on its gradient made contiguous."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous()


def dense_attention_grads(block: nn.Module) -> None:
    """Hand each diffusers attention module in the block a contiguous gradient of its output. FLUX's single blocks
    concatenate the attention output with the MLP's along features, so the gradient reaching the attention kernel is a
    slice with a row stride wider than the row, and PyTorch passes such a gradient to cuDNN as it is (it copies only
    one whose innermost stride is not 1). FLUX.1's update failed in cuDNN's backward without these hooks (torch 2.11,
    cuDNN 9.19, H100 and H200: an illegal memory access compiled, "mha_graph.execute(...).is_good()" eager) and trains
    with them; the kernel alone with such a gradient at batch 8 did not fail (benchmarks/attention_kernels.py's
    `padded` case), so the condition is narrower than the stride alone. A contiguous gradient passes unchanged."""
    for module in block.modules():
        if isinstance(module, AttentionModuleMixin):
            module.register_forward_hook(lambda m, args, out: tree_map_only(torch.Tensor, _DenseGrad.apply, out))


def written_as(source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """`source` as an in-place write into `target` takes it: a trained parameter's local tensor (over one rank the
    whole of it) where `target` is a frozen weight that `shard` left to its module, else `source` itself."""
    return source.to_local() if isinstance(source, DTensor) and not isinstance(target, DTensor) else source


def shard(
    module: nn.Module,
    blocks: list[nn.Module],
    device_mesh: DeviceMesh,
    param_dtype: torch.dtype,
    activation_checkpointing: bool = False,
    cpu_offload: bool = False,
    reshard_after_forward: bool = True,
    compile: bool = False,
    cudnn_attention: bool = True,
    checkpoint_every: int = 1,
) -> nn.Module:
    """Shard `module` in place: each of `blocks` is one FSDP unit, the rest of `module` the root unit.

    Parameters keep their stored dtype (fp32 master weights for trained ones); compute runs in
    `param_dtype` and gradients are reduced in fp32. Inputs are not cast: the network sees the dtypes its caller
    passes (the adapters pass what their pipelines do: latents in the compute dtype, SD3's and Wan's timestep in
    fp32) and its blocks what it computes (the rotary tables of FLUX and LTX-2 in fp32), so a sharded network
    computes as the model loaded in `param_dtype` does (tests/test_mixed_precision.py). With `cpu_offload`,
    sharded parameters, gradients and optimizer states live in host memory; otherwise they move to the mesh's device.
    With `compile`, each block's forward is compiled (regional compilation). Without `cudnn_attention`, the blocks'
    attention never runs cuDNN's kernel (`without_cudnn_attention`); with it, the blocks' attention modules get dense
    output gradients, which cuDNN's backward needs (`dense_attention_grads`). With `activation_checkpointing`, one
    block in `checkpoint_every` recomputes its activations in backward (blocks 0, k, 2k, ...).

    Over one rank (without `cpu_offload`) a shard is the whole parameter, and FSDP's unshard would copy it before
    every forward and backward of its unit (torch's world-size-1 path allocates and copies): the frozen parameters
    already in `param_dtype`, which that copy would not change, stay the module's own tensors on the device instead,
    unmanaged. The trained ones (float32 master weights, cast to `param_dtype`, gradients reduced in float32) and
    frozen ones stored in another dtype (cast as before) stay FSDP's. The computation is the same, bit for bit.
    """
    mixed = MixedPrecisionPolicy(
        param_dtype=None if param_dtype == torch.float32 else param_dtype,
        reduce_dtype=torch.float32,
        cast_forward_inputs=False,
    )
    offload = CPUOffloadPolicy(pin_memory=device_mesh.device_type == "cuda") if cpu_offload else OffloadPolicy()
    ignored = set()
    if device_mesh.size() == 1 and not cpu_offload:
        module.to(device_mesh.device_type)  # FSDP moves only what it manages
        ignored = {p for p in module.parameters() if not p.requires_grad and p.dtype == param_dtype}
    for i, block in enumerate(blocks):
        if compile:
            compile_forward(block)
        if cudnn_attention:
            dense_attention_grads(block)
        else:
            without_cudnn_attention(block)
        if activation_checkpointing and i % checkpoint_every == 0:
            checkpoint_activations(block)
        fully_shard(block, mesh=device_mesh, mp_policy=mixed, offload_policy=offload,
                    reshard_after_forward=reshard_after_forward, ignored_params=ignored)  # fmt: skip
    fully_shard(module, mesh=device_mesh, mp_policy=mixed, offload_policy=offload,
                reshard_after_forward=reshard_after_forward, ignored_params=ignored)  # fmt: skip
    return module
