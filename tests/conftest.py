import importlib.util
import os
import shutil

import pytest
import torch

# marker -> (is the external program or package there, why the test skips without it)
EXTERNAL = {
    "tesseract": (shutil.which("tesseract") is not None, "needs the tesseract program: apt-get install tesseract-ocr"),
    "math_verify": (importlib.util.find_spec("math_verify") is not None, "needs math-verify: pip install math-verify"),
}


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run learning checks and other slow tests")


def pytest_collection_modifyitems(config, items):
    skip_slow = pytest.mark.skip(reason="slow: pass --runslow")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    skip_matrix = pytest.mark.skip(reason="a recipe beyond its model's representatives: on a CPU only with --runslow")
    for item in items:
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "matrix" in item.keywords and not (torch.cuda.is_available() or config.getoption("--runslow")):
            item.add_marker(skip_matrix)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
        for marker, (present, reason) in EXTERNAL.items():
            if marker in item.keywords and not present:
                item.add_marker(pytest.mark.skip(reason=reason))


# each pytest-xdist worker gets its share of the cores (2 threads in each of `-n 2` on 2 cores ran 7% slower)
THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", 1))))


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(THREADS)
