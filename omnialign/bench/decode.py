"""`decode`: sampling from a Qwen3 of `--model-size` (random weights, bf16) by each decoder in turn, side by side:
transformers' `generate` with its dynamic cache (the log-prob recorder of the rollout on; its static cache, 6x
slower still, was dropped after the first runs: BENCHMARKS.md), and omnialign's static-cache decoder
(rollout/decode.py) with an eager and a CUDA-graph decode step, and the graph of the step through `torch.compile`
(its first call compiles: the warm-up call, not timed). `--prompts` prompts (the batch, default 128) of
`--prompt-len` random byte tokens, `--max-new-tokens` sampled tokens (temperature 1, no filters; random weights
rarely stop a row, and a call ends only when every row has). Per decoder: seconds of the whole call and of a call
for two tokens (the prefill, the first decode step and, for a graph, its capture, which happens at a call's first
step: `first_two_s`), each the faster of two calls; tokens/s overall and of the decode steps alone ((N - 2) tokens
over the time beyond the two), their share of the memory-bandwidth bound, the largest and mean gap between the
recorded log-probs and the training forward's (`token_logprobs` on the sampled sequences), peak memory. The bound:
every step reads the weights (less the input embedding table, of which it reads B rows) and the keys and values of
the mean context (prompt + (N + 1) / 2) once, at `--bandwidth` TB/s (by default the card's nominal figure,
`NOMINAL_TB_S`; 4.8 for `--tiny`, whose figures check the code, not the speed): B x bandwidth / bytes per step.
`--profile DIR`: then each static decoder of the run (eager, graph, compiled) under the torch profiler
(`bench.profile`) twice, for 2 tokens (the prefill, the capture and the first step; DIR/KEY/tokens_2) and for 18
(DIR/KEY/tokens_18);
their difference over 16 is one decode step's device time by kernel kind and its wall time (DIR/KEY/step.json;
null where the short run took longer, timing noise of a tiny model),
free of the prefill, which dominates a whole call's profile.
"""

import json
import time
from functools import partial
from pathlib import Path

import torch

from omnialign.bench.models import language_policy
from omnialign.bench.profile import profiled

PROFILED = 16  # decode steps under the profiler (`--profile`)
GSPO_CLIP = 3e-4  # choice_gspo's lower clip range: a sequence whose mean log-ratio exceeds it is clipped at once


def training_logprobs(policy, ids: torch.Tensor, out: torch.Tensor, keep: torch.Tensor,
                      head_dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """The training forward's log-probs (B, R) of responses `out` to prompts `ids` (no padding) through the kept
    tokens, 16 sequences at a time; `head_dtype` bfloat16 runs the output head in the network's own dtype instead
    (what the decoders recorded before their head was float32)."""
    parts = []
    with torch.no_grad():
        for lo in range(0, len(ids), 16):
            full = torch.cat([ids[lo : lo + 16], out[lo : lo + 16]], 1)
            mask = torch.cat([torch.ones_like(ids[lo : lo + 16]), keep[lo : lo + 16].long()], 1)
            if head_dtype == torch.float32:
                parts.append(policy.token_logprobs(full, mask, None, ids.shape[1]))
            else:
                logits = policy.transformer(input_ids=full, attention_mask=mask, use_cache=False).logits
                logp = logits[:, ids.shape[1] - 1 : -1].float().log_softmax(-1)
                parts.append(logp.gather(-1, full[:, ids.shape[1] :, None]).squeeze(-1))
    return torch.cat(parts)


def logprob_gaps(reference: torch.Tensor, lp: torch.Tensor, keep: torch.Tensor) -> dict[str, float]:
    """Recorded log-probs `lp` (B, R) against `reference` over the kept tokens: the mean and largest |difference| per
    token, the largest |mean difference| of a sequence (GSPO's log-ratio at the first update) and the share of
    sequences whose mean exceeds GSPO_CLIP."""
    keep = keep.float()
    diff = (reference - lp.float()) * keep
    seq = diff.sum(-1) / keep.sum(-1)
    return {"logprob_gap_mean": round(float(diff.abs().sum() / keep.sum()), 5),
            "logprob_gap_max": round(float(diff.abs().max()), 4), "seq_gap_max": round(float(seq.abs().max()), 5),
            "gspo_clipped": round(float((seq.abs() > GSPO_CLIP).float().mean()), 3)}  # fmt: skip


DECODERS = {
    "transformers": "transformers generate, dynamic cache",
    "eager": "omnialign static cache, eager step",
    "graph": "omnialign static cache, CUDA graph",
    "compiled": "omnialign static cache, compiled step, CUDA graph",
}
"""`--decoders` keys and the names their rows carry."""


NOMINAL_TB_S = {"H200": 4.8, "H100 80GB HBM3": 3.35}
"""Nominal memory bandwidth, TB/s, of the cards the benches ran on, by a part of the CUDA device name."""


def nominal_bandwidth(device: torch.device) -> float:
    """The card's nominal memory bandwidth (TB/s) from `NOMINAL_TB_S`; ValueError for another card."""
    name = torch.cuda.get_device_name(device)
    found = [tb for part, tb in NOMINAL_TB_S.items() if part in name]
    if not found:
        raise ValueError(f"bench decode: no nominal memory bandwidth known for {name!r}: give --bandwidth TB/s")
    return found[0]


def bench_decode(batch: int, tiny: bool, model_size: str, prompt_len: int, max_new_tokens: int,
                 bandwidth: float | None = None, logit_scale: float = 1.0, profile: Path | None = None,
                 decoders: list[str] | None = None) -> list[dict]:  # fmt: skip
    """The `decoders` (keys of DECODERS; default all) side by side on one Qwen3 of `model_size` with random weights
    (bf16; `--tiny`: the tiny twin in float32 on the CPU), the final norm's weight times `logit_scale` (realistic
    logits: random weights give logits of about unit spread, a trained model's spread over tens): see the module
    docstring."""
    from omnialign.rollout import decode

    cuda = torch.cuda.is_available() and not tiny
    device = torch.device("cuda" if cuda else "cpu")
    policy = language_policy("qwen3", "tiny" if tiny else model_size, device, torch.float32 if tiny else torch.bfloat16)
    net = policy.transformer.eval()
    with torch.no_grad():
        net.model.norm.weight.mul_(logit_scale)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (batch, prompt_len), generator=g).to(device)  # byte tokens, no special ones
    mask = torch.ones_like(ids)
    stop, pad = policy.stop_token_ids, policy.pad_token_id
    hf = {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0}

    runs = {
        "transformers": lambda n: policy.generate(ids, mask, None, {**hf, "max_new_tokens": n}),
        "eager": lambda n: decode.generate(net, ids, mask, stop, pad, n, graph=False),
        "graph": lambda n: decode.generate(net, ids, mask, stop, pad, n, graph=cuda),
        "compiled": lambda n: decode.generate(net, ids, mask, stop, pad, n, graph=cuda, compiled=True),
    }
    layers, kv_heads = net.config.num_hidden_layers, net.config.num_key_value_heads
    weights = sum(p.numel() * p.element_size() for p in net.parameters())
    if not net.config.tie_word_embeddings:  # a step reads B rows of the input embedding, not the table
        weights -= net.model.embed_tokens.weight.numel() * net.model.embed_tokens.weight.element_size()
    mean_len = prompt_len + (max_new_tokens + 1) / 2
    kv = 2 * layers * kv_heads * net.config.head_dim * 2 * batch * mean_len  # bf16 keys and values
    bandwidth = bandwidth or (nominal_bandwidth(device) if cuda else 4.8)
    bound = batch * bandwidth * 1e12 / (weights + kv)
    rows = []
    for key in decoders or DECODERS:
        name, run = DECODERS[key], runs[key]

        def timed(n: int, run=run) -> tuple[float, torch.Tensor, torch.Tensor]:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            out, lp = run(n)
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter() - start, out, lp

        torch.manual_seed(0)
        timed(4)  # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        # the faster of two calls each: one short call once took 0.8 s longer than the same prefill in the next
        # decoder's call (an H200, batch 128)
        first = min(timed(2)[0] for _ in range(2))
        total, out, lp = min((timed(max_new_tokens) for _ in range(2)), key=lambda timing: timing[0])
        is_stop = torch.isin(out, torch.tensor(stop, device=out.device)).long()
        keep = is_stop.cumsum(1) - is_stop == 0  # through each row's stop token
        reference = training_logprobs(policy, ids, out, keep)
        gaps = logprob_gaps(reference, lp, keep)
        # None where the two-token run took longer than the whole (timing noise of a tiny model on a busy CPU)
        decode_tps = batch * (out.shape[1] - 2) / (total - first) if total > first else None
        row = {"decoder": name, "model": f"qwen3-{'tiny' if tiny else model_size}", "batch": batch,
               "prompt_len": prompt_len, "new_tokens": out.shape[1], "seconds": round(total, 3),
               "first_two_s": round(first, 3), "tokens_per_s": round(batch * out.shape[1] / total, 1),
               "decode_tokens_per_s": decode_tps and round(decode_tps, 1), "bandwidth_tb_s": bandwidth,
               "bound_tokens_per_s": round(bound, 1),
               "share_of_bound": decode_tps and round(decode_tps / bound, 3), **gaps,
               "peak_alloc_gb": round(torch.cuda.max_memory_allocated() / 2**30, 1) if cuda else None}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    # what a bf16 output head alone adds: the training forward with its head in bf16, on the last decoder's tokens
    bf16_head = training_logprobs(policy, ids, out, keep, torch.bfloat16)
    rows.append({k: None for k in rows[-1]} | {"decoder": "training forward, bf16 head (reference)",
                                               **logprob_gaps(reference, bf16_head, keep)})  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    for key in [k for k in decoders or DECODERS if k != "transformers"] if profile else ():
        summaries = []
        for n in (2, PROFILED + 2):  # the prefill, capture and first step, then PROFILED decode steps more
            summaries.append(profiled(partial(runs[key], n), profile / key / f"tokens_{n}", cuda)[1])
        first, whole = (s["kinds"] for s in summaries)
        per_step = {kind: round((whole[kind]["ms"] - first.get(kind, {"ms": 0.0})["ms"]) / PROFILED, 4)
                    for kind in whole}  # fmt: skip
        step = {"decoder": DECODERS[key], "device_ms_per_step": round(sum(per_step.values()), 4),
                "wall_ms_per_step": round((summaries[1]["wall_ms"] - summaries[0]["wall_ms"]) / PROFILED, 4),
                "kinds_ms_per_step": dict(sorted(per_step.items(), key=lambda kv: -kv[1]))}  # fmt: skip
        if step["device_ms_per_step"] <= 0 or step["wall_ms_per_step"] <= 0:
            # the short run took longer than the whole: a tiny model's kernels timed on a shared GPU or a busy CPU
            # (an H200 beside another process once gave -3.3 ms); no figure rather than a negative one
            step |= {"device_ms_per_step": None, "wall_ms_per_step": None, "kinds_ms_per_step": None}
        (profile / key / "step.json").write_text(json.dumps(step, indent=2))
        print(key, json.dumps(step), flush=True)
    return rows
