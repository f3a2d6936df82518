"""The reward server and its client over real HTTP on loopback, and the OpenAI-compatible path."""

import asyncio
import base64
import http.client
import io
import json
import random
import re
import select
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from http_stub import JSONHandler, serving
from PIL import Image

from omnialign.cli import main
from omnialign.config import RewardConfig
from omnialign.rewards import RewardWorker, score
from omnialign.rewards.base import from_png, to_png
from omnialign.rewards.client import RemoteReward, RewardServerError, post_json
from omnialign.rewards.ocr import ocr_vlm
from omnialign.rewards.server import RewardServer
from omnialign.rewards.user import load_reward
from omnialign.rewards.vlm import vlm_judge
from omnialign.worlds.glyphs.data import CHARSET, render
from omnialign.worlds.glyphs.recognizer import glyph_ocr, load_recognizer

FNS = Path(__file__).parent / "reward_fns.py"
FAST = {"backoff": 0.01, "max_backoff": 0.05}  # client retry timing for tests


@contextmanager
def running(fn, name="test", **kwargs):
    with RewardServer(fn, name, port=kwargs.pop("port", 0), **kwargs) as server:
        yield server


def glyph_batch(n: int, seed: int = 0) -> tuple[torch.Tensor, list[str]]:
    """n rendered glyphs in [0, 1], already 8-bit (as they arrive at the server), and their prompts."""
    texts = [random.Random(seed + i).choice(CHARSET) for i in range(n)]
    images = (render(texts, seed) + 1) / 2
    return images.mul(255).round().div(255), texts


def test_remote_reward_scores_like_in_process_and_reports_health():
    images, texts = glyph_batch(6)
    with running(glyph_ocr, "glyph_ocr") as server:
        remote = RemoteReward(server.url, **FAST)
        scores = remote(images, texts, [{}] * 6)
        health = remote.health()
    assert scores == pytest.approx(glyph_ocr(images, texts), abs=1e-5) and scores.info == [{}] * 6
    assert health["status"] == "ok" and health["reward"] == "glyph_ocr" and health["samples"] == 6


def test_many_concurrent_clients_nothing_lost_or_reordered():
    images, texts = glyph_batch(40, seed=1)
    expected = glyph_ocr(images, texts)
    rng = random.Random(0)
    requests = [rng.sample(range(40), 3) for _ in range(96)]
    slowed = lambda o, p, m: (time.sleep(0.02), glyph_ocr(o, p, m))[1]  # so that requests pile up
    with running(slowed, "glyph_ocr", max_batch=24, max_queue=6) as server:
        remote = RemoteReward(server.url, retries=400, **FAST)  # 20 s of retries: enough on a loaded 2-core CPU
        with ThreadPoolExecutor(24) as clients:
            replies = list(clients.map(lambda idx: remote(images[idx], [texts[i] for i in idx], [{}] * 3), requests))
        health = remote.health()
    for idx, reply in zip(requests, replies):
        assert reply == pytest.approx([expected[i] for i in idx], abs=1e-4)
    assert health["requests"] == 96 and health["samples"] == 288
    assert health["batches"] < 96  # concurrent requests were merged
    assert health["rejected"] > 0 and health["held"] == 0  # the bound held, and the client retried the 429s


def test_texts_are_chunked_and_kept_in_order():
    fn = load_reward(f"{FNS}:slow_length")
    texts = ["x" * i for i in range(1, 10)]
    with running(lambda o, p, m: fn(o, p, m, seconds=0.05), "slow_length") as server:
        scores = RemoteReward(server.url, chunk=2, concurrency=3, **FAST)(texts, ["q"] * 9, [{}] * 9)
    assert scores == [float(i) for i in range(1, 10)]


def test_killed_server_is_retried_then_fails_clearly():
    command = [sys.executable, "-m", "omnialign", "serve-reward", f"{FNS}:slow_length", "--port", "0",
               "--options", '{"seconds": 1.0}']  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "serving reward" in line, line
        url = line.split(" at ")[1].split()[0]
        port = int(url.rsplit(":", 1)[1])
        remote = RemoteReward(url, retries=40, backoff=0.05, max_backoff=0.1)
        call = ThreadPoolExecutor(1).submit(remote, ["abc", "de"], ["q", "q"], [{}, {}])
        time.sleep(0.5)  # the request is being scored
        process.kill()
        process.wait()
        time.sleep(0.3)  # the client now meets a refused connection and retries
        assert not call.done()
        with running(load_reward(f"{FNS}:slow_length"), "restarted", port=port):  # back on the same port
            assert call.result(timeout=30) == [3.0, 2.0]
    finally:
        process.kill()
    start = time.monotonic()
    with pytest.raises(
        RewardServerError, match=rf"{url}/score: no answer after 3 attempts .* last error: ConnectionRefusedError"
    ):
        RemoteReward(url, retries=2, **FAST)(["abc"], ["q"], [{}])
    assert time.monotonic() - start < 2


def test_bad_token_fails_at_once_with_the_servers_message(monkeypatch):
    monkeypatch.delenv("OMNIALIGN_REWARD_TOKEN", raising=False)
    images, texts = glyph_batch(2)
    with running(glyph_ocr, "glyph_ocr", token="s3cret") as server:
        for token in ("wrong", None):
            start = time.monotonic()
            with pytest.raises(RewardServerError, match="HTTP 401: missing or wrong bearer token"):
                RemoteReward(server.url, token=token, retries=5, backoff=1.0)(images, texts, [{}, {}])
            assert time.monotonic() - start < 0.9  # no retry of a 4xx
        assert RemoteReward(server.url, token="s3cret")(images, texts, [{}, {}]) == pytest.approx(
            glyph_ocr(images, texts), abs=1e-5
        )
        monkeypatch.setenv("OMNIALIGN_REWARD_TOKEN", "s3cret")
        assert len(RemoteReward(server.url)(images, texts, [{}, {}])) == 2
        assert server.health()["requests"] == 2


def test_malformed_requests_are_400_naming_the_field():
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buffer, format="JPEG")
    png = to_png(torch.zeros(1, 8, 8))
    cases = [
        ({"images": ["not base64!"], "prompts": ["a"]}, r"images\[0\] is not a base64-encoded PNG"),
        (
            {
                "images": [base64.b64encode(png).decode(), base64.b64encode(buffer.getvalue()).decode()],
                "prompts": ["a", "b"],
            },
            r"images\[1\] is not a base64-encoded PNG \(no PNG signature",
        ),  # fmt: skip
        ({"images": [base64.b64encode(png[:40]).decode()], "prompts": ["a"]}, r"images\[0\] is not a base64"),
        (
            {
                "images": [base64.b64encode(png).decode(), base64.b64encode(to_png(torch.zeros(3, 8, 8))).decode()],
                "prompts": ["a", "b"],
            },
            r"images\[1\] has shape \(3, 8, 8\) but images\[0\] \(1, 8, 8\)",
        ),  # fmt: skip
        ({"texts": ["a"], "prompts": ["a"], "metadata": [{}, {}]}, "'metadata' must be a list of 1 objects"),
        ({"texts": ["a"], "images": [], "prompts": ["a"]}, "give exactly one of 'images'"),
        ({"texts": ["a"]}, "'prompts' must be a non-empty list"),
    ]
    with running(glyph_ocr, "glyph_ocr") as server:
        for body, message in cases:
            with pytest.raises(RewardServerError, match=f"HTTP 400: {message}"):
                post_json(f"{server.url}/score", body, retries=3, **FAST)
        with pytest.raises(RewardServerError, match="HTTP 404"):
            post_json(f"{server.url}/nope", {}, retries=3, **FAST)
        assert server.health()["requests"] == 0


def test_a_failing_reward_is_500_retried_then_reported():
    with running(load_reward(f"{FNS}:broken"), "broken") as server:
        with pytest.raises(
            RewardServerError, match="after 2 attempts.*HTTP 500: reward 'broken' failed: .*judge is down"
        ):
            RemoteReward(server.url, retries=1, **FAST)(["x"], ["q"], [{}])
        assert server.health()["failed_batches"] == 2


def test_remote_reward_in_a_weighted_sum_and_in_the_worker():
    images, texts = glyph_batch(8, seed=2)
    slow = lambda o, p, m: (time.sleep(0.6), glyph_ocr(o, p, m))[1]
    with running(slow, "slow_glyphs") as server:
        config = RewardConfig(
            weights={"remote_ocr": 1.0, "jpeg_compressibility": 0.01}, remote={"remote_ocr": server.url}
        )
        expected = score(images, texts, [{}] * 8, config)
        with RewardWorker(config) as worker:
            start = time.monotonic()
            futures = [worker.submit(images[lo : lo + 4], texts[lo : lo + 4], [{}] * 4) for lo in (0, 4)]
            assert time.monotonic() - start < 0.4  # submit does not wait for the server
            results = [f.result(timeout=30) for f in futures]
    assert torch.allclose(torch.cat([r.total for r in results]), expected.total, atol=1e-5)
    assert torch.allclose(expected.parts["remote_ocr"], torch.tensor(glyph_ocr(images, texts)), atol=1e-5)


def test_a_bad_request_in_a_batch_fails_alone_with_422():
    fn = load_reward(f"{FNS}:picky")
    calls = vars(sys.modules[fn.__module__])["PICKY_CALLS"]
    with running(fn, "picky") as server:
        remote = RemoteReward(server.url, retries=0)
        with ThreadPoolExecutor(5) as pool:
            first = pool.submit(remote, ["x"], ["q"], [{}])  # occupies the batcher while the others queue
            time.sleep(0.1)
            good = [pool.submit(remote, ["ab" * i], ["q"], [{}]) for i in (1, 2, 3)]
            bad = pool.submit(remote, ["abc"], ["q"], [{"bad": True}])
            assert first.result() == [1.0] and [g.result() for g in good] == [[2.0], [4.0], [6.0]]
            with pytest.raises(RewardServerError, match="HTTP 422: reward 'picky' failed: ValueError: metadata 'bad'"):
                bad.result()
    assert max(calls) == 4 and server.health()["failed_batches"] == 1  # batched together, then one by one


# Hostile and broken peers, against `omnialign serve-reward` in its own process with one-second limits.

TOKEN = "hostile-tests"


def serve(tmp_path_factory, timeout: int):
    """(url, pid) of a served `hang_if_asked` whose token is in a file and whose timeouts are `timeout` seconds."""
    token_file = tmp_path_factory.mktemp("token") / "token"
    token_file.write_text(TOKEN + "\n")
    command = [sys.executable, "-m", "omnialign", "serve-reward", f"{FNS}:hang_if_asked", "--port", "0",
               "--token-file", str(token_file), "--max-queue", "1000", "--reward-timeout", str(timeout),
               "--header-timeout", str(timeout), "--body-timeout", str(timeout)]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert "serving reward" in line, line
        yield line.split(" at ")[1].split()[0], process.pid
    finally:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The server with 1 s timeouts."""
    yield from serve(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def served_patiently(tmp_path_factory):
    """The server with 30 s timeouts, for a test that is not about them: on a busy machine a connection's first
    bytes can reach the server more than 1 s after it was accepted, and the header timeout would close it."""
    yield from serve(tmp_path_factory, 30)


def test_serve_reward_refuses_an_empty_token_file_and_a_zero_timeout(tmp_path):
    (tmp_path / "token").write_text("\n")
    with pytest.raises(SystemExit, match=r"--token-file .*token is empty; write the token into it"):
        main(["serve-reward", "jpeg_compressibility", "--token-file", str(tmp_path / "token")])
    with pytest.raises(SystemExit, match=r"--reward-timeout 0.0: must be a positive number of seconds"):
        main(["serve-reward", "jpeg_compressibility", "--port", "0", "--reward-timeout", "0"])


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def head(length: int, token: str | None = TOKEN, path: str = "/score") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return f"POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: {length}\r\n\r\n".encode()


def reply(sock: socket.socket) -> tuple[int, dict]:
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, json.loads(response.read())


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (looks without waiting)."""
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


def test_an_unauthenticated_huge_body_is_refused_before_it_is_read(served):
    url, pid = served
    rss = lambda: int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())[1]) << 10
    before = rss()
    clients = [connect(url) for _ in range(4)]
    for sock, token in zip(clients, (None, "wrong", None, "wrong")):
        sock.sendall(head(200_000_000, token) + b"[" * (1 << 20))  # 200 MB announced, 1 MiB sent
    for sock in clients:
        status, body = reply(sock)  # answered while 199 MB of the body are still to come
        assert status == 401 and body["error"].startswith("missing or wrong bearer token"), body
    for sock in clients:
        sock.sendall(b"[" * (16 << 20))  # more of the body: read and dropped, never kept
    assert rss() - before < 32 << 20
    for sock in clients:
        sock.close()


def test_slow_clients_are_dropped(served):
    url, _ = served
    loris = [connect(url) for _ in range(100)]
    slow_body = connect(url)
    slow_body.sendall(head(1000) + b'{"texts": ')
    start = time.monotonic()
    for sock in loris:
        sock.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\n")
    open_ = set(loris)
    while open_ and time.monotonic() - start < 3:  # a header byte every 0.1 s, slow-loris style
        for sock in list(open_):
            try:
                sock.send(b"X")
            except OSError:
                open_.discard(sock)
            if closed_by_server(sock):
                open_.discard(sock)
        time.sleep(0.1)
    assert not open_, f"{len(open_)} of 100 slow-header connections still open after {time.monotonic() - start:.1f}s"
    status, body = reply(slow_body)
    assert status == 408 and "body_timeout=1 s" in body["error"]
    assert time.monotonic() - start < 3 and closed_by_server(slow_body)
    assert RemoteReward(url, token=TOKEN, retries=0)(["abc"], ["q"], [{}]) == [3.0]


def test_300_simultaneous_connections_are_all_answered(served_patiently):
    url, _ = served_patiently
    host, port = url.removeprefix("http://").split(":")

    async def one(i: int) -> tuple[bytes, bytes]:
        reader, writer = await asyncio.open_connection(host, int(port))
        body = json.dumps({"texts": ["x" * i], "prompts": ["q"]}).encode()
        writer.write(head(len(body)).replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n") + body)
        data = await reader.read()  # to the end: the server closes after its reply
        writer.close()
        return data.split(b"\r\n", 1)[0], data.split(b"\r\n\r\n", 1)[1]

    async def all_at_once() -> list:
        return await asyncio.gather(*(asyncio.wait_for(one(i), 20) for i in range(300)), return_exceptions=True)

    results = asyncio.run(all_at_once())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, f"{len(errors)} of 300 failed, e.g. {errors[0]!r}"
    assert [status for status, _ in results] == [b"HTTP/1.1 200 OK"] * 300
    assert [json.loads(body)["scores"] for _, body in results] == [[float(i)] for i in range(300)]


def test_deeply_nested_json_is_400(served):
    url, _ = served
    sock = connect(url)
    body = b"[" * 100_000 + b"]" * 100_000
    sock.sendall(head(len(body)) + body)
    status, reply_ = reply(sock)
    assert status == 400 and "nests arrays or objects too deeply" in reply_["error"]


def test_a_hung_reward_times_out_and_the_server_goes_on(served):
    url, _ = served
    remote = RemoteReward(url, token=TOKEN, timeout=10, retries=0)
    start = time.monotonic()
    with pytest.raises(RewardServerError, match=r"HTTP 504: reward .*hang_if_asked' did not return within "
                       r"reward_timeout=1 s \(--reward-timeout\)"):  # fmt: skip
        remote(["abc"], ["q"], [{"hang": True}])
    assert time.monotonic() - start < 3
    assert remote(["abcd", "ab"], ["q", "q"], [{}, {}]) == [4.0, 2.0]
    health = remote.health()
    assert health["status"] == "ok" and health["timed_out"] == 1 and health["held"] == 0


def test_replies_are_not_held_back_on_a_kept_alive_connection():
    """Without TCP_NODELAY each reply's body waited ~40 ms for the client's delayed ACK (Nagle's algorithm)."""
    with running(load_reward(f"{FNS}:slow_length"), "quick") as server:
        sock = connect(server.url)
        start = time.monotonic()
        for _ in range(50):
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert reply(sock)[0] == 200
        assert time.monotonic() - start < 1.0  # 2 s held back; a busy CI machine needs room


def test_bodies_being_read_are_capped_in_memory():
    with running(load_reward(f"{FNS}:slow_length"), "capped", max_body=1 << 20, body_memory=2 << 20) as server:
        readers = [connect(server.url) for _ in range(2)]
        for sock in readers:  # two 1 MiB bodies, begun
            sock.sendall(head(1 << 20, None) + b'{"texts": ')
        deadline = time.monotonic() + 5
        while server.health()["reading"] < 2 << 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        sock = connect(server.url)
        sock.sendall(head(2, None) + b"{}")
        status, body = reply(sock)
        assert (
            status == 503
            and "2097152 body bytes are being read and 2 more would pass body_memory=2097152" in (body["error"])
        )
        for sock in readers:
            sock.close()  # the server lets their bytes go
        assert RemoteReward(server.url, retries=20, **FAST)(["abc"], ["q"], [{}]) == [3.0]
        assert server.health()["reading"] == 0


class ChatServer(ThreadingHTTPServer):
    """A small OpenAI-compatible chat endpoint whose 'VLM' is the glyphs recognizer.

    It reads the image with the recognizer (argmax per slot). An OCR request gets that text; a
    request that asks for an Alignment score gets a messy judge reply, alignment 5 when the
    reading equals the caption's quoted text and 1 otherwise. The first `fail_first` requests
    are answered 503. Request bodies and headers are kept in `seen`.
    """

    daemon_threads = True

    def __init__(self, fail_first: int = 0):
        super().__init__(("127.0.0.1", 0), ChatHandler)
        self.recognizer, self.fail_first, self.seen = load_recognizer(), fail_first, []
        self.lock = threading.Lock()

    def read(self, image: torch.Tensor) -> str:
        with torch.no_grad():
            ids = self.recognizer(image[None] * 2 - 1).argmax(-1)[0].tolist()
        return "".join(CHARSET[i] for i in ids if i < len(CHARSET))


class ChatHandler(JSONHandler):
    server: ChatServer

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.seen.append((self.path, dict(self.headers), body))
            fail = len(self.server.seen) <= self.server.fail_first
        if fail or self.path != "/v1/chat/completions":
            return self.answer(503 if fail else 404, {"error": {"message": "overloaded" if fail else "no such path"}})
        content = body["messages"][0]["content"]
        image_url = next(c["image_url"]["url"] for c in content if c["type"] == "image_url")
        question = next(c["text"] for c in content if c["type"] == "text")
        assert image_url.startswith("data:image/png;base64,")
        reading = self.server.read(from_png(base64.b64decode(image_url.split(",", 1)[1])))
        if "Alignment" in question:
            caption = question.split("Text caption: ")[1].split("\n")[0]
            alignment = 5 if f'"{reading}"' in caption else 1
            reply = f"I see {reading}.\n**Alignment Score (1-5):** {alignment}\nCoherence score = 4/5\nStyle: 3"
        else:
            reply = reading
        self.answer(200, {"id": "x", "object": "chat.completion", "model": body["model"],
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                                       "finish_reason": "stop"}]})  # fmt: skip


@contextmanager
def chat_server(fail_first: int = 0):
    with serving(ChatServer(fail_first)) as server:
        yield server


def test_ocr_through_an_openai_compatible_endpoint(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    texts = ["42", "7", "13", "5"]
    images = (render(texts, seed=5) + 1) / 2
    metadata = [{"ground_truth": t} for t in texts[:3]] + [{"ground_truth": "8"}]
    with chat_server(fail_first=1) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        scores = ocr_vlm(images, texts, metadata, url=url, model="glyphs-vlm", concurrency=2,
                         sampling={"temperature": 0.7, "top_p": 0.9})  # fmt: skip
    assert scores == [1.0, 1.0, 1.0, 0.0] and scores.info[0] == {"text": "42", "target": "42"}
    path, headers, body = server.seen[-1]
    assert path == "/v1/chat/completions" and headers["Authorization"] == "Bearer sk-test"
    assert body["model"] == "glyphs-vlm" and body["temperature"] == 0.7 and body["top_p"] == 0.9
    assert body["max_tokens"] == 256 and len(server.seen) == 5  # one 503, retried


def test_vlm_judge_through_an_openai_compatible_endpoint():
    texts = ["42", "7"]
    images = (render(texts, seed=6) + 1) / 2
    prompts = ['the number "42"', 'the number "9"']
    with chat_server() as server:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        scores = vlm_judge(images, prompts, [{}, {}], url=url, model="judge")
    assert scores == pytest.approx([(1 + 0.75 + 0.5) / 3, (0 + 0.75 + 0.5) / 3])
    assert scores.info[0]["alignment"] == 1.0 and scores.info[0]["text"].startswith("I see 42.")
    assert server.seen[0][2]["temperature"] == 0.0


def fake_png(width: int, height: int) -> str:
    """A base64 PNG whose header claims width x height pixels, followed by no image data at all."""
    header = b"\x89PNG\r\n\x1a\n" + (13).to_bytes(4, "big") + b"IHDR" + width.to_bytes(4, "big")
    return base64.b64encode(header + height.to_bytes(4, "big") + b"\x08\x00\x00\x00\x00" + b"\x00" * 4).decode()


def test_pixel_budget_is_checked_from_png_headers_before_decoding(monkeypatch):
    """A request whose images, frames or sources hold more pixels than --max-pixels (by their PNG headers) is 413
    with a JSON error before anything is decoded (a 12000 x 12000 frame was decoded to float and raised the
    server's memory by 1.3 GB); a decompression bomb under the budget is a 400 naming the image, not a 500."""
    png = base64.b64encode(to_png(torch.zeros(1, 32, 32))).decode()
    with running(glyph_ocr, "glyph_ocr", max_pixels=3_500) as server:
        url = f"{server.url}/score"
        cases = [({"images": [fake_png(12000, 12000)], "prompts": ["1"]}, "hold 144000000 pixels"),
                 ({"images": [png] * 4, "prompts": ["1"] * 4}, "hold 4096 pixels, over the server's 3500"),
                 ({"videos": [[png, png], [png, png]], "prompts": ["1", "2"]}, "hold 4096 pixels"),
                 ({"images": [png], "prompts": ["1"], "sources": [[png, png, png]]}, "hold 4096 pixels")]  # fmt: skip
        for body, message in cases:
            with pytest.raises(RewardServerError, match=f"HTTP 413: the request's images {message}.*--max-pixels"):
                post_json(url, body, retries=3, **FAST)
        assert len(post_json(url, {"images": [png] * 3, "prompts": ["1"] * 3}, retries=1, **FAST)["scores"]) == 3
        monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 500)  # 32 x 32 is then over Pillow's bomb limit (2 x 500)
        with pytest.raises(RewardServerError, match=r"HTTP 400: images\[0\] is not .*too large to decode"):
            post_json(url, {"images": [png], "prompts": ["1"]}, retries=3, **FAST)
        assert server.health()["requests"] == 1


class TrickleHandler(JSONHandler):
    """Answers every request slowly or hugely: `/trickle` one byte of a JSON reply every 0.2 s, `/huge` 20 MB of
    reply, `/garbage` bytes that are no JSON."""

    requests = 0

    def do_POST(self):
        TrickleHandler.requests += 1
        self.rfile.read(int(self.headers["Content-Length"]))
        data = {"/trickle": b'{"scores": [1.0]}', "/huge": b'{"x": "' + b"y" * (20 << 20) + b'"}',
                "/garbage": b"\xff\xfe\x00<html>"}[self.path]  # fmt: skip
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            if self.path == "/trickle":
                for byte in data:
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
                    time.sleep(0.2)
            else:
                self.wfile.write(data)
        except OSError:  # the client hung up, as it should
            pass


def test_every_client_call_has_a_whole_request_deadline_and_a_reply_cap():
    """post_json (which the reward client, the VLM rewards, geneval and the judge all call) bounds an attempt as a
    whole: an endpoint sending one byte every 0.2 s is cut off at the timeout and retried, not waited on for as long
    as it keeps sending (420 s on one geneval request before). A reply over max_reply fails at once, read no further;
    a reply that is no JSON names the URL."""
    TrickleHandler.requests = 0
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), TrickleHandler)) as server:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        start = time.monotonic()
        with pytest.raises(
            RewardServerError, match=r"/trickle: no answer after 2 attempts.*no whole reply within the request's 1 s"
        ):
            post_json(f"{url}/trickle", {}, timeout=1.0, retries=1, **FAST)
        assert time.monotonic() - start < 4 and TrickleHandler.requests == 2  # 3.4 s for one reply, twice
        with pytest.raises(RewardServerError, match=r"/huge: the reply is larger than 1048576 bytes"):
            post_json(f"{url}/huge", {}, max_reply=1 << 20, retries=3, **FAST)
        assert TrickleHandler.requests == 3  # not retried
        with pytest.raises(RewardServerError, match=r"/garbage: the reply is not JSON"):
            post_json(f"{url}/garbage", {}, retries=3, **FAST)


class ReplyHandler(JSONHandler):
    """Answers every POST with `reply`, whatever was sent."""

    reply: object = None

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.answer(200, ReplyHandler.reply)


@pytest.mark.parametrize("reply, message", [
    ({"scores": ["0.5", "0.5"], "info": [{}, {}]}, r'"scores"\[0\] is \'0.5\' \(2 such\): scores are JSON numbers'),
    ({"scores": [1.0, True], "info": [{}, {}]}, r'"scores"\[1\] is True \(1 such\)'),
    ({"scores": [None, 1.0], "info": [{}, {}]}, r'"scores"\[0\] is None'),
    ([0.5, 0.5], r"the reply is a list, not an object"),
    ({"scores": [0.5, 0.5]}, r'"info" is missing, not a list of 2 objects'),
    ({"scores": [0.5], "info": [{}]}, r'"scores" is a list of 1, not a list of 2 numbers; "info" is a list of 1'),
])  # fmt: skip
def test_a_malformed_reward_reply_is_refused_naming_the_field(reply, message):
    """A server's scores are trained on: strings, booleans and nulls are refused, not converted ("0.5" and true were
    read as 0.5 and 1.0 before), and a reply of the wrong form names what is missing."""
    ReplyHandler.reply = reply
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), ReplyHandler)) as server:
        remote = RemoteReward(f"http://127.0.0.1:{server.server_address[1]}", retries=0, **FAST)
        with pytest.raises(RewardServerError, match=rf"/score: {message}"):
            remote(["a", "b"], ["q", "q"], [{}, {}])
