# A candidate, not used by omnialign: rollout/fused_sample.py of 7975e9e with one Philox call for four entries.
"""A decode step's draw on a GPU as one Triton kernel: the next token and its log-prob in one pass over the logits.

`decode.sample` without top-k or top-p is softmax, a multinomial draw (which torch runs as argmax(p / q) with q
exponential), then log softmax and a gather: about ten passes over the float32 logits (78 MB for Qwen3-8B at batch
128) in as many kernels between two graph replays. `draw` reads each row once: the scores s = logits / temperature
(IEEE division, as the training forward divides), the token argmax(s + Gumbel noise) (the Gumbel-max trick: token i
with probability softmax(s)_i, as the multinomial draws it, from other random numbers), and the log-prob
s[token] - logsumexp(s) from a running max and sum per lane. A row is read in parts by programs of their own
(`_partial`), as many as fill the card, and `_combine` takes the best part's token and adds the parts' sums. The noise
is Philox's, keyed by one seed a call drawn from the default CUDA generator (seed it as the rollout does) and each
element's place, so a seeded generation repeats, whatever the card's size.

On an H100 at batch 128 x 151,936 (Qwen3's vocabulary) the eager draw took 0.579 ms and this kernel 0.128 ms (0.222
and 0.119 at batch 32, 1.039 and 0.242 at 256; BENCHMARKS.md, "the draw read in parts").
"""

import torch
import triton
import triton.language as tl

from omnialign.rollout.flash_decode import split_length

BLOCK = 2048  # vocabulary entries a program reads at a time


@triton.jit
def _partial(logits, seed, best, at, top, total, vocab, stride, temperature, chunk, BLOCK: tl.constexpr):
    row, split = tl.program_id(0), tl.program_id(1)
    key = tl.load(seed)
    n = tl.arange(0, BLOCK)
    lane_best = tl.full([BLOCK], float("-inf"), tl.float32)  # per lane: the largest s + noise so far, and where
    lane_at = tl.zeros([BLOCK], tl.int32)
    lane_top = tl.full([BLOCK], -1e30, tl.float32)  # per lane: running max and sum of exp(s - max)
    lane_total = tl.zeros([BLOCK], tl.float32)
    for start in tl.range(0, chunk, BLOCK):
        i = split * chunk + start + n
        x = tl.load(logits + row * stride + i, mask=i < vocab, other=float("-inf"))
        s = tl.div_rn(x, temperature)
        # one Philox call for four elements: group i // 4 of the row, its four numbers interleaved back in order
        u0, u1, u2, u3 = tl.rand4x(
            key, row * tl.cdiv(vocab, 4) + (split * chunk + start) // 4 + tl.arange(0, BLOCK // 4)
        )
        u = tl.interleave(tl.interleave(u0, u2), tl.interleave(u1, u3))
        noisy = s - tl.log(-tl.log(u))
        better = noisy > lane_best
        lane_best = tl.where(better, noisy, lane_best)
        lane_at = tl.where(better, i, lane_at)
        new_top = tl.maximum(lane_top, s)
        lane_total = lane_total * tl.exp(lane_top - new_top) + tl.exp(s - new_top)
        lane_top = new_top
    peak = tl.max(lane_best, 0)
    here = row * tl.num_programs(1) + split
    tl.store(best + here, peak)
    tl.store(at + here, tl.max(tl.where(lane_best == peak, lane_at, -1), 0))
    most = tl.max(lane_top, 0)
    tl.store(top + here, most)
    tl.store(total + here, tl.sum(lane_total * tl.exp(lane_top - most), 0))


@triton.jit
def _combine(logits, best, at, top, total, tokens, logps, splits, stride, temperature, SPLITS: tl.constexpr):
    row = tl.program_id(0)
    s = tl.arange(0, SPLITS)
    inside = s < splits
    bests = tl.load(best + row * splits + s, mask=inside, other=float("-inf"))
    token = tl.max(tl.where(bests == tl.max(bests, 0), tl.load(at + row * splits + s, mask=inside, other=-1), -1), 0)
    tops = tl.load(top + row * splits + s, mask=inside, other=-1e30)
    peak = tl.max(tops, 0)
    totals = tl.load(total + row * splits + s, mask=inside, other=0.0)
    logsumexp = peak + tl.log(tl.sum(totals * tl.exp(tops - peak), 0))
    chosen = tl.div_rn(tl.load(logits + row * stride + token), temperature)
    tl.store(tokens + row, token.to(tl.int64))
    tl.store(logps + row, chosen - logsumexp)


def draw(logits: torch.Tensor, temperature: float, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) tokens drawn from softmax(logits / temperature) and their float32 log-probs, logits (B, V) float32 on
    a GPU (the last dimension contiguous). Each row is read in parts of `chunk` entries (a multiple of BLOCK) by
    programs of their own (default: as many parts as fill the card twice over, `flash_decode.split_length`); the draw
    does not depend on them."""
    batch, vocab = logits.shape
    if chunk is None:
        processors = torch.cuda.get_device_properties(logits.device).multi_processor_count
        chunk = split_length(batch, vocab, processors, BLOCK)
    splits = triton.cdiv(vocab, chunk)
    seed = torch.randint(2**31 - 1, (1,), device=logits.device)
    best, top, total = (torch.empty(batch, splits, dtype=torch.float32, device=logits.device) for _ in range(3))
    at = torch.empty(batch, splits, dtype=torch.int32, device=logits.device)
    _partial[(batch, splits)](logits, seed, best, at, top, total, vocab, logits.stride(0), temperature, chunk,
                              BLOCK=BLOCK, num_warps=8)  # fmt: skip
    tokens = torch.empty(batch, dtype=torch.long, device=logits.device)
    logps = torch.empty(batch, dtype=torch.float32, device=logits.device)
    _combine[(batch,)](logits, best, at, top, total, tokens, logps, splits, logits.stride(0), temperature,
                       SPLITS=max(2, triton.next_power_of_2(splits)))  # fmt: skip
    return tokens, logps
