"""The read/write family's syscall hooks, detached while the traced TCP traffic does not use them.

The sockcalls probe hooks the entry and exit of eight syscalls on the whole machine. libzmq
(ps-lite, BytePS, psbench) moves its TCP bytes with sendto and recvfrom, and uses read and
write for its eventfd signals. Each of those enters and leaves the hooks without being TCP
(docs/cost.md). The events say which syscall moved each traced TCP byte, so each of read,
write, readv and writev is detached once it has been quiet:
- QUIET_S have passed with its hooks attached;
- the other syscalls carried at least QUIET_MIN_CALLS traced TCP calls meanwhile;
- it carried none.

Every detached kind is attached again, and waits for a new quiet window, when:
- a new traced process appears (it may use them: a job starting beside another);
- the walker counts a stream gap (bytes moved by a call the probe did not see);
- RECHECK_S have passed since it was detached. A connection that starts after the
  detach and moves its bytes only through a detached call is seen from then on.

Closing a perf event waits for an RCU grace period (agent/detach.py): the closing runs in a
thread of its own, off the agent's loop."""
from __future__ import annotations

import threading
import time
from typing import Callable

from probes.events import SockCall

QUIET_S = 10.0
QUIET_MIN_CALLS = 1000
RECHECK_S = 60.0
KINDS = (SockCall.READ, SockCall.WRITE, SockCall.READV, SockCall.WRITEV)


def _tracepoints(kind: SockCall) -> tuple[tuple[bytes, bytes], ...]:
    """(tracepoint, program) of a kind's entry and exit, as the probe attaches them."""
    from probes.sockcalls import SOCKCALLS

    ends = (f"sys_enter_{kind.name.lower()}", f"sys_exit_{kind.name.lower()}")
    return tuple((a.target.encode(), a.fn.encode()) for a in SOCKCALLS.attach if a.target.endswith(ends))


class CallHooks:
    """Follows which syscalls carry traced TCP calls (seen() per sockcalls event) and detaches
    or attaches the read/write family's hooks in tick() (about once a second)."""

    def __init__(self, bpf, now_s: float, log: Callable[[str], None], quiet_s: float = QUIET_S,
                 close_fd: Callable[[int], object] | None = None):
        self._bpf = bpf
        self._log = log
        self._quiet_s = quiet_s
        if close_fd is None:
            from bcc import lib
            close_fd = lib.bpf_close_perf_event_fd
        self._close_fd = close_fd
        self.calls = [0] * (max(SockCall) + 1)   # traced TCP calls per SockCall value, since the start
        # kind -> (its quiet window's start, its calls then, the other kinds' calls then)
        self._window = {k: (now_s, 0, 0) for k in KINDS}
        self.detached: dict[SockCall, float] = {}   # kind -> when (monotonic s)
        self.changes: list[dict] = []            # for meta.json: what was detached or attached, when, why
        self._processes = None
        self._gaps = None
        self._closing: list[threading.Thread] = []

    def seen(self, call: int) -> None:
        if 0 <= call < len(self.calls):
            self.calls[call] += 1

    def _other_calls(self, kind: SockCall) -> int:
        return sum(self.calls) - self.calls[kind]

    def _window_from(self, now_s: float, kind: SockCall) -> tuple[float, int, int]:
        return now_s, self.calls[kind], self._other_calls(kind)

    def tick(self, now_s: float, processes_seen: int, stream_gaps: int) -> None:
        new_process = self._processes is not None and processes_seen != self._processes
        gap = self._gaps is not None and stream_gaps > self._gaps
        self._processes, self._gaps = processes_seen, stream_gaps
        if self.detached:
            why = ("a new traced process" if new_process else "a stream gap" if gap else
                   "the re-check" if now_s - min(self.detached.values()) >= RECHECK_S else None)
            if why is not None:
                self._attach(now_s, why)
                return
        quiet = []
        for kind in KINDS:
            if kind in self.detached:
                continue
            since, own, others = self._window[kind]
            if self.calls[kind] != own:   # it carries traced TCP calls: a new window
                self._window[kind] = self._window_from(now_s, kind)
            elif now_s - since >= self._quiet_s and self._other_calls(kind) - others >= QUIET_MIN_CALLS:
                quiet.append(kind)
        if quiet:
            self._detach(now_s, quiet)

    def _detach(self, now_s: float, kinds: list[SockCall]) -> None:
        fds = [self._bpf.tracepoint_fds.pop(tp) for k in kinds for tp, _ in _tracepoints(k)
               if tp in self._bpf.tracepoint_fds]
        t = threading.Thread(target=lambda: [self._close_fd(fd) for fd in fds], name="pslat-callhooks",
                             daemon=True)
        t.start()
        self._closing = [c for c in self._closing if c.is_alive()] + [t]
        for k in kinds:
            self.detached[k] = now_s
        self._note(now_s, "detached", kinds, "no traced TCP call in them")

    def _attach(self, now_s: float, why: str) -> None:
        kinds = sorted(self.detached)
        for k in kinds:
            for tp, fn in _tracepoints(k):
                if tp not in self._bpf.tracepoint_fds:
                    self._bpf.attach_tracepoint(tp=tp, fn_name=fn)
            del self.detached[k]
            self._window[k] = self._window_from(now_s, k)
        self._note(now_s, "attached", kinds, why)

    def _note(self, now_s: float, what: str, kinds: list[SockCall], why: str) -> None:
        names = [k.name.lower() for k in kinds]
        self.changes.append({"at_mono_ns": int(now_s * 1e9), what: names, "why": why})
        del self.changes[:-100]   # the latest hundred
        self._log(f"{what} the {', '.join(names)} hooks: {why}")

    def close(self, timeout_s: float = 5.0) -> None:
        """Wait for detaches under way (the probes' own detach comes after)."""
        deadline = time.monotonic() + timeout_s
        for t in self._closing:
            t.join(max(0.0, deadline - time.monotonic()))
