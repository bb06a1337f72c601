"""The agent's CPU priority beside the job (`pslat agent --nice N`).

Once its probes are attached, every thread of the agent runs at nice N (new
threads inherit it from the main thread), so on cores the job saturates the
scheduler gives the job's threads the CPU first. A consumer that then falls
behind sheds host pairs (agent.shedding) instead of slowing the job down.
The stop path goes back to the start's priority: the 2 s a SIGTERM allows are
not spent waiting behind the job.
"""
from __future__ import annotations

import os

NICE_MIN, NICE_MAX = -20, 19


def check_nice(n: int) -> int:
    from core.errors import UserError

    if not NICE_MIN <= n <= NICE_MAX:
        raise UserError(f"--nice {n}: give a nice value from {NICE_MIN} to {NICE_MAX} "
                        "(higher: the job's threads get the CPU first)")
    return n


class Priority:
    """Sets every thread of this process to a nice value, and back."""

    def __init__(self) -> None:
        self.start_nice = os.getpriority(os.PRIO_PROCESS, 0)   # Linux: the calling thread's
        self.changed = False

    @staticmethod
    def _set_all(n: int) -> None:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.setpriority(os.PRIO_PROCESS, int(tid), n)
            except ProcessLookupError:   # a thread that just ended
                pass

    def set(self, n: int) -> None:
        """Usually lowers the priority (N > 0); a negative N, as root, raises it."""
        self._set_all(n)
        self.changed = True

    def restore(self) -> None:
        if self.changed:
            self._set_all(self.start_nice)
            self.changed = False
