"""A decode step's draw on a GPU as one Triton kernel: the next token and its log-prob in one pass over the logits.

`decode.sample` without top-k or top-p is softmax, a multinomial draw (which torch runs as argmax(p / q) with q
exponential), then log softmax and a gather: about ten passes over the float32 logits (78 MB for Qwen3-8B at batch
128) in as many kernels between two graph replays. `draw` reads each row once: the scores s = logits / temperature
(IEEE division, as the training forward divides), the token argmax(s + Gumbel noise) (the Gumbel-max trick: token i
with probability softmax(s)_i, as the multinomial draws it, from other random numbers), and the log-prob
s[token] - logsumexp(s) from a running max and sum per lane. The noise is Philox's, keyed by one seed a call drawn
from the default CUDA generator (seed it as the rollout does) and each element's place, so a seeded generation
repeats.
"""

import torch
import triton
import triton.language as tl

BLOCK = 2048  # vocabulary entries a program reads at a time


@triton.jit
def _draw(logits, seed, tokens, logps, vocab, stride, temperature, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    key = tl.load(seed)
    n = tl.arange(0, BLOCK)
    best = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: the largest s + noise so far, and where
    at = tl.zeros([BLOCK], tl.int32)
    top = tl.full([BLOCK], -1e30, tl.float32)  # per lane: running max and sum of exp(s - max)
    total = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, vocab, BLOCK):
        i = start + n
        x = tl.load(logits + row * stride + i, mask=i < vocab, other=float("-inf"))
        s = tl.div_rn(x, temperature)
        noisy = s - tl.log(-tl.log(tl.rand(key, row * vocab + i)))
        better = noisy > best
        best = tl.where(better, noisy, best)
        at = tl.where(better, i, at)
        new_top = tl.maximum(top, s)
        total = total * tl.exp(top - new_top) + tl.exp(s - new_top)
        top = new_top
    token = tl.max(tl.where(best == tl.max(best, 0), at, -1), 0)
    peak = tl.max(top, 0)
    logsumexp = peak + tl.log(tl.sum(total * tl.exp(top - peak), 0))
    chosen = tl.div_rn(tl.load(logits + row * stride + token), temperature)
    tl.store(tokens + row, token.to(tl.int64))
    tl.store(logps + row, chosen - logsumexp)


def draw(logits: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) tokens drawn from softmax(logits / temperature) and their float32 log-probs, logits (B, V) float32 on
    a GPU (the last dimension contiguous)."""
    batch, vocab = logits.shape
    seed = torch.randint(2**31 - 1, (1,), device=logits.device)
    tokens = torch.empty(batch, dtype=torch.long, device=logits.device)
    logps = torch.empty(batch, dtype=torch.float32, device=logits.device)
    _draw[(batch,)](logits, seed, tokens, logps, vocab, logits.stride(0), temperature, BLOCK=BLOCK, num_warps=8)
    return tokens, logps
