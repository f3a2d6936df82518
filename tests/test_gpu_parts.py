"""The GPU tier's phase 2 runs in four named parts (`make test-gpu-2 PART=...`, the Makefile's PART_* lines) on
machines that limit a command's time: together they must select every test marked `gpu`, or a new GPU test would
never run in the tier, and each test once, or it would run twice."""

import itertools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_makefile_parts_select_every_gpu_test_once():
    parts = dict(re.findall(r"^PART_(\w+) = (.+)$", (ROOT / "Makefile").read_text(), re.M))
    assert set(parts) == {"cuda", "sd35", "qwen_flux", "flux2"}, parts
    # only the files that can hold a GPU test (every way of marking one spells `mark.gpu`): collecting all took 20 s
    files = [p for p in sorted((ROOT / "tests").glob("test_*.py")) if "mark.gpu" in p.read_text()]
    assert ROOT / "tests" / "test_gpu.py" in files, files
    left = "not (" + " or ".join(f"({k})" for k in parts.values()) + ")"
    twice = " or ".join(f"(({a}) and ({b}))" for a, b in itertools.combinations(parts.values(), 2))
    for expression in (left, twice):  # no part selects it; two parts select it (it would run twice)
        out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-m",
                              "gpu", "-k", expression, *files], cwd=ROOT, capture_output=True, text=True)  # fmt: skip
        found = [line for line in out.stdout.splitlines() if "::" in line]
        assert out.returncode == 5 and not found, out.stdout[-3000:]  # 5: pytest collected no test
