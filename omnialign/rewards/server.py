"""`omnialign serve-reward`: any reward over HTTP, concurrent requests batched into one call.

    POST /score   {"images": [base64 PNG, ...] | "videos": [[base64 PNG, ...], ...] | "texts": [str, ...],
                   "prompts": [str, ...], "metadata": [object, ...] (optional),
                   "sources": [[base64 PNG, ...] | null, ...] (optional: editing samples' source images,
                               decoded into metadata[i]["sources"] as tensors (C, H, W) in [0, 1])}
              ->  200 {"scores": [float, ...], "info": [object, ...]}   (in sample order)
    GET  /health  ->  200 {"status": "ok", "reward": NAME, "held": n, "requests": n, "batches": n, ...}

Errors are `{"error": message}` with 400 (malformed body or image), 401 (bearer token), 404, 408 (body too
slow), 411/413 (body length, or more pixels than `max_pixels` by the PNG headers), 422 (the reward raised
ValueError on this request's samples, e.g. a missing ground_truth), 429 (queue full) and 503 (too many body
bytes being read), both with Retry-After, 500 (the reward failed otherwise) and 504 (the reward call did not
return in time). A video is the list of its frames' PNGs (all of one size, every video of a request with as
many frames); the reward gets them as (B, F, C, H, W). The full API is in docs/rewards.md; the client is
`omnialign.rewards.client.RemoteReward`.

`RewardServer` is a plain ASGI app run by uvicorn on one asyncio loop. A request is checked from
its headers first (path, token, Content-Length), so a refused body is never held: uvicorn reads
ahead at most 64 KiB and discards the rest. Bodies are then read within `body_timeout`, with at
most `body_memory` bytes being read at once, and decoded on a worker thread. One batcher task takes
everything waiting of one kind (texts, or images of one shape), up to `max_batch` samples, and
calls the reward once on a thread of its own, so a model reward sees large batches under load and
no request waits for a timer (a video counts as its frames toward `max_batch`). A request larger than
`max_batch` is scored alone, and so is each
request of a batch that failed, so that one bad request fails only itself. A call that has not
returned after `reward_timeout` seconds fails its requests with 504 and is abandoned (its thread
runs on until the reward returns); the next batch gets a new thread. At most `max_queue` requests
are held (queued or being scored); more are answered 429 and the client retries them.
"""

import asyncio
import base64
import binascii
import hmac
import json
import math
import socket
import struct
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field

import torch
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from omnialign.rewards.base import Outputs, RewardFn, Scores, from_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
BACKLOG = 2048  # connections the kernel queues before accept (capped by net.core.somaxconn)


@dataclass
class _Job:
    outputs: Outputs
    prompts: list[str]
    metadata: list[dict]
    key: tuple  # ("texts",), ("images", C, H, W) or ("videos", F, C, H, W): jobs of one key can share a batch
    size: int  # samples, or frames for videos: what counts toward max_batch
    done: asyncio.Event = field(default_factory=asyncio.Event)
    scores: Scores | None = None
    error: str = ""
    status: int = 200


class TooManyPixels(ValueError):
    """A request's images hold more pixels than the server's `max_pixels` (answered 413)."""


def _png(item: object, where: str) -> tuple[bytes, int]:
    """A base64 PNG string of the request as its bytes and its pixel count, read from the PNG header (nothing is
    decoded yet); ValueError naming `where` otherwise."""
    try:
        data = base64.b64decode(item, validate=True)
    except (ValueError, TypeError, binascii.Error) as e:
        raise ValueError(f"{where} is not a base64-encoded PNG ({e}); send PNG bytes, base64-encoded") from None
    if not data.startswith(PNG_SIGNATURE) or data[12:16] != b"IHDR" or len(data) < 24:
        raise ValueError(f"{where} is not a base64-encoded PNG (no PNG signature and header); send PNG bytes, "
                         "base64-encoded")  # fmt: skip
    width, height = struct.unpack(">II", data[16:24])
    return data, width * height


def _decode(data: bytes, where: str) -> torch.Tensor:
    try:
        return from_png(data, where)
    except ValueError as e:
        raise ValueError(f"{where} is not a base64-encoded PNG ({e}); send PNG bytes, base64-encoded") from None


def parse_request(body: bytes, max_pixels: int = 1 << 28) -> _Job:
    """A /score body as a job; ValueError naming the field and the fix when it is malformed, `TooManyPixels` when its
    images and sources (counted from their PNG headers, before any is decoded) hold more than `max_pixels`."""
    try:
        request = json.loads(body)
    except ValueError as e:
        raise ValueError(f"the body is not JSON ({e})") from None
    except RecursionError:
        raise ValueError("the body nests arrays or objects too deeply to parse; send the flat object of "
                         "docs/rewards.md ('images' or 'texts', 'prompts', 'metadata')") from None  # fmt: skip
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object with 'images' or 'texts', 'prompts' and 'metadata'")
    prompts = request.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError("'prompts' must be a non-empty list of strings, one per sample")
    n = len(prompts)
    metadata = request.get("metadata") or [{} for _ in prompts]
    if not isinstance(metadata, list) or len(metadata) != n or not all(isinstance(m, dict) for m in metadata):
        raise ValueError(f"'metadata' must be a list of {n} objects, one per prompt (or left out)")
    if sum(kind in request for kind in ("images", "videos", "texts")) != 1:
        raise ValueError("give exactly one of 'images' (base64 PNG strings), 'videos' (lists of base64 PNG "
                         "strings, a video's frames) and 'texts' (strings)")  # fmt: skip
    sources, pngs = request.get("sources"), {}  # (sample, index) of each source -> (bytes, pixels, name)
    if sources is not None:
        if not isinstance(sources, list) or len(sources) != n:
            raise ValueError(f"'sources' must be a list of {n} entries, one per prompt: a list of base64 PNG strings "
                             "(that sample's source images) or null")  # fmt: skip
        for i, entry in enumerate(sources):
            if entry is not None:
                if not isinstance(entry, list) or not entry:
                    raise ValueError(f"sources[{i}] must be a non-empty list of base64 PNG strings, or null")
                for j, item in enumerate(entry):
                    pngs[i, j] = (*_png(item, f"sources[{i}][{j}]"), f"sources[{i}][{j}]")
    if "texts" in request:
        texts = request["texts"]
        if not isinstance(texts, list) or len(texts) != n or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"'texts' must be a list of {n} strings, one per prompt")
        check_pixels(sum(p for _, p, _ in pngs.values()), max_pixels)
        decode_sources(pngs, metadata)
        return _Job(texts, prompts, metadata, ("texts",), n)
    kind = "videos" if "videos" in request else "images"
    items, f = request[kind], 1
    if kind == "images":
        if not isinstance(items, list) or len(items) != n:
            raise ValueError(f"'images' must be a list of {n} base64 PNG strings, one per prompt")
        names = [f"images[{i}]" for i in range(n)]
    else:
        if not isinstance(items, list) or len(items) != n or not all(isinstance(v, list) and v for v in items):
            raise ValueError(f"'videos' must be a list of {n} non-empty lists of base64 PNG strings (each video's "
                             "frames), one per prompt")  # fmt: skip
        f = len(items[0])
        if any(len(v) != f for v in items):
            raise ValueError(f"'videos' hold {sorted({len(v) for v in items})} frames: send videos of one length "
                             "per request")  # fmt: skip
        items, names = [x for v in items for x in v], [f"videos[{i}][{j}]" for i in range(n) for j in range(f)]
    frames = [_png(item, name) for item, name in zip(items, names)]
    check_pixels(sum(p for _, p in frames) + sum(p for _, p, _ in pngs.values()), max_pixels)
    decode_sources(pngs, metadata)
    images = [_decode(data, name) for (data, _), name in zip(frames, names)]
    for name, image in zip(names, images):
        if image.shape != images[0].shape:
            raise ValueError(
                f"{name} has shape {tuple(image.shape)} but {names[0]} {tuple(images[0].shape)}: "
                "send images of one size and mode per request"
            )
    outputs = torch.stack(images).unflatten(0, (n, f)) if kind == "videos" else torch.stack(images)
    return _Job(outputs, prompts, metadata, (kind, *outputs.shape[1:]), n * f)


def check_pixels(pixels: int, max_pixels: int) -> None:
    if pixels > max_pixels:
        raise TooManyPixels(f"the request's images hold {pixels} pixels, over the server's {max_pixels} "
                            "(--max-pixels); send fewer or smaller images per request")  # fmt: skip


def decode_sources(pngs: dict[tuple[int, int], tuple[bytes, int, str]], metadata: list[dict]) -> None:
    """Each sample's source images, decoded into its metadata as "sources"."""
    for (i, _), (data, _, name) in pngs.items():
        metadata[i].setdefault("sources", []).append(_decode(data, name))


class _Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol plus the header timeout it lacks: a connection with no request in
    flight `timeout_keep_alive` (= header_timeout) seconds after it opened or after its last reply is
    closed, however slowly it trickles the next request's headers."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.header_timer = self.loop.call_later(self.timeout_keep_alive, self._close_if_idle)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.header_timer.cancel()
        self.header_timer = self.loop.call_later(self.timeout_keep_alive, self._close_if_idle)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.header_timer.cancel()

    def _close_if_idle(self) -> None:
        if self.cycle is None or self.cycle.response_complete:  # no request's headers came since
            self.transport.close()


class RewardServer:
    """Serves `fn` at http://host:port: `run()` blocks; `with RewardServer(...) as server:` serves
    from a thread for the block (tests, notebooks). The socket listens from construction on."""

    def __init__(
        self,
        fn: RewardFn,
        name: str,
        host: str = "127.0.0.1",
        port: int = 8000,
        token: str | None = None,
        device: str | None = None,
        max_batch: int = 64,
        max_queue: int = 256,
        max_body: int = 256 << 20,
        body_memory: int = 1 << 30,
        max_pixels: int = 1 << 28,
        reward_timeout: float = 240.0,
        header_timeout: float = 10.0,
        body_timeout: float = 60.0,
    ):
        if max_batch < 1 or max_queue < 1:
            raise ValueError(f"max_batch={max_batch}, max_queue={max_queue}: both must be at least 1")
        if body_memory < max_body:
            raise ValueError(f"body_memory={body_memory} is below max_body={max_body}: a largest body could never "
                             "be read; raise body_memory")  # fmt: skip
        for flag, seconds in (("reward", reward_timeout), ("header", header_timeout), ("body", body_timeout)):
            if not seconds > 0:
                raise ValueError(f"--{flag}-timeout {seconds}: must be a positive number of seconds")
        if device is not None:
            try:
                torch.empty(0, device=device)
            except (RuntimeError, AssertionError) as e:
                raise ValueError(
                    f"--device {device!r} is not usable here ({e}); leave it out to score on the CPU"
                ) from None
        self.fn, self.name, self.token, self.device = fn, name, token, device
        self.max_batch, self.max_queue, self.max_body, self.body_memory = max_batch, max_queue, max_body, body_memory
        self.reward_timeout, self.body_timeout, self.max_pixels = reward_timeout, body_timeout, max_pixels
        self.socket = socket.create_server((host, port), backlog=BACKLOG)
        # accepted sockets inherit TCP_NODELAY, so a reply's header and body are not held back 40 ms by Nagle's
        # algorithm (asyncio sets it only on sockets made with proto=IPPROTO_TCP, which create_server's are not)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        config = uvicorn.Config(self, http=_Protocol, ws="none", lifespan="off", interface="asgi3", log_config=None,
                                log_level="warning", access_log=False, proxy_headers=False, server_header=False,
                                backlog=BACKLOG, timeout_keep_alive=header_timeout)  # fmt: skip
        self.server = uvicorn.Server(config)
        self.held = self.reading = 0  # requests queued or being scored; body bytes being read
        self.counts = {"requests": 0, "samples": 0, "batches": 0, "failed_batches": 0, "rejected": 0, "timed_out": 0}

    @property
    def url(self) -> str:
        host, port = self.socket.getsockname()[:2]
        return f"http://{host}:{port}"

    def health(self) -> dict:
        return {"status": "ok", "reward": self.name, "device": self.device or "cpu", "held": self.held,
                "reading": self.reading, "max_queue": self.max_queue, "max_batch": self.max_batch,
                **self.counts}  # fmt: skip

    def authorized(self, header: bytes) -> bool:
        return not self.token or hmac.compare_digest(header, f"Bearer {self.token}".encode())

    def run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self.jobs: asyncio.Queue[_Job] = asyncio.Queue()
        batcher = asyncio.create_task(self._batcher())
        await self.server.serve(sockets=[self.socket])
        batcher.cancel()

    def __enter__(self) -> "RewardServer":
        self.thread = threading.Thread(target=self.run, name="reward-server", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join()

    async def __call__(self, scope: dict, receive, send) -> None:
        """The ASGI entry point: one request, one JSON reply."""
        status, body = await self._handle(scope, receive)
        data = json.dumps(body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if status in (429, 503):
            headers.append((b"retry-after", b"1"))
        if status == 408:  # a client this slow loses its connection
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": data})

    async def _handle(self, scope: dict, receive) -> tuple[int, dict]:
        method, path = scope["method"], scope["path"]
        if (method, path) == ("GET", "/health"):
            return 200, self.health()
        if (method, path) != ("POST", "/score"):
            return 404, {"error": f"no {method} {path}; use POST /score or GET /health"}
        headers = dict(scope["headers"])
        if not self.authorized(headers.get(b"authorization", b"")):
            return 401, {"error": "missing or wrong bearer token: send 'Authorization: Bearer TOKEN' with the "
                                  "server's token (RemoteReward reads it from $OMNIALIGN_REWARD_TOKEN)"}  # fmt: skip
        length = headers.get(b"content-length", b"")
        if not length.isdigit():
            return 411, {"error": "a Content-Length header is required"}
        n = int(length)
        if n > self.max_body:
            return 413, {"error": f"body of {n} bytes exceeds {self.max_body}; send fewer samples"}
        if self.reading + n > self.body_memory:
            return 503, {"error": f"busy: {self.reading} body bytes are being read and {n} more would pass "
                                  f"body_memory={self.body_memory}; retry later"}  # fmt: skip
        self.reading += n
        try:
            body = await asyncio.wait_for(_read_body(receive), self.body_timeout)
            job = await asyncio.to_thread(parse_request, body, self.max_pixels)
        except TimeoutError:
            return 408, {"error": f"the body of {n} bytes did not arrive within body_timeout={self.body_timeout:g} "
                                  "s (--body-timeout); send faster or fewer samples per request"}  # fmt: skip
        except TooManyPixels as e:
            return 413, {"error": str(e)}
        except ValueError as e:
            return 400, {"error": str(e)}
        finally:
            self.reading -= n
        if self.held >= self.max_queue:
            self.counts["rejected"] += 1
            return 429, {"error": f"busy: {self.max_queue} requests held; retry later"}
        self.held += 1
        try:
            self.jobs.put_nowait(job)
            await job.done.wait()
        finally:
            self.held -= 1
        if job.error:
            return job.status, {"error": job.error}
        return 200, {"scores": list(job.scores), "info": job.scores.info}

    async def _batcher(self) -> None:
        waiting: deque[_Job] = deque()
        while True:
            if not waiting:
                waiting.append(await self.jobs.get())
            while not self.jobs.empty():
                waiting.append(self.jobs.get_nowait())
            batch, rest, size = [], deque(), 0
            for job in waiting:
                if not batch or (job.key == batch[0].key and size + job.size <= self.max_batch):
                    batch.append(job)
                    size += job.size
                else:
                    rest.append(job)
            waiting = rest
            await self._score(batch)

    def _call(self, batch: list[_Job]) -> Scores:
        """The reward on a merged batch (runs on a reward thread); raises when it fails."""
        prompts = [p for job in batch for p in job.prompts]
        if batch[0].key[0] != "texts":
            outputs = torch.cat([job.outputs for job in batch])
            outputs = outputs if self.device is None else outputs.to(self.device)
        else:
            outputs = [text for job in batch for text in job.outputs]
        with torch.no_grad():
            values = self.fn(outputs, prompts, [m for job in batch for m in job.metadata])
        if len(values) != len(prompts):
            raise RuntimeError(f"returned {len(values)} scores for {len(prompts)} samples")
        scores = values if isinstance(values, Scores) else Scores(values)
        if not all(math.isfinite(v) for v in scores):
            raise RuntimeError(f"returned non-finite scores {[v for v in scores if not math.isfinite(v)][:8]}")
        json.dumps(scores.info)  # fails here, with the reason, rather than in the reply
        return scores

    async def _score(self, batch: list[_Job]) -> None:
        """Score a batch; when it fails, score each request alone so one bad request fails only itself."""
        loop = asyncio.get_running_loop()
        result = loop.create_future()

        def call() -> None:
            try:
                scores = self._call(batch)
            except Exception as e:
                loop.call_soon_threadsafe(result.set_exception, e)
            else:
                loop.call_soon_threadsafe(result.set_result, scores)

        threading.Thread(target=call, name="reward-call", daemon=True).start()
        await asyncio.wait([result], timeout=self.reward_timeout)  # leaves `result` pending on timeout
        if not result.done():
            self.counts["timed_out"] += 1
            for job in batch:
                job.status = 504
                job.error = (f"reward {self.name!r} did not return within reward_timeout={self.reward_timeout:g} s "
                             "(--reward-timeout); that call was abandoned")  # fmt: skip
        elif result.exception() is not None:
            e = result.exception()
            if len(batch) > 1:
                for job in batch:
                    await self._score([job])
                return
            traceback.print_exception(e)
            batch[0].status = 422 if isinstance(e, ValueError) else 500
            batch[0].error = f"reward {self.name!r} failed: {type(e).__name__}: {e}"
        else:
            scores, lo = result.result(), 0
            for job in batch:
                hi = lo + len(job.prompts)
                job.scores, lo = Scores(scores[lo:hi], scores.info[lo:hi]), hi
        self.counts["batches"] += 1
        self.counts["failed_batches"] += bool(batch[0].error)
        self.counts["requests"] += len(batch)
        self.counts["samples"] += sum(len(job.prompts) for job in batch)
        for job in batch:
            job.done.set()


async def _read_body(receive) -> bytearray:
    """The request body as uvicorn hands it over (short if the client went away)."""
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def serve(server: RewardServer) -> None:
    """Serve until interrupted; prints the URL (with the real port when port is 0) first."""
    host = server.socket.getsockname()[0]
    if host != "127.0.0.1" and not server.token:
        print(f"warning: serving on {host} without a token: anyone who reaches this port can use it", flush=True)
    print(f"serving reward {server.name!r} at {server.url} (POST /score, GET /health)", flush=True)
    try:
        server.run()
    except KeyboardInterrupt:
        pass
