"""`pslat top` says what traffic no protocol parser recognised (issue 13): the agent's
live view counts such connections per host, open ones and ones let go, with their bytes,
thread names and service port; the snapshot reader keeps only well-formed values of it
from another agent; the screen names it. Synthetic calls through agent.daemon.Pipeline,
no root."""
from __future__ import annotations

from agent.daemon import Pipeline
from agent.hosts import HostMap
from agent.live import LiveAggregates, merge_snapshots
from agent.snapshots import read_snapshot
from agent.top import render_text
from test_agent_streams import HTTP_REQUEST, HTTP_RESPONSE, _exchange

MOVED = len(HTTP_REQUEST) + len(HTTP_RESPONSE)


def _snapshot(tmp_path):
    pipe = Pipeline(tmp_path, HostMap("h1", names={}), {"clock": {}})
    pipe.live = LiveAggregates(agent="a1")
    for r in _exchange(4, sk=0x1, local=("10.0.0.1", 41001)) + _exchange(2, sk=0x2, local=("10.0.0.1", 41002)):
        pipe.handle("sockcalls", r)
    pipe.set_probe_counters({})
    first = pipe.live.snapshot()
    pipe.decoder.finish()
    pipe.close()
    return first


def test_the_live_view_counts_unrecognised_connections_with_their_bytes(tmp_path):
    snap = _snapshot(tmp_path)
    assert snap["unrecognised"] == {"h1": {"connections": 2, "bytes": 6 * MOVED, "port": 9000,
                                           "threads": ["pslat-test"]}}


def test_connections_let_go_stay_counted(tmp_path):
    pipe = Pipeline(tmp_path, HostMap("h1", names={}), {"clock": {}})
    pipe.live = LiveAggregates(agent="a1")
    for r in _exchange(3, sk=0x1, local=("10.0.0.1", 41001)):
        pipe.handle("sockcalls", r)
    pipe.decoder.closed(4026531840, 0x1, ("10.0.0.2", 9000), 10**12)
    pipe.decoder.advance(10**13)   # the close applies: the connection is let go, its row written
    assert not pipe.decoder.conns
    pipe.set_probe_counters({})
    assert pipe.live.snapshot()["unrecognised"]["h1"]["bytes"] == 3 * MOVED
    pipe.close()


def test_top_shows_it_and_a_hostile_snapshot_is_cut_to_shape(tmp_path):
    snap = _snapshot(tmp_path)
    screen = render_text(snap, 120, 30)
    assert "traffic not recognised" in screen
    assert f"h1: 2 connections, {6 * MOVED} bytes by pslat-test (port 9000)" in screen
    bad = dict(snap, unrecognised={"h2": {"connections": -1, "bytes": 5}, "h3": "x",
                                   "h4": {"connections": 1, "bytes": 10, "port": 70000},
                                   "h5": {"connections": 2, "bytes": 2_500_000, "port": 80,
                                          "threads": ["[red]x[/red]", 7]}})
    got, skipped = read_snapshot(bad)
    assert got["unrecognised"] == {} and skipped["unrecognised"] == 4
    ok = dict(snap, unrecognised={"h5": {"connections": 2, "bytes": 2_500_000, "port": 80,
                                         "threads": ["[red]x[/red]"]}})
    got, _ = read_snapshot(ok)
    merged = merge_snapshots([got, snap])
    assert merged["unrecognised"]["h5"]["bytes"] == 2_500_000 and merged["unrecognised"]["h1"]["connections"] == 2
    screen = render_text(merged, 120, 30)
    assert "h5: 2 connections, 2.5 MB by [red]x[/red] (port 80)" in screen
