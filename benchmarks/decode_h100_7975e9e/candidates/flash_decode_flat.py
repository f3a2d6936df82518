"""A candidate decode attention, not used by omnialign (issue 32, goal 3; slower than the code at every shape
measured: BENCHMARKS.md, "Two candidates from that profile"). `rollout/flash_decode.py` of 7975e9e gives each (row,
key/value head) pair a program of its own; `_flat` deals whole pairs to as many programs as the card holds at once
(FLAT["resident"] a processor), each taking its pairs' blocks as one loop, so that the next pair's first keys load
while this pair's last block is worked on. `write_attention` (here `flat::write_attention`) takes it where the code
takes one split a pair, and the code's `attention` elsewhere."""

import torch
import triton
import triton.language as tl

from omnialign.rollout.flash_decode import TILES, attention, split_length

FLAT = {"resident": 3, "block": 64, "warps": 2, "stages": 2}  # `_flat`: programs a processor holds at once, tiles


@triton.jit
def _flat(q, k, v, keys, values, through, visible, out, scale, sqb, sqh, sqg, skb, skh, svb, svh, sKb, sKh, sKl, sVb,
          sVh, sVl, smb, sml, sob, soh, sog, pairs, per, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
          ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr):  # fmt: skip
    """One program takes `per` whole (row, head) pairs one after another, their blocks as one loop, so that the
    next pair's first keys load while this pair's last block is worked on."""
    program = tl.program_id(0)
    g, d = tl.arange(0, ROWS), tl.arange(0, DIM)
    rows = (g[:, None] < G) & (d[None, :] < D)
    last = tl.load(through).to(tl.int32)
    blocks = last // BLOCK + 1
    begin = program * per * blocks
    end = tl.minimum(begin + per * blocks, pairs * blocks)
    top = tl.full([ROWS], -1e30, tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, DIM], tl.float32)
    for item in tl.range(begin, end):
        pair = item // blocks
        j = item - pair * blocks
        row, head = pair // KV, pair % KV
        first = j == 0
        top = tl.where(first, -1e30, top)
        total = tl.where(first, 0.0, total)
        acc = tl.where(first, 0.0, acc)
        query = tl.load(q + row * sqb + head * sqh + g[:, None] * sqg + d[None, :], mask=rows, other=0.0)
        new_key = tl.load(k + row * skb + head * skh + d, mask=d < D, other=0.0)
        new_value = tl.load(v + row * svb + head * svh + d, mask=d < D, other=0.0)
        n = j * BLOCK + tl.arange(0, BLOCK)
        inside = n <= last
        seen = tl.load(visible + row * smb + n * sml, mask=inside, other=0) != 0
        where = inside[:, None] & (d[None, :] < D)
        step = (n == last)[:, None]
        key = tl.load(keys + row * sKb + head * sKh + n[:, None] * sKl + d[None, :], mask=where, other=0.0)
        key = tl.where(step, new_key[None, :], key)
        scores = tl.dot(query, tl.trans(key), input_precision=PRECISION).to(tl.float32) * scale
        scores = tl.where(seen[None, :], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        probs = tl.exp(scores - new_top[:, None])
        fade = tl.exp(top - new_top)
        total = total * fade + tl.sum(probs, 1)
        value = tl.load(values + row * sVb + head * sVh + n[:, None] * sVl + d[None, :], mask=where, other=0.0)
        value = tl.where(step, new_value[None, :], value)
        acc = acc * fade[:, None] + tl.dot(probs.to(value.dtype), value, input_precision=PRECISION)
        top = new_top
        width = tl.where(j == blocks - 1, D, 0)  # the pair's last block: its cache write and output
        tl.store(keys + row * sKb + head * sKh + last * sKl + d, new_key, mask=d < width)
        tl.store(values + row * sVb + head * sVh + last * sVl + d, new_value, mask=d < width)
        o = acc / total[:, None]
        tl.store(
            out + row * sob + head * soh + g[:, None] * sog + d[None, :],
            o.to(out.dtype.element_ty),
            mask=(g[:, None] < G) & (d[None, :] < width),
        )


def flat(q, k, v, keys, values, slots, visible, scale, programs, block, warps, stages):
    """`attention` by `_flat`: the pairs dealt to `programs` programs (all resident at once), whole pairs each."""
    batch, heads, groups, dim = q.shape
    per = triton.cdiv(batch * heads, programs)
    out = torch.empty_like(q)
    _flat[(triton.cdiv(batch * heads, per),)](
        q, k, v, keys, values, slots, visible, out, scale, *q.stride()[:3], *k.stride()[:2], *v.stride()[:2],
        *keys.stride()[:3], *values.stride()[:3], visible.stride(0), visible.stride(3), *out.stride()[:3],
        batch * heads, per, KV=heads, G=groups, D=dim, ROWS=max(16, triton.next_power_of_2(groups)),
        DIM=max(16, triton.next_power_of_2(dim)), BLOCK=block, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages)  # fmt: skip
    return out


@torch.library.custom_op("flat::write_attention", mutates_args=("keys", "values"))
def write_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    slots: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
    """`flash_decode.write_attention`, through `flat` where that takes one split a pair."""
    processors = torch.cuda.get_device_properties(q.device).multi_processor_count
    chunk = split_length(q.shape[0] * q.shape[1], keys.shape[2], processors, TILES["block"])
    if chunk >= keys.shape[2]:  # one split: the pairs fill the card
        tiles = {name: value for name, value in FLAT.items() if name != "resident"}
        return flat(q, k, v, keys, values, slots, visible, scale, FLAT["resident"] * processors, **tiles)
    return attention(q, k, v, keys, values, slots, visible, scale, chunk, **TILES)


@write_attention.register_fake
def _(q, k, v, keys, values, slots, visible, scale):
    return torch.empty_like(q)
