"""`--profile DIR`: the torch profiler over a bench's last measured step, for finding where a step's time goes before
changing anything (issue 32: profile first, then fix what the profile shows).

    omnialign bench recipe --recipe flux_ocr_flowgrpo_lora --prompts 2 --steps 2 --profile runs/profile/flux

writes DIR/trace.json.gz (open it in https://ui.perfetto.dev or chrome://tracing; the trainer's phases show as
named ranges) and DIR/kernels.json: the step's device time (CUDA kernels; CPU operators where there is no GPU) by
kind (`KINDS`: matmul, attention, normalisation, fused Triton, copies and casts, reductions, elementwise, other),
each with its milliseconds and share, the busy share of the step's wall time (the rest is the device waiting on the
host: launches, syncs, Python), and the 25 costliest kernels. A trace holds every kernel launch, so profile a small
step (`--prompts 1` or 2): a full-size step of a minute makes a trace of gigabytes.
"""

import gzip
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# (kind, substrings of a kernel's or operator's lower-cased name), first match wins: attention before matmul (flash
# kernels run matmuls inside), Triton before the rest (a fused kernel is named after what it fuses)
KINDS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn")),
    ("triton", ("triton",)),
    (
        "matmul",
        ("gemm", "gemv", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm", "matmul"),
    ),
    ("norm", ("norm",)),
    ("copy/cast", ("copy", "memcpy", "memset", "aten::to", "aten::cat", "fill")),
    ("reduce", ("reduce", "aten::sum", "aten::mean", "softmax")),
    ("elementwise", ("elementwise", "aten::mul", "aten::add", "aten::sub", "aten::div", "silu", "gelu", "aten::exp")),
)


def kind(name: str) -> str:
    """The kind (`KINDS`) of a kernel or operator name."""
    lower = name.lower()
    return next((k for k, keys in KINDS if any(s in lower for s in keys)), "other")


def summarise(events: list[tuple[str, float]], wall_ms: float) -> dict:
    """Device time by kind of (name, self milliseconds) events over a step of `wall_ms`: {wall_ms, device_ms,
    busy_share, kinds: {kind: {ms, share}} costliest first, top: the 25 costliest names with their kind}."""
    total = sum(ms for _, ms in events)
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for name, ms in events:
        by_kind[kind(name)] = by_kind.get(kind(name), 0.0) + ms
        by_name[name] = by_name.get(name, 0.0) + ms
    kinds = {k: {"ms": round(ms, 3), "share": round(ms / total, 4)}
             for k, ms in sorted(by_kind.items(), key=lambda kv: -kv[1])}  # fmt: skip
    top = [{"name": n[:200], "kind": kind(n), "ms": round(ms, 3)}
           for n, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:25]]  # fmt: skip
    return {"wall_ms": round(wall_ms, 1), "device_ms": round(total, 1), "busy_share": round(total / wall_ms, 4),
            "kinds": kinds, "top": top}  # fmt: skip


def profiled(step: Callable[[], object], out: Path, cuda: bool) -> tuple[object, dict]:
    """Run `step()` under the profiler; write `out`/trace.json.gz and `out`/kernels.json (see the module docstring)
    and return (what the step returned, that summary). `cuda`: the step runs on the GPU, so its CUDA kernels are
    counted; otherwise its CPU operators (a tiny model on the CPU of a GPU machine launches no kernels)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        result = step()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    out.mkdir(parents=True, exist_ok=True)
    if cuda:  # the kernels themselves, not the ranges around them (record_function shows on the GPU's timeline too)
        events = [(e.name, e.device_time_total / 1e3) for e in prof.events()
                  if e.device_type == DeviceType.CUDA and not e.is_user_annotation]  # fmt: skip
    else:  # operators by their self time (nested ones not counted twice), the trainer's phase ranges left out
        events = [(e.key, e.self_cpu_time_total / 1e3) for e in prof.key_averages()
                  if e.self_cpu_time_total > 0 and not e.key.startswith("phase/")]  # fmt: skip
    summary = {"device": torch.cuda.get_device_name() if cuda else "cpu", **summarise(events, wall_ms)}
    (out / "kernels.json").write_text(json.dumps(summary, indent=2))
    prof.export_chrome_trace(str(out / "trace.json"))
    with open(out / "trace.json", "rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (out / "trace.json").unlink()
    return result, summary
