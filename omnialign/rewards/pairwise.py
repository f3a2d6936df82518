"""Group-wise rewards from pairwise preferences: win rates within each prompt group (Pref-GRPO).

A group-wise reward scores the samples of a prompt group against each other. It reads each sample's group from
`metadata[i]["group"]`, which the online trainer sets (the group id of the sampler), and the trainer hands the
rewards whole groups: a rollout chunk that ends inside a group is held back and scored with the next one.

`pairwise_win_rate(judge, ...)` turns any pairwise judge, `judge(image_a, image_b, prompt) -> P(a is better)` in
[0, 1], into each sample's win rate within its group of G: (1 / (G - 1)) * sum over the others j of
P(i beats j). With `both_orders` (default) each pair is judged in both orders and P(i beats j) =
(judge(i, j) + 1 - judge(j, i)) / 2, which cancels a judge's bias towards the first (or second) position;
G (G - 1) judge calls per group, else G (G - 1) / 2. A group of one scores 0.5. Win rates are in [0, 1] and a
group's mean is 0.5 whatever the images, so GRPO's group-relative advantages come from the comparisons alone
(and the mean reward of a run stays 0.5: watch another reward or `reward.gold` for progress).

`pairwise_vlm` is such a reward with a VLM judge behind an OpenAI-compatible chat endpoint
(`omnialign.rewards.vlm.chat`): it is shown image A, then image B, and the caption, and ends its reply with
`Better Image: 1` or `2`; the last such statement counts (`Image 2 is better` also parses). A reply that names
neither counts as a tie (0.5) and is logged (a warning on this module's logger, with the count and an example).
"""

import logging
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import torch

from omnialign.rewards.base import Outputs, Scores, images_of
from omnialign.rewards.vlm import chat

PairJudge = Callable[[torch.Tensor, torch.Tensor, str], float]

PAIR_PROMPT = """You are shown two images generated from the same text caption: Image 1 first, then Image 2.
Text caption: {prompt}
Which image is better overall: more faithful to the caption, more coherent (no distortions, glitches or \
artifacts) and more aesthetically pleasing?
Explain briefly, then end your reply with exactly this line, where N is 1 or 2:
Better Image: N"""

log = logging.getLogger(__name__)


def groups_of(metadata: list[dict], reward: str) -> dict[object, list[int]]:
    """The sample indices of each group, by `metadata[i]["group"]`, in order of first appearance."""
    groups: dict[object, list[int]] = {}
    for i, meta in enumerate(metadata):
        if "group" not in meta:
            raise ValueError(f'reward {reward!r} compares the samples of a prompt group, but metadata[{i}] has no '
                             '"group": the online trainer sets it (but not on the frames of reward.per_frame, where '
                             "the frames of one video would compete with each other: take this reward out of "
                             "reward.per_frame); elsewhere give each sample its group id as "
                             'metadata["group"]')  # fmt: skip
        groups.setdefault(meta["group"], []).append(i)
    return groups


def group_spans(groups: list, size: int) -> list[slice]:
    """Consecutive spans of rows, each at least `size` long (but the last), that end where the group id changes."""
    spans, lo = [], 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or (i - lo >= size and groups[i] != groups[i - 1]):
            spans.append(slice(lo, i))
            lo = i
    return spans


def pairwise_win_rate(
    judge: PairJudge,
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    both_orders: bool = True,
    concurrency: int = 8,
    reward: str = "pairwise_win_rate",
) -> Scores:
    """Each sample's mean probability of beating the others of its group under `judge`; see the module docstring."""
    if isinstance(outputs, torch.Tensor) and outputs.ndim == 5:
        raise ValueError(f"reward {reward!r} compares images (B, 1 or 3, H, W), not videos {tuple(outputs.shape)}; "
                         "a group-wise reward cannot score frames through reward.per_frame (docs/rewards.md, Video "
                         "rewards)")  # fmt: skip
    images = images_of(outputs, reward)
    pairs = [(i, j) for members in groups_of(metadata, reward).values() for k, i in enumerate(members)
             for j in members[k + 1:]]  # fmt: skip
    calls = pairs + [(j, i) for i, j in pairs] if both_orders else pairs
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        verdicts = dict(zip(calls, pool.map(lambda p: float(judge(images[p[0]], images[p[1]], prompts[p[0]])), calls)))
    bad = {p: v for p, v in verdicts.items() if not 0 <= v <= 1}
    if bad:
        raise ValueError(f"reward {reward!r}: the judge returned {len(bad)} values outside [0, 1], e.g. "
                         f"{next(iter(bad.items()))}; it must return P(first image is better)")  # fmt: skip
    wins, games = [0.0] * len(images), [0] * len(images)
    for i, j in pairs:
        p = (verdicts[i, j] + 1 - verdicts[j, i]) / 2 if both_orders else verdicts[i, j]
        wins[i], wins[j] = wins[i] + p, wins[j] + 1 - p
        games[i], games[j] = games[i] + 1, games[j] + 1
    rates = [w / g if g else 0.5 for w, g in zip(wins, games)]
    return Scores(rates, [{"win_rate": r, "opponents": g} for r, g in zip(rates, games)])


def parse_preference(text: str) -> int | None:
    """1 or 2, the image a pairwise judge's reply prefers (its last statement of it), or None."""
    found = re.findall(r"better\s*image[^\w\n]{0,8}(?:is\s*)?(?:image\s*)?([12])\b|image\s*([12])\s*is\s*(?:the\s*)?"
                       r"better", text, flags=re.I)  # fmt: skip
    return int("".join(found[-1])) if found else None


def vlm_prefers_first(
    image_a: torch.Tensor,
    image_b: torch.Tensor,
    prompt: str,
    *,
    url: str,
    model: str,
    template: str = PAIR_PROMPT,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    unparsed: list | None = None,
) -> float:
    """A pairwise judge: 1.0 if the VLM prefers image A (shown first), 0.0 if B, 0.5 if its reply names neither
    (then the reply is appended to `unparsed`)."""
    reply = chat(url, model, [image_a, image_b], template.replace("{prompt}", prompt),
                 {"temperature": 0.0, "max_tokens": 512} | (sampling or {}), api_key, timeout)  # fmt: skip
    choice = parse_preference(reply)
    if choice is None and unparsed is not None:
        unparsed.append(reply)
    return {1: 1.0, 2: 0.0, None: 0.5}[choice]


def pairwise_vlm(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    url: str,
    model: str,
    prompt: str = PAIR_PROMPT,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    concurrency: int = 8,
    both_orders: bool = True,
) -> Scores:
    """Reward (group-wise): each image's win rate against the others of its group, judged pairwise by a VLM, [0, 1]."""
    unparsed: list[str] = []  # list.append is atomic: the judge threads share it
    judge = partial(vlm_prefers_first, url=url, model=model, template=prompt, sampling=sampling, api_key=api_key,
                    timeout=timeout, unparsed=unparsed)  # fmt: skip
    scores = pairwise_win_rate(judge, outputs, prompts, metadata, both_orders=both_orders, concurrency=concurrency,
                               reward="pairwise_vlm")  # fmt: skip
    if unparsed:
        log.warning("pairwise_vlm: %d of the judge's replies named no better image (scored as ties), e.g. %r",
                    len(unparsed), unparsed[0][-200:])  # fmt: skip
    return scores
