"""The kernel walker's brpc framing (probes/brpc_framing.bpf.h) on real TCP traffic.

A client and a server (one process, in a network namespace of our own whose loopback
has MTU 1500) exchange baidu_std messages shaped as PaddlePaddle's parameter server
sends them (parsers/brpc/encode.py: pull and push, sparse and dense, a control
command, another service's request, responses with attachments). From the probe's
records alone -- captured bytes, Skip, Hunted and Gap, as
oracles.walker.WalkedCall.stream_view gives them -- parsers/brpc must rebuild
exactly the messages sent, on both ends: their correlation ids, commands, tables and
key counts (from the 64 payload bytes the walker copies), and every message end's TCP
sequence where the sender's byte counts put it. Calls are cut at every header byte
(1 to 13 bytes, through send, sendmsg and writev; read in 1 to 11) and batched (8 KiB);
garbage inside a stream is counted and followed by a resync; a connection that starts
with no framing's bytes is counted, and only its first call is copied; a connection
joined mid-stream is walked from a hint that names the framing, or, once a stale
hint named it, from the walker's own self-sync.

This file is also the peer program: `python test_probes_walker_brpc.py`
(commands on stdin, JSON lines on stdout).
"""
from __future__ import annotations

import itertools
import json
import os
import random
import socket
import sys

import pytest
from test_probes_walker import PeerProc, netns, start_probe  # noqa: F401

from probes.events import WalkProtocol

SEND_SIZES = range(1, 14)
RECV_SIZES = range(1, 12)
WARMUP = 20   # messages before the probe attaches (mid-stream tests)
# brpc's walk, and ZMTP's hunt: a connection joined mid-stream is hunted as ZMTP until a hint
BRPC_WALKERS = (WalkProtocol.BRPC, WalkProtocol.ZMTP)


# ---------------------------------------------------------------- the messages

def make_rpcs(kind: str, count: int, seed: int) -> list[tuple[object, dict]]:
    """(RpcSpec, what the parser must say of it) for `count` messages of a kind:
    mixed: Paddle's table requests (1-300 keys), a control command, another
      service's request, responses with attachments of up to 3 kB;
    large: a push of 4000 keys x 32 value bytes (160 kB), a 100 kB response;
    paced: pull-sparse requests of 100 keys (1.2 kB: longer than a raw prefix)."""
    from parsers.brpc import encode
    from parsers.brpc.paddle import CMD_IDS, PULL_DENSE, PULL_SPARSE, PUSH_DENSE, PUSH_SPARSE

    rng = random.Random(seed)
    out = []
    for i in range(count):
        cid = seed * 100_000 + i
        keys = sorted(rng.sample(range(1, 1 << 40), rng.randint(1, 300)))
        pick = i % 7 if kind == "mixed" else {"large": 1 + 5 * (i % 2), "paced": 0}[kind]
        if kind == "large":
            keys = sorted(rng.sample(range(1, 1 << 40), 4000))
        if kind == "paced":
            keys = sorted(rng.sample(range(1, 1 << 40), 100))
        if pick == 0:
            spec, want = encode.pull_sparse(3, keys, correlation_id=cid), (True, PULL_SPARSE, 3, len(keys))
        elif pick == 1:
            spec, want = encode.push_sparse(3, keys, correlation_id=cid), (True, PUSH_SPARSE, 3, len(keys))
        elif pick == 2:
            spec, want = encode.pull_dense(0, 100, correlation_id=cid), (True, PULL_DENSE, 0, 0)
        elif pick == 3:
            spec, want = encode.push_dense(0, 100, correlation_id=cid), (True, PUSH_DENSE, 0, 0)
        elif pick == 4:
            spec, want = encode.control("PS_BARRIER", correlation_id=cid), (True, CMD_IDS["PS_BARRIER"], 0, 0)
        elif pick == 5:
            spec = encode.RpcSpec(correlation_id=cid, service_name="echo.EchoService", method_name="Echo",
                                  payload=rng.randbytes(40))
            want = (True, None, None, None)
        else:
            size = 100_000 if kind == "large" else rng.randint(0, 3000)
            spec = encode.response(cid, data=rng.randbytes(16), attachment=rng.randbytes(size))
            want = (False, None, None, None)
        out.append((spec, dict(zip(("request", "cmd_id", "table_id", "num_keys"), want), correlation_id=cid)))
    return out


def stream_of(rpcs) -> tuple[bytes, list[int]]:
    """The messages' bytes back to back, and the offset just past each."""
    from parsers.brpc.encode import encode_stream

    data, spans = encode_stream([s for s, _ in rpcs])
    return data, [last + 1 for _first, last in spans]


# ---------------------------------------------------------------- peer side

def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


def _send_split(c: socket.socket, data: bytes) -> int:
    """data in chunks of SEND_SIZES through send, sendmsg (iovecs of 1, 2, the rest)
    and writev; returns the calls made."""
    calls = pos = 0
    sizes = itertools.cycle(SEND_SIZES)
    view = memoryview(data)
    while pos < len(data):
        chunk = view[pos:pos + next(sizes)]
        how = calls % 3
        if how == 0:
            pos += c.send(chunk)
        elif how == 1:
            pos += c.sendmsg([chunk[:1], chunk[1:3], chunk[3:]])
        else:
            pos += os.writev(c.fileno(), [chunk[:2], chunk[2:]])
        calls += 1
    return calls


def _recv_split(s: socket.socket, n: int) -> bytes:
    got = bytearray()
    sizes = itertools.cycle(RECV_SIZES)
    while len(got) < n:
        k = next(sizes)
        if len(got) % 2:
            bufs = [bytearray(1), bytearray(max(0, k - 1))]
            m = s.recvmsg_into(bufs)[0]
            got += (bytes(bufs[0]) + bytes(bufs[1]))[:m]
        else:
            got += s.recv(k)
    return bytes(got)


def _recv_exactly(s: socket.socket, n: int, chunk: int = 1 << 16) -> bytes:
    got = bytearray()
    while len(got) < n:
        got += s.recv(min(chunk, n - len(got)))
    return bytes(got)


def peer() -> None:
    """One client connection to one server socket, both in this process. Commands:
    split SEED: the mixed messages in calls cut at every byte, read the same way;
    batched KIND COUNT SEED: messages in 8 KiB sends, read in 8 KiB;
    paced KIND COUNT SEED: a send per message, each read whole before the next;
    bad SEED: paced messages, 3000 bytes of garbage, paced messages, in one send (27 kB:
      one call on each end);
    garbage: a second connection whose bytes are no framing's, 3 sends;
    opaque COUNT SEED: COUNT sends of 2000 bytes that are no framing's on a third
      connection, made with the first (so a probe started later joins it mid-stream),
      each read whole before the next."""
    lst = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lst.getsockname())
    s = lst.accept()[0]
    oc = socket.create_connection(lst.getsockname())
    os_ = lst.accept()[0]
    emit({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "split":
            data, _ends = stream_of(make_rpcs("mixed", 40, int(cmd[1])))
            calls = _send_split(c, data)   # the reader keeps up: the socket buffer holds it all
            assert _recv_split(s, len(data)) == data
            emit({"send_calls": calls})
        elif cmd[0] in ("batched", "paced"):
            rpcs = make_rpcs(cmd[1], int(cmd[2]), int(cmd[3]))
            if cmd[0] == "batched":
                data, _ends = stream_of(rpcs)
                for at in range(0, len(data), 8192):
                    c.sendall(data[at:at + 8192])
                    _recv_exactly(s, len(data[at:at + 8192]), 8192)
            else:
                for spec, _want in rpcs:
                    one, _ends = stream_of([(spec, None)])
                    c.sendall(one)
                    _recv_exactly(s, len(one), len(one))
            emit({"sent": len(rpcs)})
        elif cmd[0] == "bad":
            seed = int(cmd[1])
            before, _ = stream_of(make_rpcs("paced", 10, seed))
            after, _ = stream_of(make_rpcs("paced", 10, seed + 1))
            junk = random.Random(seed).randbytes(3000).replace(b"PRPC", b"prpc")
            data = before + junk + after
            c.sendall(data)
            _recv_exactly(s, len(data))
            emit({"sent": 20})
        elif cmd[0] == "garbage":
            g = socket.create_connection(lst.getsockname())
            h = lst.accept()[0]
            rng = random.Random(5)
            for _ in range(3):
                junk = b"G" + rng.randbytes(2000)
                g.sendall(junk)
                _recv_exactly(h, len(junk))
            emit({"port": g.getsockname()[1]})
        elif cmd[0] == "opaque":
            rng = random.Random(int(cmd[2]))
            for _ in range(int(cmd[1])):
                junk = rng.randbytes(2000).replace(b"PRPC", b"prpc")
                oc.sendall(junk)
                _recv_exactly(os_, len(junk))
            emit({"port": oc.getsockname()[1]})


if __name__ == "__main__":
    peer()
    sys.exit(0)


# ---------------------------------------------------------------- test side

class Side:
    """One direction of the connection as one end saw it: its calls in order, the
    brpc parser fed from their stream views, what came out."""

    def __init__(self, first_call, mid_stream: bool):
        from parsers.brpc import BrpcStreamParser
        from oracles.walker import StreamOffsets

        self.offsets = StreamOffsets()
        self.first_offset = self.offsets.offset_of(first_call.event)
        self.parser = BrpcStreamParser(mid_stream=mid_stream, start_offset=self.first_offset)
        self.calls, self.views, self.messages = [], [], []

    def add(self, call) -> None:
        from oracles.walker import feed_parser

        self.calls.append(call)
        view = call.stream_view(self.offsets.offset_of(call.event))
        self.views.append(view)
        self.messages += feed_parser(self.parser, view)

    def offset_of_seq(self, seq: int) -> int:
        ev = self.calls[0].event
        isn = ev.isn_local if ev.call_kind.is_send else ev.isn_remote
        base = self.first_offset
        first_seq = (isn + 1 + base) & 0xFFFFFFFF
        return base + ((seq - first_seq + 2**31) % 2**32) - 2**31

    def message_ends(self) -> list[int]:
        return [self.offset_of_seq(e.end_seq) for c in self.calls for e in c.message_ends()]

    def walk_start(self):
        """(why, framing, stream offset) of the first WALK_START, or None."""
        from probes.events import SockcallItemKind

        for c in self.calls:
            for off, kind, why, mark in c.marks():
                if kind == SockcallItemKind.WALK_START:
                    return why, mark.detail, self.offset_of_seq(c.event.seq_start) + off
        return None


def sides(calls, pid: int, mid_stream: bool = False) -> dict[bool, Side]:
    """The peer's one connection with traffic, by is_send (client sends, server receives)."""
    out: dict[tuple, Side] = {}
    for call in sorted(calls, key=lambda c: c.event.enter_ts_ns):
        ev = call.event
        if ev.tgid != pid or call.walkable_bytes == 0:
            continue
        key = (ev.connection_key(), ev.call_kind.is_send)
        if key not in out:
            out[key] = Side(call, mid_stream)
        out[key].add(call)
    busiest = {}
    for (_conn, is_send), side in out.items():
        if is_send not in busiest or len(side.calls) > len(busiest[is_send].calls):
            busiest[is_send] = side
    return busiest


def check_messages(got: list, rpcs: list[tuple[object, dict]]) -> None:
    """The parser's messages are the sent ones: ids, commands, tables, key counts. A
    message's key sample is its keys' (all of few keys) or, where the walker skipped
    them, absent and said so."""
    from parsers.brpc.parser import KEYS_SKIPPED

    assert len(got) == len(rpcs), (len(got), len(rpcs))
    for m, (_spec, want) in zip(got, rpcs):
        assert {k: getattr(m, k) for k in want} == want
        if want["num_keys"]:
            assert (m.key_sample and m.key_sample_complete) or (
                m.key_sample == () and m.keys_reason == KEYS_SKIPPED), (m.key_sample, m.keys_reason)
        assert m.lost_bytes == 0


def check_bytes(side: Side, data: bytes, base: int) -> None:
    """Every captured byte is the stream's (data starts at stream offset base)."""
    for view in side.views:
        for off, x in view:
            if isinstance(x, bytes) and off >= base:
                assert data[off - base:off - base + len(x)] == x


def brpc_counts(prog) -> dict:
    return prog.counters()["sockcalls"]


def hint_both_sides(prog, cap, pid: int, stale: bool) -> dict[bool, int]:
    """A sync hint naming brpc on each side of the joined connection: where its last
    call ended (the next call starts there: the traffic is paced), or, stale, where
    that call began (the stream has passed it). Returns the stream offset hinted."""
    from probes.events import WalkProtocol
    from probes.sockcalls import Direction, set_sync_hint

    cap.drain()
    hinted = {}
    for is_send, side in sides(cap.calls, pid, mid_stream=True).items():
        assert side.walk_start() is None
        ev = side.calls[-1].event
        seq = ev.seq_start if stale else ev.seq_end
        set_sync_hint(prog, ev.sk, Direction.TX if is_send else Direction.RX, seq, 0, WalkProtocol.BRPC)
        hinted[is_send] = side.offset_of_seq(seq)
    return hinted


@pytest.mark.privileged
def test_brpc_walker_rebuilds_messages_across_any_call_boundary(netns):  # noqa: F811
    from probes.events import WalkProtocol, WalkStart

    split = make_rpcs("mixed", 40, 11)
    batched, large = make_rpcs("mixed", 400, 12), make_rpcs("large", 4, 13)
    peer = PeerProc(netns, script=__file__)
    try:
        pid = peer.read()["pid"]
        prog, cap = start_probe(netns, BRPC_WALKERS)
        with prog:
            # the connection was made before the probe; its first byte is sent after
            done = peer.ask("split 11", prog)
            assert peer.ask("batched mixed 400 12", prog)["sent"] == 400
            assert peer.ask("batched large 4 13", prog)["sent"] == 4
            cap.drain()
            counters = brpc_counts(prog)
    finally:
        peer.stop()
    rpcs = split + batched + large
    data, ends = stream_of(rpcs)
    got = sides(cap.calls, pid)
    assert set(got) == {True, False}
    for is_send, side in got.items():
        assert side.walk_start() == (WalkStart.GREETING, WalkProtocol.BRPC, 0)   # walked from its first byte
        # every call of the split part on its own (1 to 13 bytes sent, 1 to 11 read), then batches
        assert len(side.calls) >= (done["send_calls"] if is_send else len(stream_of(split)[0]) // 11)
        check_messages(side.messages, rpcs)
        assert [m.end_offset for m in side.messages] == ends
        assert side.message_ends() == ends
        assert side.parser.stats().unparsed_bytes == side.parser.stats().desyncs == 0
        check_bytes(side, data, 0)
    print("\ncounters:", counters)
    assert counters["desyncs"] == counters["walk_aborted"] == counters["stream_gaps"] == 0
    assert counters["messages"] == 2 * len(rpcs) and counters["not_zmtp"] == 0


@pytest.mark.privileged
def test_brpc_walker_counts_garbage_resyncs_and_leaves_unknown_bytes_uncopied(netns):  # noqa: F811
    from probes.events import SockcallItemKind, WalkStop

    peer = PeerProc(netns, script=__file__)
    try:
        pid = peer.read()["pid"]
        prog, cap = start_probe(netns, BRPC_WALKERS)
        with prog:
            peer.ask("batched mixed 30 21", prog)
            peer.ask("bad 22", prog)
            port = peer.ask("garbage", prog)["port"]
            peer.ask("batched mixed 30 24", prog)
            cap.drain()
            counters = brpc_counts(prog)
    finally:
        peer.stop()
    # the brpc connection: every message before and after the garbage
    expect = make_rpcs("mixed", 30, 21) + make_rpcs("paced", 10, 22) + make_rpcs("paced", 10, 23) + \
        make_rpcs("mixed", 30, 24)
    for side in sides([c for c in cap.calls if port not in (c.event.sport, c.event.dport)], pid).values():
        check_messages(side.messages, expect)
        stops = [m[2] for c in side.calls for m in c.marks() if m[1] == SockcallItemKind.WALK_END]
        assert stops == [WalkStop.BAD_MAGIC]
        assert side.parser.stats().unparsed_bytes >= 3000 - 12
    assert counters["desyncs"] == 2 and counters["self_syncs"] == 2
    # the connection of unknown bytes, on both ends: counted; only its first call copied
    unknown = [c for c in cap.calls if port in (c.event.sport, c.event.dport) and c.walkable_bytes]
    for is_send in (True, False):
        calls = [c for c in unknown if c.event.call_kind.is_send == is_send]
        assert len(calls) >= 3
        copied = [c for c in calls if any(it.kind == SockcallItemKind.BYTES for it, _body in c.items)]
        assert copied == calls[:1]
    assert counters["not_zmtp"] == 2
    print("\ncounters:", counters)


@pytest.mark.privileged
def test_brpc_walker_joins_mid_stream_through_a_hint_naming_its_framing(netns):  # noqa: F811
    """Joined mid-stream, the walker hunts as ZMTP (it does not know the framing) and
    finds nothing; paced messages end each call, and a hint at a call's end that names
    brpc starts the walk there, in brpc."""
    from probes.events import WalkProtocol, WalkStart

    peer = PeerProc(netns, script=__file__)
    try:
        pid = peer.read()["pid"]
        peer.ask(f"paced paced {WARMUP} 30")
        prog, cap = start_probe(netns, BRPC_WALKERS)
        with prog:
            peer.ask("paced paced 3 31", prog)
            hinted = hint_both_sides(prog, cap, pid, stale=False)
            peer.ask("paced paced 10 32", prog)
            peer.ask("batched mixed 100 33", prog)
            cap.drain()
            counters = brpc_counts(prog)
    finally:
        peer.stop()
    after = make_rpcs("paced", 10, 32) + make_rpcs("mixed", 100, 33)
    got = sides(cap.calls, pid, mid_stream=True)
    assert set(got) == set(hinted) == {True, False}
    for is_send, side in got.items():
        assert side.walk_start() == (WalkStart.HINT, WalkProtocol.BRPC, hinted[is_send])
        check_messages([m for m in side.messages if m.first_byte_offset >= hinted[is_send]], after)
    print("\ncounters:", counters)
    assert counters["hints_applied"] == 2 and counters["hints_stale"] == 0
    assert counters["desyncs"] == counters["walk_aborted"] == 0


@pytest.mark.privileged
def test_brpc_walker_syncs_by_itself_once_a_stale_hint_named_its_framing(netns):  # noqa: F811
    """A hint the stream has passed still says the framing: the walker's own hunt then
    looks for brpc messages, and syncs at the first paced call (one message ending at
    the call's end)."""
    from probes.events import WalkProtocol, WalkStart

    peer = PeerProc(netns, script=__file__)
    try:
        pid = peer.read()["pid"]
        peer.ask(f"paced paced {WARMUP} 40")
        prog, cap = start_probe(netns, BRPC_WALKERS)
        with prog:
            peer.ask("paced paced 2 41", prog)
            assert len(hint_both_sides(prog, cap, pid, stale=True)) == 2
            peer.ask("paced paced 10 42", prog)
            cap.drain()
            counters = brpc_counts(prog)
    finally:
        peer.stop()
    after = make_rpcs("paced", 10, 42)
    for side in sides(cap.calls, pid, mid_stream=True).values():
        why, framing, at = side.walk_start()
        assert (why, framing) == (WalkStart.SELF, WalkProtocol.BRPC)
        check_messages([m for m in side.messages if m.first_byte_offset >= at], after)
    print("\ncounters:", counters)
    assert counters["hints_stale"] == 2 and counters["self_syncs"] == 2
    assert counters["desyncs"] == counters["walk_aborted"] == 0


@pytest.mark.privileged
def test_walker_counts_only_a_joined_connection_user_space_found_in_no_framing(netns):  # noqa: F811
    """Joined mid-stream, a connection in no framing is hunted in and each call's
    first bytes go out raw (user space hunts in them with every parser); a
    count-only hint (what the agent sends once its parsers gave up) makes the
    walker count the direction's calls from its next call on and copy nothing."""
    from probes.events import SockcallItemKind
    from probes.sockcalls import Direction, set_count_only

    peer = PeerProc(netns, script=__file__)
    try:
        pid = peer.read()["pid"]
        port = peer.ask("opaque 5 50")["port"]   # before the probe: joined mid-stream
        prog, cap = start_probe(netns, BRPC_WALKERS)
        with prog:
            peer.ask("opaque 4 51", prog)
            cap.drain()
            before = len(cap.calls)
            ends = {}
            for call in cap.calls:
                ev = call.event
                if ev.tgid == pid and port in (ev.sport, ev.dport) and call.walkable_bytes:
                    ends[ev.call_kind.is_send] = ev.sk
            assert set(ends) == {True, False}
            for is_send, sk in ends.items():
                set_count_only(prog, sk, Direction.TX if is_send else Direction.RX)
            peer.ask("opaque 6 52", prog)
            cap.drain()
            counters = brpc_counts(prog)
    finally:
        peer.stop()

    def calls_of(calls, is_send):
        return [c for c in calls if c.event.tgid == pid and port in (c.event.sport, c.event.dport)
                and c.walkable_bytes and c.event.call_kind.is_send == is_send]

    def copied(call):
        return any(it.kind == SockcallItemKind.BYTES for it, _body in call.items)

    print("\ncounters:", counters)
    for is_send in (True, False):
        hunted, counted = calls_of(cap.calls[:before], is_send), calls_of(cap.calls[before:], is_send)
        assert len(hunted) >= 4 and all(copied(c) for c in hunted)
        assert len(counted) >= 6 and not any(copied(c) or c.items for c in counted)
        assert sum(c.walkable_bytes for c in counted) == 6 * 2000   # their bytes still counted
    assert counters["hints_applied"] == 2 and counters["self_syncs"] == 0
