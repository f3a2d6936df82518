"""`omnialign serve-reward`: any reward over HTTP, concurrent requests batched into one call.

    POST /score   {"images": [base64 PNG, ...] | "texts": [str, ...],
                   "prompts": [str, ...], "metadata": [object, ...] (optional)}
              ->  200 {"scores": [float, ...], "info": [object, ...]}   (in sample order)
    GET  /health  ->  200 {"status": "ok", "reward": NAME, "held": n, "requests": n, "batches": n, ...}

Errors are `{"error": message}` with 400 (malformed body or image), 401 (bearer token), 404,
411/413 (body length), 422 (the reward raised ValueError on this request's samples, e.g. a
missing ground_truth), 429 (queue full, with Retry-After) and 500 (the reward failed otherwise).
The full API is in docs/rewards.md; the client is `omnialign.rewards.client.RemoteReward`.

Handler threads decode requests and queue them; one batcher thread takes everything waiting of
one kind (texts, or images of one shape), up to `max_batch` samples, and calls the reward once,
so a model reward sees large batches under load and no request waits for a timer. A request
larger than `max_batch` is scored alone, and so is each request of a batch that failed, so that
one bad request fails only itself. At most `max_queue` requests are held (queued or being
scored); more are answered 429 and the client retries them.
"""

import base64
import binascii
import hmac
import json
import math
import queue
import sys
import threading
import traceback
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from omnialign.rewards.base import Outputs, RewardFn, Scores, from_png

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class _Job:
    outputs: Outputs
    prompts: list[str]
    metadata: list[dict]
    key: tuple  # ("texts",) or ("images", C, H, W): jobs of one key can share a batch
    done: threading.Event = field(default_factory=threading.Event)
    scores: Scores | None = None
    error: str = ""
    status: int = 200


def parse_request(body: bytes) -> _Job:
    """A /score body as a job; ValueError naming the field and the fix when it is malformed."""
    try:
        request = json.loads(body)
    except ValueError as e:
        raise ValueError(f"the body is not JSON ({e})") from None
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object with 'images' or 'texts', 'prompts' and 'metadata'")
    prompts = request.get("prompts")
    if not isinstance(prompts, list) or not prompts or not all(isinstance(p, str) for p in prompts):
        raise ValueError("'prompts' must be a non-empty list of strings, one per sample")
    n = len(prompts)
    metadata = request.get("metadata") or [{} for _ in prompts]
    if not isinstance(metadata, list) or len(metadata) != n or not all(isinstance(m, dict) for m in metadata):
        raise ValueError(f"'metadata' must be a list of {n} objects, one per prompt (or left out)")
    if ("images" in request) == ("texts" in request):
        raise ValueError("give exactly one of 'images' (base64 PNG strings) and 'texts' (strings)")
    if "texts" in request:
        texts = request["texts"]
        if not isinstance(texts, list) or len(texts) != n or not all(isinstance(t, str) for t in texts):
            raise ValueError(f"'texts' must be a list of {n} strings, one per prompt")
        return _Job(texts, prompts, metadata, ("texts",))
    items = request["images"]
    if not isinstance(items, list) or len(items) != n:
        raise ValueError(f"'images' must be a list of {n} base64 PNG strings, one per prompt")
    images = []
    for i, item in enumerate(items):
        try:
            data = base64.b64decode(item, validate=True)
            if not data.startswith(PNG_SIGNATURE):
                raise ValueError("no PNG signature")
            images.append(from_png(data))
        except (ValueError, TypeError, OSError, binascii.Error) as e:
            raise ValueError(f"images[{i}] is not a base64-encoded PNG ({e}); send PNG bytes, base64-encoded") from None
        if images[i].shape != images[0].shape:
            raise ValueError(
                f"images[{i}] has shape {tuple(images[i].shape)} but images[0] {tuple(images[0].shape)}: "
                "send images of one size and mode per request"
            )
    return _Job(torch.stack(images), prompts, metadata, ("images", *images[0].shape))


class RewardServer(ThreadingHTTPServer):
    """Serves `fn` at http://host:port; start with `serve_forever()` (in a thread, for tests)."""

    daemon_threads = True

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
    ):
        if max_batch < 1 or max_queue < 1:
            raise ValueError(f"max_batch={max_batch}, max_queue={max_queue}: both must be at least 1")
        if device is not None:
            try:
                torch.empty(0, device=device)
            except (RuntimeError, AssertionError) as e:
                raise ValueError(
                    f"--device {device!r} is not usable here ({e}); leave it out to score on the CPU"
                ) from None
        super().__init__((host, port), _Handler)
        self.fn, self.name, self.token, self.device = fn, name, token, device
        self.max_batch, self.max_queue, self.max_body = max_batch, max_queue, max_body
        self.jobs: queue.Queue[_Job] = queue.Queue()
        self.lock = threading.Lock()
        self.held = 0
        self.counts = {"requests": 0, "samples": 0, "batches": 0, "failed_batches": 0, "rejected": 0}
        threading.Thread(target=self._batcher, name="reward-batcher", daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def health(self) -> dict:
        with self.lock:
            return {"status": "ok", "reward": self.name, "device": self.device or "cpu", "held": self.held,
                    "max_queue": self.max_queue, "max_batch": self.max_batch, **self.counts}  # fmt: skip

    def authorized(self, header: str | None) -> bool:
        return not self.token or hmac.compare_digest((header or "").encode(), f"Bearer {self.token}".encode())

    def admit(self) -> bool:
        with self.lock:
            if self.held >= self.max_queue:
                self.counts["rejected"] += 1
                return False
            self.held += 1
            return True

    def release(self) -> None:
        with self.lock:
            self.held -= 1

    def _batcher(self) -> None:
        waiting: deque[_Job] = deque()
        while True:
            if not waiting:
                waiting.append(self.jobs.get())
            while not self.jobs.empty():
                waiting.append(self.jobs.get_nowait())
            batch, rest, size = [], deque(), 0
            for job in waiting:
                if not batch or (job.key == batch[0].key and size + len(job.prompts) <= self.max_batch):
                    batch.append(job)
                    size += len(job.prompts)
                else:
                    rest.append(job)
            waiting = rest
            self._score(batch)

    def _score(self, batch: list[_Job]) -> None:
        """Score a batch; when it fails, score each request alone so one bad request fails only itself."""
        prompts = [p for job in batch for p in job.prompts]
        try:
            if batch[0].key[0] == "images":
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
            lo = 0
            for job in batch:
                hi = lo + len(job.prompts)
                job.scores, lo = Scores(scores[lo:hi], scores.info[lo:hi]), hi
        except Exception as e:
            if len(batch) > 1:
                for job in batch:
                    self._score([job])
                return
            traceback.print_exc(file=sys.stderr)
            batch[0].status = 422 if isinstance(e, ValueError) else 500
            batch[0].error = f"reward {self.name!r} failed: {type(e).__name__}: {e}"
        with self.lock:
            self.counts["batches"] += 1
            self.counts["failed_batches"] += bool(batch[0].error)
            self.counts["requests"] += len(batch)
            self.counts["samples"] += len(prompts)
        for job in batch:
            job.done.set()


class _Handler(BaseHTTPRequestHandler):
    server: RewardServer

    def log_message(self, format: str, *args) -> None:  # quiet: one line per request is too much
        pass

    def reply(self, code: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path != "/health":
            return self.reply(404, {"error": f"no GET {self.path}; use GET /health or POST /score"})
        self.reply(200, self.server.health())

    def do_POST(self) -> None:
        server = self.server
        if self.path != "/score":
            return self.reply(404, {"error": f"no POST {self.path}; use POST /score or GET /health"})
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            return self.reply(411, {"error": "a Content-Length header is required"})
        if int(length) > server.max_body:
            return self.reply(413, {"error": f"body of {length} bytes exceeds {server.max_body}; send fewer samples"})
        body = self.rfile.read(int(length))
        if not server.authorized(self.headers.get("Authorization")):
            return self.reply(401, {"error": "missing or wrong bearer token: send 'Authorization: Bearer TOKEN' "
                                             "with the server's --token"})  # fmt: skip
        try:
            job = parse_request(body)
        except ValueError as e:
            return self.reply(400, {"error": str(e)})
        if not server.admit():
            return self.reply(429, {"error": f"busy: {server.max_queue} requests held; retry later"},
                              {"Retry-After": "1"})  # fmt: skip
        try:
            server.jobs.put(job)
            job.done.wait()
        finally:
            server.release()
        if job.error:
            return self.reply(job.status, {"error": job.error})
        self.reply(200, {"scores": list(job.scores), "info": job.scores.info})


def serve(
    fn: RewardFn,
    name: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    device: str | None = None,
    max_batch: int = 64,
    max_queue: int = 256,
) -> None:
    """Serve `fn` until interrupted; prints the URL (with the real port when port is 0) first."""
    server = RewardServer(fn, name, host, port, token, device, max_batch, max_queue)
    if host not in ("127.0.0.1", "localhost") and not token:
        print(f"warning: serving on {host} without --token: anyone who reaches this port can use it", flush=True)
    print(f"serving reward {name!r} at {server.url} (POST /score, GET /health)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
