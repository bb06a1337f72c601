"""Bounded per-connection state in the agent's user space (issue 11, finding 3): the
stream decoder drops a connection at its close (once its last calls came), when
idle, and beyond its cap (the least recently active, counted); so do the live
aggregates, the connections table's bookkeeping and the correlator's learnt ids.
Synthetic calls (test_agent_decode's records), no root."""
from __future__ import annotations

import socket
from collections import OrderedDict

import pytest

from agent import correlate, netrows
from agent.bounded import put_newest, touch
from agent.daemon import Pipeline
from agent.calls import SockcallAssembler
from agent.streams import CLOSE_SETTLE_NS, StreamDecoder
from agent.hosts import HostMap
from agent.live import CLOSED_KEEP_NS, LiveAggregates
from agent.rundir import read_run_dir
from probes.events import NsConnEvent, NsEventKind
from test_agent_decode import ISN_C, ISN_S, SERVER, record, stream

NETNS = 4026531840
S = 10**9


def conn_calls(i: int, t0_ns: int, n_msgs: int = 2, isns=None) -> list[bytes]:
    """Connection i (its own port and socket) sending a greeting, READY and n_msgs
    messages, one call each 1 ms from t0_ns."""
    data, spans = stream(n_msgs)
    local = ("10.0.0.1", 20000 + i)
    isns = isns or (ISN_C + i, ISN_S)
    cuts = [0] + [last + 1 for _, last in spans]
    if cuts[-1] < len(data):
        cuts.append(len(data))   # the greeting alone
    return [record(True, isns[0] + 1 + a, b - a, data[a:b][:256], ts=t0_ns + k * 1_000_000, local=local,
                   sk=0x1000 + i, isns=isns) for k, (a, b) in enumerate(zip(cuts, cuts[1:]))]


def feed(dec: StreamDecoder, recs: list[bytes]) -> list:
    asm, out = SockcallAssembler("prefix"), []
    for r in recs:
        c = asm.feed(r)
        if c is not None:
            out += dec.feed(c)
    return out


def stats(dec: StreamDecoder) -> dict:
    return dec.stats_by_netns().get(NETNS, {})


def test_closed_connections_are_dropped_with_every_message_kept():
    dec = StreamDecoder()
    got = []
    for i in range(200):
        t0 = i * 10_000_000
        got += feed(dec, conn_calls(i, t0))
        dec.closed(NETNS, 0x1000 + i, SERVER, t0 + 5_000_000)
        got += dec.advance(t0 + 6_000_000)
    assert dec.conns == {}
    s = stats(dec)
    assert s["decoder_conns_closed"] == 200 and s["connections"] == 200
    assert sorted((w.conn.local[1], w.msg.timestamp) for w in got) == [(20000 + i, t) for i in range(200)
                                                                       for t in range(2)]


def test_a_close_seen_before_the_connections_last_call_waits_for_it():
    """The netstack ring may be read ahead of sockcalls': the close comes first."""
    dec = StreamDecoder()
    recs = conn_calls(0, 1_000_000)
    got = feed(dec, recs[:-1])
    dec.closed(NETNS, 0x1000, SERVER, 10_000_000)
    assert dec.advance(5_000_000) == [] and len(dec.conns) == 1   # not everything before it delivered
    got += feed(dec, recs[-1:])                                    # its last call, after the close
    got += dec.advance(10_000_000)
    assert [w.msg.timestamp for w in got] == [0, 1] and dec.conns == {}
    # without watermarks, a later call of another connection is as good
    recs = conn_calls(1, 20_000_000)
    feed(dec, recs)
    dec.closed(NETNS, 0x1001, SERVER, 30_000_000)
    feed(dec, conn_calls(2, 30_000_000 + CLOSE_SETTLE_NS + 1))
    assert [c.local[1] for c in dec.conns.values()] == [20002]


def test_a_close_of_an_earlier_connection_on_a_reused_socket_leaves_the_new_one():
    dec = StreamDecoder()
    feed(dec, conn_calls(0, 1_000_000))
    feed(dec, conn_calls(0, 2_000_000, isns=(5000, 7000)))   # same socket and ports, new ISNs
    assert stats(dec)["decoder_conns_reused"] == 1
    dec.closed(NETNS, 0x1000, SERVER, 1_500_000)   # the first one's close, late
    dec.advance(10_000_000)
    assert [c.isn_local for c in dec.conns.values()] == [5000]
    # the common case: the socket's memory reused at once by a connection on another
    # port, whose calls come before the earlier one's close (the rings are read in turn)
    dec = StreamDecoder()
    early, late = conn_calls(0, 1_000_000), conn_calls(1, 8_000_000)
    late = [r[:16] + (0x1000).to_bytes(8, "little") + r[24:] for r in late]   # the same sk
    feed(dec, early + late)
    dec.closed(NETNS, 0x1000, SERVER, 5_000_000)
    dec.advance(9_000_000)
    assert [c.local[1] for c in dec.conns.values()] == [20001] and stats(dec)["decoder_conns_closed"] == 1


def test_the_cap_evicts_the_least_recently_active_and_counts():
    dec = StreamDecoder(conns_max=8)
    busy_data, spans = stream(40)
    cuts = [0] + [last + 1 for _, last in spans]
    busy = [record(True, ISN_C + 1 + a, b - a, busy_data[a:b][:256], ts=(k + 1) * 1_000_000, local=("10.0.0.9", 999),
                   sk=0x99) for k, (a, b) in enumerate(zip(cuts, cuts[1:]))]
    got = []
    for k, r in enumerate(busy):
        got += feed(dec, [r])
        got += feed(dec, conn_calls(k, (k + 1) * 1_000_000 + 1, n_msgs=0)[:1])   # a connection that says hello
        assert len(dec.conns) <= 8
    s = stats(dec)
    assert s["decoder_conns_evicted"] == len(busy) + 1 - 8
    # the busy connection was never evicted: all its messages, none lost
    assert [w.msg.timestamp for w in got if w.conn.local == ("10.0.0.9", 999)] == list(range(40))
    assert s["lost_bytes"] == 0


def test_an_idle_connection_expires_and_comes_back_as_a_mid_stream_join():
    dec = StreamDecoder(idle_ns=60 * S)
    data, spans = stream(12)
    cuts = [0] + [last + 1 for _, last in spans]
    recs = [record(True, ISN_C + 1 + a, b - a, data[a:b][:256], ts=(k + 1) * S) for k, (a, b) in
            enumerate(zip(cuts, cuts[1:]))]
    got = feed(dec, recs[:6])
    cid = next(iter(dec.conns.values())).conn_id
    got += dec.advance(200 * S)   # idle for minutes (a ps-lite scheduler connection, say)
    assert dec.conns == {} and stats(dec)["decoder_conns_idle_expired"] == 1
    later = [record(True, ISN_C + 1 + a, b - a, data[a:b][:256], ts=(300 + k) * S)
             for k, (a, b) in enumerate(zip(cuts[6:], cuts[7:]))]
    got += feed(dec, later)
    got += dec.advance(301 * S)
    assert next(iter(dec.conns.values())).conn_id == cid   # the same connection id
    stamps = [w.msg.timestamp for w in got]
    assert stamps[:5] == list(range(5))
    # after the join every message is found once the parser is in sync again (the one
    # it joined at may be taken as hunting: a mid-stream join's loss at most)
    assert set(range(6, 12)) - set(stamps) <= {5, 6} and stamps == sorted(set(stamps))


def _conn_event(sk: int, newstate: int, ts_ns: int, local, remote) -> bytes:
    ev = NsConnEvent()
    ev.kind, ev.newstate, ev.netns_ino, ev.ts_ns, ev.sk = int(NsEventKind.CONN), newstate, NETNS, ts_ns, sk
    ev.family, ev.sport, ev.dport = socket.AF_INET, local[1], remote[1]
    ev.saddr[:4] = socket.inet_aton(local[0])
    ev.daddr[:4] = socket.inet_aton(remote[0])
    return bytes(ev)


def test_the_pipeline_drops_a_connection_at_the_netstack_probes_close_and_says_so_in_meta(tmp_path):
    pipe = Pipeline(tmp_path, HostMap("h", names={}), {"clock": {}}, netstack_on=True)
    for i in range(50):
        t0 = (i + 1) * 10_000_000
        for r in conn_calls(i, t0):
            pipe.handle("sockcalls", r)
        local = ("10.0.0.1", 20000 + i)
        pipe.handle("netstack", _conn_event(0x1000 + i, netrows.TCP_ESTABLISHED, t0, local, SERVER))
        # at TCP_CLOSE the kernel has released the local port: the event says 0
        pipe.handle("netstack", _conn_event(0x1000 + i, netrows.TCP_CLOSE, t0 + 5_000_000, (local[0], 0), SERVER))
        pipe.handle("agent", b'{"watermark_ns": %d}' % (t0 + 6_000_000))
    assert pipe.errors == {} and pipe.decoder.conns == {}
    c = pipe._host_counters("h")
    assert c["decoder_conns_closed"] == 50 and c["connections"] == 50
    assert c["connection_rows_evicted"] == 0 and c["correlate_ids_evicted"] == 0
    pipe.close()
    assert pipe.rows["h"] == 50 * 2   # every message of the closed connections
    table = read_run_dir(tmp_path / "h").tables["connections"]
    assert len(table) == 50 and (table.local_port >= 20000).all()   # not the 0 of the close event


def test_established_times_go_after_their_close_and_rows_beyond_the_cap_are_written_open(monkeypatch):
    rows = []
    conns = netrows.Connections(lambda _ino, r: rows.append(r), lambda _ino: "h")
    ev = NsConnEvent.from_buffer_copy
    for i in range(1000):
        local, t = ("10.0.0.1", 20000 + i), i * 10_000_000
        conns.on_state(ev(_conn_event(i, netrows.TCP_ESTABLISHED, t, local, SERVER)))
        assert conns.established_ns(local, SERVER) == t
        conns.on_state(ev(_conn_event(i, netrows.TCP_CLOSE, t + 1, (local[0], 0), SERVER)))
    # kept ESTABLISHED_KEEP_NS after the close (rows held for their times may ask), no longer
    assert len(conns._est_of) <= netrows.ESTABLISHED_KEEP_NS // 10_000_000 + 1
    assert len(rows) == 1000 and all("ts_close_ns" in r for r in rows)
    # the local port the close event no longer has is the one seen before
    assert [r["local_port"] for r in rows] == list(range(20000, 21000))
    monkeypatch.setattr(netrows, "CONNS_MAX", 10)
    rows.clear()
    for i in range(30):
        conns.on_state(ev(_conn_event(5000 + i, netrows.TCP_ESTABLISHED, i, ("10.0.0.1", 30000 + i), SERVER)))
    assert len(conns._open) == 10 and conns.counters["rows_evicted"] == 20
    assert [r["local_port"] for r in rows] == list(range(30000, 30020))   # the oldest, written open
    assert not any("ts_close_ns" in r for r in rows)


def test_live_aggregates_forget_closed_ids_and_cap_open_connections(monkeypatch):
    live = LiveAggregates()
    for i in range(100_000):
        live.on_connection({"host_id": "h", "conn_id": f"c{i}", "role": "accept", "ts_close_ns": i * 1_000_000})
        if i % 1000 == 0:
            live.advance(i * 1_000_000)
    assert len(live.closed_ids) <= CLOSED_KEEP_NS // 1_000_000 + 1000
    monkeypatch.setattr("agent.live.CONNS_MAX", 100)
    for i in range(1000):   # rows of connections whose close is never seen (no netstack probe)
        live.on_message({"host_id": "h", "conn_id": f"o{i}", "ts_recv_last_exit_ns": 10**12 + i, "op": "push",
                         "control": True})
        live.on_message({"host_id": "h", "conn_id": "busy", "ts_recv_last_exit_ns": 10**12 + i, "op": "push",
                         "control": True})
    assert len(live.conns["h"]) == 100 and "busy" in live.conns["h"]
    assert live.bounded["conns_evicted"] == 901 - 100 + 100   # 1001 opened, 100 kept
    live.advance(10**12 + 1000 + 400 * S)   # idle past agent.bounded.CONN_IDLE_NS
    assert live.conns["h"] == {} and live.bounded["conns_idle_expired"] == 100


def test_learnt_tables_are_capped_least_recently_used_first(monkeypatch):
    monkeypatch.setattr(correlate, "LEARNT_MAX", 4)
    ids = correlate.Identities()
    for i in range(10):
        ids._set(ids.tgid_of_endpoint, ("10.0.0.1", i), i)
        ids._set(ids.tgid_of_endpoint, ("10.0.0.1", 999), 1)   # in use all along: kept
    assert list(ids.tgid_of_endpoint)[-1] == ("10.0.0.1", 999) and len(ids.tgid_of_endpoint) == 4
    assert ids.evicted == 7
    t = netrows.TxTimes()
    monkeypatch.setattr(netrows, "TX_ENDS_MAX", 3)
    for seq in range(10):
        t.on_tx(1, seq, 0, 5, 6, 0)
    assert len(t._by_end) == 3 and t.evicted == 7 and t.get(1, 9) is not None


def test_put_newest_and_touch():
    d: OrderedDict = OrderedDict()
    assert [put_newest(d, k, k, 3) for k in "abcd"] == [0, 0, 0, 1]
    touch(d, "b")
    touch(d, "zz")
    assert list(d) == ["c", "d", "b"]
    assert put_newest(d, "c", 9, 3) == 0 and list(d) == ["d", "b", "c"]
    with pytest.raises(KeyError):
        d["a"]


def test_the_rescan_forgets_processes_that_exited(monkeypatch):
    """Per-process maps of the live source: a job that forks short-lived processes (health
    checks, launchers) must not grow them, and a reused pid is looked at anew."""
    import agent.sources as sources
    src = sources.LiveSource(sources.Selection(), sink=lambda p, r: None)
    running = list(range(1000, 3000))
    monkeypatch.setattr(src.selector, "running", lambda: running)
    monkeypatch.setattr(sources, "_may_map_framework", lambda tgid: False)
    monkeypatch.setattr(sources, "_vsize", lambda tgid: 4096)
    src.rescan(force=True)
    assert len(src._lib_wait) == 2000   # waiting for their framework library (LIB_WAIT_S)
    running = [5000]
    src.rescan(force=True)
    assert set(src._lib_wait) == {5000} and set(src._vsize_seen) <= {5000} and src._known_tgids <= {5000}


def test_closes_still_settling_at_the_stop_are_counted():
    dec = StreamDecoder()
    got = feed(dec, conn_calls(0, 1_000_000))
    dec.closed(NETNS, 0x1000, SERVER, 10_000_000)   # its last calls might still come: it waits
    assert len(dec.conns) == 1
    got += dec.finish()                              # the stop: everything was delivered
    assert dec.conns == {} and stats(dec)["decoder_conns_closed"] == 1
    assert [w.msg.timestamp for w in got] == [0, 1]
