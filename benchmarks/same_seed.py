"""Same config, same seed, two runs at once: are their metrics.jsonl equal, and what does trainer.deterministic cost?

For each recipe and each value of trainer.deterministic, starts two `omnialign train` processes together (on one
GPU they share the card, each running beside the other) and compares their metrics.jsonl without the timing/*
entries: identical, or the first step where they differ and by how much. The step time is the median over steps
2..N of the sum of a step's phases (validation and saving left out), per run.

    python benchmarks/same_seed.py OUT STEPS RECIPE [RECIPE ...] [--set KEY=VALUE ...]

Prints a table last and writes OUT/same_seed.json.
"""

import json
import statistics
import subprocess
import sys
from pathlib import Path

from omnialign.metrics import read_metrics, without_timing


def first_difference(a: list[dict], b: list[dict]) -> tuple[int | None, str, float]:
    """(step, key, |difference|) of the first differing entry of two runs' records; (None, "", 0) if equal."""
    for ra, rb in zip(a, b):
        for key in sorted(set(ra) | set(rb)):
            if ra.get(key) != rb.get(key):
                return ra["step"], key, abs((ra.get(key) or 0) - (rb.get(key) or 0))
    return (None, "", 0.0) if len(a) == len(b) else (min(len(a), len(b)), "missing steps", 0.0)


def step_seconds(records: list[dict]) -> float:
    times = [sum(v for k, v in r.items() if k.startswith("timing/") and k not in ("timing/validate", "timing/save"))
             for r in records if r["step"] >= 2]  # fmt: skip
    return statistics.median(times)


def main() -> None:
    args = sys.argv[1:]
    sets = args[args.index("--set") + 1 :] if "--set" in args else []
    args = args[: args.index("--set")] if "--set" in args else args
    out, steps, recipes = Path(args[0]), int(args[1]), args[2:]
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for recipe in recipes:
        for deterministic in ("false", "true"):
            names = [f"{recipe}_det-{deterministic}_{copy}" for copy in "ab"]
            procs = [subprocess.Popen([sys.executable, "-m", "omnialign", "train", recipe, f"name={name}",
                                       f"trainer.output_dir={out}", f"trainer.total_steps={steps}",
                                       f"trainer.deterministic={deterministic}", "trainer.progress=false", *sets],
                                      stdout=subprocess.DEVNULL, stderr=open(out / f"{name}.log", "w"))
                     for name in names]  # fmt: skip
            codes = [p.wait() for p in procs]
            row = {"recipe": recipe, "deterministic": deterministic == "true", "exit": codes}
            if codes == [0, 0]:
                runs = [read_metrics(out / name / "metrics.jsonl") for name in names]
                step, key, gap = first_difference(*(without_timing(r) for r in runs))
                row.update(identical=step is None, first_diff_step=step, first_diff_key=key, first_diff=gap,
                           step_s=[round(step_seconds(r), 3) for r in runs],
                           val_reward=[r[-1].get("val/reward/mean") for r in runs],
                           gold=[r[-1].get("val/gold/accuracy") for r in runs])  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    (out / "same_seed.json").write_text(json.dumps(rows, indent=2))
    print("recipe | deterministic | identical | first differing step (key, |diff|) | step s (a, b) | val reward | gold")
    for r in rows:
        print(f"{r['recipe']} | {r['deterministic']} | {r.get('identical')} | {r.get('first_diff_step')} "
              f"({r.get('first_diff_key')}, {r.get('first_diff', 0):.2e}) | {r.get('step_s')} | {r.get('val_reward')} "
              f"| {r.get('gold')}")  # fmt: skip


if __name__ == "__main__":
    main()
