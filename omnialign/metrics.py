"""Metrics sinks (console, JSONL and the trackers of trainer.loggers), phase timing, sample grids and reward curves.

Metric values arrive as tensors and are brought to the host together, once per step.
"""

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from PIL import Image, ImageDraw, ImageFont

from omnialign.config import Config, to_dict
from omnialign.trackers import IDS, SINKS


class Timer:
    """Wall time of named phases; `sync` (e.g. a device synchronize) runs before each reading."""

    def __init__(self, sync: Callable[[], None] = lambda: None):
        self.sync = sync
        self.seconds: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.sync()
        start = time.perf_counter()
        with torch.profiler.record_function(f"phase/{name}"):  # a named range in profiler traces (bench --profile)
            yield
        self.sync()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        out, self.seconds = {f"timing/{k}": v for k, v in self.seconds.items()}, {}
        return out


def to_host(
    metrics: dict[str, torch.Tensor | float],
    reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t,
    device: torch.device | None = None,
) -> dict[str, float]:
    """Scalars of a dict of 0-d tensors and floats: the tensors are stacked on `device`, passed
    through `reduce` (e.g. a mean across ranks) and brought to the host in one copy."""
    keys = [k for k, v in metrics.items() if isinstance(v, torch.Tensor)]
    out = {k: float(v) for k, v in metrics.items() if not isinstance(v, torch.Tensor)}
    if keys:
        device = device or metrics[keys[0]].device
        stacked = torch.stack([metrics[k].detach().float().reshape(()).to(device) for k in keys])
        out.update(zip(keys, reduce(stacked).tolist()))
    return out


def without_timing(records: list[dict]) -> list[dict]:
    """Step records of metrics.jsonl without their timing/* entries: what two runs of one config share bit for bit
    under trainer.deterministic, and a resumed run with an uninterrupted one."""
    return [{k: v for k, v in r.items() if not k.startswith("timing/")} for r in records]


SUMMARY = [
    ("reward/mean", "reward {:.3f}"),
    ("reward/std", "±{:.3f}"),
    ("reward/zero_std_ratio", "zero-std {:.2f}"),
    ("actor/clip_frac", "clip {:.3f}"),
    ("actor/approx_kl", "approx-kl {:.2e}"),
    ("actor/kl", "ref-kl {:.2e}"),
    ("actor/grad_norm", "grad {:.3f}"),
    ("actor/skipped_updates", "SKIPPED {:.0f} non-finite updates"),
    ("rollout/diversity", "div {:.3f}"),
    ("val/reward/mean", "| val {:.3f}"),
    ("val/diversity", "val-div {:.3f}"),
]


def failed_rewards(m: dict[str, float]) -> list[str]:
    """Names of the optional rewards that failed in a step's metrics (training or validation)."""
    return sorted({k.removeprefix("val/").removeprefix("reward/").removesuffix("/failed_chunks")
                   for k, v in m.items() if k.endswith("/failed_chunks") and v})  # fmt: skip


def summary_line(step: int, total: int, m: dict[str, float]) -> str:
    shown = [(k, fmt) for k, fmt in SUMMARY if k in m and (k != "actor/skipped_updates" or m[k])]
    parts = [f"step {step}/{total}"] + [fmt.format(m[k]) for k, fmt in shown]
    failed = failed_rewards(m)
    if failed:
        parts.append(f"OPTIONAL REWARDS FAILED, scored 0: {', '.join(failed)}")
    times = [f"{k.removeprefix('timing/')} {v:.1f}s" for k, v in m.items() if k.startswith("timing/")]
    return " ".join(parts) + (" | " + " ".join(times) if times else "")


class MetricsLog:
    """Appends one JSON object per step to metrics.jsonl, sends the same scalars (and the step's images) to the
    trackers of trainer.loggers, prints a line. A tracker run's id is kept in trackers.json, so that a resumed run
    (whose folder keeps that file) reopens the same tracker run."""

    def __init__(self, run_dir: Path, config: Config):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.total_steps = config.trainer.total_steps
        ids_path = Path(run_dir) / IDS
        ids = json.loads(ids_path.read_text()) if ids_path.exists() else {}
        self.trackers = {name: SINKS[name](Path(run_dir), config.trainer.project, config.name, to_dict(config),
                                           ids.get(name)) for name in config.trainer.loggers}  # fmt: skip
        ids.update({name: t.id for name, t in self.trackers.items() if t.id is not None})
        if ids:
            write_atomic(ids_path, json.dumps(ids, indent=2))

    def log(
        self,
        step: int,
        metrics: dict[str, float],
        echo: Callable[[str], None] = print,
        images: dict[str, Path] | None = None,
    ) -> None:
        """Record a step's scalars (NaN and infinities as null, so that every line is JSON); `images` ({key: PNG
        path}, e.g. the validation grid) go to the trackers."""
        record = {k: v if math.isfinite(v) else None for k, v in metrics.items()}
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, **record}, allow_nan=False) + "\n")
        for name, tracker in list(self.trackers.items()):
            self.guarded(name, "log", partial(tracker.log, step, metrics, images or {}))
        echo(summary_line(step, self.total_steps, metrics))

    def guarded(self, name: str, what: str, call: Callable[[], None]) -> None:
        """Run a tracker's call; a tracker that raises (any error of a third-party library) is switched off with a
        warning, and the run goes on: metrics.jsonl, not a tracker, is the record."""
        try:
            call()
        except Exception as e:  # noqa: BLE001 - a tracker must never take a run down
            del self.trackers[name]
            print(f"WARNING: trainer.loggers: {name} failed to {what} ({type(e).__name__}: {e}); it is switched "
                  "off for the rest of this run, and metrics.jsonl keeps every step")  # fmt: skip

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (a resumed run redoes them), and a last line a crash cut short;
        the file is replaced atomically."""
        if self.path.exists():
            keep = [json.dumps(r) for r in read_metrics(self.path) if r["step"] <= step]
            write_atomic(self.path, "".join(line + "\n" for line in keep))

    def close(self) -> None:
        for name, tracker in list(self.trackers.items()):
            self.guarded(name, "close", tracker.close)


def read_metrics(path: Path) -> list[dict]:
    """The records of a metrics.jsonl. A last line that is not JSON was cut short by a crash and is left out;
    a bad line elsewhere raises ValueError naming the file and the line."""
    lines = Path(path).read_text().splitlines()
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path}:{number} is not a JSON record: {line[:80]!r}") from None
    return records


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` through a temporary file, so a crash leaves the old file or the new one."""
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def grid_path(run_dir: Path, step: int) -> Path:
    """The validation grid of a step: samples/step_XXXXXX.png."""
    return Path(run_dir) / "samples" / f"step_{step:06d}.png"


def save_grid(images: torch.Tensor, captions: list[str], ncols: int, path: Path, scale: int = 2) -> None:
    """A PNG grid of images (N, C, H, W) in [0, 1], each with its caption underneath; videos (N, F, C, H, W) show
    as strips of their frames, left to right, a 1-pixel white line between frames."""
    if images.ndim == 5:
        line = images.new_ones(*images.shape[:1], *images.shape[2:-1], 1)
        images = torch.cat([torch.cat([frame, line], -1) for frame in images.unbind(1)], -1)[..., :-1]
    images = (images.detach().float().clamp(0, 1) * 255).round().byte().cpu()
    n, c, h, w = images.shape
    h, w = h * scale, w * scale
    font = ImageFont.load_default(size=10)
    cap = 12
    nrows = (n + ncols - 1) // ncols
    mode = "L" if c == 1 else "RGB"  # gray images make a gray PNG (57% of the RGB one on 80 glyphs)
    grid = Image.new(mode, (ncols * (w + 4), nrows * (h + cap + 4)), "white")
    draw = ImageDraw.Draw(grid)
    for i, (image, caption) in enumerate(zip(images, captions)):
        pil = Image.fromarray(image.permute(1, 2, 0).squeeze(-1).numpy(), mode).resize((w, h), Image.NEAREST)
        x, y = (i % ncols) * (w + 4) + 2, (i // ncols) * (h + cap + 4) + 2
        grid.paste(pil, (x, y))
        draw.text((x, y + h), caption, fill="black", font=font)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)


def plot_curves(records: list[dict], path: Path) -> None:
    """reward_curve.png: train and validation reward (left axis) and diversity (right) over steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, style in [("reward/mean", "-"), ("val/reward/mean", "o-")]:
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), style, label=key, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    div = [(r["step"], r["val/diversity"]) for r in records if r.get("val/diversity") is not None]
    if div:
        ax2 = ax.twinx()
        ax2.plot(*zip(*div), "s--", color="gray", label="val/diversity", markersize=3)
        ax2.set_ylabel("per-prompt diversity")
        ax2.legend(loc="lower right")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def diversity(images: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """Mean over groups of the mean pairwise RMS distance between the images of one group (0-d)."""
    flat = images.flatten(1).float()
    out = []
    for g in torch.unique(group):
        members = flat[group == g]
        if len(members) > 1:
            d = torch.cdist(members, members) / flat.shape[1] ** 0.5
            out.append(d.sum() / (len(members) * (len(members) - 1)))
    return torch.stack(out).mean() if out else flat.new_zeros(())
