"""Seconds each `decode.generate(compiled=True)` call takes on a tiny random Qwen3 with many layers: the first pays
the compilation, later ones of other batch sizes and cache lengths should not (batch 1 compiles once more).

    python benchmarks/decode_compile_time.py LAYERS [plain|lora|lora_fsdp] [float32|bfloat16]

lora: LoRA on the attention projections (merged for generation); lora_fsdp: and sharded with FSDP2 at world size 1,
as the trainers run it. Used to find why Qwen3-8B's compiled GSPO rollout did not finish compiling (BENCHMARKS.md,
"Merged adapters in the GSPO rollout").
"""

import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from omnialign.engine import dist
from omnialign.engine.fsdp import mesh, shard
from omnialign.models import lora
from omnialign.models.qwen3 import ATTENTION
from omnialign.models.tiny import qwen3_sizes
from omnialign.rollout import decode

layers, mode = int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "lora_fsdp"
dtype = getattr(torch, sys.argv[3] if len(sys.argv) > 3 else "float32")
torch.manual_seed(0)
net = Qwen3ForCausalLM(Qwen3Config(**qwen3_sizes(32, layers), pad_token_id=0, eos_token_id=1)).to(dtype)
if mode != "plain":
    lora.apply_lora(net, 4, 4, ATTENTION)
if mode == "lora_fsdp":
    shard(net, list(net.model.layers), mesh(dist.init()), dtype, activation_checkpointing=True)
for batch, width, new in [(4, 8, 6), (6, 11, 9), (3, 5, 12), (1, 7, 5)]:
    ids = torch.randint(2, 500, (batch, width))
    start = time.time()
    decode.generate(net, ids, torch.ones_like(ids), [1], 0, new, compiled=True)
    print(f"{mode} layers={layers} batch={batch} width={width} new={new}: {time.time() - start:.2f} s", flush=True)
