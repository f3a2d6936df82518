"""The host's share of one FLUX.1 training pass: a forward and backward of FLUX.1's 19 + 38 blocks at a tiny width
(LoRA on the recipes' targets, batch 2, 64 image and 32 text tokens), where the arithmetic is negligible, so the time
is the Python and dispatch work a pass costs whatever its size. On a GPU that work runs beside the kernels: hidden
behind a pass of many rows, exposed by a pass of few (BENCHMARKS.md, BranchGRPO against DanceGRPO).

    OMP_NUM_THREADS=1 python benchmarks/flux_host_cost.py VARIANT

VARIANT: plain (LoRA, eager, unsharded), fsdp (FSDP2 at world size 1), fsdp_compile (and regional compile),
fsdp_compile_ckpt (and activation checkpointing, as the FLUX recipes run). Prints ms a pass, with and without grad.
"""

import copy
import sys
import time

import torch
from diffusers import FluxTransformer2DModel

from omnialign.engine import dist, fsdp
from omnialign.models import lora, tiny
from omnialign.models.flux import LORA_TARGETS

torch.manual_seed(0)
world = dist.init()
base = FluxTransformer2DModel(**{**tiny.FLUX_TRANSFORMER, "num_layers": 19, "num_single_layers": 38})
lora.apply_lora(base, 8, 16, LORA_TARGETS, None)
n_params = sum(1 for _ in base.parameters())
b, img, txt = 2, 64, 32
x = torch.randn(b, img, 16)
enc = torch.randn(b, txt, 32)
pooled = torch.randn(b, 32)
img_ids = torch.zeros(img, 3)
txt_ids = torch.zeros(txt, 3)
t = torch.rand(b)
g = torch.full((b,), 3.5)


def call(net):
    return net(hidden_states=x, timestep=t, guidance=g, pooled_projections=pooled, encoder_hidden_states=enc,
               txt_ids=txt_ids, img_ids=img_ids, return_dict=False)[0]  # fmt: skip


def passes(net, n):
    for _ in range(n):
        call(net).float().square().mean().backward()


def forward_only(net, n):
    with torch.no_grad():
        for _ in range(n):
            call(net)


variant = sys.argv[1]
net = copy.deepcopy(base)
if variant != "plain":
    blocks = [*net.transformer_blocks, *net.single_transformer_blocks]
    fsdp.shard(
        net,
        blocks,
        fsdp.mesh(world),
        torch.float32,
        activation_checkpointing="ckpt" in variant,
        compile="compile" in variant,
    )
passes(net, 2)
forward_only(net, 2)  # warm (compile)
n = 8
s = time.perf_counter()
passes(net, n)
train = (time.perf_counter() - s) / n
s = time.perf_counter()
forward_only(net, n)
fwd = (time.perf_counter() - s) / n
print(f"{variant}: params {n_params}, fwd+bwd {train * 1e3:.0f} ms, no-grad fwd {fwd * 1e3:.0f} ms", flush=True)
