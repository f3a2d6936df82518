"""Reward functions that the reward tests load by path (`tests/reward_fns.py:NAME`) or serve."""

import random
import time

import torch


def mean_pixel(outputs: torch.Tensor, prompts: list[str], metadata: list[dict], offset: float = 0.0) -> list[float]:
    return [float(image.mean()) + offset for image in outputs]


def slow_length(outputs: list[str], prompts: list[str], metadata: list[dict], seconds: float = 0.5) -> list[float]:
    time.sleep(seconds)
    return [float(len(text)) for text in outputs]


def random_scores(outputs, prompts: list[str], metadata: list[dict], seed: int = 0) -> list[float]:
    """Uniform numbers that ignore the outputs: non-zero advantages for update-path tests on random weights."""
    rng = random.Random(seed)
    return [rng.random() for _ in outputs]


def broken(outputs, prompts: list[str], metadata: list[dict]) -> list[float]:
    raise RuntimeError("the judge is down")


def not_finite(outputs, prompts: list[str], metadata: list[dict]) -> list[float]:
    return [float("nan")] * len(prompts)


def beyond_float32(outputs, prompts: list[str], metadata: list[dict]) -> list[float]:
    return [1e39] * len(prompts)  # finite in Python, inf in float32


def strings(outputs, prompts: list[str], metadata: list[dict]) -> list[str]:
    return ["1.0"] * len(prompts)


def bools(outputs, prompts: list[str], metadata: list[dict]) -> list[bool]:
    return [True] * len(prompts)


def too_few(outputs, prompts: list[str], metadata: list[dict]) -> list[float]:
    return [1.0]


def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus: float = 0.0):
    """verl's signature: a float, or a dict with 'score' and extra details."""
    correct = float(solution_str.strip() == ground_truth) + bonus
    if data_source == "detailed":
        return {"score": correct, "length": len(solution_str), "extra": extra_info}
    return correct


PICKY_CALLS: list[int] = []  # the batch size of each call


def picky(outputs: list[str], prompts: list[str], metadata: list[dict]) -> list[float]:
    """Slow, and rejects (ValueError) any batch with a sample whose metadata says 'bad'."""
    PICKY_CALLS.append(len(prompts))
    time.sleep(0.2)
    if any(meta.get("bad") for meta in metadata):
        raise ValueError("metadata 'bad' is set")
    return [float(len(text)) for text in outputs]
