"""Symbolic equivalence of math answers, bounded in time: math-verify (sympy) in a helper process.

`equivalent(gold, answer, timeout)` is True when math-verify parses both (LaTeX or plain; a
string without `$`, `\\(`, `\\[` or `\\boxed` is read as one formula) and finds them equal, False
when it does not, and None when the check ran over `timeout` seconds. Sympy can run away on
adversarial input and a thread cannot be stopped, so the checks run in a helper process (this
file run as a script, which imports nothing of omnialign): a check over time kills it and the
next call starts a fresh one (about a second). Calls from several threads take turns.
"""

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time


def as_formula(text: str) -> str:
    """`text` with `$...$` around it unless it already marks its math."""
    text = text.strip()
    return text if any(mark in text for mark in ("$", "\\(", "\\[", "\\boxed")) else f"${text}$"


class _Helper:
    def __init__(self):
        self.lock = threading.Lock()
        self.process: subprocess.Popen | None = None
        atexit.register(self.stop)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def _read_line(self, timeout: float) -> bytes | None:
        deadline, line = time.monotonic() + timeout, b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.process.stdout], [], [], left)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 65536)
            if not chunk:
                raise RuntimeError("the math-verify helper process exited; is math-verify installed?")
            line += chunk
        return line

    def check(self, gold: str, answer: str, timeout: float) -> bool | None:
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                # -P: this file's folder stays off sys.path; the environment (PYTHONPATH) is kept
                self.process = subprocess.Popen([sys.executable, "-P", __file__], stdin=subprocess.PIPE,
                                                stdout=subprocess.PIPE, bufsize=0)  # fmt: skip
                if self._read_line(120.0) != b"ready\n":
                    self.stop()
                    raise RuntimeError("the math-verify helper process did not start; is math-verify installed?")
            self.process.stdin.write(json.dumps([gold, answer]).encode() + b"\n")
            line = self._read_line(timeout)
            if line is None:
                self.stop()
                return None
            return json.loads(line)


_HELPER = _Helper()


def equivalent(gold: str, answer: str, timeout: float = 5.0) -> bool | None:
    """Whether `answer` equals `gold` symbolically; None when the check ran over `timeout` seconds."""
    return _HELPER.check(as_formula(gold), as_formula(answer), timeout)


def _serve() -> None:
    """The helper: JSON lines [gold, answer] in, true/false lines out, on a private copy of stdout."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into the replies
    import logging

    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # it warns that we bound time ourselves

    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        gold, answer = json.loads(line)
        try:
            same = bool(verify(parse(gold, parsing_timeout=None), parse(answer, parsing_timeout=None),
                               timeout_seconds=None))  # fmt: skip
        except Exception:
            same = False
        out.write(json.dumps(same) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
