"""Issue 32, goal 3: the decode step's products alone, at Qwen3-8B's shapes and a decode batch.

    python benchmarks/decode_products.py OUT.json [BATCH]      # a GPU; BATCH 128 by default

The fifty-seventh session's profile of one decode step (BENCHMARKS.md, "one decode step kernel by kernel") put the
products at 6.0 ms against 4.5 ms of weight bytes on an H100, cuBLAS reading the o and down weights with 64x64 tiles
(128 programs on 132 processors). This times each product three ways, each as the decoder runs it (calls captured in
a CUDA graph and replayed, `decode_splitkv.timed`) over copies of its weight in turn, each read again only after
twice the L2 cache of the others, so that no call finds its weight there (the step reads each weight once):

- `linear`: `F.linear`, as the decoder's merged step calls it (cuBLAS's own choice of kernel);
- `cublaslt`: the same with `torch.backends.cuda.preferred_blas_library("cublaslt")`;
- `split2`: the product over each half of the inputs' width, the second added into the first (`torch.addmm`): twice
  the programs, each reading half a row of the weight. Its bf16 output rounds twice, so it is a measure of what
  splitting the width buys, not a drop-in for the decoder.

Each row gives ms per call, the weight's bytes over that time and the largest difference from the float32 product.
"""

import itertools
import json
import sys

import torch
import torch.nn.functional as F
from decode_splitkv import timed  # this folder's: calls captured in a CUDA graph and replayed

SHAPES = {  # name: (output features, input features) of Qwen3-8B's products as the merged decode step has them
    "qkv": (4096 + 2 * 1024, 4096),
    "o": (4096, 4096),
    "gate_up": (2 * 12288, 4096),
    "down": (4096, 12288),
    "head": (151_936, 4096),
}


def split2(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    half = x.shape[1] // 2
    return torch.addmm(F.linear(x[:, :half], w[:, :half]), x[:, half:], w[:, half:].T)


def in_turn(fn, x: torch.Tensor, weights: list[torch.Tensor]):
    """fn(x, w) with the next copy of the weight at each call."""
    copies = itertools.cycle(weights)
    return lambda: fn(x, next(copies))


def main(out: str, batch: int) -> None:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    default = torch.backends.cuda.preferred_blas_library()
    rows = []
    for name, (n, k) in SHAPES.items():
        copies = max(2, -(-4 * l2 // (n * k * 2)))  # at least twice the L2 cache between two reads of one copy
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
        x = torch.randn(batch, k, device="cuda", dtype=torch.bfloat16)
        exact = F.linear(x.float(), weights[0].float())
        mb = n * k * 2 / 1e6
        row = {"product": name, "batch": batch, "out": n, "in": k, "weight_MB": round(mb, 1), "copies": copies}
        for variant, fn in (("linear", F.linear), ("cublaslt", F.linear), ("split2", split2)):
            torch.backends.cuda.preferred_blas_library("cublaslt" if variant == "cublaslt" else default)
            err = float((fn(x, weights[0]).float() - exact).abs().max())
            ms = timed(in_turn(fn, x, weights))
            torch.backends.cuda.preferred_blas_library(default)
            row[variant] = {"ms": round(ms, 4), "TB_s": round(mb / ms / 1e3, 2), "err": err}
        rows.append(row)
        print(json.dumps(row), flush=True)
        del weights
    with open(out, "w") as f:
        json.dump(rows, f)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 128)
