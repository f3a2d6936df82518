"""Rewards: plain functions over lists, their weighted combination, and scoring in the background.

A reward is `fn(outputs, prompts, metadata) -> list[float]` (see `omnialign.rewards.base`):
outputs a float image tensor (B, C, H, W) in [0, 1], a video tensor (B, F, C, H, W) (see
`omnialign.rewards.video`) or B response strings, prompts B strings, metadata B dicts. Add one
by writing such a function and naming it in `REWARDS`, or name its file in the config
(`path/to/file.py:fn`). docs/rewards.md describes each reward and its sign.

`reward.weights` names the rewards of a run: each name is a key of `REWARDS`, a user function
`path/to/file.py:fn`, or a key of `reward.remote` (a reward served by `omnialign serve-reward`);
`reward.options[name]` holds its keyword options. `score` calls each reward, checks its answer
(B finite numbers) and returns `Rewards`: the weighted total, each reward on its own, per-sample
info, and the optional rewards that failed (logged, scored 0). A failing reward not listed in
`reward.optional` raises `RewardError` with its name and the reason, which stops the step.

Overlap with generation (the async API):

    worker = RewardWorker(config.reward)       # resolves and checks the rewards, starts threads
    futures = [worker.submit(images, prompts, metadata) for each chunk, as soon as it is generated]
    results = [future.result() for future in futures]      # a Rewards per chunk
    total = torch.cat([r.total for r in results])
    worker.close()                             # or use `with RewardWorker(...) as worker:`

`submit` returns a `concurrent.futures.Future` at once. In-process rewards run on one worker
thread, chunk after chunk in submission order, under `torch.no_grad`; remote rewards are sent
from a pool of `remote_threads` threads, so several chunks can be at the server at once, where
they are batched. A future resolves to what `score` returns for that chunk, or raises what it
raises. Leave a submitted chunk's tensors unmodified until its future is done.
"""

import inspect
import logging
import math
import numbers
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import torch

from omnialign.config import RewardConfig
from omnialign.rewards.answers import choice, math_answer
from omnialign.rewards.base import Outputs, RewardFn, Scores
from omnialign.rewards.client import RemoteReward
from omnialign.rewards.edit import ocr_edit, pixel_preservation, vlm_edit_following, vlm_edit_preservation
from omnialign.rewards.geneval import geneval
from omnialign.rewards.jpeg import jpeg_compressibility, jpeg_incompressibility
from omnialign.rewards.ocr import ocr, ocr_vlm
from omnialign.rewards.pairwise import pairwise_vlm
from omnialign.rewards.preference import aesthetic, clip_score, hps, image_reward, pickscore
from omnialign.rewards.user import is_file_spec, load_reward
from omnialign.rewards.video import per_frame, temporal_consistency, vlm_video
from omnialign.rewards.vlm import vlm_judge
from omnialign.worlds.glyphs import glyph_gold, glyph_ocr
from omnialign.worlds.glyphs.edit import glyph_edit, glyph_edit_gold
from omnialign.worlds.glyphs.video import glyph_video, glyph_video_gold

__all__ = ["REWARDS", "RewardError", "RewardFn", "RewardWorker", "Rewards", "Scores", "lookup", "resolve", "score"]

REWARDS: dict[str, RewardFn] = {
    "glyph_ocr": glyph_ocr,
    "glyph_gold": glyph_gold,
    "glyph_edit": glyph_edit,
    "glyph_edit_gold": glyph_edit_gold,
    "glyph_video": glyph_video,
    "glyph_video_gold": glyph_video_gold,
    "ocr": ocr,
    "ocr_vlm": ocr_vlm,
    "vlm_judge": vlm_judge,
    "geneval": geneval,
    "clip_score": clip_score,
    "pickscore": pickscore,
    "aesthetic": aesthetic,
    "hps": hps,
    "image_reward": image_reward,
    "pairwise_vlm": pairwise_vlm,
    "vlm_edit_following": vlm_edit_following,
    "vlm_edit_preservation": vlm_edit_preservation,
    "ocr_edit": ocr_edit,
    "pixel_preservation": pixel_preservation,
    "choice": choice,
    "math": math_answer,
    "jpeg_compressibility": jpeg_compressibility,
    "jpeg_incompressibility": jpeg_incompressibility,
    "temporal_consistency": temporal_consistency,
    "vlm_video": vlm_video,
}

CHAT_REWARDS = ("ocr_vlm", "vlm_judge", "geneval", "pairwise_vlm", "vlm_edit_following", "vlm_edit_preservation",
                "vlm_video")  # fmt: skip
"""The rewards of `REWARDS` that ask an OpenAI-compatible endpoint (their `url` option): the trainer checks that
each required one answers before it loads the model."""

log = logging.getLogger(__name__)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


class RewardError(RuntimeError):
    """A required reward failed; the message names it and gives the reason."""


@dataclass
class Rewards:
    total: torch.Tensor  # (B,) float32, the weighted sum
    parts: dict[str, torch.Tensor]  # name -> (B,) float32, each reward on its own (0 where an optional one failed)
    info: list[dict]  # B dicts, {reward name: its info for that sample} for rewards that return Scores
    failed: dict[str, str]  # optional rewards that failed on this call: name -> reason


def lookup(name: str, options: dict | None = None, remote: dict[str, str] | None = None) -> RewardFn:
    """The reward function of a name with its options bound; ValueError naming the fix when it cannot be."""
    options, remote = options or {}, remote or {}
    if name in remote:
        try:
            return RemoteReward(remote[name], **options)
        except TypeError as e:
            raise ValueError(f"reward.options[{name!r}]={options!r} does not fit RemoteReward: {e}") from None
    if name in REWARDS:
        fn = REWARDS[name]
    elif is_file_spec(name):
        fn = load_reward(name)
    else:
        raise ValueError(f"reward {name!r} is not a key of omnialign.rewards.REWARDS {sorted(REWARDS)}, "
                         f"a path/to/file.py:function, or a key of reward.remote {sorted(remote)}")  # fmt: skip
    try:
        inspect.signature(fn).bind(None, None, None, **options)
    except TypeError as e:
        raise ValueError(f"options {options!r} do not fit reward {name}{inspect.signature(fn)}: {e}") from None
    return partial(fn, **options) if options else fn


def resolve(config: RewardConfig) -> dict[str, RewardFn]:
    """Every reward of `reward.weights` as a function; ValueError naming the field and the fix."""
    weights = config.weights
    if not weights:
        raise ValueError('reward.weights is empty; name at least one reward, e.g. reward.weights={"glyph_ocr": 1}')
    named = set(weights) | {config.gold} - {None}
    for field_name, names in (("optional", config.optional), ("options", config.options), ("remote", config.remote),
                              ("per_frame", config.per_frame)):  # fmt: skip
        stray = sorted(set(names) - named)
        if stray:
            raise ValueError(f"reward.{field_name} names {stray}, which neither reward.weights {sorted(weights)} "
                             f"nor reward.gold ({config.gold}) does")  # fmt: skip
    bad = {k: w for k, w in weights.items() if not math.isfinite(w)}
    if bad:
        raise ValueError(f"reward.weights has non-finite weights {bad}")
    return {name: framed(name, config) for name in weights}


def framed(name: str, config: RewardConfig) -> RewardFn:
    """The reward `name` with its options, applied per frame where `reward.per_frame` names it."""
    fn = lookup(name, config.options.get(name), config.remote)
    return per_frame(fn, name, config.per_frame[name]) if name in config.per_frame else fn


def _call(fn: RewardFn, outputs: Outputs, prompts: list[str], metadata: list[dict]) -> Scores | Exception:
    """The reward's checked scores, or the exception that says why there are none."""
    try:
        with torch.no_grad():
            values = fn(outputs, prompts, metadata)
        if len(values) != len(prompts):
            raise ValueError(f"returned {len(values)} scores for {len(prompts)} samples")
        if isinstance(values, torch.Tensor):
            values = values.tolist()  # a bool tensor gives bools, refused below
        wrong = [(i, v) for i, v in enumerate(values) if isinstance(v, bool) or not isinstance(v, numbers.Real)]
        if wrong:
            i, v = wrong[0]
            raise TypeError(f"returned {type(v).__name__} {v!r} for sample {i} ({len(wrong)} such): a reward returns "
                            "numbers (int or float), never strings or bools")  # fmt: skip
        scores = values if isinstance(values, Scores) else Scores(values)
        big = [v for v in scores if not math.isfinite(v) or abs(v) > FLOAT32_MAX]
        if big and isinstance(outputs, torch.Tensor) and not outputs.isfinite().all():
            raise ValueError(f"returned non-finite scores {big[:8]} for outputs that hold non-finite values: the "
                             "policy diverged (look at actor/grad_norm and the loss before this step; lower actor.lr "
                             "or actor.max_grad_norm)")  # fmt: skip
        if big:
            raise ValueError(f"returned non-finite scores (or beyond float32, which training uses) {big[:8]}")
        return scores
    except Exception as e:  # judged in combine: fatal for a required reward, logged for an optional one
        return e


def combine(results: dict[str, Scores | Exception], config: RewardConfig, n: int) -> Rewards:
    """The weighted total of each reward's scores; raises RewardError for a failed required one."""
    parts, info, failed = {}, [{} for _ in range(n)], {}
    for name, result in results.items():
        if isinstance(result, Exception):
            reason = f"{type(result).__name__}: {result}"
            if name not in config.optional:
                raise RewardError(f"required reward {name!r} failed: {reason} "
                                  f"(list it in reward.optional to score 0 instead)") from result  # fmt: skip
            log.warning("optional reward %r failed on %d samples, scoring 0: %s", name, n, reason)
            failed[name], result = reason, Scores([0.0] * n)
        parts[name] = torch.tensor(result, dtype=torch.float32)
        for sample, details in zip(info, result.info):
            if details:
                sample[name] = details
    total = sum(config.weights[name] * part for name, part in parts.items())
    return Rewards(total, parts, info, failed)


def _check_lengths(outputs: Outputs, prompts: list[str], metadata: list[dict]) -> None:
    if not len(outputs) == len(prompts) == len(metadata):
        raise ValueError(f"{len(outputs)} outputs, {len(prompts)} prompts, {len(metadata)} metadata: need equal")


def score(outputs: Outputs, prompts: list[str], metadata: list[dict], config: RewardConfig) -> Rewards:
    """The rewards of `config` on one batch, one after another; see the module docstring."""
    _check_lengths(outputs, prompts, metadata)
    results = {name: _call(fn, outputs, prompts, metadata) for name, fn in resolve(config).items()}
    return combine(results, config, len(prompts))


class RewardWorker:
    """Scores chunks in the background: `submit(outputs, prompts, metadata) -> Future[Rewards]`."""

    def __init__(self, config: RewardConfig, remote_threads: int = 8):
        self.config, self.fns = config, resolve(config)
        gold = config.gold  # the gold judge, scored at validation only (`reward.gold`)
        self.gold = framed(gold, config) if gold else None
        self.local = ThreadPoolExecutor(1, thread_name_prefix="reward")
        self.remote = ThreadPoolExecutor(remote_threads, thread_name_prefix="reward-remote")

    def submit(self, outputs: Outputs, prompts: list[str], metadata: list[dict]) -> Future:
        """Start scoring one chunk; the future resolves to its `Rewards` (or raises `RewardError`)."""
        _check_lengths(outputs, prompts, metadata)
        result: Future = Future()
        lock, left = threading.Lock(), [len(self.fns)]

        def part_done(_: Future) -> None:
            with lock:
                left[0] -= 1
                if left[0]:
                    return
            try:
                result.set_result(combine({k: f.result() for k, f in parts.items()}, self.config, len(prompts)))
            except Exception as e:
                result.set_exception(e)

        parts = {
            name: (self.remote if name in self.config.remote else self.local).submit(
                _call, fn, outputs, prompts, metadata
            )
            for name, fn in self.fns.items()
        }
        for part in parts.values():
            part.add_done_callback(part_done)
        return result

    def close(self) -> None:
        """Wait for submitted chunks and stop the threads."""
        self.local.shutdown()
        self.remote.shutdown()

    def __enter__(self) -> "RewardWorker":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
