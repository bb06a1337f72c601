"""`pslat agent` as a child process, for the demo, the benchmarks and tests.

Started, it is waited for until it says "ready:" on stderr (its probes are
attached), never for a fixed time; stopped, it gets SIGINT and is given time to
detach and close its run dirs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from core.errors import UserError

READY_MARK = "ready:"


class ChildProcess:
    """A child process that says "ready:" on stderr once it is ready (`pslat agent`,
    bench.floor); a context manager that stops it on exit. Its stderr lines are kept
    with the time each was read; its stdout too when capture_stdout."""

    def __init__(self, argv: list[str], name: str = "the agent", ready_timeout_s: float = 120.0, echo=None,
                 cwd: Path | None = None, capture_stdout: bool = False):
        self.name = name
        self.proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=os.environ.copy(), cwd=cwd,
                                     stdout=subprocess.PIPE if capture_stdout else None)
        self.lines: list[str] = []
        self.lines_ns: list[int] = []   # CLOCK_MONOTONIC when each stderr line was read
        self.stdout = ""
        self._echo = echo
        self._ready = threading.Event()
        # one reader from the start: a select() on the pipe misses lines already in the
        # file object's buffer (a warning read in one chunk with "ready:" hid it), and
        # draining keeps the child from blocking on a full pipe
        self._drain = threading.Thread(target=self._read_rest, daemon=True)
        self._drain.start()
        self._out = None
        if capture_stdout:
            self._out = threading.Thread(target=self._read_stdout, daemon=True)
            self._out.start()
        deadline = time.monotonic() + ready_timeout_s
        while not self._ready.wait(0.05):
            if self.proc.poll() is not None:
                self._drain.join(5)
                if self._ready.is_set():
                    break
                raise UserError(f"{name} exited with {self.proc.returncode} before it was ready: "
                                f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise UserError(f"{name} did not get ready in {ready_timeout_s:g} s: {self.log_tail()}")

    def _read_stdout(self) -> None:
        self.stdout = self.proc.stdout.read()

    def first_line_ns(self, text: str) -> int | None:
        """When the first stderr line after "ready:" containing text was read."""
        ready = next((i for i, line in enumerate(self.lines) if READY_MARK in line), len(self.lines))
        return next((t for t, line in zip(self.lines_ns[ready + 1:], self.lines[ready + 1:]) if text in line), None)

    def _add(self, line: str) -> None:
        self.lines_ns.append(time.monotonic_ns())
        self.lines.append(line)
        if self._echo:
            self._echo(line.rstrip("\n"))

    def _read_rest(self) -> None:
        for line in self.proc.stderr:
            self._add(line)
            if READY_MARK in line and not self._ready.is_set():
                self.ready_ns = time.monotonic_ns()
                self._ready.set()

    def log_tail(self, n: int = 10) -> str:
        return "".join(self.lines[-n:]).strip()

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGINT, then wait for it to detach and close its run dirs; its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise UserError(f"{self.name} did not stop within {timeout_s:g} s after SIGINT: {self.log_tail()}")
        self._drain.join(5)
        if self._out is not None:
            self._out.join(5)
        return rc

    @property
    def pid(self) -> int:
        return self.proc.pid

    def terminate(self, timeout_s: float = 60.0) -> tuple[int, float]:
        """SIGTERM (as a service manager stops it); its exit status and the seconds
        from the signal to its exit."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise UserError(f"{self.name} did not stop within {timeout_s:g} s after SIGTERM: {self.log_tail()}")
        took_s = time.monotonic() - t0
        self._drain.join(5)
        return rc, took_s

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "ChildProcess":
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            try:
                self.stop()
            finally:
                self.kill()


class AgentProcess(ChildProcess):
    """`pslat agent --out OUT ARGS...`."""

    def __init__(self, out: Path, args: list[str], ready_timeout_s: float = 120.0, echo=None):
        self.out = Path(out)
        super().__init__([sys.executable, "-m", "pslat.cli", "agent", "--out", str(self.out), *args],
                         "the agent", ready_timeout_s, echo)
