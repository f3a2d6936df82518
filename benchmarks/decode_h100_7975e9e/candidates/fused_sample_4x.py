"""A candidate for `rollout/fused_sample._partial` of 7975e9e, not used by omnialign (issue 32, goal 3; BENCHMARKS.md,
"Two candidates from that profile"): one Philox call (`tl.rand4x`) for four entries, keyed by the entry's group of
four in its row, the four numbers interleaved back in order, so that the draw still does not depend on the splits.
Everything else is the code's; `flat_bench.py` swaps it in for `fused_sample._partial` and calls `fused_sample.draw`.
"""

import triton
import triton.language as tl


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
