# A candidate, not used by omnialign: rollout/flash_decode.py of 7975e9e with `_flat` and `flat` added, which
# `write_attention` takes where one split would do (FLAT). Slower than the code at every shape measured (BENCHMARKS.md).
"""A decode step's cache write and attention on a GPU in one Triton kernel (flash decoding), two where a row's slots
are read in several splits.

At a decode step each key/value head has a few query rows (Qwen3-8B: 4). SDPA's kernels pad them to a 64- or
128-row tile and took 0.094-0.100 ms a layer at batch 128 x 384 slots on an H100 and an H200 alike, held by that
padded work rather than by the 200 MB of keys and values they read. `attention` pads the rows to 16 (tl.dot's least):
program (pair, split) takes `chunk` slots (`split_length`) of one (row, key/value head) pair in blocks of BLOCK and
writes its rows' unnormalised float32 output and running max and sum; `_combine` weighs the splits together (with
one split, at batch 128 on an H100, the program writes the output itself). A masked slot scores -inf; the running
max starts finite, so that a block of masked slots leaves the state as it was.

A program reads no slot after the step's own (`slots`, read from the device, so that one CUDA graph serves every
step of a reach): the decoder's reach grows by 128 slots at a time, and the slots past the step are not filled yet
(at batch 128, prompts of 256 and 128 new tokens, a sixth of the keys and values a step would read otherwise). The
program whose split holds the step's slot writes the step's key and value there, and uses them from its registers.

`write_attention` is one operator: an opaque operator that read the cache after a write outside it would be handed,
inside a compiled step, a fresh copy of the written cache (its functional value, a layer's 200 MB read and written
again at batch 128), which made such a kernel a third slower than SDPA in the decoder. With the write as two
`index_copy_` before the kernels and every slot of the reach read, on an H100 at batch 128 x 384 slots it took 0.077
ms a layer against SDPA's 0.100, and the compiled decoder sampled Qwen3-8B 5.4% faster (BENCHMARKS.md, "the Triton
decode attention adopted"); as it is now, 1.6% faster again beside that version (13,265 against 13,058 decode
tokens/s, "the decode attention that stops at the step's slot").
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _partial(q, k, v, keys, values, through, visible, part, stats, out, scale, sqb, sqh, sqg, skb, skh, svb, svh, sKb,
             sKh, sKl, sVb, sVh, sVl, smb, sml, sob, soh, sog, chunk, KV: tl.constexpr, G: tl.constexpr,
             D: tl.constexpr, ROWS: tl.constexpr, DIM: tl.constexpr, BLOCK: tl.constexpr, PRECISION: tl.constexpr,
             ONE: tl.constexpr):  # fmt: skip
    pair, split = tl.program_id(0), tl.program_id(1)
    row, head = pair // KV, pair % KV
    g, d = tl.arange(0, ROWS), tl.arange(0, DIM)
    rows = (g[:, None] < G) & (d[None, :] < D)
    query = tl.load(q + row * sqb + head * sqh + g[:, None] * sqg + d[None, :], mask=rows, other=0.0)
    last = tl.load(through).to(tl.int32)
    # the step's key and value: written to the cache by the program whose split holds the slot, and taken from
    # registers where the loop reaches it (its own store need not be visible to its loads)
    new_key = tl.load(k + row * skb + head * skh + d, mask=d < D, other=0.0)
    new_value = tl.load(v + row * svb + head * svh + d, mask=d < D, other=0.0)
    mine = d < tl.where(split == last // chunk, D, 0)  # the whole width in the slot's split, nothing elsewhere
    tl.store(keys + row * sKb + head * sKh + last * sKl + d, new_key, mask=mine)
    tl.store(values + row * sVb + head * sVh + last * sVl + d, new_value, mask=mine)
    top = tl.full([ROWS], -1e30, tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, DIM], tl.float32)
    for start in tl.range(0, tl.minimum(chunk, last + 1 - split * chunk), BLOCK):
        n = split * chunk + start + tl.arange(0, BLOCK)
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
    if ONE:  # one split: the output itself (what `_combine` makes of one split, bit for bit)
        o = acc / total[:, None]
        tl.store(out + row * sob + head * soh + g[:, None] * sog + d[None, :], o.to(out.dtype.element_ty), mask=rows)
    else:
        at = (pair * tl.num_programs(1) + split) * G + g
        tl.store(part + at[:, None] * DIM + d[None, :], acc, mask=g[:, None] < G)
        tl.store(stats + at * 2, top, mask=g < G)
        tl.store(stats + at * 2 + 1, total, mask=g < G)


@triton.jit
def _combine(part, stats, out, splits, sob, soh, sog, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
             DIM: tl.constexpr, SPLITS: tl.constexpr):  # fmt: skip
    pair = tl.program_id(0)
    row, head = pair // KV, pair % KV
    s, d = tl.arange(0, SPLITS), tl.arange(0, DIM)
    for g in tl.static_range(G):
        at = (pair * splits + s) * G + g
        tops = tl.load(stats + at * 2, mask=s < splits, other=float("-inf"))
        totals = tl.load(stats + at * 2 + 1, mask=s < splits, other=0.0)
        weights = tl.exp(tops - tl.max(tops, 0))
        parts = tl.load(part + at[:, None] * DIM + d[None, :], mask=(s < splits)[:, None], other=0.0)
        o = tl.sum(parts * weights[:, None], 0) / tl.sum(totals * weights, 0)
        tl.store(out + row * sob + head * soh + g * sog + d, o.to(out.dtype.element_ty), mask=d < D)


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


TILES = {"block": 64, "warps": 2, "stages": 2}
FLAT = {"resident": 3, "block": 64, "warps": 2, "stages": 2}  # `_flat`: programs a processor holds at once, tiles
"""The tiles `write_attention` uses: the best of `benchmarks/decode_splitkv.py micro` at Qwen3-8B's batch 128 x 384
slots on an H100 (where one split per pair was best: 1,024 pairs already fill the card)."""


def split_length(pairs: int, length: int, processors: int, block: int) -> int:
    """Slots per split (`attention`'s chunk) for `pairs` (row, key/value head) pairs over `length` slots: as many
    splits as make the programs fill the card's `processors` twice over (one split where the pairs alone do, at
    most one per block), in whole blocks."""
    splits = min(triton.cdiv(2 * processors, pairs), triton.cdiv(length, block))
    return triton.cdiv(triton.cdiv(length, splits), block) * block


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
              slots: torch.Tensor, visible: torch.Tensor, scale: float, chunk: int, block: int, warps: int,
              stages: int) -> torch.Tensor:  # fmt: skip
    """A decode step's cache write, k/v (B, KV, 1, D) into slot `slots` (a one-element int tensor on the device) of
    keys/values (B, KV, L, D) (the last dimension contiguous), and its `decode.decode_attention` of q (B, KV, G, D)
    over the slots up to that one (the last any row sees; the slots after it are not read), visible (B, 1, 1, L) bool
    -> (B, KV, G, D) in q's dtype; the slots in splits of `chunk` read in blocks of `block` (chunk a multiple of
    block)."""
    batch, heads, groups, dim = q.shape
    splits = triton.cdiv(keys.shape[2], chunk)
    padded = max(16, triton.next_power_of_2(dim))
    part = torch.empty(batch * heads * splits * groups, padded, dtype=torch.float32, device=q.device)
    stats = torch.empty(batch * heads * splits * groups, 2, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _partial[(batch * heads, splits)](
        q, k, v, keys, values, slots, visible, part, stats, out, scale, *q.stride()[:3], *k.stride()[:2],
        *v.stride()[:2], *keys.stride()[:3], *values.stride()[:3], visible.stride(0), visible.stride(3),
        *out.stride()[:3], chunk, KV=heads, G=groups, D=dim, ROWS=max(16, triton.next_power_of_2(groups)),
        DIM=padded, BLOCK=block, PRECISION="ieee" if q.dtype == torch.float32 else "tf32", ONE=splits == 1,
        num_warps=warps, num_stages=stages)  # fmt: skip
    if splits > 1:
        _combine[(batch * heads,)](part, stats, out, splits, *out.stride()[:3], KV=heads, G=groups, D=dim,
                                   DIM=padded, SPLITS=triton.next_power_of_2(splits))  # fmt: skip
    return out


@torch.library.custom_op("omnialign::write_attention", mutates_args=("keys", "values"))
def write_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    slots: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
    """`attention` as one operator, its splits from `split_length`."""
    processors = torch.cuda.get_device_properties(q.device).multi_processor_count
    chunk = split_length(q.shape[0] * q.shape[1], keys.shape[2], processors, TILES["block"])
    if chunk >= keys.shape[2]:  # one split: the pairs fill the card
        tiles = {name: value for name, value in FLAT.items() if name != "resident"}
        return flat(q, k, v, keys, values, slots, visible, scale, FLAT["resident"] * processors, **tiles)
    return attention(q, k, v, keys, values, slots, visible, scale, chunk, **TILES)


@write_attention.register_fake
def _(q, k, v, keys, values, slots, visible, scale):
    return torch.empty_like(q)
