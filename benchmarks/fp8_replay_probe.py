"""Where FLUX.1's compiled fp8 replay leaves exactness (issue 32): one double-stream and one single-stream block at
FLUX.1-dev's size with the recipe's LoRA (r64, a128, B random as after an update), compiled as engine.compile does
(`compile_forward`) and run as the rollout (no grad) and as the update (with grad, then backward), in bf16 and fp8.
Prints, per block and precision, how many outputs differ between the two and by how much; whether running the
update's graph without its backward (a rollout under grad, output detached) gives the update's bits; and the
forward's milliseconds without and with grad, what such a rollout would cost. On a CUDA device:

    python benchmarks/fp8_replay_probe.py [--tokens 1024] [--text 128] [--batch 16]
"""

import argparse
from collections.abc import Callable

import torch
from diffusers.models.transformers.transformer_flux import (
    FluxPosEmbed,
    FluxSingleTransformerBlock,
    FluxTransformerBlock,
)

from omnialign.engine.fp8 import float8_frozen_linears
from omnialign.engine.fsdp import compile_forward, without_cudnn_attention
from omnialign.models.flux import LORA_TARGETS, grid_ids
from omnialign.models.lora import apply_lora


def probe(kind: str, fp8: bool, batch: int, tokens: int, text: int) -> str:
    torch.manual_seed(0)
    block = {"double": FluxTransformerBlock, "single": FluxSingleTransformerBlock}[kind](3072, 24, 128)
    block = block.to("cuda", torch.bfloat16)
    apply_lora(block, 64, 128, [t for t in LORA_TARGETS if any(n.endswith(t) for n, _ in block.named_modules())])
    for name, p in block.named_parameters():
        if "lora_" in name:  # bf16 as FSDP's param_dtype gives it; B random as after the first update
            p.data = (torch.randn_like(p) * 0.01 if "lora_B" in name else p.data).to(torch.bfloat16)
    converted = float8_frozen_linears([block], torch.device("cuda")) if fp8 else 0
    compile_forward(block)
    without_cudnn_attention(block)
    ids = torch.cat([torch.zeros(text, 3, device="cuda"), grid_ids(32, tokens // 32, 0.0, torch.device("cuda"))])
    rotary = FluxPosEmbed(10000, [16, 56, 56])(ids)
    image = torch.randn(batch, tokens, 3072, device="cuda", dtype=torch.bfloat16)
    prompt = torch.randn(batch, text, 3072, device="cuda", dtype=torch.bfloat16)
    temb = torch.randn(batch, 3072, device="cuda", dtype=torch.bfloat16)

    def forward() -> torch.Tensor:
        return torch.cat(block(image, prompt, temb, rotary), 1)

    with torch.no_grad():
        rollout = forward()
    update = forward()
    update.float().square().mean().backward()
    with torch.enable_grad():  # the update's graph, its saved activations dropped with the output's graph
        rollout_in_update_graph = forward().detach()
    differ = (rollout != update).sum().item()
    gap = (rollout.float() - update.float()).abs().max().item()
    same_graph = (rollout_in_update_graph != update).sum().item()
    ms = {mode: forward_ms(forward, mode) for mode in (torch.no_grad, torch.enable_grad)}
    precision = "fp8" if fp8 else "bf16"
    return (
        f"{kind} {precision} ({converted} fp8 linears): no-grad vs update {differ} of {rollout.numel()} differ, "
        f"max {gap:.3g}; update graph without backward vs update {same_graph} differ; forward ms no-grad "
        f"{ms[torch.no_grad]:.2f}, with grad {ms[torch.enable_grad]:.2f}"
    )


def forward_ms(forward: Callable[[], torch.Tensor], mode: type, repeats: int = 20) -> float:
    """Mean milliseconds of one forward under `mode` (torch.no_grad or torch.enable_grad, output dropped)."""
    with mode():
        forward()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            forward().detach()
        end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="image tokens (512 x 512: 1024)")
    parser.add_argument("--text", type=int, default=128, help="text tokens (the recipe's model.text_tokens)")
    parser.add_argument("--batch", type=int, default=16, help="the rollout's and the actor's micro-batch")
    args = parser.parse_args()
    for kind in ("double", "single"):
        for fp8 in (False, True):
            print(probe(kind, fp8, args.batch, args.tokens, args.text), flush=True)
            torch._dynamo.reset()


if __name__ == "__main__":
    main()
