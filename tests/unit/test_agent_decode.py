"""agent.calls and agent.streams on hand-made sockcall records: both payload formats (the landed
256-byte prefix, and the ZMTP walker's items), gaps, mid-stream joins, sequence
wrap-around, connection ids, and the framework-event decoder."""
from __future__ import annotations

import socket
import struct

import pytest

from agent.calls import _HEAD, _RX_TIMES, SockcallAssembler, walked_view
from agent.endpoints import conn_id_of
from agent.streams import StreamDecoder
from parsers.pslite.encode import MessageSpec, encode_stream
from probes.events import (SOCKCALL_F_CONTINUED, SOCKCALL_F_ISN_EXACT, SockCall, SockcallItem,
                           SockcallItemKind as K, SockcallWalkMark, WalkProtocol, WalkStart)

ISN_C, ISN_S = 1000, 2**32 - 300   # the server's ISN wraps around within the stream
CLIENT, SERVER = ("10.0.0.1", 40000), ("10.0.0.2", 9000)


def record(tx: bool, seq_start: int, n: int, payload: bytes = b"", *, flags=SOCKCALL_F_ISN_EXACT,
           ts=1_000, tgid=100, tid=101, local=CLIENT, remote=SERVER, isns=(ISN_C, ISN_S), sk=0xABC,
           ret=None) -> bytes:
    call = SockCall.SENDMSG if tx else SockCall.RECVFROM
    head = _HEAD.pack(ts, ts + 500, sk, 7, n if ret is None else ret, tgid, tid, 3, 4026531840,
                      seq_start & 0xFFFFFFFF, (seq_start + n) & 0xFFFFFFFF, isns[0], isns[1],
                      socket.inet_aton(local[0]).ljust(16, b"\0"), socket.inet_aton(remote[0]).ljust(16, b"\0"),
                      socket.AF_INET, local[1], remote[1], len(payload), call, flags, b"pslat-test")
    return head + payload


def stream(n_msgs: int, keys_per=4):
    msgs = [MessageSpec(timestamp=i, push=i % 2 == 0, keys=list(range(i * 10, i * 10 + keys_per)),
                        vals=bytes(16 * keys_per) if i % 2 == 0 else b"") for i in range(n_msgs)]
    return encode_stream(msgs, identity=b"ps9")


def calls_of(data: bytes, cut: int, isn: int, tx=True):
    """The stream cut into calls of `cut` bytes, prefix format (<= 256 bytes each)."""
    out = []
    for off in range(0, len(data), cut):
        chunk = data[off:off + cut]
        out.append(record(tx, isn + 1 + off, len(chunk), chunk[:256], ts=1_000 + off))
    return out


def run(records, fmt="prefix"):
    asm, dec = SockcallAssembler(fmt), StreamDecoder()
    out = []
    for r in records:
        c = asm.feed(r)
        if c is not None:
            out += dec.feed(c)
    return out, dec


def test_prefix_calls_give_every_message_with_its_calls_and_sequence_numbers():
    data, spans = stream(6)
    got, dec = run(calls_of(data, 200, ISN_C))
    assert [w.msg.timestamp for w in got] == list(range(6))
    for w, (first, last) in zip(got, spans):
        assert (w.msg.first_byte_offset, w.msg.last_byte_offset) == (first, last)
        assert w.seq_first == (ISN_C + 1 + first) & 0xFFFFFFFF and w.seq_end == (ISN_C + 2 + last) & 0xFFFFFFFF
        assert w.first_call.start_offset <= first < w.first_call.start_offset + w.first_call.seq_bytes
        assert w.last_call.start_offset <= last < w.last_call.start_offset + w.last_call.seq_bytes
        assert w.msg.sender_node_id == 9 and w.tx
    s = dec.stats_by_netns()[4026531840]
    assert s["lost_bytes"] == 0 and s["unparsed_bytes"] == 0


def test_bytes_past_the_prefix_are_a_gap_and_sequence_numbers_wrap():
    data, spans = stream(8, keys_per=40)   # pushes of ~1.3 KB: most bytes past the 256-byte prefix
    got, dec = run(calls_of(data, 1000, ISN_S, tx=False))
    s = dec.stats_by_netns()[4026531840]
    assert s["gap_bytes"] > 0
    for w in got:   # what was found is right, across the 2**32 wrap
        first, last = spans[w.msg.timestamp]
        assert (w.msg.first_byte_offset, w.msg.last_byte_offset) == (first, last)
        assert w.seq_end == (ISN_S + 2 + last) & 0xFFFFFFFF and not w.tx


def test_a_stream_joined_mid_way_resynchronises():
    data, spans = stream(10)
    recs = calls_of(data, 150, ISN_C)[3:]   # the greeting and the first messages were never seen
    got, _ = run(recs)
    assert got, "no message found after joining mid-stream"
    assert [w.msg.timestamp for w in got] == list(range(got[0].msg.timestamp, 10))
    assert all(w.msg.sender_node_id is None for w in got)   # READY was missed


def test_peek_errors_and_fin_give_no_bytes():
    dec, asm = StreamDecoder(), SockcallAssembler("prefix")
    assert asm.feed(record(False, ISN_S + 1, 0, ret=-11)) is None
    assert asm.feed(record(False, ISN_S + 1, 0, ret=5)) is None      # MSG_PEEK: range empty
    assert asm.feed(record(False, ISN_S + 1, 1, ret=0)) is None      # FIN
    assert dec.conns == {}


def test_conn_id_is_the_same_on_both_ends():
    a, _ = conn_id_of(CLIENT, SERVER, ISN_C, ISN_S, True)
    b, _ = conn_id_of(SERVER, CLIENT, ISN_S, ISN_C, True)
    assert a == b and str(ISN_C) in a and str(ISN_S) in a
    assert conn_id_of(CLIENT, SERVER, ISN_C, ISN_S + 1, True)[0] != a   # reconnect: new id


def test_new_isns_on_the_same_socket_and_ports_are_a_new_connection():
    data, _ = stream(2)
    dec, asm = StreamDecoder(), SockcallAssembler("prefix")
    dec.feed(asm.feed(record(True, ISN_C + 1, 100, data[:100])))
    dec.feed(asm.feed(record(True, 5000 + 1, 100, data[:100], isns=(5000, 7000))))
    assert len(dec.conns) == 1 and next(iter(dec.conns.values())).isn_local == 5000


# ---- the walker's items format --------------------------------------------------------

def item(kind: int, off: int, body: bytes = b"", what: int = 0) -> bytes:
    return bytes(SockcallItem(kind, what, len(body), off)) + body


ITEM_BYTES, ITEM_MSG_END, ITEM_RX_TIMES = K.BYTES, K.MSG_END, K.RX_TIMES
_ITEM_HDR = len(bytes(SockcallItem()))


def walk_start(off: int, how: WalkStart) -> bytes:
    return item(K.WALK_START, off, bytes(SockcallWalkMark(0, how, 0, 0)))


def kept_by_walker(data: bytes, start: int):
    """Byte ranges a walker copies out: the handshake, every frame header, meta bodies."""
    keep = [(0, start)]
    pos, first_frame = start, True
    while pos < len(data):
        flags = data[pos]
        if flags & 0x02:
            size, hl = int.from_bytes(data[pos + 1:pos + 9], "big"), 9
        else:
            size, hl = data[pos + 1], 2
        keep.append((pos, pos + hl + (size if first_frame else 0)))
        first_frame = not flags & 0x01
        pos += hl + size
    return keep


def walked_call(data: bytes, start: int, end: int, spans, keep):
    """Items for data[start:end]: BYTES for the ranges in keep (absolute offsets),
    MSG_END + RX_TIMES at each message end inside the call."""
    items = walk_start(0, WalkStart.GREETING if start == 0 else WalkStart.CONTINUE)
    for a, b in keep:
        a, b = max(a, start), min(b, end)
        if a < b:
            items += item(ITEM_BYTES, a - start, data[a:b], what=4)
    for first, last in spans:
        if start < last + 1 <= end:
            off = last + 1 - start
            items += item(ITEM_MSG_END, off, struct.pack("<IIQ", (ISN_S + 2 + last) & 0xFFFFFFFF, 3, 0))
            items += item(ITEM_RX_TIMES, off, _RX_TIMES.pack(0, 5_000 + last, 6_000 + last, 0, 0x1 | 0x4 | 0x8))
    return items


def test_walker_items_give_messages_with_rx_stage_times_even_when_bodies_were_skipped():
    data, spans = stream(6, keys_per=40)
    # what a walker keeps: greeting+READY, then per message its meta frame and headers;
    # the rest (keys, values) is skipped inside frame bodies
    keep = kept_by_walker(data, spans[0][0])
    recs = []
    for off in range(0, len(data), 3000):
        end = min(len(data), off + 3000)
        items = walked_call(data, off, end, spans, keep)
        # split across two records (CONTINUED) when long, as the probe does
        half = len(items) // 2
        cut = 0
        pos = 0
        while pos < half:
            ln = SockcallItem.from_buffer_copy(items, pos).len
            pos += _ITEM_HDR + ln
            cut = pos
        if 0 < cut < len(items):
            recs.append(record(False, ISN_S + 1 + off, end - off, items[:cut],
                               flags=SOCKCALL_F_ISN_EXACT | SOCKCALL_F_CONTINUED))
            recs.append(record(False, ISN_S + 1 + off, end - off, items[cut:]))
        else:
            recs.append(record(False, ISN_S + 1 + off, end - off, items))
    got, dec = run(recs, "items")
    assert [w.msg.timestamp for w in got] == list(range(6))
    for w in got:
        last = spans[w.msg.timestamp][1]
        assert w.stages["ts_netif_rx_last_ns"] == 5_000 + last
        assert w.stages["ts_data_ready_ns"] == 6_000 + last
        assert w.stages["ts_nic_rx_last_ns"] is None
        assert "NAPI" in w.stages["ts_nic_rx_last_ns:null"]
        assert w.msg.num_keys == 40
    assert dec.stats_by_netns()[4026531840]["unparsed_bytes"] == 0


def test_unknown_format_is_refused():
    with pytest.raises(ValueError):
        SockcallAssembler("pcap")


def test_a_sync_hint_names_the_next_frame_header_of_a_direction_the_kernel_does_not_walk():
    """Walker format, joined mid-stream: the kernel sends raw prefixes (BYTES PREFIX).
    Once the parser is in sync at a message boundary it tells where the next frame
    header is, as a TCP sequence number, for the walker to start there."""
    data, spans = stream(12)
    hints = []
    asm, dec = SockcallAssembler("items"), StreamDecoder(on_sync_hint=lambda *a: hints.append(a))
    start = spans[2][0]   # joined at the third message
    for i, (first, last) in enumerate(spans[2:]):
        chunk = data[first:last + 1]
        items = item(ITEM_BYTES, 0, chunk[:256], what=0x01)
        r = record(True, ISN_C + 1 + first, len(chunk), items, ts=1_000_000_000 * (i + 1))
        dec.feed(asm.feed(r))
    assert hints, "no hint given"
    sk, tx, seq, frame_index, framing = hints[-1]
    assert (sk, tx, frame_index, framing) == (0xABC, True, 0, WalkProtocol.ZMTP)
    assert (seq - ISN_C - 1) in {f for f, _ in spans} or seq - ISN_C - 1 == len(data)
    assert start < seq - ISN_C - 1


def test_a_direction_joined_mid_stream_that_no_parser_recognised_is_left_to_the_kernel_to_count():
    """Walker format: the kernel hunts in a joined direction and sends each call's
    raw prefix; once every parser gave up on it (parsers/sniff.py HUNT_BYTES_MAX), the
    decoder asks the kernel to count its calls only (framing None), once, and again
    only while raw prefixes still come. A direction seen from its first byte is the
    kernel's to classify: no hint."""
    import random

    from parsers.sniff import HUNT_BYTES_MAX

    rng = random.Random(3)
    call_bytes = 64 << 10

    def calls(first_offset: int, n_raw: int, n_counted: int, ts0: int):
        for i in range(n_raw + n_counted):
            off = first_offset + i * call_bytes
            raw = rng.randbytes(256).replace(b"PRPC", b"prpc") if i < n_raw else b""
            items = item(ITEM_BYTES, 0, raw, what=0x01) if raw else b""
            yield record(True, ISN_C + 1 + off, call_bytes, items, ts=ts0 + i * 5_000_000)

    raw_calls = HUNT_BYTES_MAX // call_bytes + 1   # the last one makes the hunters give up
    for first_offset, want in ((10 * call_bytes, 1), (0, 0)):
        hints = []
        asm, dec = SockcallAssembler("items"), StreamDecoder(on_sync_hint=lambda *a: hints.append(a))
        for r in calls(first_offset, raw_calls, 20, 1_000_000_000):
            dec.feed(asm.feed(r))
        (flow,) = [conn.tx for conn in dec.conns.values()]
        assert type(flow.parser).__name__ == "OpaqueStream"
        assert hints == [(0xABC, True, 0, 0, None)] * want and dec.hints_count_only == want
    # prefixes that still come after the interval: asked again, at most once per interval
    hints = []
    asm, dec = SockcallAssembler("items"), StreamDecoder(on_sync_hint=lambda *a: hints.append(a))
    for r in calls(10 * call_bytes, raw_calls + 20, 0, 1_000_000_000):
        dec.feed(asm.feed(r))
    assert 2 <= len(hints) <= 20 * 5_000_000 // 20_000_000 + 1


# ---------------------------------------------------------------- struct items decoder == probes.sockcalls

def _reference_call(assembler, history, raw: bytes):
    """A sockcall record decoded the slow, obvious way: probes.sockcalls' ctypes
    mirrors (CallAssembler, WalkedCall), as the agent did before its struct decoder."""
    from agent import calls as decode
    from probes.events import SockcallEvent

    wc = assembler.add(SockcallEvent.decode(raw))
    if wc is None or not wc.walkable_bytes:
        return None
    # probes.sockcalls' Gap / Skip / Hunted as the agent's int / Skip / Hunted
    as_agent = {"Gap": int, "Skip": decode.Skip, "Hunted": decode.Hunted}
    view = [(o, x if isinstance(x, bytes) else as_agent[type(x).__name__](int(x))) for o, x in wc.stream_view(0)]
    ends: dict = {}
    for e in wc.message_ends():
        st = ends.setdefault(e.call_off, {})
        if e.rx_times is not None and len(e.rx_times) >= _RX_TIMES.size:
            nic, netif, dr, _nxt, flags = _RX_TIMES.unpack_from(e.rx_times)
            st.update(decode.rx_stages(nic, netif, dr, flags))
    c = decode._call(decode._head(raw), view, ends)
    for it, body in wc.items:
        if it.kind == K.SCHED:
            c.sched = history.snapshot(c.tid, c.exit_ts_ns, body)
        elif it.kind == K.WINDOW:
            c.window = body
    walked = wc.walked_ranges()
    c.kernel_unsynced = not walked or walked[-1][1] < wc.walkable_bytes
    return c


@pytest.mark.parametrize("name", ["netstack.rec.gz", "psbench.rec.gz"])
def test_struct_decoder_gives_the_calls_of_the_ctypes_mirrors(name):
    from pathlib import Path

    from agent.netrows import SchedHistory
    from agent.sources import read_recording
    from oracles.walker import CallAssembler

    header, events = read_recording(Path(__file__).resolve().parents[1] / "data" / "agent" / name)
    assert header["sockcall_format"] == "items"
    fast = SockcallAssembler("items")
    ref, history = CallAssembler(), SchedHistory()
    n = kinds = whole = 0
    seen: set = set()
    for probe, raw in events:
        if probe != "sockcalls":
            continue
        want, got = _reference_call(ref, history, raw), fast.feed(raw)
        if got is not None and got.walked is not None:
            # a call walked whole: its view is built only where the parser cannot take its
            # messages as they are (test_walked_fast_path); it must be the same view
            whole += 1
            got.view, got.walked, got.record = walked_view(got), None, None
        assert want == got, n
        if got is not None:
            assert [type(x) for _, x in got.view] == [type(x) for _, x in want.view]
            seen.update(type(x).__name__ for _, x in got.view)
            kinds += got.sched is not None or got.window is not None
        n += 1
    assert n > 300 and {"bytes", "Skip"} <= seen and whole > n // 2
    if name.startswith("netstack"):
        assert kinds > 100   # SCHED / WINDOW items were compared too


def test_struct_decoder_refuses_what_the_mirrors_refuse():
    items = SockcallItem(int(K.WALK_START), 0, 8, 0)
    bad_mark = bytes(items) + bytes(SockcallWalkMark(0, 99, 0, 0))   # an unknown start reason
    with pytest.raises(ValueError):
        SockcallAssembler("items").feed(record(True, ISN_C + 1, 10, bad_mark))
    cut = bytes(SockcallItem(int(K.BYTES), 0, 50, 0)) + b"x" * 10    # claims more than it carries
    with pytest.raises(ValueError):
        SockcallAssembler("items").feed(record(True, ISN_C + 1, 10, cut))
