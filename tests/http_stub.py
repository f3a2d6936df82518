"""Loopback HTTP pieces shared by the tests' stand-in servers (OpenAI-compatible chat, judge)."""

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler


@contextmanager
def serving(server):
    """Serve `server` on a daemon thread for the block; shut it down and close it afterwards."""
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


class JSONHandler(BaseHTTPRequestHandler):
    """A quiet request handler that answers with JSON bodies."""

    def log_message(self, format, *args):
        pass

    def answer(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
