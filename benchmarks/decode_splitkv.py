"""Issue 32, goal 3: the decode step's attention through `omnialign.rollout.flash_decode` (two Triton kernels, flash
decoding) beside SDPA, alone and inside the compiled decoder, and its draw through `fused_sample` beside the eager
softmax, multinomial and log softmax.

    TRITON_INTERPRET=1 python benchmarks/decode_splitkv.py check      # equal to SDPA (a CPU, Triton's interpreter)
    python benchmarks/decode_splitkv.py compile                       # the kernels compile for an H100/H200 (a CPU)
    python benchmarks/decode_splitkv.py micro OUT.json                # SDPA and every tile config, alone (a GPU)
    python benchmarks/decode_splitkv.py draw OUT.json                 # the eager and the fused draw, alone (a GPU)
    python benchmarks/decode_splitkv.py decode OUT.jsonl BATCH [BASELINE.py] [BLOCK WARPS STAGES]
        # `bench decode --model-size 8b --prompts BATCH --prompt-len 256 --max-new-tokens 128 --decoders compiled`,
        # through SDPA with the eager draw, through BASELINE.py's kernels (another commit's flash_decode.py: `git show
        # COMMIT:omnialign/rollout/flash_decode.py > BASELINE.py`) with the fused draw, then as the code has it (the
        # kernels, with these tiles, and the fused draw), in one process
"""

import itertools
import json
import sys
import types

import torch
import triton

from omnialign.rollout import decode, flash_decode, fused_sample
from omnialign.rollout.decode import decode_attention
from omnialign.rollout.flash_decode import TILES, attention, split_length


def sdpa_write_attention(q, k, v, keys, values, slots, visible, scale):
    """`decode.write_decode_attention` as it is on a CPU: the cache write, then SDPA."""
    keys.index_copy_(2, slots, k)
    values.index_copy_(2, slots, v)
    return decode_attention(q, keys, values, visible, scale)


def eager_sample(logits, temperature, top_k, top_p, greedy):
    """`decode.sample` as it is on a CPU without top-k or top-p: softmax, a multinomial draw, log softmax."""
    scores = logits / temperature
    token = torch.multinomial(scores.softmax(-1), 1).squeeze(-1)
    return token, scores.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)


def case(batch: int, heads: int, groups: int, dim: int, length: int, device: str, dtype: torch.dtype) -> tuple:
    """q, k, v, keys, values, slots, visible as a decode step has them: the step's query, key and value, keys/values
    views of a cache one slot longer, rows left-padded by different amounts, one with random holes, the step's slot
    the 17th from the end (the last 16 not reached yet)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, n, dim, generator=g).to(device, dtype) for n in (groups, 1, 1))
    keys, values = (torch.randn(batch, heads, length + 1, dim, generator=g).to(device, dtype)[:, :, :length]
                    for _ in "kv")  # fmt: skip
    seen = torch.ones(batch, length + 1, dtype=torch.bool)
    for b in range(batch):
        seen[b, : (b * 37) % (length // 2)] = False
    seen[1 % batch] = torch.rand(length + 1, generator=g) < 0.5
    seen[:, length - 16 : length] = False
    seen[:, length - 17] = True
    slots = torch.tensor([length - 17], device=device)
    return q, k, v, keys, values, slots, seen.to(device)[:, None, None, :length]


def check() -> None:
    """`attention` against the cache write by indexing and SDPA in float32 over splits of every kind (several, one
    ending past the cache, one); the mask counts, and the slots after the step's own are not read."""
    for length, chunk, block in ((150, 64, 32), (150, 32, 32), (130, 256, 64), (64, 64, 64)):
        q, k, v, keys, values, slots, visible = case(3, 2, 4, 128, length, "cpu", torch.float32)
        written = keys.clone(), values.clone()
        expected = sdpa_write_attention(q, k, v, *written, slots, visible, 128**-0.5)
        out = attention(q, k, v, keys, values, slots, visible, 128**-0.5, chunk, block, 4, 2)
        err = (out - expected).abs().max().item()
        print(f"L={length} chunk={chunk} block={block}: largest difference {err:.2e}", flush=True)
        assert err < 1e-5 and torch.equal(keys, written[0]) and torch.equal(values, written[1]), err
        unmasked = attention(q, k, v, keys, values, slots, visible | True, 128**-0.5, chunk, block, 4, 2)
        assert not torch.allclose(unmasked, expected, atol=0.1)  # the mask counts
        reached = (torch.arange(length) <= slots)[None, None, None]  # and no slot after the step's own does
        assert torch.allclose(unmasked, decode_attention(q, keys, values, reached, 128**-0.5), atol=1e-5)


def compile_kernels(capability: int = 90) -> None:
    """Compile the kernels of `flash_decode` and `fused_sample` at Qwen3-8B's shapes for a GPU of this compute
    capability through the Triton wheel's own ptxas: no GPU needed, so a kernel that does not compile is found before
    a device run."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kinds = {"q": "*bf16", "k": "*bf16", "v": "*bf16", "keys": "*bf16", "values": "*bf16", "through": "*i64",
             "visible": "*i1", "part": "*fp32", "stats": "*fp32", "out": "*bf16", "scale": "fp32",
             "logits": "*fp32", "seed": "*i64", "best": "*fp32", "at": "*i32", "top": "*fp32", "total": "*fp32",
             "tokens": "*i64", "logps": "*fp32", "temperature": "fp32"}  # fmt: skip
    heads = {"KV": 8, "G": 4, "D": 128, "DIM": 128}
    kernels = [(flash_decode._partial, heads | {"ROWS": 16, "BLOCK": 64, "PRECISION": "tf32", "ONE": one})
               for one in (True, False)]  # fmt: skip
    kernels += [(flash_decode._combine, heads | {"SPLITS": 4}), (fused_sample._partial, {"BLOCK": 2048}),
                (fused_sample._combine, {"SPLITS": 128})]  # fmt: skip
    for kernel, constants in kernels:
        names = kernel.arg_names
        signature = {n: "constexpr" if n in constants else kinds.get(n, "i32") for n in names}
        source = ASTSource(kernel, signature, {(names.index(n),): c for n, c in constants.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", capability, 32), options={"num_warps": 4})
        print(f"{kernel.__name__} {constants}: {len(compiled.asm['cubin'])} bytes of sm_{capability} code", flush=True)


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
    """ms per layer call of the cache write and SDPA (`sdpa_write_attention`) and of `attention` (both in one
    kernel) at every tile config, and their largest difference from float32 SDPA, at Qwen3-8B's shape (8 key/value
    heads x 4 query rows of 128). kv_MB counts the whole cache; the kernel reads it through the step's slot."""
    rows = []
    processors = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, length in ((128, 384), (128, 256), (32, 384), (256, 384), (8, 384), (32, 1024)):
        q, k, v, keys, values, slots, visible = case(batch, 8, 4, 128, length, "cuda", torch.bfloat16)
        inputs = (q, k, v, keys, values, slots, visible, 128**-0.5)
        exact = sdpa_write_attention(q.float(), k.float(), v.float(), keys.float(), values.float(), *inputs[5:])
        mb = 2 * keys.numel() * 2 / 1e6
        ms = timed(sdpa_write_attention, *inputs)
        row = {"batch": batch, "L": length, "kv_MB": round(mb, 1), "sdpa_ms": round(ms, 4), "sdpa_GBs": round(mb / ms),
               "sdpa_err": float((sdpa_write_attention(*inputs).float() - exact).abs().max()), "all": []}  # fmt: skip
        for chunk, block, warps, stages in itertools.product((32, 64, 128, 512), (32, 64), (2, 4, 8), (1, 2, 3)):
            if block > chunk or (chunk == 512 and block == 32):
                continue
            tiles = dict(chunk=chunk, block=block, warps=warps, stages=stages)
            err = float((attention(*inputs, **tiles).float() - exact).abs().max())
            row["all"].append({**tiles, "ms": round(timed(attention, *inputs, **tiles), 4), "err": err})
        best = min(row["all"], key=lambda r: r["ms"])
        auto = dict(chunk=split_length(batch * 8, length, processors, TILES["block"]), **TILES)
        auto["ms"] = round(timed(attention, *inputs, **auto), 4)
        row.update(best=best, best_GBs=round(mb / best["ms"]), auto=auto)  # auto: what write_attention takes
        rows.append(row)
        print(json.dumps({x: y for x, y in row.items() if x != "all"}), flush=True)
    with open(out, "w") as f:
        json.dump(rows, f)


def draws(out: str) -> None:
    """ms per draw from float32 logits (B, 151,936), eager (`eager_sample`) and fused (`fused_sample.draw`), as the
    decoder calls them between two graph replays: 50 calls between two CUDA events after 3 warm-up calls."""
    rows = []
    for batch in (8, 32, 128, 256):
        logits = torch.randn(batch, 151_936, device="cuda") * 4
        row = {"batch": batch}
        for name, fn, args in (("eager", eager_sample, (1.0, 0, 1.0, False)), ("fused", fused_sample.draw, (1.0,))):
            for _ in range(3):
                fn(logits, *args)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(50):
                fn(logits, *args)
            end.record()
            torch.cuda.synchronize()
            row[f"{name}_ms"] = round(start.elapsed_time(end) / 50, 4)
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open(out, "w") as f:
        json.dump(rows, f)


def baseline_attention(path: str):
    """`write_attention` of another commit's flash_decode.py (`git show COMMIT:omnialign/rollout/flash_decode.py >
    FILE`), its operator renamed so that both are registered in one process."""
    text = open(path).read().replace('"omnialign::write_attention"', '"baseline::write_attention"')
    module = types.ModuleType("baseline_flash_decode")
    exec(compile(text, path, "exec"), module.__dict__)
    return module.write_attention


def in_decoder(out: str, batch: int, baseline: str | None) -> None:
    """The compiled decoder at `batch` prompts through SDPA and the eager draw, through `baseline`'s kernels (a
    flash_decode.py of another commit; `baseline_attention`) and the fused draw, then as the code has it (the kernels
    and the fused draw), one process; a row each to `out`."""
    from omnialign.bench.decode import bench_decode

    code = decode.write_decode_attention, decode.sample
    variants = {"sdpa": (sdpa_write_attention, eager_sample)}
    if baseline:
        variants["baseline"] = baseline_attention(baseline), code[1]
    variants["code"] = code
    for name, (attend, draw) in variants.items():
        decode.write_decode_attention, decode.sample = attend, draw
        torch._dynamo.reset()
        rows = bench_decode(decoders=["compiled"], tiny=False, model_size="8b", prompt_len=256, max_new_tokens=128,
                            batch=batch)  # fmt: skip
        decode.write_decode_attention, decode.sample = code
        with open(out, "a") as f:
            for row in rows:
                f.write(json.dumps({"attention": name, "baseline": baseline, "tiles": TILES, **row}) + "\n")
        r = rows[0]
        print(f"== batch {batch} {name}: {r['decode_tokens_per_s']} decode tokens/s, share {r['share_of_bound']}, "
              f"log-prob gap {r['logprob_gap_mean']} / {r['logprob_gap_max']}", flush=True)  # fmt: skip


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    if command == "check":
        check()
    elif command == "compile":
        compile_kernels()
    elif command == "micro":
        micro(args[0])
    elif command == "draw":
        draws(args[0])
    else:
        baseline = args.pop(2) if len(args) > 2 and args[2].endswith(".py") else None
        TILES.update(zip(("block", "warps", "stages"), map(int, args[2:])))
        in_decoder(args[0], int(args[1]), baseline)
