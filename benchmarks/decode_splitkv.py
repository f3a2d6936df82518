"""Issue 32, goal 3: the decode step's attention as two Triton kernels (flash decoding) beside SDPA, alone and inside
the compiled decoder. An experiment, not used by omnialign.

Why: at Qwen3-8B's decode shape (batch 128, 8 key/value heads of 4 query heads, 384 slots) SDPA's kernels pad the 4
query rows of a key/value head to a 64- or 128-row tile, and take 0.094-0.100 ms a layer on an H100 and on an H200
alike, hardly more for a third more slots: held, it seems, by that padded work rather than by the 200 MB of keys and
values. `attention` pads the rows to 16 (tl.dot's
least): program (pair, split) takes CHUNK slots of one (row, key/value head) pair in blocks of BLOCK, writes its rows'
unnormalised float32 output and running max and sum, and `_combine` weighs the splits together. A masked slot scores
-inf; the running max starts finite, so a block of masked slots leaves the state as it was.

Inside the compiled step the kernels run as one operator that also writes the step's key and value into the cache
(`write_attention`, mutating the cache). With the write left outside an opaque operator, inductor hands the operator
a fresh copy of the written cache (its functional value: a layer's 200 MB read and written again at batch 128), which
made the forty-first session's Triton kernel, and this one, a third slower than SDPA in the decoder
(`benchmarks/decode_h100_f148650/`).

    TRITON_INTERPRET=1 python benchmarks/decode_splitkv.py check      # equal to SDPA (a CPU, Triton's interpreter)
    python benchmarks/decode_splitkv.py micro OUT.json                # SDPA and every tile config, alone (a GPU)
    python benchmarks/decode_splitkv.py decode OUT.jsonl [CHUNK BLOCK WARPS STAGES]
        # `bench decode --model-size 8b --prompts 128 --prompt-len 256 --max-new-tokens 128 --decoders compiled`,
        # the code and then through the kernels, in one process
"""

import inspect
import itertools
import json
import sys
import textwrap

import torch
import triton
import triton.language as tl

from omnialign.rollout import decode
from omnialign.rollout.decode import decode_attention


@triton.jit
def _partial(q, k, v, visible, part, stats, scale, length, sqb, sqh, sqg, skb, skh, skl, svb, svh, svl, smb, sml,
             KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr, CHUNK: tl.constexpr,
             BLOCK: tl.constexpr):  # fmt: skip
    pair, split = tl.program_id(0), tl.program_id(1)
    row, head = pair // KV, pair % KV
    g, d = tl.arange(0, ROWS), tl.arange(0, D)
    query = tl.load(q + row * sqb + head * sqh + g[:, None] * sqg + d[None, :], mask=g[:, None] < G, other=0.0)
    top = tl.full([ROWS], -1e30, tl.float32)
    total = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, D], tl.float32)
    for start in tl.range(0, CHUNK, BLOCK):
        n = split * CHUNK + start + tl.arange(0, BLOCK)
        inside = n < length
        seen = tl.load(visible + row * smb + n * sml, mask=inside, other=0) != 0
        keys = tl.load(k + row * skb + head * skh + n[:, None] * skl + d[None, :], mask=inside[:, None], other=0.0)
        scores = tl.dot(query, tl.trans(keys)).to(tl.float32) * scale
        scores = tl.where(seen[None, :], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        probs = tl.exp(scores - new_top[:, None])
        fade = tl.exp(top - new_top)
        total = total * fade + tl.sum(probs, 1)
        values = tl.load(v + row * svb + head * svh + n[:, None] * svl + d[None, :], mask=inside[:, None], other=0.0)
        acc = acc * fade[:, None] + tl.dot(probs.to(values.dtype), values)
        top = new_top
    at = (pair * tl.num_programs(1) + split) * G + g
    tl.store(part + at[:, None] * D + d[None, :], acc, mask=g[:, None] < G)
    tl.store(stats + at * 2, top, mask=g < G)
    tl.store(stats + at * 2 + 1, total, mask=g < G)


@triton.jit
def _combine(part, stats, out, splits, sob, soh, sog, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
             SPLITS: tl.constexpr):  # fmt: skip
    pair = tl.program_id(0)
    row, head = pair // KV, pair % KV
    s, d = tl.arange(0, SPLITS), tl.arange(0, D)
    for g in tl.static_range(G):
        at = (pair * splits + s) * G + g
        tops = tl.load(stats + at * 2, mask=s < splits, other=float("-inf"))
        totals = tl.load(stats + at * 2 + 1, mask=s < splits, other=0.0)
        weights = tl.exp(tops - tl.max(tops, 0))
        parts = tl.load(part + at[:, None] * D + d[None, :], mask=(s < splits)[:, None], other=0.0)
        o = tl.sum(parts * weights[:, None], 0) / tl.sum(totals * weights, 0)
        tl.store(out + row * sob + head * soh + g * sog + d, o.to(out.dtype.element_ty))


TILES = {"chunk": 512, "block": 64, "warps": 2, "stages": 2}
"""The tiles `write_attention` uses: the best of `micro` at batch 128 x 384 slots on an H100 (one split)."""


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float, chunk: int,
              block: int, warps: int, stages: int) -> torch.Tensor:  # fmt: skip
    """`decode.decode_attention`: q (B, KV, G, D), k/v (B, KV, L, D) (the last dimension contiguous), visible
    (B, 1, 1, L) bool -> (B, KV, G, D) in q's dtype."""
    batch, heads, groups, dim = q.shape
    length = k.shape[2]
    splits = triton.cdiv(length, chunk)
    part = torch.empty(batch * heads * splits * groups, dim, dtype=torch.float32, device=q.device)
    stats = torch.empty(batch * heads * splits * groups, 2, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    _partial[(batch * heads, splits)](
        q, k, v, visible, part, stats, scale, length, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
        visible.stride(0), visible.stride(3), KV=heads, G=groups, D=dim, ROWS=max(16, triton.next_power_of_2(groups)),
        CHUNK=chunk, BLOCK=min(block, chunk), num_warps=warps, num_stages=stages)  # fmt: skip
    _combine[(batch * heads,)](part, stats, out, splits, *out.stride()[:3], KV=heads, G=groups, D=dim,
                               SPLITS=max(2, triton.next_power_of_2(splits)))  # fmt: skip
    return out


@torch.library.custom_op("omnialign_bench::write_attention", mutates_args=("keys", "values"))
def write_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                    slots: torch.Tensor, visible: torch.Tensor, scale: float) -> torch.Tensor:  # fmt: skip
    """A decode step's cache write (k/v (B, KV, 1, D) into slot `slots` of keys/values) and its `attention`."""
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v)
    return attention(q, keys, values, visible, scale, **TILES)


@write_attention.register_fake
def _(q, k, v, keys, values, slots, visible, scale):
    return torch.empty_like(q)


def kernel_forward():
    """`decode._forward` with the decode step's cache write and attention through `write_attention` (the prefill as
    it was): the code's own source with those lines replaced, run in the decode module's namespace."""
    source = textwrap.dedent(inspect.getsource(decode._forward))
    before = """        keys[i].index_copy_(2, slots, k.to(keys[i].dtype))
        values[i].index_copy_(2, slots, v.to(values[i].dtype))
        if length == 1:
            o = decode_attention(q.reshape(batch, keys[i].shape[1], -1, attn.head_dim), keys[i], values[i], visible,
                                 attn.scaling)  # fmt: skip
        else:
"""
    after = """        if length == 1:
            o = write_attention(q.reshape(batch, keys[i].shape[1], -1, attn.head_dim), k.to(keys[i].dtype),
                                v.to(values[i].dtype), keys[i], values[i], slots, visible, attn.scaling)
        else:
            keys[i].index_copy_(2, slots, k.to(keys[i].dtype))
            values[i].index_copy_(2, slots, v.to(values[i].dtype))
"""
    assert before in source, "rollout/decode.py's _forward changed: update kernel_forward"
    scope = dict(vars(decode), write_attention=write_attention)
    exec(compile(source.replace(before, after), decode.__file__, "exec"), scope)
    return scope["_forward"]


def case(batch: int, heads: int, groups: int, dim: int, length: int, device: str, dtype: torch.dtype) -> tuple:
    """q, k, v, visible as the decoder has them: k/v views of a cache one slot longer, rows left-padded by different
    amounts, one with random holes, the last 16 slots not reached yet."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, groups, dim, generator=g).to(device, dtype)
    k, v = (torch.randn(batch, heads, length + 1, dim, generator=g).to(device, dtype)[:, :, :length] for _ in "kv")
    seen = torch.ones(batch, length + 1, dtype=torch.bool)
    for b in range(batch):
        seen[b, : (b * 37) % (length // 2)] = False
    seen[1 % batch] = torch.rand(length + 1, generator=g) < 0.5
    seen[:, length - 16 : length] = False
    seen[:, length - 17] = True
    return q, k, v, seen.to(device)[:, None, None, :length]


def check() -> None:
    """`attention` against SDPA in float32 over splits of every kind (several, one ending past the cache, one)."""
    for length, chunk, block in ((150, 64, 32), (150, 32, 32), (130, 256, 64), (64, 64, 64)):
        q, k, v, visible = case(3, 2, 4, 128, length, "cpu", torch.float32)
        expected = decode_attention(q, k, v, visible, 128**-0.5)
        err = (attention(q, k, v, visible, 128**-0.5, chunk, block, 4, 2) - expected).abs().max().item()
        print(f"L={length} chunk={chunk} block={block}: largest difference {err:.2e}", flush=True)
        assert err < 1e-5, err
        unmasked = attention(q, k, v, visible | True, 128**-0.5, chunk, block, 4, 2)
        assert not torch.allclose(unmasked, expected, atol=0.1)  # the mask counts


def timed(fn, *args, **kwargs) -> float:
    """ms per call of fn(*args, **kwargs) as the decoder runs it, in a CUDA graph: 20 calls captured in one graph,
    replayed 10 times (so the host's launch cost, which the graph removes, is not counted)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compiles and picks its algorithms outside the capture
            fn(*args, **kwargs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            fn(*args, **kwargs)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 200


def micro(out: str) -> None:
    """ms per layer call of SDPA (the decoder's) and of `attention` at every tile config, and their largest
    difference from float32 SDPA, at Qwen3-8B's shape (8 key/value heads x 4 query rows of 128)."""
    rows = []
    for batch, length in ((128, 384), (128, 256), (32, 384), (256, 384)):
        inputs = (*case(batch, 8, 4, 128, length, "cuda", torch.bfloat16), 128**-0.5)
        exact = decode_attention(*(t.float() for t in inputs[:3]), *inputs[3:])
        mb = 2 * inputs[1].numel() * 2 / 1e6
        ms = timed(decode_attention, *inputs)
        row = {"batch": batch, "L": length, "kv_MB": round(mb, 1), "sdpa_ms": round(ms, 4), "sdpa_GBs": round(mb / ms),
               "sdpa_err": float((decode_attention(*inputs).float() - exact).abs().max()), "all": []}  # fmt: skip
        for chunk, block, warps, stages in itertools.product((32, 64, 128, 512), (32, 64), (2, 4, 8), (1, 2, 3)):
            if block > chunk or (chunk == 512 and block == 32):
                continue
            tiles = dict(chunk=chunk, block=block, warps=warps, stages=stages)
            err = float((attention(*inputs, **tiles).float() - exact).abs().max())
            row["all"].append({**tiles, "ms": round(timed(attention, *inputs, **tiles), 4), "err": err})
        best = min(row["all"], key=lambda r: r["ms"])
        row.update(best=best, best_GBs=round(mb / best["ms"]))
        rows.append(row)
        print(json.dumps({x: y for x, y in row.items() if x != "all"}), flush=True)
    with open(out, "w") as f:
        json.dump(rows, f)


def in_decoder(out: str) -> None:
    """The compiled decoder as the code has it, then through `kernel_forward`, one process; a row each to `out`."""
    from omnialign.bench.decode import bench_decode

    code = decode._forward
    for name, forward in (("sdpa", code), ("triton", kernel_forward())):
        decode._forward = forward
        torch._dynamo.reset()
        rows = bench_decode(decoders=["compiled"], tiny=False, model_size="8b", prompt_len=256, max_new_tokens=128,
                            batch=128)  # fmt: skip
        decode._forward = code
        with open(out, "a") as f:
            for row in rows:
                f.write(json.dumps({"attention": name, "tiles": TILES, **row}) + "\n")
        print(
            f"== {name}: {rows[0]['decode_tokens_per_s']} decode tokens/s, share {rows[0]['share_of_bound']}, "
            f"log-prob gap {rows[0]['logprob_gap_mean']} / {rows[0]['logprob_gap_max']}",
            flush=True,
        )


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "check":
        check()
    elif command == "micro":
        micro(args[0])
    else:
        TILES.update(zip(("chunk", "block", "warps", "stages"), map(int, args[1:])))
        in_decoder(args[0])
