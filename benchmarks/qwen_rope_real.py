"""Qwen-Image's rotary embedding in real arithmetic, an experiment for issue 32's goal 1. diffusers' Qwen-Image
attention applies the rotary embedding as a complex multiply (`apply_rotary_emb_qwen(..., use_real=False)`), which
inductor leaves to an eager kernel inside each compiled block (0.50 s of a 19.4 s step on an H200, BENCHMARKS.md,
twenty-third session). This runs omnialign's CLI with that function replaced by the same product in real float32
arithmetic, which inductor can fuse with the query and key norms before it. Side by side with the plain CLI:

    benchmarks/speed_gpu.sh OUT qwen_rope        # the recipe's bench, plain then with this patch
    python benchmarks/qwen_rope_real.py bench recipe --recipe qwen_image_ocr_flowgrpo_lora --prompts 4 --steps 2
"""

import sys

import diffusers.models.transformers.transformer_qwenimage as qwen_image
import torch

complex_rotary = qwen_image.apply_rotary_emb_qwen


def real_rotary(
    x: torch.Tensor, freqs_cis: torch.Tensor, use_real: bool = True, use_real_unbind_dim: int = -1
) -> torch.Tensor:
    """x (B, S, H, D) rotated by freqs_cis (S, D/2) complex, as (a + ib)(c + is) over x's consecutive pairs."""
    if use_real:
        return complex_rotary(x, freqs_cis, use_real, use_real_unbind_dim)
    a, b = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    c, s = torch.view_as_real(freqs_cis).unsqueeze(1).unbind(-1)
    return torch.stack([a * c - b * s, a * s + b * c], -1).flatten(3).type_as(x)


if __name__ == "__main__":
    qwen_image.apply_rotary_emb_qwen = real_rotary
    from omnialign.cli import main

    main(sys.argv[1:])
