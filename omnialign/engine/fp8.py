"""FP8 matmuls for the frozen linear layers of a LoRA run (`engine.fp8`), applied from outside like sharding.

Each frozen `nn.Linear` in the network's blocks (the base layer under each LoRA adapter, and the layers no adapter
targets) becomes a `Float8Linear`: its weight stored once in float8 e4m3 with one scale per output channel, its
input scaled per row to float8 at each call, the product in `torch._scaled_mm` (fp32 accumulation, bf16 out). The
rollout, the old-policy and reference passes and the training forward all run these kernels, so the log-probs the
rollout records are the ones the update replays, as in bf16. The policy trained is the base model with its weights
rounded to float8 (as QLoRA trains over a 4-bit base), plus the bf16 adapters. The backward gives the input's
gradient through the dequantized weight in the input's dtype; the rounding of the input to float8 passes the
gradient straight through. With `engine.fp8_backward` that product runs in float8 too: the output's gradient, the
weight's per-channel scale folded in, scaled per row to float8 against the same float8 weight (its transpose laid
out for `torch._scaled_mm`, a copy of one byte a parameter per layer while it runs). The float8 weights are buffers
outside every checkpoint (they are the base model's, re-rounded at each load); the LoRA parameters stay as they are,
so checkpoints and exported adapters are unchanged.
"""

import torch
from torch import nn

E4M3_MAX = torch.finfo(torch.float8_e4m3fn).max  # 448


def to_float8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(x / scale in float8 e4m3, scale): one float32 scale per row (the last dimension), its largest magnitude
    mapped to 448; an all-zero row gets scale 1."""
    x = x.float()
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, 1.0)
    return (x / scale).to(torch.float8_e4m3fn), scale


def float8_mm(a: torch.Tensor, b8: torch.Tensor, b_scale: torch.Tensor) -> torch.Tensor:
    """a (M, K) scaled per row to float8 times b8 (K, N) float8 (column-major on CUDA) whose columns carry b_scale
    (1, N) float32 -> (M, N) bf16, accumulated in fp32."""
    a8, a_scale = to_float8(a)
    if a.is_cuda:
        return torch._scaled_mm(a8, b8, scale_a=a_scale, scale_b=b_scale, out_dtype=torch.bfloat16)
    # torch 2.11's CPU _scaled_mm takes per-tensor scales only: the same product of the rounded operands, in fp32
    return ((a8.float() @ b8.float()) * a_scale * b_scale).to(torch.bfloat16)


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, float8_grad: bool) -> torch.Tensor:
        """x (M, K) bf16 or fp32, weight (N, K) float8, weight_scale (1, N) float32 -> (M, N) bf16."""
        return float8_mm(x, weight.t(), weight_scale)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, weight, weight_scale, float8_grad = inputs
        ctx.save_for_backward(weight, weight_scale)
        ctx.x_dtype, ctx.float8_grad = x.dtype, float8_grad

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        weight, weight_scale = ctx.saved_tensors
        dtype = ctx.x_dtype
        grad = grad.float() * weight_scale  # the weight's scale per output channel, on the gradient's columns
        if ctx.float8_grad:  # weight (N, K) laid out column-major: its transpose's copy, seen transposed
            ones = weight_scale.new_ones(1, weight.shape[1])
            return float8_mm(grad, weight.t().contiguous().t(), ones).to(dtype), None, None, None
        return grad.to(dtype) @ weight.to(dtype), None, None, None


class Float8Linear(nn.Module):
    """A frozen linear layer computing in float8 (see the module doc); `bias` stays the layer's own parameter."""

    def __init__(self, linear: nn.Linear, float8_grad: bool = False) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.float8_grad = float8_grad  # the input's gradient in float8 too (engine.fp8_backward)
        weight, scale = to_float8(linear.weight.detach())
        self.register_buffer("weight8", weight, persistent=False)
        self.register_buffer("weight_scale", scale.t().contiguous(), persistent=False)  # (1, out_features)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _Float8Matmul.apply(x.reshape(-1, self.in_features), self.weight8, self.weight_scale, self.float8_grad)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"float8_grad={self.float8_grad}")  # fmt: skip


def float8_frozen_linears(
    blocks: list[nn.Module], device: torch.device | None = None, float8_grad: bool = False
) -> int:
    """Replace every frozen `nn.Linear` in `blocks` outside the LoRA adapters whose two sizes are multiples of 16
    (what `torch._scaled_mm` takes) by a `Float8Linear` on `device` (rounded there, one layer at a time; its input's
    gradient in float8 with `float8_grad`), in place; returns how many. Before sharding."""
    if device is not None and device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        raise ValueError(
            f"engine.fp8=true needs FP8 matmuls (CUDA compute capability 8.9 or later: Ada, Hopper, Blackwell); "
            f"{torch.cuda.get_device_name(device)} has {torch.cuda.get_device_capability(device)}: set engine.fp8=false"
        )
    count = 0
    for block in blocks:
        for path, parent in list(block.named_modules()):
            if "lora_" in path:  # peft's lora_A / lora_B dicts: a frozen `old` or `reference` adapter stays as it is
                continue
            for name, child in list(parent.named_children()):
                if (
                    type(child) is nn.Linear
                    and not child.weight.requires_grad
                    and child.in_features % 16 == 0
                    and child.out_features % 16 == 0
                ):
                    setattr(parent, name, Float8Linear(child.to(device), float8_grad))
                    count += 1
    return count
