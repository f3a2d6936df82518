"""Two experiments for issue 32's goal 3 (decoding at half the bandwidth bound), each a replacement in
`omnialign.rollout.decode`, run through omnialign's CLI. DECODE_PATCHES names them (default "sample"):

- `sample`: `decode.sample` as one compiled function. Between two replays of the decode step it runs eagerly, about
  twenty kernels over the (B, V) float32 logits (the temperature, a softmax, torch.multinomial's checks and draw, a
  log-softmax): 0.41 ms of the compiled step's 8.6 ms of device time at batch 128 (BENCHMARKS.md, "reduce" and
  "elementwise"). `fused` writes torch.multinomial's single draw out (argmax of p / q with q ~ Exp(1), the draw it
  makes for one sample, from the same generator: the same tokens) and is compiled, so that inductor fuses the rest
  around the eager random draw (`fallback_random`).
- `attention`: `decode.decode_attention` as broadcast products and sums in float32 (`reduced_attention`), which
  inductor turns into its own reduction kernels inside the compiled step, in place of SDPA's masked
  memory-efficient kernel (3.05 ms a step against the 1.5 ms its keys and values take at 4.8 TB/s). Compiled decoder
  only: eagerly it would materialise (B, KV, G, L, D) products.

Side by side, one call:

    python -m omnialign bench decode --model-size 8b --prompts 128 --prompt-len 256 --max-new-tokens 128 \
        --decoders compiled --out A.json
    DECODE_PATCHES="sample attention" python benchmarks/decode_experiments.py bench decode --model-size 8b \
        --prompts 128 --prompt-len 256 --max-new-tokens 128 --decoders compiled --out B.json
"""

import os
import sys

import torch

from omnialign.rollout import decode


def sample(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, greedy: bool) -> tuple:
    """`decode.sample`, with torch.multinomial's one draw written out: (B,) next tokens and their log-probs
    log softmax(logits / temperature) from float32 logits (B, V)."""
    scores = logits / temperature
    if greedy:
        token = logits.argmax(-1)
    else:
        probs = decode.filtered(scores, top_k, top_p).softmax(-1)
        token = (probs / torch.empty_like(probs).exponential_()).argmax(-1)
    return token, scores.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)


fused = torch.compile(sample, options={"fallback_random": True})


def reduced_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor,
                      scale: float) -> torch.Tensor:  # fmt: skip
    """`decode.decode_attention` in float32 products and sums: q (B, KV, G, D), k/v (B, KV, L, D), visible
    (B, 1, 1, L) -> (B, KV, G, D)."""
    scores = (q.float().unsqueeze(-2) * k.float().unsqueeze(-3)).sum(-1) * scale  # (B, KV, G, L)
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return (probs.unsqueeze(-1) * v.float().unsqueeze(-3)).sum(-2).to(q.dtype)


PATCHES = {"sample": ("sample", fused), "attention": ("decode_attention", reduced_attention)}

if __name__ == "__main__":
    for patch in os.environ.get("DECODE_PATCHES", "sample").split():
        setattr(decode, *PATCHES[patch])
    from omnialign.cli import main

    main(sys.argv[1:])
