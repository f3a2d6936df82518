"""Serving benchmark of `omnialign serve-reward` (issue 15): the http.server version of commit 87f4eb9
and the current uvicorn one, side by side in one run, at several numbers of concurrent clients.

    .venv/bin/python benchmarks/serve_reward.py --clients 8 64 256 --requests 2000 --out benchmarks/serve_reward.json

Each server runs in its own process with the `jpeg_compressibility` reward and default flags; the old
one is `git show 87f4eb9:omnialign/rewards/server.py` written to a temporary folder and imported from
there. The load is N clients on one asyncio loop in this process, each sending `POST /score` with one
32x32 RGB PNG (16 distinct images in turn) and waiting for the reply before the next, over one
keep-alive connection when the server allows it (the old server answers HTTP/1.0 and closes every
connection, so its clients reconnect for each request). A request whose connection fails (refused,
reset, cut short, no reply in 30 s) is sent again on a new connection, and a 429 after 50 ms; both are
counted. Latency is from the first send to the whole reply, retries included. Every score is checked
against the in-process score of the same PNG. Per server and client count: `--warmup` requests, then
`--requests` timed ones; the mean batch is samples per reward call over the timed part (/health).
Both servers run with OMP_NUM_THREADS=1: on a busy 2-core machine torch's two-thread pool made the
reward's `round()` of one 32x32 image take 7 ms instead of 0.04 ms, which would measure that, not serving.
"""

import argparse
import asyncio
import base64
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from omnialign.rewards.base import from_png, to_png
from omnialign.rewards.client import post_json
from omnialign.rewards.jpeg import jpeg_compressibility

ROOT = Path(__file__).resolve().parents[1]
OLD = "87f4eb9"  # the last commit with the http.server reward server
OLD_MAIN = (
    "import sys; sys.path.insert(0, sys.argv[1]); from old_server import serve; "
    "from omnialign.rewards import lookup; serve(lookup('jpeg_compressibility'), 'jpeg_compressibility', port=0)"
)


def start(name: str, folder: Path) -> tuple[subprocess.Popen, str]:
    """A server process and its URL, read from its first line."""
    if name == "old":
        (folder / "old_server.py").write_bytes(
            subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{OLD}:omnialign/rewards/server.py"], check=True, capture_output=True
            ).stdout  # fmt: skip
        )
        command = [sys.executable, "-c", OLD_MAIN, str(folder)]
    else:
        command = [sys.executable, "-m", "omnialign", "serve-reward", "jpeg_compressibility", "--port", "0"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # see the docstring
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    line = process.stdout.readline()
    if " at http" not in line:
        process.kill()
        raise RuntimeError(f"{name} server did not start: {line!r}")
    return process, line.split(" at ")[1].split()[0]


def requests_and_scores(n: int = 16) -> tuple[list[bytes], list[float]]:
    """n POST /score requests of one random 32x32 RGB PNG each, and each one's in-process score."""
    g = torch.Generator().manual_seed(0)
    pngs = [to_png(torch.rand(3, 32, 32, generator=g)) for _ in range(n)]
    requests = []
    for png in pngs:
        body = json.dumps({"images": [base64.b64encode(png).decode()], "prompts": ["p"]}).encode()
        head = (
            f"POST /score HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        requests.append(head.encode() + body)
    return requests, [jpeg_compressibility(from_png(png)[None], ["p"], [{}])[0] for png in pngs]


async def read_reply(reader: asyncio.StreamReader) -> tuple[int, bytes, bool]:
    """(status, body, whether the connection stays open) of one HTTP reply."""
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed before the reply")
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        key, value = line.decode().split(":", 1)
        headers[key.strip().lower()] = value.strip().lower()
    body = await reader.readexactly(int(headers["content-length"]))
    return (
        int(status_line.split()[1]),
        body,
        status_line.startswith(b"HTTP/1.1") and headers.get("connection") != "close",
    )


async def load(url: str, clients: int, total: int, requests: list[bytes], expected: list[float]) -> dict:
    host, port = url.removeprefix("http://").split(":")
    tickets, latencies = itertools.count(), []
    counts = {"connection_errors": 0, "busy_429": 0, "wrong": 0}

    async def client() -> None:
        connection = None
        while (i := next(tickets)) < total:
            k, began = i % len(requests), time.perf_counter()
            while True:
                try:
                    if connection is None:
                        connection = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 30)
                    connection[1].write(requests[k])
                    status, body, keep = await asyncio.wait_for(read_reply(connection[0]), 30)
                except (OSError, asyncio.IncompleteReadError, TimeoutError):
                    counts["connection_errors"] += 1
                    status, keep = None, False
                if not keep and connection is not None:
                    connection[1].close()
                    connection = None
                if status == 429:
                    counts["busy_429"] += 1
                    await asyncio.sleep(0.05)
                elif status is not None:
                    break
            latencies.append(time.perf_counter() - began)
            counts["wrong"] += status != 200 or abs(json.loads(body)["scores"][0] - expected[k]) > 1e-9
        if connection is not None:
            connection[1].close()

    began = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    seconds = time.perf_counter() - began
    q = statistics.quantiles(latencies, n=100)
    return {"answered": len(latencies), "requests_per_s": round(total / seconds, 1),
            "p50_ms": round(q[49] * 1000, 1), "p99_ms": round(q[98] * 1000, 1), **counts}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[8, 64, 256])
    p.add_argument("--requests", type=int, default=2000, help="timed requests per server and client count")
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--out", help="write the rows as JSON here")
    args = p.parse_args()
    requests, expected = requests_and_scores()
    rows, processes = [], []
    with tempfile.TemporaryDirectory() as folder:
        try:
            servers = {}
            for name in ("old", "new"):
                process, servers[name] = start(name, Path(folder))
                processes.append(process)
            for clients in args.clients:
                for name, url in servers.items():
                    asyncio.run(load(url, clients, args.warmup, requests, expected))
                    before = post_json(f"{url}/health", None, retries=0)
                    row = asyncio.run(load(url, clients, args.requests, requests, expected))
                    after = post_json(f"{url}/health", None, retries=0)
                    mean_batch = (after["samples"] - before["samples"]) / (after["batches"] - before["batches"])
                    rows.append({"server": name, "clients": clients, **row, "mean_batch": round(mean_batch, 1)})
                    print(json.dumps(rows[-1]), flush=True)
        finally:
            for process in processes:
                process.kill()
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
