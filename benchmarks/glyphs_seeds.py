"""Summarise a glyphs seed sweep (benchmarks/glyphs_seeds.sh): per recipe, each seed's gold and reward at the end,
whether it collapsed, and how long it took to reach gold 0.9.

    python benchmarks/glyphs_seeds.py OUT [--into benchmarks/glyphs/seeds.json]
    python benchmarks/glyphs_seeds.py --into benchmarks/glyphs/seeds.json   # prints the shipped table only

reads OUT/runs/RECIPE_sSEED/metrics.jsonl and writes OUT/seeds.json, {recipe: {"seeds", "steps", "gold_base",
"gold_final", "reward_final", "not_a_digit_final", "diversity_final", "collapsed", "max_drop", "steps_to_gold_0.9",
"images_to_gold_0.9", "seconds_to_gold_0.9", "date", "device"}, for video recipes "gold_clip_base",
"gold_clip_final", "gold_steady_base" and "gold_steady_final", and where runs logged it (from 0789767 on)
"gold_person_base" and "gold_person_final" (`val/gold/person`), for edit recipes "gold_kept_*" and "gold_copied_*"}
(lists in seed order), and OUT/seeds.png, the
validation reward and gold accuracy of every recipe (median over seeds, band from min to max). A run has collapsed
if its validation reward falls more than 0.15 below its running maximum after step 50. Seconds count the training
phases of each step (rollout to update; validation and saving left out) as measured with the sweep's runs sharing
the card. `--into FILE` merges the recipes of this sweep into FILE (the other recipes there stay). Prints a table.

Seconds measured with many runs sharing a card depend on what shares it, so the wall-clock comparison takes each
recipe's step time from runs made one at a time (`JOBS=1 benchmarks/glyphs_seeds.sh ALONE 20 1`):

    python benchmarks/glyphs_seeds.py [OUT] --alone ALONE [--into benchmarks/glyphs/seeds.json]

adds "step_seconds_alone" (the median step of the run alone, its first two steps left out) and
"gpu_seconds_to_gold_0.9" (steps to gold 0.9 x that) to each recipe of OUT's sweep, or without OUT to those
already in the --into file.
"""

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from omnialign.config import from_dict, images_per_sample
from omnialign.metrics import read_metrics

DROP, AFTER, GOLD = 0.15, 50, 0.9
STEP_PHASES = ("rollout", "reward_wait", "advantage", "old_log_probs", "update")


def max_drop(records: list[dict]) -> float:
    """The largest fall of the validation reward below its running maximum at a step after `AFTER`."""
    best, drop = float("-inf"), 0.0
    for r in records:
        if "val/reward/mean" not in r:
            continue
        if r["step"] > AFTER:
            drop = max(drop, best - r["val/reward/mean"])
        best = max(best, r["val/reward/mean"])
    return drop


def to_gold(records: list[dict], images_per_step: int) -> tuple[int | None, int | None, float | None]:
    """(step, images generated, training seconds) at the first validation whose gold accuracy is at least GOLD;
    Nones if none is."""
    seconds = 0.0
    for r in records:
        seconds += sum(r.get(f"timing/{p}", 0.0) for p in STEP_PHASES)
        if r.get("val/gold/accuracy", 0.0) >= GOLD:
            return r["step"], r["step"] * images_per_step, round(seconds, 1)
    return None, None, None


def summarise(out: Path) -> dict[str, dict]:
    runs = defaultdict(dict)
    for path in sorted(out.glob("runs/*_s*/metrics.jsonl")):
        recipe, seed = path.parent.name.rsplit("_s", 1)
        runs[recipe][int(seed)] = path.parent
    table = {}
    for recipe, seeds in sorted(runs.items()):
        entry = defaultdict(list)
        for seed, run in sorted(seeds.items()):
            config = from_dict(json.loads((run / "config.json").read_text()))
            records = read_metrics(run / "metrics.jsonl")
            val = [r for r in records if "val/gold/accuracy" in r]
            images = config.data.prompts_per_step * config.rollout.n * images_per_sample(config)
            step, count, seconds = to_gold(records, images)
            entry["seeds"].append(seed)
            entry["steps"].append(val[-1]["step"])
            entry["gold_base"].append(val[0]["val/gold/accuracy"])
            entry["gold_final"].append(val[-1]["val/gold/accuracy"])
            entry["reward_final"].append(val[-1]["val/reward/mean"])
            entry["not_a_digit_final"].append(val[-1]["val/gold/not_a_digit"])
            entry["diversity_final"].append(val[-1].get("val/diversity"))
            for key in ("clip", "steady", "person", "kept", "copied"):  # video's whole-clip gold and temporal check;
                # the person judge; the edit task's place kept and source digit copied
                if f"val/gold/{key}" in val[-1]:
                    entry[f"gold_{key}_base"].append(val[0][f"val/gold/{key}"])
                    entry[f"gold_{key}_final"].append(val[-1][f"val/gold/{key}"])
            entry["max_drop"].append(round(max_drop(records), 4))
            entry["steps_to_gold_0.9"].append(step)
            entry["images_to_gold_0.9"].append(count)
            entry["seconds_to_gold_0.9"].append(seconds)
        entry = dict(entry)
        entry["collapsed"] = sum(d > DROP for d in entry["max_drop"])
        for key in [k for k in entry if k.endswith("_base")]:
            (entry[key],) = set(entry[key])  # the same base model and validation seeds in every run
        steps = sorted(set(entry["steps"]))
        entry["steps"] = steps[0] if len(steps) == 1 else steps
        meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
        table[recipe] = {**entry, **meta}
    return table


def step_seconds(alone: Path) -> dict[str, float]:
    """Each recipe's median step seconds (STEP_PHASES) in the runs under `alone`, its first two steps left out."""
    times = {}
    for path in sorted(alone.glob("runs/*_s*/metrics.jsonl")):
        steps = [r for r in read_metrics(path) if "timing/update" in r][2:]
        times[path.parent.name.rsplit("_s", 1)[0]] = statistics.median(
            sum(r.get(f"timing/{p}", 0.0) for p in STEP_PHASES) for r in steps
        )
    return times


def add_step_times(table: dict[str, dict], times: dict[str, float]) -> None:
    for recipe in table.keys() & times.keys():
        entry, seconds = table[recipe], times[recipe]
        entry["step_seconds_alone"] = round(seconds, 4)
        entry["gpu_seconds_to_gold_0.9"] = [None if s is None else round(s * seconds, 1)
                                            for s in entry["steps_to_gold_0.9"]]  # fmt: skip


def spread(values: list[float | None]) -> str:
    """median [min, max] of the numbers (a count of the missing ones after them)."""
    numbers = [v for v in values if v is not None]
    missing = f" ({len(values) - len(numbers)} never)" if len(numbers) < len(values) else ""
    if not numbers:
        return "never"
    return f"{statistics.median(numbers):.3g} [{min(numbers):.3g}, {max(numbers):.3g}]{missing}"


def plot(out: Path, table: dict[str, dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(table), 2, figsize=(9, 2.2 * len(table)), squeeze=False, sharex=True)
    for row, recipe in zip(axes, table):
        curves = [read_metrics(out / "runs" / f"{recipe}_s{s}" / "metrics.jsonl") for s in table[recipe]["seeds"]]
        for ax, key, title in zip(row, ("val/reward/mean", "val/gold/accuracy"), ("reward", "gold accuracy")):
            series = [{r["step"]: r[key] for r in c if key in r} for c in curves]
            steps = sorted(set.intersection(*(set(s) for s in series)))
            values = [[s[t] for s in series] for t in steps]
            ax.fill_between(steps, [min(v) for v in values], [max(v) for v in values], alpha=0.3)
            ax.plot(steps, [statistics.median(v) for v in values])
            ax.set_ylim(0, 1.02)
            ax.set_title(f"{recipe}: {title} ({len(series)} seeds)", fontsize=9)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(out / "seeds.png", dpi=80)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, nargs="?", help="a sweep's folder (glyphs_seeds.sh OUT)")
    parser.add_argument("--into", type=Path, help="merge this sweep's recipes into this seeds.json")
    parser.add_argument("--alone", type=Path, help="a sweep run one recipe at a time, for the step seconds")
    args = parser.parse_args()
    merged = json.loads(args.into.read_text()) if args.into and args.into.exists() else {}
    if args.out:
        table = summarise(args.out)
        if args.alone:
            add_step_times(table, step_seconds(args.alone))
        (args.out / "seeds.json").write_text(json.dumps(table, indent=1))
        plot(args.out, table)
    elif args.into:
        table = {k: v for k, v in merged.items() if isinstance(v, dict)}
        if args.alone:
            add_step_times(table, step_seconds(args.alone))
    else:
        parser.error("give a sweep's folder OUT, or --into FILE (with --alone to add step times; alone to print it)")
    if args.into and (args.out or args.alone):
        args.into.write_text(json.dumps({**merged, **table}, indent=1))
    print(
        "| recipe | seeds | gold base | gold final | least gain | reward final | not a digit | diversity | collapsed | "
        "steps to gold 0.9 | images to gold 0.9 | step s alone | GPU s to gold 0.9 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for recipe, e in table.items():
        print(f"| {recipe} | {len(e['seeds'])} | {e['gold_base']:.3f} | {spread(e['gold_final'])} | "
              f"{min(e['gold_final']) - e['gold_base']:+.3f} | {spread(e['reward_final'])} | "
              f"{spread(e['not_a_digit_final'])} | "
              f"{spread(e.get('diversity_final', [None]))} | {e['collapsed']} | "
              f"{spread(e['steps_to_gold_0.9'])} | {spread(e['images_to_gold_0.9'])} | "
              f"{e.get('step_seconds_alone', '')} | "
              f"{spread(e.get('gpu_seconds_to_gold_0.9', [None]))} |")  # fmt: skip


if __name__ == "__main__":
    main()
