"""Vision-language models behind an OpenAI-compatible chat endpoint, and the VLM judge reward.

`chat` sends one user turn (the image, or images, as base64 PNG data URLs, then the text) to
`{url}/chat/completions` (so `url` is the base URL, e.g. `http://127.0.0.1:8001/v1` for vLLM or
SGLang), with `sampling` merged into the body (`temperature`, `max_tokens`, `top_p`, ...), the
API key from `api_key` or $OPENAI_API_KEY, and the client's retries.
`served_model` names the endpoint's first model (`GET {url}/models`) when none is given.

`vlm_judge` (UnifiedReward style) asks for alignment, coherence and style, each 1-5; the reward
is the mean of the scores found, each mapped to [0, 1] as (s - 1) / 4. The parser takes the last
number after each dimension's name on its line (any markup, "(1-5)" and "out of 5" ignored),
clamped to [1, 5]; a reply with none of the three scores 0, and `info` keeps the raw reply, the
three mapped scores and what was missing. `rewards.video.vlm_video` asks the same of sampled frames of a
video (`VIDEO_JUDGE_PROMPT`).
"""

import base64
import os
import re
from concurrent.futures import ThreadPoolExecutor

import torch

from omnialign.rewards.base import Outputs, Scores, images_of, to_png
from omnialign.rewards.client import RewardServerError, post_json

ANSWER_FORMAT = """Text caption: {prompt}
Explain briefly, then end your reply with exactly these three lines:
Alignment Score: X
Coherence Score: Y
Style Score: Z"""
"""The end of both judge prompts: the caption and the three score lines that `judge_score` parses."""

JUDGE_PROMPT = (
    """You are presented with a generated image and the text caption it was generated from. \
Rate the image on three dimensions, each an integer from 1 (poor) to 5 (excellent):
Alignment: how well the image shows everything the caption describes.
Coherence: how logically and visually consistent the image is (no distortions, glitches or artifacts).
Style: how aesthetically appealing the image is, regardless of the caption.
"""
    + ANSWER_FORMAT
)

VIDEO_JUDGE_PROMPT = (
    """You are presented with {frames} frames of one generated video, in order, and the text \
caption it was generated from. Rate the video on three dimensions, each an integer from 1 (poor) to 5 (excellent):
Alignment: how well the video shows everything the caption describes, including any change over time.
Coherence: how logically and visually consistent the video is, within and across frames (no distortions, \
glitches, artifacts or flicker).
Style: how aesthetically appealing the video is, regardless of the caption.
"""
    + ANSWER_FORMAT
)

DIMENSIONS = ("alignment", "coherence", "style")
_SCALE = re.compile(r"[(<\[]?\s*(?:1\s*(?:-|–|to)\s*5|out\s+of\s+5(?:\.0)?)\s*[)>\]]?", re.I)


def chat(
    url: str,
    model: str,
    image: torch.Tensor | list[torch.Tensor],
    text: str,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    retries: int = 3,
) -> str:
    """The reply text of an OpenAI-compatible chat endpoint to (image (C, H, W) in [0, 1], or a list of them, text)."""
    images = image if isinstance(image, list) else [image]
    urls = ["data:image/png;base64," + base64.b64encode(to_png(im)).decode() for im in images]
    content = [{"type": "image_url", "image_url": {"url": url}} for url in urls] + [{"type": "text", "text": text}]
    body = {"model": model, "messages": [{"role": "user", "content": content}], **(sampling or {})}
    reply = post_json(url.rstrip("/") + "/chat/completions", body, api_key or os.environ.get("OPENAI_API_KEY"),
                      timeout, retries)  # fmt: skip
    try:
        return reply["choices"][0]["message"]["content"] or ""
    except (KeyError, IndexError, TypeError):
        raise RewardServerError(f"{url}: not a chat completion: {reply!r:.300}") from None


def served_model(url: str, api_key: str | None = None, timeout: float = 30.0) -> str:
    """The first model an OpenAI-compatible endpoint lists (`GET {url}/models`), for when none is named; `Unreachable`
    when nothing answered (two retries, each attempt within `timeout` s)."""
    try:
        listing = post_json(url.rstrip("/") + "/models", None, api_key or os.environ.get("OPENAI_API_KEY"), timeout, 2)
    except RewardServerError as e:  # Unreachable stays Unreachable
        raise type(e)(f"{e}: is the OpenAI-compatible endpoint up at {url}? Start it, or correct its URL "
                      "(--judge-url, or the reward's url option)") from None  # fmt: skip
    try:
        return listing["data"][0]["id"]
    except (KeyError, IndexError, TypeError):
        raise RewardServerError(f"{url}/models lists no model ({listing!r:.200}); name one (--judge-model, or the "
                                "reward's model option)") from None  # fmt: skip


def chat_each(
    images: torch.Tensor | list[list[torch.Tensor]], texts: list[str], concurrency: int, **kwargs
) -> list[str]:
    """`chat` for each (image or list of images, text) pair, `concurrency` requests at a time, replies in order."""
    with ThreadPoolExecutor(max(1, concurrency)) as pool:
        return list(pool.map(lambda pair: chat(image=pair[0], text=pair[1], **kwargs), zip(images, texts)))


def parse_judge(text: str, dimensions: tuple[str, ...] = DIMENSIONS) -> dict[str, float]:
    """The 1-5 score of each dimension found in a judge's reply (the last one given), clamped to [1, 5]."""
    text = _SCALE.sub(" ", text)
    found = {}
    for dim in dimensions:
        matches = re.findall(rf"{dim}[^\d\n]{{0,24}}?(\d+(?:\.\d+)?)", text, flags=re.I)
        if matches:
            found[dim] = min(5.0, max(1.0, float(matches[-1])))
    return found


def judge_score(text: str, dimensions: tuple[str, ...] = DIMENSIONS) -> tuple[float, dict]:
    """A judge's reply as (reward in [0, 1], info with the raw text and each dimension in [0, 1])."""
    found = parse_judge(text, dimensions)
    info = {dim: (s - 1) / 4 for dim, s in found.items()} | {"text": text}
    if len(found) < len(dimensions):
        info["missing"] = [dim for dim in dimensions if dim not in found]
    return (sum(info[dim] for dim in found) / len(found) if found else 0.0), info


def vlm_judge(
    outputs: Outputs,
    prompts: list[str],
    metadata: list[dict],
    *,
    url: str,
    model: str,
    prompt: str = JUDGE_PROMPT,
    sampling: dict | None = None,
    api_key: str | None = None,
    timeout: float = 120.0,
    concurrency: int = 8,
) -> Scores:
    """Reward: a VLM's 1-5 alignment, coherence and style ratings, mean mapped to [0, 1]; higher is better."""
    images = images_of(outputs, "vlm_judge")
    return judge(images, [prompt.replace("{prompt}", p) for p in prompts], url=url, model=model, sampling=sampling,
                 api_key=api_key, timeout=timeout, concurrency=concurrency)  # fmt: skip


def judge(
    images: torch.Tensor | list[list[torch.Tensor]],
    texts: list[str],
    *,
    url: str,
    model: str,
    sampling: dict | None,
    api_key: str | None,
    timeout: float,
    concurrency: int,
    dimensions: tuple[str, ...] = DIMENSIONS,
) -> Scores:
    """`judge_score` of the reply to each (image or list of images, question) pair, at temperature 0 unless
    `sampling` says otherwise (`vlm_judge`, `vlm_video`, `vlm_edit_*`)."""
    replies = chat_each(images, texts, concurrency, url=url, model=model,
                        sampling={"temperature": 0.0, "max_tokens": 512} | (sampling or {}), api_key=api_key,
                        timeout=timeout)  # fmt: skip
    scored = [judge_score(reply, dimensions) for reply in replies]
    return Scores([s for s, _ in scored], [info for _, info in scored])
