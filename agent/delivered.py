"""How far the live consumer has come in each ring: the watermark a drain can give
even when its time budget cut it short.

A watermark T says "every event before T has been delivered" (agent/correlate.py):
groups of the correlator settle, and rows that waited in vain go out, only as T
moves. A drain that empties every ring gives T = its start. A consumer that is
behind (a job faster than the agent, until shedding catches up) does not empty
them; with no other watermark nothing settled, and the correlator held the whole
backlog (tens of thousands of groups, 470-810 MB of RSS in closed loops).

What a drain proves, per ring (each is consumed on its own, in output order:
bpf_ringbuf_output copies at once):
- a ring it emptied holds nothing output before the drain began;
- a ring whose time share ran out was consumed up to its last event L. No
  timestamp an event carries is later than its output, so the events left have
  their times after L's latest timestamp, less how long a probe may take from a
  timestamp to its output (OUTPUT_SLACK_NS: a preempted program; measured runs
  take microseconds).
The watermark is the least of the rings' bounds, so it never passes an event
still waiting in a ring that lags (session 2: 76-152 of 9,600 messages lost
their framework times when a watermark outran the framework ring).

A ring more than AHEAD_LIMIT_NS ahead of the watermark is not read until the
others catch up: its records would only wait in the correlator for partners
still in the lagging ring, as Python objects (measured: 25k wire messages and
50k framework records held, RSS +300 MB, with the framework ring read 2.5 s
ahead of sockcalls'), where the ring keeps them in a few hundred bytes each.
"""
from __future__ import annotations

OUTPUT_SLACK_NS = 100_000_000
AHEAD_LIMIT_NS = 500_000_000


class Delivered:
    """Per ring: every event output before `through_ns[ring]` has been handed on."""

    def __init__(self) -> None:
        self.through_ns: dict[str, int] = {}

    def add_ring(self, ring: str, since_ns: int) -> None:
        """A ring whose probes attach now: it holds no event from before `since_ns`."""
        self.through_ns.setdefault(ring, since_ns)

    def emptied(self, ring: str, start_ns: int) -> None:
        """A drain that began at `start_ns` emptied `ring`."""
        self._raise(ring, start_ns)

    def cut(self, ring: str, start_ns: int, last_ts_ns: int | None) -> None:
        """A drain that began at `start_ns` stopped in `ring` after an event whose latest
        timestamp is `last_ts_ns` (None: it cannot say, and nothing is learnt)."""
        if last_ts_ns is not None:
            self._raise(ring, min(last_ts_ns - OUTPUT_SLACK_NS, start_ns))

    def _raise(self, ring: str, bound_ns: int) -> None:
        if bound_ns > self.through_ns.get(ring, bound_ns - 1):   # never back
            self.through_ns[ring] = bound_ns

    def ahead(self, ring: str) -> bool:
        """Far enough ahead of the laggard that reading it now only moves its backlog
        from the ring into the agent's memory."""
        floor = self.watermark_ns()
        return floor is not None and self.through_ns.get(ring, floor) > floor + AHEAD_LIMIT_NS

    def watermark_ns(self) -> int | None:
        return min(self.through_ns.values()) if self.through_ns else None
