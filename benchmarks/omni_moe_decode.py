"""Decode-step time of the Qwen3-Omni thinker's text stack per MoE experts implementation (issue 32, goal 5).

Builds the thinker with L full-size layers (random weights, bf16; on a CPU the tiny twin's dims with the released
expert count), prefills 256 tokens of a batch with `grouped_mm`, then times 10 single-token decode steps (median,
after 2 warm-up steps) with each of transformers' `grouped_mm` and `batched_mm` (which `generate` switches to for
decoding on a GPU) and the thinker's own `dense_decode` (`omnialign.models.qwen3_omni.dense_decode_experts`, every
expert on every token), at batch 32 and 128:

    python benchmarks/omni_moe_decode.py L
"""

import sys
import time

import torch
from transformers import DynamicCache, Qwen3OmniMoeThinkerConfig, Qwen3OmniMoeThinkerForConditionalGeneration

from omnialign.bench.models import QWEN3_OMNI_TEXT
from omnialign.models import qwen3_omni  # noqa: F401  (registers dense_decode)
from omnialign.models.tiny import TINY_OMNI_TEXT, byte_tokenizer, thinker_config

dev = "cuda" if torch.cuda.is_available() else "cpu"
layers = int(sys.argv[1])
tok = byte_tokenizer()
experts = {k: QWEN3_OMNI_TEXT[k] for k in ("num_experts", "num_experts_per_tok")}  # the released 128, 8 per token
text = {**(TINY_OMNI_TEXT if dev == "cpu" else QWEN3_OMNI_TEXT), **experts, "num_hidden_layers": layers,
        "pad_token_id": tok.pad_token_id, "eos_token_id": tok.eos_token_id}  # fmt: skip
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device(dev):
    net = Qwen3OmniMoeThinkerForConditionalGeneration(Qwen3OmniMoeThinkerConfig(**thinker_config(text, tok))).eval()


def sync() -> None:
    if dev == "cuda":
        torch.cuda.synchronize()


for batch in (32, 128):
    ids = torch.randint(300, 500, (batch, 256), device=dev)
    for impl in ("grouped_mm", "batched_mm", "dense_decode"):
        net.set_experts_implementation("grouped_mm")  # batched_mm's prefill gathers an expert copy per token
        with torch.no_grad():
            cache = DynamicCache(config=net.config.text_config)
            pos = torch.arange(256, device=dev).expand(3, batch, 256)  # text only: the three M-RoPE axes agree
            out = net(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=pos, past_key_values=cache)
            nxt, mask = out.logits[:, -1:].argmax(-1), torch.ones(batch, 257, device=dev, dtype=torch.long)
            net.set_experts_implementation(impl)
            times = []
            for i in range(12):
                sync()
                start = time.perf_counter()
                pos = torch.full((3, batch, 1), 256 + i, device=dev)
                out = net(input_ids=nxt, attention_mask=mask, position_ids=pos, past_key_values=cache)
                nxt, mask = out.logits[:, -1:].argmax(-1), torch.cat([mask, mask[:, :1]], 1)
                sync()
                times.append(time.perf_counter() - start)
        ms = sorted(times[2:])[5] * 1e3
        print(f"batch {batch} {impl}: {ms:.2f} ms per decode step of {layers} layers, {ms / layers:.3f} ms a layer")
