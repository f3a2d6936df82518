"""An experiment for issue 32's goal 3 (decoding at half the bandwidth bound): the decode step's attention as one
Triton kernel in place of SDPA's masked memory-efficient kernel, run through omnialign's CLI.

The compiled step spends 3.05 ms a step in attention at batch 128 on an H200, against the 1.3 ms its keys and values
take at 4.8 TB/s (BENCHMARKS.md, "Language decoding"); FlexAttention was seven times slower, inductor's own products
and sums twice. `triton_attention` runs one program per (row, key/value head): the G query heads sharing that
key/value head are its query rows (padded to 16 for the tensor cores), and it streams the row's keys and values once
in blocks of BLOCK slots (autotuned with the warps and pipeline stages, per cache length) with an online softmax in
float32 (scores, running maximum and sum, the output), the
probabilities cast to the values' dtype for their product, as flash attention does. A masked slot scores -inf; a
block of nothing but masked slots leaves the running state as it was (the running maximum starts finite).

Side by side, one call:

    python -m omnialign bench decode --model-size 8b --prompts 128 --prompt-len 256 --max-new-tokens 128 \
        --decoders compiled graph --out A.json
    python benchmarks/decode_triton.py bench decode --model-size 8b --prompts 128 --prompt-len 256 \
        --max-new-tokens 128 --decoders compiled graph --out B.json

On a CPU the kernel runs in Triton's interpreter (TRITON_INTERPRET=1 before this module is loaded), for the tests.
"""

import os
import sys

import torch
import triton
import triton.language as tl

from omnialign.rollout import decode

ROWS = 16  # query rows of a program's tile: tl.dot's least


@triton.jit
def _attention(q, k, v, visible, out, scale, length, stride_qb, stride_qh, stride_qg, stride_kb, stride_kh,
               stride_kl, stride_vb, stride_vh, stride_vl, stride_mb, stride_ml, stride_ob, stride_oh, stride_og,
               G: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr,
               IEEE: tl.constexpr):  # fmt: skip
    row, head = tl.program_id(0), tl.program_id(1)
    g, d = tl.arange(0, ROWS), tl.arange(0, D)
    query = tl.load(q + row * stride_qb + head * stride_qh + g[:, None] * stride_qg + d[None, :],
                    mask=g[:, None] < G, other=0.0)  # fmt: skip
    top = tl.full([ROWS], -1e30, tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for start in range(0, length, BLOCK):
        n = start + tl.arange(0, BLOCK)
        inside = n < length
        seen = tl.load(visible + row * stride_mb + n * stride_ml, mask=inside, other=0) != 0
        keys = tl.load(k + row * stride_kb + head * stride_kh + n[:, None] * stride_kl + d[None, :],
                       mask=inside[:, None], other=0.0)  # fmt: skip
        if IEEE:  # float32 operands multiplied as float32, not TF32 (the tiny twins' tests)
            scores = tl.dot(query, tl.trans(keys), input_precision="ieee")
        else:
            scores = tl.dot(query, tl.trans(keys))
        scores = (scores * scale).to(tl.float32)  # under torch.compile the scale arrives as a float64
        scores = tl.where(seen[None, :], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        probs = tl.exp(scores - new_top[:, None])
        fade = tl.exp(top - new_top)
        total = total * fade + tl.sum(probs, 1)
        values = tl.load(v + row * stride_vb + head * stride_vh + n[:, None] * stride_vl + d[None, :],
                         mask=inside[:, None], other=0.0)  # fmt: skip
        if IEEE:
            acc = acc * fade[:, None] + tl.dot(probs, values, input_precision="ieee")
        else:
            acc = acc * fade[:, None] + tl.dot(probs.to(values.dtype), values)
        top = new_top
    tl.store(out + row * stride_ob + head * stride_oh + g[:, None] * stride_og + d[None, :],
             (acc / total[:, None]).to(out.dtype.element_ty), mask=g[:, None] < G)  # fmt: skip


CONFIGS = [triton.Config({"BLOCK": block}, num_warps=warps, num_stages=stages)
           for block in (32, 64, 128) for warps in (4, 8) for stages in (2, 3)]  # fmt: skip
tuned = triton.autotune(CONFIGS, key=["length", "D"])(_attention)
"""The kernel autotuned (on a GPU; the interpreter cannot time configurations, and runs BLOCK=64)."""
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@torch.library.custom_op("omnialign::triton_decode_attention", mutates_args=())
def triton_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                     scale: float) -> torch.Tensor:  # fmt: skip
    """`decode.decode_attention` as one Triton kernel: q (B, KV, G, D), k/v (B, KV, L, D) (the last dimension
    contiguous), visible (B, 1, 1, L) bool -> (B, KV, G, D) in q's dtype.

    An operator of its own, opaque to torch.compile, so that the compiled step launches the kernel as the eager one
    does: traced as a user-defined kernel, inductor's copy of it gave float32 log-probs 0.028 away from SDPA's on an
    H100, where the eager launch is within 1e-5."""
    batch, heads, groups, dim = q.shape
    out = torch.empty_like(q)
    args = (q, k, v, visible, out, scale, k.shape[2], q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1),
            k.stride(2), v.stride(0), v.stride(1), v.stride(2), visible.stride(0), visible.stride(3), out.stride(0),
            out.stride(1), out.stride(2))  # fmt: skip
    shapes = dict(G=groups, D=dim, ROWS=max(ROWS, triton.next_power_of_2(groups)), IEEE=q.dtype == torch.float32)
    if INTERPRETED:
        _attention[(batch, heads)](*args, **shapes, BLOCK=64)
    else:
        tuned[(batch, heads)](*args, **shapes)
    return out


@triton_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:
    return torch.empty_like(q)


def check(device: str, dtype: torch.dtype, atol: float) -> None:
    """`triton_attention` against `decode.decode_attention` (SDPA) on views of a larger cache like the decoder's: 150
    slots in three blocks, one row left-padded past its first block, one with random holes, one seeing everything.
    AssertionError where they differ by more than atol."""
    g = torch.Generator().manual_seed(0)
    batch, heads, groups, dim, length = 3, 2, 4, 128, 150
    q = torch.randn(batch, heads, groups, dim, generator=g).to(device, dtype)
    k, v = (torch.randn(batch, heads, length + 7, dim, generator=g).to(device, dtype)[:, :, :length] for _ in "kv")
    seen = torch.ones(batch, length + 7, dtype=torch.bool)
    seen[0, :70] = False
    seen[1] = torch.rand(length + 7, generator=g) < 0.5
    seen[1, length - 1] = True
    visible = seen.to(device)[:, None, None, :length]
    expected = decode.decode_attention(q.float(), k.float(), v.float(), visible, dim**-0.5)
    out = triton_attention(q, k, v, visible, dim**-0.5)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), expected, atol=atol, rtol=0)
    unmasked = triton_attention(q, k, v, visible | True, dim**-0.5).float()
    assert not torch.allclose(unmasked, expected, atol=0.1)  # the mask counts


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:  # TRITON_INTERPRET=1 python benchmarks/decode_triton.py --check (a CPU)
        check("cuda" if torch.cuda.is_available() else "cpu", torch.float32, 1e-5)
        print("triton_attention equals SDPA")
    else:
        decode.decode_attention = triton_attention
        from omnialign.cli import main

        main(sys.argv[1:])
        print("autotuned:", tuned.best_config)
