"""The seed-sweep benchmark (issue 29; BENCHMARKS.md, "Learning on every seed"): `benchmarks/glyphs_seeds.sh` runs
real debug trainings and `benchmarks/glyphs_seeds.py` summarises them; the collapse rule and the time to gold are
checked on validation curves written by hand."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
spec = importlib.util.spec_from_file_location("glyphs_seeds", ROOT / "benchmarks" / "glyphs_seeds.py")
glyphs_seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(glyphs_seeds)


def sweep(out: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "JOBS": "2", "CUDA_VISIBLE_DEVICES": ""}
    cmd = ["bash", "benchmarks/glyphs_seeds.sh", str(out), "3", "2", "debug"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def debug_sweep(tmp_path_factory) -> Path:
    """Two seeds of the debug recipe, three steps each, through the script."""
    out = tmp_path_factory.mktemp("sweep")
    done = sweep(out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(done.stdout.split("\n")[:2]) == ["done debug seed 0", "done debug seed 1"], done.stdout
    return out


def test_the_script_trains_every_seed_and_summarises_them(debug_sweep):
    row = json.loads((debug_sweep / "seeds.json").read_text())["debug"]
    assert row["seeds"] == [0, 1] and row["steps"] == 3
    for seed in (0, 1):
        run = debug_sweep / "runs" / f"debug_s{seed}"
        assert (run / "summary.json").exists() and (run / "samples" / "step_000003.png").exists()
        val = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        val = [r for r in val if "val/gold/accuracy" in r]
        assert [r["step"] for r in val] == [0, 3]
        assert row["gold_final"][seed] == val[-1]["val/gold/accuracy"]
        assert row["gold_base"] == val[0]["val/gold/accuracy"]
    assert (debug_sweep / "seeds.png").exists()


def test_a_finished_run_is_skipped_when_the_sweep_runs_again(debug_sweep):
    before = (debug_sweep / "runs" / "debug_s0" / "metrics.jsonl").read_text()
    again = sweep(debug_sweep)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already done debug seed 0" in again.stdout and "already done debug seed 1" in again.stdout
    assert (debug_sweep / "runs" / "debug_s0" / "metrics.jsonl").read_text() == before


def test_the_collapse_rule_counts_falls_after_step_50_only():
    def curve(points):
        return [{"step": step, "val/reward/mean": reward} for step, reward in points]

    # a fall of 0.3 at step 20 does not count; after step 50: 0.95 -> 0.85 -> 0.78, a fall of 0.17
    assert glyphs_seeds.max_drop(curve([(0, 0.5), (10, 0.9), (20, 0.6), (60, 0.95), (70, 0.85), (80, 0.78)])) == (
        pytest.approx(0.17)
    )
    # the running maximum counts the steps before 50, the fall at step 50 itself does not
    assert glyphs_seeds.max_drop(curve([(0, 0.5), (40, 0.9), (50, 0.5), (60, 0.8)])) == pytest.approx(0.1)


def test_a_collapsed_seed_and_the_time_to_gold_are_counted(debug_sweep, tmp_path):
    """Two runs whose validation curves are written by hand, with the debug run's config: one falls 0.2 below its best
    after step 50 (collapsed), one reaches gold 0.9 at step 60."""
    curves = {
        0: [(0, 0.5, 0.4), (60, 0.9, 0.8), (100, 0.7, 0.6)],
        1: [(0, 0.5, 0.4), (60, 0.85, 0.92), (100, 0.9, 1.0)],
    }
    for seed, points in curves.items():
        run = tmp_path / "runs" / f"toy_s{seed}"
        run.mkdir(parents=True)
        shutil.copy(debug_sweep / "runs" / "debug_s0" / "config.json", run / "config.json")
        records = [{"step": step, "val/reward/mean": reward, "val/gold/accuracy": gold, "val/gold/not_a_digit": 0.0}
                   for step, reward, gold in points]  # fmt: skip
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    row = glyphs_seeds.summarise(tmp_path)["toy"]
    assert row["collapsed"] == 1 and row["max_drop"] == [0.2, 0.0]
    assert row["steps_to_gold_0.9"] == [None, 60]
    config = json.loads((debug_sweep / "runs" / "debug_s0" / "config.json").read_text())
    assert row["images_to_gold_0.9"] == [None, 60 * config["data"]["prompts_per_step"] * config["rollout"]["n"]]
    assert row["gold_base"] == 0.4 and row["gold_final"] == [0.6, 1.0] and row["steps"] == 100


def test_the_shipped_table_prints_without_being_rewritten(debug_sweep, tmp_path):
    shipped = tmp_path / "seeds.json"
    shutil.copy(debug_sweep / "seeds.json", shipped)
    before = shipped.read_text()
    cmd = [sys.executable, "benchmarks/glyphs_seeds.py", "--into", str(shipped)]
    printed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    row = json.loads(before)["debug"]
    least = min(row["gold_final"]) - row["gold_base"]
    assert f"| debug | 2 | {row['gold_base']:.3f} |" in printed.stdout and f"| {least:+.3f} |" in printed.stdout
    assert shipped.read_text() == before


def test_every_glyphs_recipe_in_the_shipped_table_meets_issue_29s_bar():
    """README's learning claims rest on benchmarks/glyphs/seeds.json: every recipe of the world at least 5 seeds x 300
    steps, none collapsed, every seed's final gold at least 0.25 above the base."""
    from omnialign.worlds.glyphs.recipes import RECIPES

    table = json.loads((ROOT / "benchmarks" / "glyphs" / "seeds.json").read_text())
    swept = set(RECIPES) - {"debug", "glyphs_flowgrpo"}  # glyphs_flowgrpo is glyphs under its algorithm's name
    assert swept <= table.keys(), sorted(swept - table.keys())
    for recipe in sorted(swept):
        row = table[recipe]
        gains = [g - row["gold_base"] for g in row["gold_final"]]
        assert len(row["seeds"]) >= 5 and row["steps"] >= 300 and row["collapsed"] == 0, (recipe, row["seeds"])
        assert min(gains) >= 0.25, (recipe, [round(gain, 3) for gain in gains])
