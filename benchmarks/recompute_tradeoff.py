"""Recompute or keep: a few full-width transformer blocks trained as the engine trains them (LoRA r64 on the model's
targets computed in bf16, `engine.fp8`'s float8 frozen linears, each block compiled, cuDNN's attention with dense
output gradients), their forward with grad and backward at several micro-batches, each block's activations recomputed
in backward (`engine.activation_checkpointing`) or kept. Prints, per row, milliseconds per sample and the bytes a
block keeps per sample for its backward: the two sides of choosing `engine.checkpoint_every` and the actor's
micro-batch (a kept block saves its share of the recompute and costs its bytes times the micro-batch).

    python benchmarks/recompute_tradeoff.py flux 32x32 128 4 8 16       # FLUX.1 at 512x512, 128 text tokens
    python benchmarks/recompute_tradeoff.py flux 32x64 128 2 4 8        # Kontext: the source's tokens too
    python benchmarks/recompute_tradeoff.py qwen_image 32x32 128 3 6 12
    python benchmarks/recompute_tradeoff.py wan 21x30x52 512 1 2        # Wan 2.1 1.3B, 832x480, 81 frames
    python benchmarks/recompute_tradeoff.py flux 4x4 8 2 --tiny         # narrow blocks on the CPU: checks the script

Arguments: the model, its token grid (image: rows x columns; Wan: latent frames x rows x columns after the patch),
text tokens, micro-batches. FLUX.1 runs 2 double- and 2 single-stream blocks, Qwen-Image and Wan 2.1 1.3B 4 of their
blocks; the rest of the network (embeddings, output layer) is the released one's and runs too.
"""

import json
import math
import sys
import time

import torch
from diffusers import FluxTransformer2DModel, QwenImageTransformer2DModel, WanTransformer3DModel

from omnialign.bench.models import FLUX, QWEN_IMAGE, WAN
from omnialign.engine import fp8, fsdp
from omnialign.models import flux, qwen_image, wan
from omnialign.models.lora import apply_lora

BLOCKS = 4


def build(arch: str, tiny: bool) -> tuple[torch.nn.Module, list[torch.nn.Module]]:
    """The network with BLOCKS blocks at the released width (`tiny`: 2 heads of 16), LoRA r64 applied, and its
    blocks."""
    narrow = dict(num_attention_heads=2, attention_head_dim=16, axes_dims_rope=(4, 6, 6)) if tiny else {}
    if arch == "flux":
        net = FluxTransformer2DModel(**{**FLUX, "num_layers": BLOCKS // 2, "num_single_layers": BLOCKS // 2, **narrow})
        blocks = [*net.transformer_blocks, *net.single_transformer_blocks]
        targets = flux.LORA_TARGETS
    elif arch == "qwen_image":
        net = QwenImageTransformer2DModel(**{**QWEN_IMAGE, "num_layers": BLOCKS, **narrow})
        blocks, targets = list(net.transformer_blocks), qwen_image.LORA_TARGETS
    else:
        narrow = dict(num_attention_heads=2, attention_head_dim=16, ffn_dim=64) if tiny else {}
        net = WanTransformer3DModel(**{**WAN["Wan2.1-T2V-1.3B-Diffusers"], "num_layers": BLOCKS, **narrow})
        blocks, targets = list(net.blocks), wan.LORA_TARGETS
    apply_lora(net, 64, 128, targets)
    for p in net.parameters():  # FSDP computes the fp32 master weights in bf16
        p.data = p.data.to(torch.bfloat16)
    return net, blocks


def inputs(net: torch.nn.Module, arch: str, batch: int, grid: list[int], text: int, device: torch.device) -> dict:
    """Random inputs of one micro-batch: a token grid (rows, columns; Wan: latent frames, rows, columns) and `text`
    text tokens a sample."""
    c, image = net.config, math.prod(grid)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=torch.bfloat16)

    t = torch.full((batch,), 0.5, device=device)
    if arch == "wan":  # the latents before the (1, 2, 2) patch
        frames, rows, cols = grid
        return dict(hidden_states=randn(batch, c.in_channels, frames, 2 * rows, 2 * cols), timestep=t * 1000,
                    encoder_hidden_states=randn(batch, text, c.text_dim))  # fmt: skip
    if arch == "flux":
        rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
        img_ids = torch.stack([torch.zeros(image), rows.flatten(), cols.flatten()], dim=1).float()
        return dict(hidden_states=randn(batch, image, c.in_channels), encoder_hidden_states=randn(batch, text,
                    c.joint_attention_dim), pooled_projections=randn(batch, c.pooled_projection_dim), timestep=t,
                    img_ids=img_ids.to(device), txt_ids=torch.zeros(text, 3, device=device),
                    guidance=torch.full((batch,), 3.5, device=device))  # fmt: skip
    return dict(hidden_states=randn(batch, image, c.in_channels), encoder_hidden_states=randn(batch, text,
                c.joint_attention_dim), encoder_hidden_states_mask=torch.ones(batch, text, device=device,
                dtype=torch.long), timestep=t, img_shapes=[[(1, *grid)]] * batch)  # fmt: skip


def run(net: torch.nn.Module, kwargs: dict, iters: int) -> float:
    """Milliseconds per forward with grad and backward, after one warm-up (which compiles)."""
    cuda = kwargs["hidden_states"].is_cuda
    sync = torch.cuda.synchronize if cuda else lambda: None

    def step() -> None:
        net(**kwargs, return_dict=False)[0].float().square().mean().backward()

    step()
    sync()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    sync()
    return (time.perf_counter() - start) * 1000 / iters


def kept_bytes(net: torch.nn.Module, kwargs: dict) -> int:
    """Bytes the forward with grad leaves allocated for its backward (CUDA). On the CPU (the --tiny check) the tensors
    autograd saves through these hooks: a recomputed block's own hooks take its tensors, so it counts none."""
    device = kwargs["hidden_states"].device
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = net(**kwargs, return_dict=False)[0]
        torch.cuda.synchronize()
        kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
        out.float().square().mean().backward()
        return kept
    saved = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[t.data_ptr()] = t.numel() * t.element_size()
        return t

    params = {p.data_ptr() for p in net.parameters()} | {b.data_ptr() for b in net.buffers()}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        net(**kwargs, return_dict=False)[0].float().square().mean().backward()
    return sum(v for ptr, v in saved.items() if ptr not in params)


def main(arch: str, grid: list[int], text: int, batches: list[int], tiny: bool) -> list[dict]:
    device = torch.device("cpu" if tiny else "cuda")
    torch.manual_seed(0)
    rows = []
    for recompute in (True, False):
        net, blocks = build(arch, tiny)
        fp8.float8_frozen_linears(blocks, device)
        net.to(device)
        for block in blocks:  # as engine.fsdp.shard does, without the sharding a single rank skips
            fsdp.compile_forward(block)
            fsdp.dense_attention_grads(block)
            if recompute:
                fsdp.checkpoint_activations(block)
        for batch in batches:
            kwargs = inputs(net, arch, batch, grid, text, device)
            ms = run(net, kwargs, iters=1 if tiny else 5)
            kept = kept_bytes(net, kwargs)
            row = {"arch": arch, "blocks": BLOCKS, "grid": grid, "text_tokens": text, "batch": batch,
                   "recompute": recompute, "ms_per_sample": round(ms / batch, 2),
                   "kept_mib_per_block_per_sample": round(kept / BLOCKS / batch / 2**20, 3)}  # fmt: skip
            if device.type == "cuda":
                row["peak_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
                torch.cuda.reset_peak_memory_stats()
            print(json.dumps(row), flush=True)
            rows.append(row)
        del net, blocks
        torch._dynamo.reset()
    return rows


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--tiny"]
    main(args[0], [int(n) for n in args[1].split("x")], int(args[2]), [int(b) for b in args[3:]], "--tiny" in sys.argv)
