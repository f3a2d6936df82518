"""A user's own reward from a file: `path/to/file.py:fn` (relative to the working directory).

A function `fn(outputs, prompts, metadata, **options) -> list[float]` is used as it is. A
function whose first parameters are verl's `(data_source, solution_str, ground_truth,
extra_info)` is called once per text sample with `metadata["data_source"]`, the response,
`metadata["ground_truth"]` and `metadata["extra_info"]` (None where absent) and the options as
keywords; as in verl it returns a number, or a dict whose "score" is the reward and whose other
keys go to the sample's info.
"""

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

from omnialign.rewards.base import Outputs, RewardFn, Scores, texts_of

VERL_PARAMETERS = ["data_source", "solution_str", "ground_truth", "extra_info"]


def is_file_spec(name: str) -> bool:
    """Whether a reward name is a `path/to/file.py:fn` spec."""
    path, sep, fn = name.rpartition(":")
    return bool(sep and fn and path.endswith(".py"))


def verl_reward(compute_score: Callable) -> RewardFn:
    """A reward function over lists that calls a verl `compute_score` for each sample."""

    def reward(outputs: Outputs, prompts: list[str], metadata: list[dict], **options) -> Scores:
        values, info = [], []
        for text, meta in zip(texts_of(outputs, compute_score.__name__), metadata, strict=True):
            result = compute_score(meta.get("data_source"), text, meta.get("ground_truth"), meta.get("extra_info"),
                                   **options)  # fmt: skip
            if isinstance(result, dict):
                values.append(float(result["score"]))
                info.append({k: v for k, v in result.items() if k != "score"})
            else:
                values.append(float(result))
                info.append({})
        return Scores(values, info)

    reward.__signature__ = inspect.Signature(  # the options it takes are compute_score's
        list(inspect.signature(reward).parameters.values())[:3]
        + list(inspect.signature(compute_score).parameters.values())[4:]
    )
    return reward


@cache
def load_reward(spec: str) -> RewardFn:
    """The reward function named by `path/to/file.py:fn`, adapted when it has verl's signature."""
    path, _, name = spec.rpartition(":")
    file = Path(path).expanduser().resolve()
    if not is_file_spec(spec) or not file.is_file():
        raise ValueError(f"reward {spec!r}: expected path/to/file.py:function with an existing file (looked at {file})")
    module_name = f"omnialign_user_reward_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    module_spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module
    module_spec.loader.exec_module(module)
    fn = vars(module).get(name)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if inspect.isfunction(v) and v.__module__ == module_name)
        raise ValueError(f"reward {spec!r}: {file} defines no function {name!r}; it defines {found}")
    return verl_reward(fn) if list(inspect.signature(fn).parameters)[:4] == VERL_PARAMETERS else fn
