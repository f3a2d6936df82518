"""Two candidates beside the code of 7975e9e (issue 32, goal 3; the fifty-seventh session's experiment, not adopted):
the decode attention flattened, `flat` of flash_decode_flat.py beside it (whole (row, head) pairs dealt to as many
programs as the card holds, their blocks one loop), and the draw with one Philox call for four entries
(fused_sample_4x.py). Run from the repository root, the candidates' paths relative to this file:

    TRITON_INTERPRET=1 python benchmarks/decode_h100_7975e9e/candidates/flat_bench.py check  # equal to SDPA (CPU)
    python .../flat_bench.py draw                    # ms per draw at batch 128 and 256, the code's and the candidate's
    python .../flat_bench.py micro OUT.json          # ms per layer call, the code's and every `flat` config (GPU)
    python .../flat_bench.py decode OUT.jsonl 128 MICRO.json  # the compiled decoder through `flat` with MICRO.json's
                                                              # best config at 128 x 320, then the code (GPU)
"""

import importlib.util
import itertools
import json
import os
import sys

import torch

sys.path.insert(0, "benchmarks")
HERE = os.path.dirname(os.path.abspath(__file__))
from decode_splitkv import case, sdpa_write_attention, timed  # noqa: E402

from omnialign.rollout import fused_sample  # noqa: E402
from omnialign.rollout.decode import decode_attention  # noqa: E402
from omnialign.rollout.flash_decode import TILES, attention, split_length  # noqa: E402


def candidate(name: str):
    spec = importlib.util.spec_from_file_location(name, f"{HERE}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


mod, draw4x = candidate("flash_decode_flat"), candidate("fused_sample_4x")


def candidate_draw(logits: torch.Tensor, temperature: float, chunk: int | None = None):
    """`fused_sample.draw` with the candidate's `_partial`."""
    code, fused_sample._partial = fused_sample._partial, draw4x._partial
    try:
        return fused_sample.draw(logits, temperature, chunk)
    finally:
        fused_sample._partial = code


def check():
    for length, programs, block in ((150, 1, 32), (150, 4, 32), (130, 5, 64), (64, 7, 64), (150, 100, 32)):
        q, k, v, keys, values, slots, visible = case(3, 2, 4, 128, length, "cpu", torch.float32)
        written = keys.clone(), values.clone()
        expected = sdpa_write_attention(q, k, v, *written, slots, visible, 128**-0.5)
        out = mod.flat(q, k, v, keys, values, slots, visible, 128**-0.5, programs, block, 2, 2)
        err = (out - expected).abs().max().item()
        print(f"L={length} programs={programs} block={block}: {err:.2e}", flush=True)
        assert err < 1e-5 and torch.equal(keys, written[0]) and torch.equal(values, written[1]), err
        unmasked = mod.flat(q, k, v, keys, values, slots, visible | True, 128**-0.5, programs, block, 2, 2)
        reached = (torch.arange(length) <= slots)[None, None, None]
        assert torch.allclose(unmasked, decode_attention(q, keys, values, reached, 128**-0.5), atol=1e-5)
    few = torch.full((4000, 6), -30.0)  # the candidate draw: softmax(0, 1, 2) and its log-probs
    few[:, :3] = torch.tensor([0.0, 1.0, 2.0])
    tokens, logps = candidate_draw(few, 1.0, fused_sample.BLOCK)
    print("draws", (torch.bincount(tokens, minlength=6) / len(tokens)).tolist(), "of", few[0].softmax(0).tolist())
    assert torch.allclose(logps, few.log_softmax(-1).gather(1, tokens[:, None])[:, 0], atol=1e-6)
    logits = torch.randn(3, 5000) * 2
    torch.manual_seed(5)
    once = candidate_draw(logits, 0.7, fused_sample.BLOCK)[0]
    torch.manual_seed(5)
    assert torch.equal(candidate_draw(logits, 0.7, 2 * fused_sample.BLOCK)[0], once)  # whatever the splits
    print("ok")


def micro(out):
    rows = []
    processors = torch.cuda.get_device_properties(0).multi_processor_count
    for batch, length in ((128, 320), (128, 272), (256, 384)):
        q, k, v, keys, values, slots, visible = case(batch, 8, 4, 128, length, "cuda", torch.bfloat16)
        inputs = (q, k, v, keys, values, slots, visible, 128**-0.5)
        exact = sdpa_write_attention(q.float(), k.float(), v.float(), keys.float(), values.float(), *inputs[5:])
        read_mb = 2 * keys[:, :, : int(slots) + 1].numel() * 2 / 1e6
        chunk = split_length(batch * 8, length, processors, TILES["block"])
        row = {
            "batch": batch,
            "L": length,
            "read_MB": round(read_mb, 1),
            "code_ms": round(timed(attention, *inputs, chunk, **TILES), 4),
        }
        row["code_err"] = float((attention(*inputs, chunk, **TILES).float() - exact).abs().max())
        row["flat"] = []
        for resident, block, warps, stages in itertools.product((3, 4, 6, 8), (64,), (2, 4), (2, 3)):
            tiles = dict(block=block, warps=warps, stages=stages)
            o = mod.flat(*inputs, resident * processors, **tiles)
            err = float((o.float() - exact).abs().max())
            ms = timed(mod.flat, *inputs, resident * processors, **tiles)
            row["flat"].append({"resident": resident, **tiles, "ms": round(ms, 4), "err": err})
        best = min(row["flat"], key=lambda r: r["ms"])
        default = next(r for r in row["flat"] if (r["resident"], r["block"], r["warps"], r["stages"]) == (3, 64, 2, 2))
        row.update(
            best=best,
            default=default,
            code_TBs=round(read_mb / row["code_ms"] / 1e3, 2),
            best_TBs=round(read_mb / best["ms"] / 1e3, 2),
        )
        rows.append(row)
        print(json.dumps({x: y for x, y in row.items() if x != "flat"}), flush=True)
    json.dump(rows, open(out, "w"))


def draw_micro():
    """ms per fused draw at batch 128 and 256: the code's and the four-numbers-a-call candidate's."""
    for batch in (128, 256):
        logits = torch.randn(batch, 151_936, device="cuda") * 4
        print(
            json.dumps(
                {
                    "batch": batch,
                    "code_ms": round(timed(fused_sample.draw, logits, 1.0), 4),
                    "rand4x_ms": round(timed(candidate_draw, logits, 1.0), 4),
                }
            ),
            flush=True,
        )


def in_decoder(out, batch, micro_json):
    """The compiled decoder at `batch`: `flat` with the micro's best config at 128 x 320, then the code's attention,
    one process (no SDPA row)."""
    from omnialign.bench.decode import bench_decode
    from omnialign.rollout import decode

    best = next(r for r in json.load(open(micro_json)) if (r["batch"], r["L"]) == (128, 320))["best"]
    mod.FLAT.update({name: best[name] for name in mod.FLAT})
    print("FLAT =", mod.FLAT, flush=True)
    code = decode.write_decode_attention
    for name, attend in (("flat", mod.write_attention), ("code", code)):
        decode.write_decode_attention = attend
        torch._dynamo.reset()
        rows = bench_decode(
            decoders=["compiled"], tiny=False, model_size="8b", prompt_len=256, max_new_tokens=128, batch=batch
        )
        decode.write_decode_attention = code
        with open(out, "a") as f:
            f.write(json.dumps({"attention": name, **rows[0]}) + "\n")
        r = rows[0]
        print(
            f"== batch {batch} {name}: {r['decode_tokens_per_s']} decode tokens/s, share {r['share_of_bound']}, "
            f"log-prob gap {r['logprob_gap_mean']} / {r['logprob_gap_max']}",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1] == "decode":
        in_decoder(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        {"check": check, "draw": draw_micro}.get(sys.argv[1], lambda: micro(sys.argv[2]))()
