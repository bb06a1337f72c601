"""agent.correlate: framework records matched to wire messages exactly by ids (in
any arrival order, slices of one request told apart by their bytes and keys,
identical twins left unmatched with a reason until a socket binding settles
them), node ids learnt mid-stream, netstack send times, rows' null reasons."""
from __future__ import annotations

from dataclasses import replace

import pytest

from agent import correlate
from agent.correlate import Correlator
from agent.calls import SockcallAssembler
from agent.streams import StreamDecoder
from parsers.pslite.encode import MessageSpec, encode_stream, message_bytes
from parsers.pslite.framework import MetaIds
from probes.framework import FrameworkMessage
from test_agent_decode import ISN_C, ISN_S, SERVER, record

WORKER_A, WORKER_B = ("10.0.0.1", 40000), ("10.0.0.3", 40001)
NS = 4026531840


class Rig:
    """A decoder and a correlator; rows collected."""

    def __init__(self, netstack=False):
        self.rows = []
        self.asm, self.dec = SockcallAssembler("prefix"), StreamDecoder()
        self.cor = Correlator(lambda ino, row: self.rows.append(row), lambda ino: f"h{ino}",
                              netstack_on=netstack)

    def send(self, specs, *, local, remote=SERVER, tx=True, ts=10_000, tgid=100, identity=b"ps9",
             handshake=True, sk=1, isns=(ISN_C, ISN_S), offset=0, sample=None):
        """sample: the key sample the walker took instead of the decoder's own (it hashes
        a few keys of a large frame: often none of a record's first keys, or none at all)."""
        data, _ = encode_stream(specs, identity=identity, handshake=handshake)
        isn = isns[0] if tx else isns[1]
        r = record(tx, isn + 1 + offset, len(data), data[:256], ts=ts, tgid=tgid, local=local,
                   remote=remote, sk=sk, isns=isns)
        for wm in self.dec.feed(self.asm.feed(r)):
            if sample is not None:
                wm.msg.key_sample = tuple(sample)
            self.cor.on_message(wm)

    def fw(self, spec: MessageSpec, *, direction="send", ts=9_000, tgid=100, sock=0x51, peer=None):
        frames = spec.frames()
        sizes = tuple(len(f) for f in frames)
        m = spec.meta()
        meta = MetaIds(app_id=m.app_id, customer_id=m.customer_id, timestamp=m.timestamp,
                       request=m.request, push=m.push)
        if peer is not None:
            sizes, frames = (len(peer),) + sizes, [peer] + frames
        self.cor.on_framework(FrameworkMessage(
            layer="zmq", direction=direction, tgid=tgid, tid=tgid + 1, sock=sock, ts_ns=ts, call_ts_ns=ts,
            ret_ts_ns=ts + 100, first_ret_ts_ns=ts + 50, total_bytes=sum(sizes), frames=len(sizes),
            peer=peer, meta=meta, frame_sizes=sizes, frame_heads=tuple(f[:64] for f in frames)))

    def close(self):
        self.cor.close()
        return self.rows


def slice_(ts, keys, push=False):
    return MessageSpec(timestamp=ts, push=push, keys=keys, vals=b"")


def test_slices_of_one_request_are_matched_by_their_keys_not_by_order():
    rig = Rig()
    a, b = slice_(0, [1, 2, 3]), slice_(0, [900, 901, 902])   # same ids, same sizes
    # the records come in the opposite order from the wire messages
    rig.fw(b, ts=5_000, sock=0xB)
    rig.fw(a, ts=6_000, sock=0xA)
    rig.send([a], local=WORKER_A, remote=("10.0.0.2", 9000), sk=1)
    rig.send([b], local=WORKER_A, remote=("10.0.0.4", 9000), sk=2, isns=(ISN_C + 7, ISN_S))
    rows = {r["remote_ip"]: r for r in rig.close()}
    assert rows["10.0.0.2"]["ts_framework_ns"] == 6_000
    assert rows["10.0.0.4"]["ts_framework_ns"] == 5_000
    assert rig.cor.counters["framework_matched"] == 2


def test_identical_twins_stay_unmatched_with_a_reason_until_a_binding_settles_them():
    rig = Rig()
    twin = MessageSpec(timestamp=3, request=False, push=True)   # empty push responses
    rig.fw(twin, sock=0xA, ts=1_000)
    rig.fw(twin, sock=0xB, ts=2_000)
    rig.send([twin], local=SERVER, remote=WORKER_A, sk=1, identity=b"ps8")
    rig.send([twin], local=SERVER, remote=WORKER_B, sk=2, identity=b"ps8", isns=(ISN_C + 9, ISN_S))
    rows = rig.close()
    assert [r["ts_framework_ns"] for r in rows] == [None, None]
    assert all("told apart" in r["null_reasons"] for r in rows)

    rig = Rig()
    # a pull response with data goes out on each socket first: that binds socket -> connection
    for sock, worker, sk, keys, ts in ((0xA, WORKER_A, 1, [5], 100), (0xB, WORKER_B, 2, [7], 200)):
        first = MessageSpec(timestamp=1, request=False, push=False, keys=keys, vals=b"x" * 4)
        rig.fw(first, sock=sock, ts=ts)
        rig.send([first], local=SERVER, remote=worker, sk=sk, identity=b"ps8",
                 isns=(ISN_C + sk, ISN_S), ts=ts + 10)
    rig.cor.now_ns += correlate.SETTLE_NS * 2
    rig.cor.step()
    rig.fw(twin, sock=0xB, ts=3_000)
    rig.fw(twin, sock=0xA, ts=4_000)
    off = len(encode_stream([first], identity=b"ps8")[0])
    for worker, sk in ((WORKER_A, 1), (WORKER_B, 2)):
        data = message_bytes(twin.frames())
        r = record(True, ISN_C + sk + 1 + off, len(data), data, ts=rig.cor.now_ns, local=SERVER, remote=worker,
                   sk=sk, isns=(ISN_C + sk, ISN_S))
        for wm in rig.dec.feed(rig.asm.feed(r)):
            rig.cor.on_message(wm)
    rows = rig.close()
    got = {(r["remote_ip"], r["call_id"]): r["ts_framework_ns"] for r in rows}
    assert got == {("10.0.0.1", 1): 100, ("10.0.0.3", 1): 200, ("10.0.0.1", 3): 4_000, ("10.0.0.3", 3): 3_000}


def test_sender_learnt_from_the_routing_id_when_ready_was_missed():
    """Joined mid-stream: no READY. The server's framework record of the request names
    the worker ("ps9"); the same connection's other end (another host, same agent)
    then knows its sender, and the worker process its own id for its received rows."""
    rig = Rig()
    req = slice_(4, [1, 2])
    rig.fw(req, direction="recv", tgid=200, ts=20_000, peer=b"ps9", sock=0xC)
    # the server host's receive (no handshake seen), and the worker host's send
    rig.send([req], local=SERVER, remote=WORKER_A, tx=False, tgid=200, handshake=False, sk=5, ts=19_000,
             offset=500)
    rig.send([req], local=WORKER_A, remote=SERVER, tx=True, tgid=100, handshake=False, sk=6, ts=18_000,
             offset=500)
    resp = MessageSpec(timestamp=4, request=False, push=False, keys=[1, 2], vals=b"v" * 8)
    rig.send([resp], local=("10.0.0.1", 9001), remote=("10.0.0.2", 50000), tx=False, tgid=100,
             handshake=False, sk=7, ts=21_000, offset=300)
    rows = rig.close()
    by = {(r["direction"], r["pid"], r["request"]): r for r in rows}
    assert by[("rx", 200, True)]["sender"] == 9
    assert by[("tx", 100, True)]["sender"] == 9
    assert by[("rx", 100, False)]["recver"] == 9     # the worker's own id, from its DEALER
    assert by[("rx", 200, True)]["ts_framework_ns"] == 20_000


def test_netstack_send_times_join_by_socket_and_end_sequence():
    rig = Rig(netstack=True)
    m = slice_(0, [1])
    rig.send([m], local=WORKER_A, sk=9)
    [w] = [p for ps in rig.cor._wires.values() for p in ps]
    end = w.wm.seq_end
    tx = type("Ev", (), dict(kind=1, sk=9, end_seq=end, flags=0, ts_queue_ns=11_000, ts_xmit_ns=11_500))
    done = type("Ev", (), dict(kind=2, sk=9, end_seq=end, reason=correlate.NS_TXC_FORWARDED, ts_done_ns=0))
    rig.cor.on_netstack(tx)
    rig.cor.on_netstack(done)
    [row] = rig.close()
    assert row["ts_xmit_last_ns"] == 11_500 and row["qdisc_wait_ns"] == 500
    assert row["ts_txdone_last_ns"] is None and "no TX completion" in row["null_reasons"]
    assert "netstack" not in row["null_reasons"]


def test_without_netstack_kernel_stages_are_null_with_the_reason():
    rig = Rig()
    rig.send([slice_(0, [1])], local=WORKER_A)
    [row] = rig.close()
    assert row["ts_framework_ns"] is None
    reasons = dict(x.split("=", 1) for x in row["null_reasons"].split(";"))
    assert reasons["ts_xmit_last_ns"] == correlate.R_NO_NETSTACK
    assert reasons["ts_framework_ns"] == correlate.R_NO_FW_PROBE
    assert row["ts_send_first_enter_ns"] == 10_000 and row["ts_send_last_exit_ns"] == 10_500
    assert row["op"] == "pull" and row["num_keys"] == 1 and row["sender"] == 9


def test_groups_whose_ids_are_absent_expire_without_comparing_none():
    """Control messages without app_id/timestamp still form groups; two expiring at
    the same time must not compare their keys (None < int)."""
    rig = Rig()
    for ts, cust in ((None, 5), (7, 5)):
        spec = MessageSpec(timestamp=ts, request=True, push=False, customer_id=cust, keys=[1], vals=b"")
        rig.fw(spec, sock=0xA, ts=1_000)
        rig.fw(replace(spec, keys=[2]), sock=0xB, ts=1_000)
    rig.cor.now_ns += correlate.SETTLE_NS
    rig.cor.step()
    rig.cor.now_ns += 2 * correlate.HOLD_NS
    rig.cor.step()
    assert rig.cor.counters["framework_unmatched"] == 4


def test_rows_carry_the_sub_component_inputs_of_their_last_call():
    """The send's window state and the receive's scheduler record (walker items, set
    on the Call here) become cwnd/rwnd and runq/busy of the message's row."""
    from agent.netrows import NS_SCHED_F_TRACKED, NS_WIN_F_VALID
    from probes.events import NsWindow

    rig = Rig(netstack=True)
    data, _ = encode_stream([slice_(0, [1])], identity=b"ps9", handshake=True)
    c = rig.asm.feed(record(True, ISN_C + 1, len(data), data[:256], ts=10_000, local=WORKER_A, sk=9))
    end = (c.seq_start + c.seq_bytes) & 0xFFFFFFFF
    # at the send's exit (10.5 us) the end was unsent and the congestion window full
    c.window = bytes(NsWindow(snd_cwnd=4, packets_out=4, snd_wnd=1 << 20, snd_una=c.seq_start,
                              snd_nxt=c.seq_start, write_seq=end, flags=NS_WIN_F_VALID))
    for wm in rig.dec.feed(c):
        rig.cor.on_message(wm)
    rig.cor.on_netstack(type("Ev", (), dict(kind=1, sk=9, end_seq=end, flags=0, ts_queue_ns=14_000,
                                            ts_xmit_ns=14_200)))
    resp, _ = encode_stream([MessageSpec(timestamp=0, request=False, keys=[1], vals=b"v" * 8)],
                            identity=None, handshake=True)
    r = rig.asm.feed(record(False, ISN_S + 1, len(resp), resp[:256], ts=30_000, local=WORKER_A, sk=9))
    # woken at 25 us after data-ready (ends' times: the walker's RX_TIMES), on CPU at 27 us
    # (SchedHistory.snapshot's shape: wake, switch-in, runq, switch-ins, tracked since, flags, previous)
    r.sched = (25_000, 27_000, 0, 3, 1, NS_SCHED_F_TRACKED, None)
    r.ends[len(resp)] = {"ts_data_ready_ns": 24_000, "ts_netif_rx_last_ns": 23_000}
    for wm in rig.dec.feed(r):
        rig.cor.on_message(wm)
    rows = {row["direction"]: row for row in rig.close()}
    assert rows["tx"]["cwnd_wait_ns"] == 14_000 - 10_500 and rows["tx"]["rwnd_wait_ns"] == 0
    assert rows["tx"]["qdisc_wait_ns"] == 200
    assert rows["rx"]["runq_wait_ns"] == 2_000 and rows["rx"]["busy_wait_ns"] == 30_500 - 24_000 - 2_000


# A worker's request sliced over two servers, ps-lite's way: server S_LOW owns the low
# half of the key space, S_HIGH the high half. Slices of 24 keys each: the same bytes.
S_LOW, S_HIGH = ("10.0.0.2", 9000), ("10.0.0.4", 9000)
LOW = [100 + 3 * i for i in range(24)]
HIGH = [(1 << 63) + 5 * i for i in range(24)]


class Worker:
    """One worker process's DEALERs (zmq socket -> TCP connection) on a Rig."""

    def __init__(self, rig: Rig):
        self.rig = rig
        self.sent: dict[int, int] = {}   # sk -> stream bytes so far

    def connect(self, sk: int, server) -> None:
        """A fresh connection: its own call with the greeting and READY."""
        hs, _ = encode_stream([], identity=b"ps9", handshake=True)
        self.rig.send([], local=("10.0.0.1", 40000 + sk), remote=server, sk=sk, isns=(ISN_C + sk, ISN_S))
        self.sent[sk] = len(hs)

    def request(self, ts: int, slices, at: int) -> dict:
        """slices: (zmq socket, sk, server, keys, walker's key sample or None) per server.
        The records come in the opposite order from the wire messages. Returns the
        records' times by server address."""
        fw_ns = {}
        for i, (sock, _sk, server, keys, _sample) in enumerate(reversed(slices)):
            fw_ns[server[0]] = at + 1_000 * i
            self.rig.fw(slice_(ts, keys), sock=sock, ts=fw_ns[server[0]])
        for sock, sk, server, keys, sample in slices:
            data, _ = encode_stream([slice_(ts, keys)], identity=b"ps9", handshake=False)
            self.rig.send([slice_(ts, keys)], local=("10.0.0.1", 40000 + sk), remote=server, handshake=False,
                          offset=self.sent[sk], sk=sk, isns=(ISN_C + sk, ISN_S), ts=at + 5_000, sample=sample)
            self.sent[sk] += len(data)
        return fw_ns

    def settle(self) -> None:
        self.rig.cor.now_ns += 2 * correlate.SETTLE_NS
        self.rig.cor.step()


def _fw_times(rows, ts):
    return {r["remote_ip"]: r["ts_framework_ns"] for r in rows if r["call_id"] == ts}


def test_fresh_sockets_after_a_reconnect_told_apart_by_the_servers_key_ranges():
    """Issue 3's reconnect gap, as recorded (psbench, 1024 keys in two slices of the same
    bytes, a reconnect every 10 requests): the first request on two fresh zmq sockets, bound
    to no connection yet, whose walker samples hold none of the records' first keys. The
    keys each server received before the reconnect tell the slices apart."""
    rig = Rig()
    w = Worker(rig)
    w.connect(1, S_LOW)
    w.connect(2, S_HIGH)
    # before: slices of different sizes, matched by their bytes; the decoder's own samples
    before = w.request(0, [(0xA, 1, S_LOW, LOW[:20], None), (0xB, 2, S_HIGH, HIGH, None)], at=1_000_000)
    w.settle()
    # reconnect: new DEALERs on new connections, the same servers
    w.connect(3, S_LOW)
    w.connect(4, S_HIGH)
    after = w.request(1, [(0xC, 3, S_LOW, LOW, ()), (0xD, 4, S_HIGH, HIGH, ())], at=2 * correlate.SETTLE_NS + 2_000_000)
    rows = rig.close()
    assert _fw_times(rows, 0) == before
    assert _fw_times(rows, 1) == after
    assert rig.cor.counters["framework_unmatched"] == 0


def test_fresh_sockets_without_history_by_key_order_and_the_only_complete_pairing():
    """A job's first request (no server's keys known yet): the low slice's sample holds a
    key below every key of the high slice's record, which therefore takes the other wire
    message; the high slice's sample is empty. One complete pairing remains: taken."""
    rig = Rig()
    w = Worker(rig)
    w.connect(1, S_LOW)
    w.connect(2, S_HIGH)
    # LOW[20]: of LOW the key with the lowest hash (the walker's sample of one); none of
    # HIGH's first 8 keys hashes lower, so the sample alone does not rule the high record out
    got = w.request(0, [(0xA, 1, S_LOW, LOW, (LOW[20],)), (0xB, 2, S_HIGH, HIGH, ())], at=1_000_000)
    rows = rig.close()
    assert _fw_times(rows, 0) == got
    assert rig.cor.counters["framework_matched"] == 2


def test_servers_whose_keys_interleave_teach_no_ranges():
    """A custom slicer spreading keys over the servers: their hulls overlap, say nothing,
    and two fresh sockets' slices of the same bytes stay unmatched, with the reason,
    rather than be guessed."""
    rig = Rig()
    w = Worker(rig)
    w.connect(1, S_LOW)
    w.connect(2, S_HIGH)
    odd, even = [10 * i + 5 for i in range(24)], [10 * i for i in range(1, 25)]
    w.request(0, [(0xA, 1, S_LOW, odd[:20], None), (0xB, 2, S_HIGH, even, None)], at=1_000_000)
    w.settle()
    w.connect(3, S_LOW)
    w.connect(4, S_HIGH)
    w.request(1, [(0xC, 3, S_LOW, [k + 1 for k in odd], ()), (0xD, 4, S_HIGH, [k + 1 for k in even], ())],
              at=2 * correlate.SETTLE_NS + 2_000_000)
    rows = [r for r in rig.close() if r["call_id"] == 1]
    assert [r["ts_framework_ns"] for r in rows] == [None, None]
    assert all("told apart" in r["null_reasons"] for r in rows)


@pytest.mark.parametrize("late_by_s", [0.0, 1.0])
def test_a_stop_deadline_counts_what_is_not_matched_by_then(monkeypatch, late_by_s):
    """A SIGTERM's stop settles and writes what it holds by a deadline: what is left then
    is counted (unsettled_at_stop), never dropped silently; with time left, all of it."""
    rig = Rig()
    n = 3 * correlate.DEADLINE_EVERY
    for ts in range(n):
        spec = slice_(ts, [ts])
        rig.fw(spec, ts=5_000 + ts)
        rig.send([spec], local=WORKER_A, remote=("10.0.0.2", 9000), sk=100 + ts,
                 isns=(ISN_C + 1000 * ts, ISN_S))
    now = 100.0
    monkeypatch.setattr(correlate.time, "monotonic", lambda: now)
    rig.cor.close(deadline=now + 5 - late_by_s * 10)   # 5 s ahead, or 5 s past
    c = rig.cor.counters
    if late_by_s:
        assert len(rig.rows) < n and c["unsettled_at_stop"] > 0
        assert len(rig.rows) + c["unsettled_at_stop"] == n
        assert c["framework_matched"] + c["framework_unsettled_at_stop"] <= n
    else:
        assert len(rig.rows) == n and c["unsettled_at_stop"] == 0



@pytest.mark.parametrize("after_ns", [-5_000_000, 10_000])
def test_a_data_ready_after_the_recv_that_took_the_byte_is_not_the_messages(after_ns):
    """Stage order is causal: a data-ready on record after the receive's exit belongs to a
    later segment (the wire2ms-large-reconnect10 case once gave one 10 us after the recv,
    5 ms after the byte's own segment); the row leaves it null with the reason."""
    from agent.netrows import R_DATA_READY_LATE

    rig = Rig(netstack=True)
    data, _ = encode_stream([slice_(1, [1, 2])], identity=b"ps9", handshake=True)
    r = record(False, ISN_S + 1, len(data), data[:256], ts=10_000, local=WORKER_A, remote=SERVER, sk=1)
    [wm] = rig.dec.feed(rig.asm.feed(r))
    exit_ns = wm.last_call.exit_ts_ns
    wm.stages = {"ts_nic_rx_last_ns": exit_ns - 6_000_000, "ts_netif_rx_last_ns": exit_ns - 5_999_000,
                 "ts_data_ready_ns": exit_ns + after_ns}
    rig.cor.on_message(wm)
    [row] = rig.close()
    if after_ns > 0:
        assert row["ts_data_ready_ns"] is None and f"ts_data_ready_ns={R_DATA_READY_LATE}" in row["null_reasons"]
    else:
        assert row["ts_data_ready_ns"] == exit_ns + after_ns
