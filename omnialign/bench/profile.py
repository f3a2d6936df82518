"""`--profile DIR`: the torch profiler over a bench's last measured step, for finding where a step's time goes before
changing anything (issue 32: profile first, then fix what the profile shows).

    omnialign bench recipe --recipe flux_ocr_flowgrpo_lora --prompts 2 --steps 2 --profile runs/profile/flux

writes DIR/trace.json.gz (open it in https://ui.perfetto.dev or chrome://tracing; the trainer's phases show as
named ranges) and DIR/kernels.json: the step's device time (CUDA kernels; CPU operators where there is no GPU) by
kind (`KINDS`: matmul, attention, normalisation, fused Triton, copies and casts, reductions, elementwise, other),
each with its milliseconds and share, the busy share of the step's wall time (the rest is the device waiting on the
host: launches, syncs, Python), the 25 costliest kernels, under `phases` the same by trainer phase (rollout,
update, ...), and on a GPU under `waits` (the step's and each phase's) the device's idle gaps between kernels summed
by the kernel each gap ends at: what the device waited to start (a host-to-device copy after a sync, the first
kernel after host work), and by the host operators that launched it (`launchers`). A trace holds every kernel
launch, so profile a small step (`--prompts 1` or 2): a full-size step of a minute makes a trace of gigabytes.
"""

import gzip
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent
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
    kinds = {k: {"ms": round(ms, 3), "share": round(ms / total, 4) if total else 0.0}
             for k, ms in sorted(by_kind.items(), key=lambda kv: -kv[1])}  # fmt: skip
    top = [{"name": n[:200], "kind": kind(n), "ms": round(ms, 3)}
           for n, ms in sorted(by_name.items(), key=lambda kv: -kv[1])[:25]]  # fmt: skip
    return {"wall_ms": round(wall_ms, 1), "device_ms": round(total, 1), "busy_share": round(total / wall_ms, 4),
            "kinds": kinds, "top": top}  # fmt: skip


def by_phase(
    events: list[tuple[str, float, float]], phases: list[tuple[str, float, float]], timeline: bool = False
) -> dict:
    """The trainer's phases one by one: events (name, start in us, self milliseconds, ...) counted in the phase range
    (name, start us, end us) that holds their start -> {phase: {wall_ms (the range's length on the timeline
    counted), device_ms, busy_share, kinds}} in the order the phases ran (a phase in several ranges: their sums).
    `timeline`: the events are a device's kernels (`gaps`), and each phase gets its `waits` too (the gaps inside its
    ranges)."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for name, start, end in sorted(phases, key=lambda p: p[1]):
        spans.setdefault(name, []).append((start, end))
    out = {}
    for name, ranges in spans.items():
        parts = [[e for e in events if start <= e[1] < end] for start, end in ranges]
        s = summarise([(e[0], e[2]) for part in parts for e in part], sum(end - start for start, end in ranges) / 1e3)
        out[name] = {k: s[k] for k in ("wall_ms", "device_ms", "busy_share", "kinds")}
        if timeline:
            out[name]["waits"] = waits([g for part in parts for g in gaps(part)])
    return out


def gaps(kernels: list[tuple[str, float, float, str]]) -> list[tuple[str, str, float]]:
    """The device's waits on a timeline of kernels (name, start in us, milliseconds, the host operators that launched
    it): (the name of the kernel a gap ends at, that is what the device waited to start; its launchers; the gap in
    milliseconds), in order. Kernels that overlap (on other streams) close no gap."""
    out, end = [], None
    for name, start, ms, launcher in sorted(kernels, key=lambda k: k[1]):
        if end is not None and start > end:
            out.append((name, launcher, (start - end) / 1e3))
        end = start + ms * 1e3 if end is None else max(end, start + ms * 1e3)
    return out


def waits(pauses: list[tuple[str, str, float]], top: int = 10) -> dict:
    """`gaps`' pauses -> {ms: their sum, count, by_next: their milliseconds and count by the kernel each ends at, and
    by_launcher the same by the host operators that launched that kernel, the `top` largest sums first}."""

    def summed(key: int) -> list[dict]:
        ms, count = Counter(), Counter()
        for pause in pauses:
            ms[pause[key]] += pause[2]
            count[pause[key]] += 1
        return [{"name": n[:200], "ms": round(t, 3), "count": count[n]} for n, t in ms.most_common(top)]

    return {"ms": round(sum(p[2] for p in pauses), 1), "count": len(pauses), "by_next": summed(0),
            "by_launcher": summed(1)}  # fmt: skip


def launchers(op: FunctionEvent | None, depth: int = 3) -> str:
    """The host operators around a kernel's launch, outermost first (`depth` of them, below the trainer's phase
    range): "aten::to > aten::_to_copy > aten::copy_" names the host code a device waited for."""
    names = []
    while op is not None and not op.name.startswith("phase/"):
        names.append(op.name)
        op = op.cpu_parent
    return " > ".join(names[::-1][:depth]) or "?"


def activities() -> list[ProfilerActivity]:
    """What every profile in a process records: the CPU's, and CUDA's wherever there is a GPU, also for a step on its
    CPU: once a process has profiled without CUDA's activity, its later profiles see no kernels
    (pytorch/pytorch#197005)."""
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def profiled(step: Callable[[], object], out: Path, cuda: bool) -> tuple[object, dict]:
    """Run `step()` under the profiler; write `out`/trace.json.gz and `out`/kernels.json (see the module docstring)
    and return (what the step returned, that summary). `cuda`: the step runs on the GPU, so its CUDA kernels are
    counted; otherwise its CPU operators (a tiny model on the CPU of a GPU machine launches no kernels)."""
    with profile(activities=activities()) as prof:
        start = time.perf_counter()
        result = step()
        if cuda:
            torch.cuda.synchronize()
        wall_ms = (time.perf_counter() - start) * 1e3
    out.mkdir(parents=True, exist_ok=True)
    # the kernels themselves, not the ranges around them (record_function shows on the GPU's timeline too; a phase's
    # range there runs from its first kernel to its last); on the CPU operators by their self time (nested ones not
    # counted twice), the trainer's phase ranges left out
    device = DeviceType.CUDA if cuda else DeviceType.CPU
    on_device = [e for e in prof.events() if e.device_type == device]
    # each kernel's launching host operator: the kernel's raw event links to the operator's correlation id (the
    # FunctionEvent of torch < 2.13 does not keep the link), found by (name, start in ns from the trace's start); only
    # the waits read it, and only a GPU's timeline has them
    raw = prof.profiler.kineto_results
    links = {
        (k.name(), k.start_ns() - raw.trace_start_ns()): k.linked_correlation_id()
        for k in (raw.events() if cuda else ())
    }
    ops = {e.id: e for e in prof.events() if e.device_type == DeviceType.CPU and e.kernels}
    events = [(e.name, e.time_range.start, (e.device_time_total if cuda else e.self_cpu_time_total) / 1e3,
               launchers(ops.get(links.get((e.name, round(e.time_range.start * 1e3))))))
              for e in on_device
              if not e.name.startswith("phase/") and not (cuda and e.is_user_annotation)]  # fmt: skip
    phases = [(e.name.removeprefix("phase/"), e.time_range.start, e.time_range.end)
              for e in on_device if e.name.startswith("phase/")]  # fmt: skip
    summary = {"device": torch.cuda.get_device_name() if cuda else "cpu",
               **summarise([(n, ms) for n, _, ms, _ in events], wall_ms),
               "phases": by_phase(events, phases, timeline=cuda)}  # fmt: skip
    if cuda:  # where the device waits, in the step and in each phase (a CPU's operators nest: no gaps to read)
        summary["waits"] = waits(gaps(events))
    (out / "kernels.json").write_text(json.dumps(summary, indent=2))
    prof.export_chrome_trace(str(out / "trace.json"))
    with open(out / "trace.json", "rb") as src, gzip.open(out / "trace.json.gz", "wb") as dst:
        shutil.copyfileobj(src, dst)
    (out / "trace.json").unlink()
    return result, summary
