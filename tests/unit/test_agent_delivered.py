"""agent.delivered: the watermark a drain gives when its budget cut it short, and
agent.sources.latest_ts_ns, the timestamp of the event where it stopped."""
from __future__ import annotations

import ctypes

import pytest

from agent.delivered import OUTPUT_SLACK_NS, Delivered
from agent.sources import latest_ts_ns
from probes.events import NsTxDoneEvent, NsTxEvent, SockcallEvent
from probes.framework import FwEvent

MS = 1_000_000
RINGS = ["sockcalls", "netstack", "framework"]


def _delivered(at_ns: int = 0) -> Delivered:
    d = Delivered()
    for ring in RINGS:
        d.add_ring(ring, at_ns)
    return d


def test_emptied_rings_give_the_drain_start():
    d = _delivered()
    for ring in RINGS:
        d.emptied(ring, 1000 * MS)
    assert d.watermark_ns() == 1000 * MS


def test_the_ring_that_lags_holds_the_watermark_back():
    """sockcalls and framework emptied, netstack cut far behind: the watermark is netstack's
    last event less the slack, and it moves on as later drains get further."""
    d = _delivered(5 * MS)
    d.emptied("sockcalls", 2000 * MS)
    d.cut("netstack", 2000 * MS, 1200 * MS)
    d.emptied("framework", 2000 * MS)
    assert d.through_ns == {"sockcalls": 2000 * MS, "netstack": 1200 * MS - OUTPUT_SLACK_NS,
                            "framework": 2000 * MS}
    assert d.watermark_ns() == 1200 * MS - OUTPUT_SLACK_NS
    d.cut("netstack", 2300 * MS, 1900 * MS)
    assert d.watermark_ns() == 1900 * MS - OUTPUT_SLACK_NS
    d.emptied("netstack", 2600 * MS)
    d.emptied("framework", 2600 * MS)
    assert d.watermark_ns() == 2000 * MS   # sockcalls, not drained since, is the laggard now


def test_never_past_the_drain_start_and_never_back():
    d = _delivered()
    # an event output during the drain, after it began: the bound stays at the start
    d.cut("netstack", 1000 * MS, 1000 * MS + 5 * OUTPUT_SLACK_NS)
    assert d.through_ns["netstack"] == 1000 * MS
    # an older event later (another CPU's, out of order within the slack): no step back
    d.cut("netstack", 1100 * MS, 900 * MS)
    assert d.through_ns["netstack"] == 1000 * MS
    # an event that cannot say its time: nothing learnt for its ring
    d.cut("netstack", 1200 * MS, None)
    assert d.through_ns["netstack"] == 1000 * MS
    d.emptied("netstack", 1300 * MS)
    assert d.through_ns["netstack"] == 1300 * MS


def test_a_ring_added_later_starts_where_its_probes_attached():
    d = Delivered()
    assert d.watermark_ns() is None
    for ring in RINGS[:2]:
        d.add_ring(ring, 0)
        d.emptied(ring, 3000 * MS)
    d.add_ring("framework", 2500 * MS)     # a process with the framework library showed up
    assert d.watermark_ns() == 2500 * MS
    d.add_ring("framework", 2900 * MS)     # adding it again changes nothing
    assert d.through_ns["framework"] == 2500 * MS


def _raw(struct: ctypes.Structure) -> bytes:
    return ctypes.string_at(ctypes.addressof(struct), ctypes.sizeof(struct))


def test_latest_ts_of_each_probe():
    call = SockcallEvent(enter_ts_ns=100, exit_ts_ns=250)
    assert latest_ts_ns("sockcalls", _raw(call)) == 250
    fw = FwEvent(ts_ns=10, first_ret_ts_ns=20, ret_ts_ns=30)
    assert latest_ts_ns("framework", _raw(fw)) == 30
    tx = NsTxEvent(kind=NsTxEvent.kind_value, ts_expect_ns=7, ts_queue_ns=9, ts_xmit_ns=8)
    assert latest_ts_ns("netstack", _raw(tx)) == 9
    done = NsTxDoneEvent(kind=NsTxDoneEvent.kind_value, ts_xmit_ns=40, ts_done_ns=45)
    assert latest_ts_ns("netstack", _raw(done)) == 45


@pytest.mark.parametrize("probe,raw", [("sockcalls", b"\x01" * 12), ("netstack", b"\xff" * 8),
                                       ("netstack", b""), ("agent", b"{}")])
def test_latest_ts_unknown_is_none(probe, raw):
    assert latest_ts_ns(probe, raw) is None


def test_a_ring_far_ahead_waits_for_the_laggard():
    d = _delivered()
    d.emptied("framework", 3000 * MS)
    d.emptied("netstack", 3000 * MS)
    d.cut("sockcalls", 3000 * MS, 1000 * MS)   # sockcalls 2.1 s behind
    assert [r for r in RINGS if d.ahead(r)] == ["netstack", "framework"]
    d.cut("sockcalls", 3200 * MS, 2500 * MS + OUTPUT_SLACK_NS)   # within the limit again
    assert not any(d.ahead(r) for r in RINGS)
    assert not Delivered().ahead("sockcalls")
