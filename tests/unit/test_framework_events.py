"""One framework event per zmq message (framework.bpf.c accumulates a thread's frames in
the kernel): the event decodes to the same FrameworkMessage as the frames did when each
was its own event, through the agent's FrameworkDecoder and the reference (tests/oracles/framework.py),
on hand-made messages and on the frames a real psbench run recorded."""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path

from agent.framework_records import FrameworkDecoder
from agent.sources import read_recording
from parsers.pslite.framework import ZMQ_ROUTER
from parsers.pslite.meta import PBControl, PBMeta, PBNode
from probes.framework import (_FIXED, _LEGACY, _LEGACY_BYTES, CAPTURE_BYTES, MAX_FRAMES,
                              FrameCall, FwEvent, Kind, decode_event, unpack_event)
from oracles.framework import MessageAssembler

RECORDING = Path(__file__).resolve().parents[1] / "data" / "agent" / "psbench.rec.gz"


def legacy_record(kind, tgid, tid, sock, ts, ret_ts, size, head, more, arg=0) -> bytes:
    """A one-frame record as agents before per-message events wrote it."""
    return (_LEGACY.pack(ts, ret_ts, sock, 0, size, size, tgid, tid, arg, len(head), kind,
                         more, 0, 0) + head.ljust(CAPTURE_BYTES, b"\0"))


def kernel_events(records: list[bytes]) -> list[bytes]:
    """What framework.bpf.c sends for the same calls: the frames of a (thread, kind) slot
    joined up to the one without "more"; a piece goes out (more set) when the slot is
    full or a frame of another socket comes. zmq_socket calls stay one event each."""
    slots: dict[tuple, list] = {}
    out = []

    def emit(frames, more):
        first, last = frames[0], frames[-1]
        e = FwEvent(ts_ns=first[4], first_ret_ts_ns=first[5], ret_ts_ns=last[5], sock=first[3],
                    ret=last[6], tgid=first[1], tid=first[2], arg=last[8], kind=first[0],
                    more=more, frames=len(frames))
        for i, (*_, size, head) in enumerate(frames):
            e.sizes[i], e.head_len[i] = size, len(head)
            e.heads[i * CAPTURE_BYTES:i * CAPTURE_BYTES + len(head)] = head
        out.append(bytes(e)[:FwEvent.heads.offset + len(frames) * CAPTURE_BYTES])

    for raw in records:
        (ts, ret_ts, sock, _obj, ret, size, tgid, tid, arg, n, kind, more, _t, _b) = \
            _LEGACY.unpack_from(raw)
        if kind == Kind.ZMQ_SOCKET:
            e = FwEvent(ts_ns=ts, first_ret_ts_ns=ret_ts, ret_ts_ns=ret_ts, sock=sock, ret=ret,
                        tgid=tgid, tid=tid, arg=arg, kind=kind)
            out.append(bytes(e)[:FwEvent.heads.offset])
            continue
        frames = slots.setdefault((tid, kind), [])
        if frames and (frames[0][3] != sock or len(frames) == MAX_FRAMES):
            emit(frames, 1)
            frames.clear()
        frames.append((kind, tgid, tid, sock, ts, ret_ts, ret, more, arg, size,
                       raw[_LEGACY.size:_LEGACY.size + n]))
        if not more:
            emit(frames, 0)
            frames.clear()
    return out


def decoded(records: list[bytes]) -> list:
    dec = FrameworkDecoder()
    return [m for m in map(dec.feed, records) if m is not None]


def assembled(records: list[bytes]) -> list:
    asm = MessageAssembler()
    return [m for m in (asm.feed(decode_event(r)) for r in records) if m is not None]


def meta(**kw) -> bytes:
    return PBMeta(**kw).SerializeToString()


def calls(kind, frames, *, tid=7, sock=0xA0, tgid=70, t0=1000) -> list[bytes]:
    return [legacy_record(kind, tgid, tid, sock, t0 + 100 * i, t0 + 100 * i + 40, len(f),
                          f[:CAPTURE_BYTES], i + 1 < len(frames)) for i, f in enumerate(frames)]


def hand_made() -> list[bytes]:
    """Frames of a ps-lite exchange, with what made pieces: a message of more frames than an
    event holds, and two sockets interleaved on one thread."""
    control = meta(head=7, request=True, app_id=0, timestamp=12, customer_id=0, control=PBControl(
        cmd=2, node=[PBNode(role=r, id=i, hostname=f"10.0.0.{i}", port=9000 + i)
                     for r, i in ((0, 8), (1, 9), (2, 1))]))
    push = meta(app_id=0, customer_id=2, timestamp=41, request=True, push=True)
    resp = meta(app_id=0, customer_id=2, timestamp=41, request=False, push=True)
    keys = struct.pack("<4Q", 1, 2, 3, 4)
    router = (legacy_record(Kind.ZMQ_SOCKET, 70, 7, 0xE0, 10, 20, 0, b"", 0, arg=ZMQ_ROUTER),)
    a = calls(Kind.ZMQ_SEND, [meta(timestamp=1)] + [b"a%d" % i for i in range(MAX_FRAMES + 3)],
              t0=5000)
    b = calls(Kind.ZMQ_SEND, [meta(timestamp=2), b"b1", b"b2"], sock=0xB0, t0=5050)
    return [*router,
            *calls(Kind.ZMQ_SEND, [push, keys, b"v" * 64, b"\4\0\0\0" * 4]),
            *calls(Kind.ZMQ_RECV, [b"ps9", push, keys, b"v" * 100_000], sock=0xE0, tid=8),
            *calls(Kind.ZMQ_SEND, [b"worker-A", resp, b"v" * 300], sock=0xE0, tid=8),
            *calls(Kind.ZMQ_RECV, [b"\0\x80\0\0\x29", control], sock=0xC0, tid=9),
            *calls(Kind.ZMQ_RECV, [b"lone frame"], sock=0xC0, tid=9),
            *[x for pair in zip(a, b) for x in pair], *a[len(b):]]


def test_one_event_per_message_decodes_as_its_frames_did():
    frames = hand_made()
    events = kernel_events(frames)
    before = decoded(frames)
    assert len(before) == 7 and [m.frames for m in before] == [4, 4, 3, 2, 1, 3, MAX_FRAMES + 4]
    assert before[1].peer == b"ps9" and before[1].meta.sender == 9
    assert before[2].peer == b"worker-A" and before[2].meta.timestamp == 41
    assert before[3].meta.truncated and before[3].meta.control_cmd == 2
    # zmq_socket, 5 messages of one event, and the interleaved pair: a piece at each of
    # the thread's 5 switches of socket, b's end, then a's 9 frames left: a full piece
    # and its last frame
    assert len(events) == 1 + 5 + (5 + 1 + 2)
    assert decoded(events) == before
    assert assembled(events) == assembled(frames) == before


def test_every_message_of_a_recorded_psbench_run_decodes_as_its_frames_did():
    _, recorded = read_recording(RECORDING)
    frames = [raw for probe, raw in recorded if probe == "framework"]
    assert frames and all(len(r) == _LEGACY_BYTES for r in frames)   # recorded one per frame
    events = kernel_events(frames)
    before = decoded(frames)
    zmq = [e for e in events if unpack_event(e)[0] != Kind.ZMQ_SOCKET]
    assert len(zmq) == len(before) > 200     # one event per message
    assert len(frames) / len(events) > 2.5   # ps-lite: 3-5 frames a message
    assert decoded(events) == before
    assert sum(m.meta is not None and m.meta.timestamp is not None for m in before) > 0.9 * len(before)


def test_record_lengths_tell_the_layouts_apart():
    assert _FIXED.size == FwEvent.heads.offset and ctypes.sizeof(FwEvent) % 8 == 0
    assert (_LEGACY_BYTES - _FIXED.size) % CAPTURE_BYTES != 0
    assert MAX_FRAMES & (MAX_FRAMES - 1) == 0


def test_an_unfinished_message_is_held_until_its_last_piece():
    events = kernel_events(calls(Kind.ZMQ_RECV, [b"m%d" % i for i in range(MAX_FRAMES + 1)]))
    dec = FrameworkDecoder()
    assert dec.feed(events[0]) is None and dec.open_messages == 1
    m = dec.feed(events[1])
    assert dec.open_messages == 0 and m.frames == MAX_FRAMES + 1
    assert m.frame_heads[-1] == b"m%d" % MAX_FRAMES
    assert m.first_ret_ts_ns == 1040 and m.ts_ns == m.ret_ts_ns == 1000 + 100 * MAX_FRAMES + 40


def test_ps_layer_and_socket_events_keep_their_meaning():
    head = bytes(range(CAPTURE_BYTES))
    e = FwEvent(ts_ns=5, first_ret_ts_ns=9, ret_ts_ns=9, sock=0xF0, ret=99, tgid=1, tid=2,
                kind=Kind.PS_SEND, frames=1)
    e.head_len[0] = CAPTURE_BYTES
    e.heads[:CAPTURE_BYTES] = head
    c = decode_event(bytes(e)[:FwEvent.heads.offset + CAPTURE_BYTES])
    assert c == FrameCall(Kind.PS_SEND, 1, 2, 0xF0, 5, 9, 9, 99, False, 0, (0,), (head,))
    (m,) = assembled([bytes(e)[:FwEvent.heads.offset + CAPTURE_BYTES]])
    assert (m.layer, m.total_bytes, m.frame_heads, m.ts_ns) == ("ps", 99, (head,), 5)
