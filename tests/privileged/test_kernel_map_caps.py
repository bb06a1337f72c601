"""The kernel's per-connection maps are bounded and say what they evicted.

The sockcalls probe with its connection and walker maps cut to 64 entries traces
300 connections held open at once on loopback, each having sent a few bytes both
ways: each map made an entry per connection end (or direction walked), so a full
map evicted at least all but 64 of them, and the counters (conns_evicted,
walks_evicted) must say so; closing them all removes what is left."""
from __future__ import annotations

import socket

import pytest

pytestmark = pytest.mark.privileged

CONNS = 300
MAP_ENTRIES = 64


def test_full_connection_maps_count_what_they_evicted():
    from probes.filters import Filters
    from probes.loader import ProbeProgram
    from probes.sockcalls import SOCKCALLS

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(CONNS)
    port = srv.getsockname()[1]
    overrides = {"SOCKCALLS_CONNS_MAX": MAP_ENTRIES, "SOCKCALLS_WALK_CONNS_MAX": MAP_ENTRIES}
    with ProbeProgram.start([SOCKCALLS], Filters.build(ports=[port]), overrides=overrides) as prog:
        prog.on_events(lambda _probe, ev: None)
        pairs = []
        for _ in range(CONNS):
            c = socket.create_connection(("127.0.0.1", port))
            s, _ = srv.accept()
            c.sendall(b"hello")
            s.recv(16)
            s.sendall(b"world")
            c.recv(16)
            pairs.append((c, s))
        prog.consume()
        held = prog.counters()["sockcalls"]
        for c, s in pairs:
            c.close()
            s.close()
        prog.consume()
        after = prog.counters()["sockcalls"]
    srv.close()
    # both ends of every connection got an entry; at most MAP_ENTRIES are kept
    assert held["conns_made"] >= 2 * CONNS
    assert held["conns_evicted"] >= CONNS
    assert held["walks_made"] >= 2 * CONNS and held["walks_evicted"] >= CONNS
    # a close removes only what is still there: never more than was made
    assert after["conns_removed"] <= after["conns_made"]
    assert after["conns_made"] - after["conns_removed"] - after["conns_evicted"] <= MAP_ENTRIES
