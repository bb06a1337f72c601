"""probes/framework.py without BPF: event decoding, zmq frames grouped into messages,
routing ids, PBMeta and ps::Meta ids, and the probe's configuration."""
from __future__ import annotations

import ctypes
import os
import re
import struct
from pathlib import Path

import pytest

from core.errors import UserError
from parsers.pslite.framework import PS_META_FORMAT, ZMQ_DEALER, ZMQ_ROUTER, decode_pbmeta, decode_ps_meta
from parsers.pslite.meta import PS_META_EMPTY, PBControl, PBMeta, PBNode
from probes.framework import (CAPTURE_BYTES, SOURCE, FrameCall, FrameworkProbe, FwEvent, Kind, Target,
                              decode_event, targets_of_pid)
from probes import libtrust
from probes.zmq_layout import pyzmq_libzmq
from oracles.framework import Checked

_ts = iter(range(1000, 10**9, 10))


def call(kind, frame: bytes = b"", more=False, tid=7, sock=0xA0, arg=0, tgid=70, ret=None):
    """One frame's event, as a piece of its message (the per-call records of older agents)."""
    t = next(_ts)
    return FrameCall(kind=kind, tgid=tgid, tid=tid, sock=sock, ts_ns=t, first_ret_ts_ns=t + 5,
                     ret_ts_ns=t + 5, ret=len(frame) if ret is None else ret, more=more, arg=arg,
                     sizes=(len(frame),), heads=(frame[:CAPTURE_BYTES],))


def meta(**kw) -> bytes:
    return PBMeta(**kw).SerializeToString()


def multipart(kind, frames, **kw):
    return [call(kind, f, more=i + 1 < len(frames), **kw) for i, f in enumerate(frames)]


def feed_all(asm, calls):
    return [m for m in map(asm.feed, calls) if m is not None]


def test_event_bytes_decode_through_the_mirror():
    e = FwEvent(ts_ns=5, first_ret_ts_ns=7, ret_ts_ns=9, sock=0xBEEF, ret=3, tgid=11, tid=12,
                arg=2, kind=Kind.ZMQ_SEND, more=1, frames=2)
    e.sizes[:2], e.head_len[:2] = [3, 70], [3, CAPTURE_BYTES]
    e.heads[:3] = b"abc"
    e.heads[CAPTURE_BYTES:2 * CAPTURE_BYTES] = b"y" * CAPTURE_BYTES
    c = decode_event(bytes(e)[:FwEvent.heads.offset + 2 * CAPTURE_BYTES])  # cut after its heads
    assert (c.kind, c.tgid, c.tid, c.sock, c.ts_ns, c.first_ret_ts_ns, c.ret_ts_ns) == \
        (Kind.ZMQ_SEND, 11, 12, 0xBEEF, 5, 7, 9)
    assert c.heads == (b"abc", b"y" * CAPTURE_BYTES) and c.more and c.sizes == (3, 70)
    assert ctypes.sizeof(FwEvent) % 8 == 0


def test_dealer_send_is_one_message_with_its_meta_ids():
    asm = Checked()   # the agent's decoder, against the reference
    frames = [meta(app_id=0, customer_id=2, timestamp=41, request=True, push=True),
              b"k" * 8, b"v" * 40, b"x" * 100_000]
    calls = multipart(Kind.ZMQ_SEND, frames)
    msgs = feed_all(asm, calls)
    assert len(msgs) == 1
    m = msgs[0]
    assert (m.direction, m.frames, m.total_bytes, m.peer) == ("send", 4, sum(map(len, frames)), None)
    assert (m.meta.app_id, m.meta.customer_id, m.meta.timestamp, m.meta.request, m.meta.push) == \
        (0, 2, 41, True, True)
    assert m.ts_ns == calls[0].ts_ns and m.ret_ts_ns == calls[-1].ret_ts_ns
    assert m.frame_sizes == (len(frames[0]), 8, 40, 100_000)
    assert m.frame_heads[3] == b"x" * CAPTURE_BYTES
    assert asm.open_messages == 0


def test_router_recv_keeps_the_routing_id_and_names_the_sender():
    asm = Checked()   # the agent's decoder, against the reference
    frames = [b"ps9", meta(app_id=0, customer_id=0, timestamp=3, request=True, push=False), b"k" * 8]
    calls = multipart(Kind.ZMQ_RECV, frames)
    (m,) = feed_all(asm, calls)
    assert m.peer == b"ps9" and m.frames == 3
    assert m.meta.sender == 9 and m.meta.timestamp == 3 and m.meta.push is False
    assert m.ts_ns == calls[-1].ret_ts_ns      # hand-over: the last frame's return
    assert m.first_ret_ts_ns == calls[0].ret_ts_ns


def test_socket_types_learned_from_zmq_socket_override_the_guess():
    asm = Checked()   # the agent's decoder, against the reference
    asm.feed(call(Kind.ZMQ_SOCKET, sock=0xD0, arg=ZMQ_DEALER))
    asm.feed(call(Kind.ZMQ_SOCKET, sock=0xE0, arg=ZMQ_ROUTER))
    # A DEALER's first frame is never a routing id, even when it looks like one.
    (d,) = feed_all(asm, multipart(Kind.ZMQ_RECV, [b"ps8", b"data"], sock=0xD0))
    assert d.peer is None
    # A ROUTER's is, even an id no heuristic would recognise.
    m = meta(app_id=1, customer_id=0, timestamp=5, request=False)
    (r,) = feed_all(asm, multipart(Kind.ZMQ_SEND, [b"worker-A", m], sock=0xE0))
    assert r.peer == b"worker-A" and r.meta.timestamp == 5 and r.meta.sender is None


def test_libzmq_generated_routing_ids_are_recognised():
    asm = Checked()   # the agent's decoder, against the reference
    (m,) = feed_all(asm, multipart(Kind.ZMQ_RECV, [b"\x00\x80\x00\x00\x29",
                                                   meta(app_id=0, timestamp=1)]))
    assert m.peer == b"\x00\x80\x00\x00\x29" and m.meta.timestamp == 1


def test_threads_and_sockets_do_not_mix_frames():
    asm = Checked()   # the agent's decoder, against the reference
    a = multipart(Kind.ZMQ_SEND, [meta(timestamp=1), b"a1", b"a2"], tid=1)
    b = multipart(Kind.ZMQ_SEND, [meta(timestamp=2), b"b1"], tid=2)
    c = multipart(Kind.ZMQ_SEND, [meta(timestamp=3), b"c1"], tid=1, sock=0xB0)
    interleaved = [a[0], b[0], c[0], a[1], b[1], c[1], a[2]]
    msgs = feed_all(asm, interleaved)
    assert [(m.meta.timestamp, m.frames) for m in msgs] == [(2, 2), (3, 2), (1, 3)]


def test_an_unfinished_message_stays_open():
    asm = Checked()   # the agent's decoder, against the reference
    assert feed_all(asm, [call(Kind.ZMQ_RECV, meta(timestamp=1), more=True)]) == []
    assert asm.open_messages == 1


def _control_meta(hostname: str) -> bytes:
    nodes = [PBNode(role=r, id=i, hostname=hostname % i, port=9000 + i) for r, i in
             ((0, 8), (1, 9), (2, 1))]
    return meta(head=7, control=PBControl(cmd=2, node=nodes), request=True, app_id=0,
                timestamp=12, customer_id=0)


def test_a_meta_cut_by_the_capture_keeps_the_whole_fields_before_the_cut():
    # The control field (3) fits in the capture; the ids serialised after it do not.
    full = _control_meta("10.0.0.%d")
    assert len(full) > CAPTURE_BYTES
    ids = decode_pbmeta(full[:CAPTURE_BYTES], len(full))
    assert ids.truncated and (ids.head, ids.control_cmd) == (7, 2)
    assert ids.timestamp is None and ids.app_id is None and ids.request is None
    whole = decode_pbmeta(full, len(full))
    assert (whole.control_cmd, whole.timestamp, whole.request, whole.truncated) == (2, 12, True, False)


def test_a_field_cut_in_the_middle_is_not_decoded():
    full = _control_meta("a-much-longer-host-name-%d.example.org")
    ids = decode_pbmeta(full[:CAPTURE_BYTES], len(full))
    assert ids.truncated and ids.head == 7
    assert ids.control_cmd is None   # never read from a partial control field


def test_non_meta_frames_give_no_ids():
    assert decode_pbmeta(b"\x00\x01\x02garbage", 10) is None
    assert decode_pbmeta(b"", 0) is None


def test_ps_meta_leading_fields():
    raw = struct.pack(PS_META_FORMAT, 0, 0, 1, 17, 9, 8, True, False, True) + b"\xff" * 37
    ids = decode_ps_meta(raw)
    assert (ids.app_id, ids.customer_id, ids.timestamp, ids.sender, ids.recver) == (0, 1, 17, 9, 8)
    assert (ids.request, ids.push, ids.simple_app) == (True, False, True)
    empty = decode_ps_meta(struct.pack(PS_META_FORMAT, *[PS_META_EMPTY] * 6, 0, 0, 0))
    assert empty.sender is None and empty.timestamp is None
    assert decode_ps_meta(b"\0" * 10) is None


def test_ps_layer_events_are_messages_on_their_own():
    asm = Checked()   # the agent's decoder, against the reference
    raw = struct.pack(PS_META_FORMAT, 0, 0, 0, 4, PS_META_EMPTY, 8, True, True, False)
    s = asm.feed(call(Kind.PS_SEND, raw, ret=99))
    r = asm.feed(call(Kind.PS_RECV, raw, ret=102))
    assert (s.layer, s.direction, s.total_bytes, s.frames, s.ts_ns) == ("ps", "send", 99, None, s.call_ts_ns)
    assert (r.direction, r.ts_ns, r.meta.timestamp, r.meta.recver) == ("recv", r.ret_ts_ns, 4, 8)


# --- the probe's configuration (no BPF: compiling and attaching need root) ---------------

def test_every_constant_the_bpf_source_requires_is_passed_as_an_integer():
    probe = FrameworkProbe([Target(pyzmq_libzmq(), "zmq")])
    required = set(re.findall(r"!defined\((\w+)\)", SOURCE.read_text()))
    passed = dict(f.removeprefix("-D").split("=") for f in probe.cflags())
    assert required and required <= set(passed)
    assert all(v.isdigit() for v in passed.values())
    assert int(passed["ZMQ_TYPE_OFF"]) == probe.layout.type_off
    assert f"#define ZMQ_VSM_DATA_OFF {probe.layout.vsm_data_off}" in probe.program_text()


def test_a_probe_without_zmq_targets_still_gets_every_constant(monkeypatch):
    monkeypatch.setattr(libtrust, "check", lambda library, pid: None)   # a path of no file
    probe = FrameworkProbe([Target(Path("/nonexistent/libmxnet.so"), "ps")])
    required = set(re.findall(r"!defined\((\w+)\)", SOURCE.read_text()))
    assert required <= {f.removeprefix("-D").split("=")[0] for f in probe.cflags()}
    assert probe.layout is None


@pytest.mark.parametrize("pages", [0, 3, -1, "8", True])
def test_bad_ring_buffer_sizes_are_refused(pages):
    with pytest.raises(UserError, match="ring buffer pages"):
        FrameworkProbe([Target(pyzmq_libzmq(), "zmq")], ringbuf_pages=pages)


def test_bad_targets_are_refused():
    with pytest.raises(UserError, match="no framework library"):
        FrameworkProbe([])
    with pytest.raises(UserError, match="unknown framework layer"):
        Target(Path("/x.so"), "grpc")
    with pytest.raises(UserError, match="not a process id"):
        Target(Path("/x.so"), "zmq", pid=0)
    with pytest.raises(UserError, match="cannot read the libraries of process"):
        targets_of_pid(2**22 + 12345)


def test_a_process_is_searched_for_the_libzmq_it_loaded():
    import zmq  # noqa: F401  (maps pyzmq's libzmq into this process)

    found = targets_of_pid(os.getpid())
    # (other tests of this session may have loaded more libzmq-named libraries)
    assert ("zmq", pyzmq_libzmq().resolve()) in {(t.layer, t.library.resolve()) for t in found}
    assert all(t.pid == os.getpid() and t.library.name.startswith("libzmq") for t in found)


def test_a_library_is_never_probed_twice_for_the_same_process(monkeypatch):
    monkeypatch.setattr(libtrust, "check", lambda library, pid: None)   # paths of no file
    lib = Path("/nonexistent/libmxnet.so")
    probe = FrameworkProbe([Target(lib, "ps", 10), Target(lib, "ps", 10), Target(lib, "ps"),
                            Target(lib, "ps", 11), Target(Path("/other/libmxnet.so"), "ps", 10)])
    assert probe.targets == [Target(lib, "ps"), Target(Path("/other/libmxnet.so"), "ps", 10)]


# ---- BytePS: a RawMeta, and a server's sender id before it -------------------------------

def _byteps_answer(timestamp: int = 17):
    from parsers.pslite import encode as penc
    spec = penc.MessageSpec(request=False, push=False, head=2, timestamp=timestamp, keys=[5 << 16],
                            vals=b"\x01" * 32, lens=[32])
    return spec.raw_frames(routing_id=b"ps8")   # ["ps8", RawMeta, keys, vals, lens]


def test_a_byteps_servers_answer_through_its_router_names_the_worker_and_the_ids():
    from parsers.pslite.framework import record_facts, zmtp_bytes
    asm = Checked()
    asm.feed(call(Kind.ZMQ_SOCKET, sock=0xE0, arg=ZMQ_ROUTER))
    wire = _byteps_answer()
    (m,) = feed_all(asm, multipart(Kind.ZMQ_SEND, [b"ps9"] + wire, sock=0xE0))
    assert m.peer == b"ps9" and (m.meta.timestamp, m.meta.request, m.meta.push) == (17, False, False)
    f = record_facts(m)
    assert f.peer_id == 9 and f.head_keys == (5 << 16,)
    assert f.wire_bytes == zmtp_bytes([len(x) for x in wire])   # the sender id is on the wire


def test_a_workers_dealer_takes_the_sender_id_frame_as_the_sender():
    from parsers.pslite.framework import record_facts, zmtp_bytes
    asm = Checked()
    asm.feed(call(Kind.ZMQ_SOCKET, sock=0xD0, arg=ZMQ_DEALER))
    wire = _byteps_answer(timestamp=3)
    (m,) = feed_all(asm, multipart(Kind.ZMQ_RECV, wire, sock=0xD0))
    assert m.peer is None and m.meta.sender == 8 and m.meta.timestamp == 3
    f = record_facts(m)
    assert f.peer_id == 8 and f.head_keys == (5 << 16,) and f.wire_bytes == zmtp_bytes([len(x) for x in wire])


def test_a_rawmeta_decodes_from_the_captured_head_and_garbage_does_not():
    from parsers.pslite.framework import decode_meta_frame
    raw = _byteps_answer()[1]
    assert len(raw) > CAPTURE_BYTES
    ids = decode_meta_frame(raw[:CAPTURE_BYTES], len(raw))
    assert (ids.timestamp, ids.request, ids.push, ids.head, ids.truncated) == (17, False, False, 2, True)
    assert decode_meta_frame(raw[:CAPTURE_BYTES], len(raw) + 4) is None    # not PackMeta's size
    bad = bytearray(raw)
    bad[20] = 1                                                             # padding not zero
    assert decode_meta_frame(bytes(bad[:CAPTURE_BYTES]), len(raw)) is None
    assert decode_meta_frame(bytes(range(64)), 100) is None


@pytest.mark.parametrize("name, layer", [
    ("libzmq.so.5", "zmq"), ("libzmq.so", "zmq"), ("libzmq.so.5.2.4", "zmq"),   # Debian's (BytePS links it)
    ("libzmq-2f02442c.so.5.2.5", "zmq"),                                      # pyzmq's wheel
    ("libzmq-before.so", "zmq"),                                              # a build of one's own
    ("libzmqx.so", None), ("libzmq.so.5.bak", None), ("libmxnet.so", "ps"), ("libpaddle.so", "brpc"),
])
def test_framework_libraries_are_told_by_their_file_names(name, layer):
    from probes.framework import layer_of
    assert layer_of(name) == layer
