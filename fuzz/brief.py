"""Brief in-process fuzzing with fixed seeds (`make test` runs every target this way)."""
from __future__ import annotations

import random
import signal
import time
from dataclasses import dataclass
from types import ModuleType

from fuzz.mutate import mutate


class Hang(Exception):
    pass


@dataclass
class BriefResult:
    inputs: int
    seconds: float


def _alarm(signum, frame):
    raise Hang()


def one(target: ModuleType, data: bytes, timeout_s: float = 5.0) -> None:
    """One input under a wall-clock limit: a Hang is raised past it."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        target.one_input(data)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run(target: ModuleType, seed: int, max_inputs: int, max_seconds: float,
        timeout_s: float = 5.0) -> BriefResult:
    """Seeds first, then mutants of them, until either budget is spent. An exception
    escaping one_input propagates with the input attached as `fuzz_input`."""
    rnd = random.Random(seed)
    pool = list(target.seeds())
    t0 = time.monotonic()
    n = 0
    queue = list(pool)
    while n < max_inputs and time.monotonic() - t0 < max_seconds:
        data = queue.pop() if queue else mutate(rnd, rnd.choice(pool) if pool else b"", pool)
        try:
            one(target, data, timeout_s)
        except BaseException as e:
            e.fuzz_input = data
            raise
        n += 1
    return BriefResult(n, time.monotonic() - t0)
