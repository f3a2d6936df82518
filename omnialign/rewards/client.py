"""The client of `omnialign serve-reward`, and the JSON-over-HTTP call with retries that the
OpenAI-compatible rewards share.

    judge = RemoteReward("http://10.0.0.2:8000")   # token: $OMNIALIGN_REWARD_TOKEN, if set
    scores = judge(images, prompts, metadata)       # a plain reward function; returns Scores

A `RemoteReward` can be named in a weighted combination like any other reward (config:
`reward.remote={"judge": "http://10.0.0.2:8000"}`, `reward.weights={"judge": 1.0}`), and
`rewards.RewardWorker` sends its chunks from background threads so that the server works while
the trainer generates (see `omnialign.rewards`).

Protocol (docs/rewards.md): `POST {url}/score` with `{"images": [base64 PNG, ...]}` (or
`"videos": [[base64 PNG, ...], ...]`, each video's frames, or `"texts": [...]`), `"prompts": [...]`,
`"metadata": [...]}`; the reply is `{"scores": [...],
"info": [...]}` in sample order. `GET {url}/health` reports the server's state. An editing sample's
`metadata["sources"]` (source image tensors) travels as `"sources": [[base64 PNG, ...] or null, ...]`,
one entry per sample, and the server puts the decoded tensors back into its metadata.

Retries: connection errors, timeouts, HTTP 429 and 5xx are retried `retries` times with
exponential backoff (`backoff * 2**k` seconds, capped at `max_backoff`, with +-50 % jitter; a
server's Retry-After is honoured up to the cap), then a `RewardServerError` names the URL, the
attempts and the last error. Any other 4xx fails at once with the server's message. A call of
more than `chunk` samples (a video counts as its frames; at least one video a request) is split
into requests sent `concurrency` at a time and put back in sample order. Requests go through one
httpx2 client per process, which keeps connections alive and reuses them (up to 64 idle, each for
5 s); proxies from the environment are not used.
"""

import base64
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2
import torch

from omnialign.rewards.base import Outputs, Scores, to_png

_CLIENT = httpx2.Client(trust_env=False, limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64))


class RewardServerError(RuntimeError):
    """An endpoint refused a request (4xx) or stayed unreachable after the retries."""


class Unreachable(RewardServerError):
    """No HTTP reply after the retries: the last attempt was refused, reset or timed out. (A server whose last reply
    was a 429 or 5xx is there: `post_json` raises a plain RewardServerError.)"""


def _server_message(response: httpx2.Response, body: bytes) -> str:
    try:
        return str(json.loads(body)["error"])
    except (ValueError, KeyError, TypeError):
        return body[:500].decode("utf-8", "replace") or response.reason_phrase


class _Deadline(httpx2.TimeoutException):
    """The whole request took longer than its timeout (an endpoint trickling its reply)."""


def _request(method: str, url: str, data: bytes | None, headers: dict, timeout: float, max_reply: int):
    """One request whose reply is read within `timeout` seconds in all (not per read) and up to `max_reply` bytes:
    (response, its body)."""
    deadline = time.monotonic() + timeout
    with _CLIENT.stream(method, url, content=data, headers=headers, timeout=timeout) as response:
        body = bytearray()
        for chunk in response.iter_bytes():
            body += chunk
            if len(body) > max_reply:
                raise RewardServerError(f"{url}: the reply is larger than {max_reply} bytes (HTTP "
                                        f"{response.status_code}); an endpoint that ignores max_tokens, or the wrong "
                                        "URL")  # fmt: skip
            if time.monotonic() > deadline:
                raise _Deadline("the reply kept trickling")
        return response, bytes(body)


def post_json(
    url: str,
    body: dict | None,
    token: str | None = None,
    timeout: float = 300.0,
    retries: int = 5,
    backoff: float = 0.5,
    max_backoff: float = 30.0,
    max_reply: int = 16 << 20,
) -> dict:
    """POST `body` as JSON (GET when it is None) and return the decoded reply, retrying as above. `timeout` bounds
    each attempt as a whole (an endpoint sending one byte at a time is cut off there and retried); a reply over
    `max_reply` bytes fails at once, unread beyond that."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    start, error = time.monotonic(), ""
    for attempt in range(retries + 1):
        retry_after, answered = 0.0, False
        try:
            response, reply = _request("GET" if data is None else "POST", url, data, headers, timeout, max_reply)
        except httpx2.TimeoutException as e:  # connecting, one read or the whole reply past `timeout`
            error = f"{type(e).__name__}: no whole reply within the request's {timeout:g} s"
        except httpx2.TransportError as e:  # refused, reset, cut short
            cause = e
            while (inner := cause.__cause__ or cause.__context__) is not None:  # down to the socket's own error,
                cause = inner  # e.g. ConnectionRefusedError
            error = f"{type(cause).__name__}: {cause}"
        else:
            if response.status_code < 400:
                try:
                    return json.loads(reply)
                except ValueError:
                    raise RewardServerError(f"{url}: the reply is not JSON: {reply[:300]!r}") from None
            message = _server_message(response, reply)
            if response.status_code != 429 and response.status_code < 500:
                raise RewardServerError(f"{url}: HTTP {response.status_code}: {message}")
            error, answered = f"HTTP {response.status_code}: {message}", True
            try:
                retry_after = float(response.headers.get("Retry-After", 0))
            except ValueError:
                pass
        if attempt < retries:
            delay = min(max_backoff, backoff * 2**attempt) * random.uniform(0.5, 1.5)
            time.sleep(max(delay, min(retry_after, max_backoff)))
    raise (RewardServerError if answered else Unreachable)(
        f"{url}: no answer after {retries + 1} attempts in {time.monotonic() - start:.1f}s; last error: {error}"
    )


def _png(source: object, i: int) -> str:
    """One source image (a tensor (C, H, W) in [0, 1]) as a base64 PNG; ValueError naming the sample otherwise."""
    if not isinstance(source, torch.Tensor):
        raise ValueError(f'RemoteReward: metadata[{i}]["sources"] holds a {type(source).__name__}; it sends source '
                         "images as tensors (C, H, W) in [0, 1]: decode them with "
                         "omnialign.data.prompts.source_images")  # fmt: skip
    return base64.b64encode(to_png(source)).decode()


def check_reply(reply: object, n: int, where: str) -> None:
    """RewardServerError naming the field unless `reply` is {"scores": n numbers, "info": n objects}."""
    if not isinstance(reply, dict):
        raise RewardServerError(f'{where}: the reply is a {type(reply).__name__}, not an object {{"scores": [...], '
                                f'"info": [...]}}: {reply!r:.300}')  # fmt: skip
    scores, info, problems = reply.get("scores"), reply.get("info"), []
    if not isinstance(scores, list) or len(scores) != n:
        problems.append(f'"scores" is {_shown(scores)}, not a list of {n} numbers')
    else:
        wrong = [(i, v) for i, v in enumerate(scores) if isinstance(v, bool) or not isinstance(v, int | float)]
        if wrong:
            problems.append(f'"scores"[{wrong[0][0]}] is {wrong[0][1]!r} ({len(wrong)} such): scores are JSON '
                            "numbers, never strings, booleans or null")  # fmt: skip
    if not isinstance(info, list) or len(info) != n or not all(isinstance(d, dict) for d in info):
        problems.append(f'"info" is {_shown(info)}, not a list of {n} objects (send {{}} for a sample without details)')
    if problems:
        raise RewardServerError(f"{where}: {'; '.join(problems)}")


def _shown(value: object) -> str:
    if value is None:
        return "missing"
    return f"a list of {len(value)}" if isinstance(value, list) else f"{type(value).__name__} {value!r:.60}"


class RemoteReward:
    """A reward served by `omnialign serve-reward` at `url`, called like a plain reward function."""

    def __init__(
        self,
        url: str,
        token: str | None = None,
        timeout: float = 300.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
        chunk: int = 64,
        concurrency: int = 4,
    ):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward server url {url!r}: expected http://HOST:PORT (as printed by serve-reward)")
        if chunk < 1 or concurrency < 1:
            raise ValueError(f"RemoteReward chunk={chunk}, concurrency={concurrency}: both must be at least 1")
        self.url = url.rstrip("/")
        self.token = os.environ.get("OMNIALIGN_REWARD_TOKEN") if token is None else token
        self.retry = {"timeout": timeout, "retries": retries, "backoff": backoff, "max_backoff": max_backoff}
        self.chunk, self.concurrency = chunk, concurrency

    def __repr__(self) -> str:
        return f"RemoteReward({self.url!r})"

    def __call__(self, outputs: Outputs, prompts: list[str], metadata: list[dict]) -> Scores:
        n = len(prompts)
        if len(outputs) != n or len(metadata) != n:
            raise ValueError(f"{self!r}: {len(outputs)} outputs, {n} prompts, {len(metadata)} metadata; need equal")
        frames = outputs.shape[1] if isinstance(outputs, torch.Tensor) and outputs.ndim == 5 else 1
        step = max(1, self.chunk // frames)
        spans = [(lo, min(lo + step, n)) for lo in range(0, n, step)]
        post = lambda span: self._post(outputs, prompts, metadata, *span)
        if len(spans) <= 1:
            replies = [post(s) for s in spans]
        else:
            with ThreadPoolExecutor(min(self.concurrency, len(spans))) as pool:
                replies = list(pool.map(post, spans))  # map keeps the order of spans
        return Scores([v for r in replies for v in r["scores"]], [d for r in replies for d in r["info"]])

    def _post(self, outputs: Outputs, prompts: list[str], metadata: list[dict], lo: int, hi: int) -> dict:
        png = lambda image: base64.b64encode(to_png(image)).decode()
        if isinstance(outputs, torch.Tensor) and outputs.ndim == 5:
            body = {"videos": [[png(frame) for frame in video] for video in outputs[lo:hi]]}
        elif isinstance(outputs, torch.Tensor):
            body = {"images": [png(image) for image in outputs[lo:hi]]}
        else:
            body = {"texts": list(outputs[lo:hi])}
        meta = list(metadata[lo:hi])
        if any("sources" in m for m in meta):  # source images (tensors) travel as PNG beside the JSON metadata
            body["sources"] = [[_png(s, lo + i) for s in m["sources"]] if "sources" in m else None
                               for i, m in enumerate(meta)]  # fmt: skip
            meta = [{k: v for k, v in m.items() if k != "sources"} for m in meta]
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self!r}: the metadata of samples {lo}-{hi - 1} cannot be sent as JSON ({e}); only "
                             '"sources" images travel as PNG: give other images as paths (`omnialign prepare edit '
                             "--reference-images`) or score that reward in process") from None  # fmt: skip
        body.update(prompts=list(prompts[lo:hi]), metadata=meta)
        reply = post_json(f"{self.url}/score", body, self.token, **self.retry)
        check_reply(reply, hi - lo, f"{self.url}/score")
        return reply

    def health(self, wait: bool = False) -> dict:
        """The server's /health reply (status, reward, queue, counters): one quick attempt, or with `wait` as many as
        a /score request gets, each within 10 s (the trainer's check before it loads the model)."""
        retry = {**self.retry, "timeout": 10.0} if wait else {"timeout": 10.0, "retries": 0}
        return post_json(f"{self.url}/health", None, self.token, **retry)
