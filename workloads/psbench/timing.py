"""Clocks and timers for psbench: all times are CLOCK_MONOTONIC ns
(time.monotonic_ns), the clock the agent's BPF timestamps use.

Sleeping precisely: Python's epoll/poll timeouts round to 1 ms and the kernel
adds "timer slack" (50 us by default) to every sleep. We shrink this thread's
slack to 1 us, sleep with clock_nanosleep (time.sleep) until a short margin
before the deadline, and spin the rest, yielding the CPU and the GIL
(os.sched_yield releases the GIL) so other threads of the process still run.
"""
from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path

SPIN_MARGIN_NS = 150_000

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_SET_TIMERSLACK = 29

try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _prctl = _libc.prctl
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
except (OSError, AttributeError):  # not Linux: keep working, less precisely
    _prctl = None


def _call_prctl(option: int, arg: int) -> bool:
    return _prctl is not None and _prctl(option, arg, 0, 0, 0) == 0


_one_name: str | None = None   # name_all_threads(): every thread gets it


def set_thread_name(name: str) -> None:
    """Name the calling OS thread (/proc/<pid>/task/<tid>/comm, 15 chars), so
    probes and `top -H` can tell psbench's threads apart."""
    if _prctl is not None:
        buf = ctypes.create_string_buffer((_one_name or name).encode()[:15])
        _prctl(_PR_SET_NAME, ctypes.addressof(buf), 0, 0, 0)


def name_all_threads(name: str) -> None:
    """One name for every thread of this process, those running (libzmq's name
    themselves) and those set_thread_name() names later: tests trace a process
    whose comm is chosen (markup, to check the reports escape it)."""
    global _one_name
    _one_name = name
    for task in Path("/proc/self/task").iterdir():
        try:
            (task / "comm").write_bytes(name.encode()[:15])
        except OSError:   # the thread ended meanwhile
            pass


def set_fine_timer_slack() -> bool:
    """Timer slack of 1 us for the calling thread (inherited by threads it starts)."""
    return _call_prctl(_PR_SET_TIMERSLACK, 1000)


def die_with_parent() -> bool:
    """SIGTERM this process when the process that started it exits."""
    import signal
    return _call_prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def sleep_until(deadline_ns: int) -> int:
    """Block until time.monotonic_ns() >= deadline_ns; returns the wake-up time."""
    now = time.monotonic_ns()
    coarse = deadline_ns - now - SPIN_MARGIN_NS
    if coarse > 0:
        time.sleep(coarse / 1e9)
        now = time.monotonic_ns()
    while now < deadline_ns:
        os.sched_yield()
        now = time.monotonic_ns()
    return now


def sleep_ns(duration_ns: int) -> int:
    if duration_ns <= 0:
        return time.monotonic_ns()
    return sleep_until(time.monotonic_ns() + duration_ns)


class IssueSchedule:
    """Open-loop issue times: request k is due at t0 + k * period, computed
    from k (not from the previous wake-up), so late wake-ups never accumulate
    into drift; a late request is issued at once and keeps its scheduled time."""

    def __init__(self, rate_per_s: float, t0_ns: int):
        if not rate_per_s > 0:
            raise ValueError("rate must be > 0")
        self.period_ns = 1e9 / rate_per_s
        self.t0_ns = t0_ns
        self.k = 0

    def next_due_ns(self) -> int:
        due = self.t0_ns + int(round(self.k * self.period_ns))
        self.k += 1
        return due
