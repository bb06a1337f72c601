"""The netstack probe's clock samples (struct ns_clock_event, probes/events.h) ->
rows of the `clock_samples` table (records.CLOCK_SAMPLES_SCHEMA).

A segment that starts a burst on a traced flow is reported by its sender (driver
handoff) and by its receiver (arrival); the report matches the two by flow and
seq into one-way samples for the clock estimate (reports/clocks.py). They are
what the per-message times cannot give: a large message's times are those of its
last segment, which queued behind the rest of its own burst on the way.
"""
from __future__ import annotations

from agent.endpoints import addr_text
from probes.events import NsEventKind

NS_EV_CLOCK = int(NsEventKind.CLOCK)   # enum ns_event_kind (probes/events.h)


def clock_sample_row(ev, host_id: str) -> dict:
    """One NsClockEvent -> one row (times as the host's CLOCK_MONOTONIC ns)."""
    return {"host_id": host_id, "direction": "rx" if ev.rx else "tx",
            "src_ip": addr_text(ev.family, bytes(ev.saddr)), "src_port": ev.sport,
            "dst_ip": addr_text(ev.family, bytes(ev.daddr)), "dst_port": ev.dport,
            "seq": ev.seq, "ts_ns": ev.ts_ns}
