"""Fuzz target: the agent's ring-record decoders, and the streams their calls make.

Byte 0 picks the ring (low 2 bits): sockcalls in the "prefix" payload format, in the
walker's "items" format, framework, netstack. The rest is records, each after a
2-byte little-endian length, fed in order to one decoder (so a call over several
CONTINUED records, or a zmq message over several framework events, is joined):
agent.calls.SockcallAssembler (call_of_sockcall, _walked_view) with its Calls fed on
to a StreamDecoder (the ps-lite parser per direction), agent.framework_records.FrameworkDecoder,
probes.events.NetstackEvent.decode.

A record the decoder refuses raises ValueError (the agent counts it in meta.json's
events_undecodable); anything else escaping is a crash, and so is a value that does
not fit the run-dir column it goes to (agent.records): ids int32, times int64."""
from __future__ import annotations

import struct
from pathlib import Path

from agent.calls import SockcallAssembler
from agent.framework_records import FrameworkDecoder
from agent.streams import StreamDecoder
from core.safetext import safe_text
from agent.sources import read_recording
from probes.events import NetstackEvent

KIND = "parser"
# two or three records an input: enough to join a call or a message over records
MAX_LEN = 1024
_REC = Path(__file__).resolve().parents[1] / "tests" / "data" / "agent"
_LEN = struct.Struct("<H")
RINGS = ("prefix", "items", "framework", "netstack")
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def pack(ring: str, records: list[bytes]) -> bytes:
    """An input of this target: the ring's index, then the records length-prefixed."""
    return bytes([RINGS.index(ring)]) + b"".join(_LEN.pack(len(r)) + r for r in records)


def seeds() -> list[bytes]:
    out = []
    for name in ("psbench.rec.gz", "netstack.rec.gz"):
        _, events = read_recording(_REC / name)
        by_probe: dict[str, list[bytes]] = {}
        for probe, raw in events:
            by_probe.setdefault(probe, []).append(raw)
        for probe, ring in (("sockcalls", "items"), ("framework", "framework"), ("netstack", "netstack")):
            raws = by_probe.get(probe, [])
            for at in range(0, min(len(raws), 60), 3):   # a few consecutive records per seed
                batch, size = [], 0
                for r in raws[at:at + 3]:
                    if size + len(r) + 3 > MAX_LEN:
                        break
                    batch.append(r)
                    size += len(r) + 2
                out.append(pack(ring, batch))
    return out + _prefix_seeds()


def _prefix_seeds() -> list[bytes]:
    """The "prefix" format (no recording has it any more): a ps-lite stream of a few
    messages cut into calls, each record the call's header and the bytes it moved."""
    import socket

    from agent.calls import _HEAD
    from parsers.pslite.encode import MessageSpec, encode_stream
    from probes.events import SOCKCALL_F_ISN_EXACT, SockCall

    specs = [MessageSpec(timestamp=i, push=i % 2 == 0, keys=list(range(i, i + 3)),
                         vals=bytes(12) if i % 2 == 0 else b"") for i in range(4)]
    out = []
    for identity, cut in ((b"ps9", 100), (b"ps3000000000", 60), (None, 250)):
        data, _ = encode_stream(specs, identity=identity)
        recs = []
        for at in range(0, len(data), cut):
            chunk = data[at:at + cut]
            if sum(len(r) + 2 for r in recs) + _HEAD.size + len(chunk) + 3 > MAX_LEN:
                break
            recs.append(_HEAD.pack(1000 + at, 1500 + at, 0xABC, 7, len(chunk), 100, 101, 3, 4026531840,
                                   (1001 + at) & 0xFFFFFFFF, (1001 + at + len(chunk)) & 0xFFFFFFFF,
                                   1000, 5000, socket.inet_aton("10.0.0.1").ljust(16, b"\0"),
                                   socket.inet_aton("10.0.0.2").ljust(16, b"\0"), socket.AF_INET,
                                   40000, 9000, len(chunk), SockCall.SENDMSG, SOCKCALL_F_ISN_EXACT,
                                   b"psbench") + chunk)
        out.append(pack("prefix", recs))
    return out


def _decoded(decode, body: bytes):
    """What `decode` makes of each record in body (None included), refusals skipped."""
    at = 0
    while at + 2 <= len(body):
        n = _LEN.unpack_from(body, at)[0]
        raw = body[at + 2:at + 2 + n]
        at += 2 + n
        try:
            got = decode(raw)
        except ValueError:   # refused: the agent counts it (events_undecodable)
            continue
        yield got


def _int32(v) -> bool:
    return v is None or -INT32_MAX - 1 <= v <= INT32_MAX


def _time(v) -> bool:
    return v is None or 0 <= v <= INT64_MAX


def _check_wire(wm) -> None:
    m = wm.msg
    for name in ("cmd", "app_id", "customer_id", "timestamp", "sender_node_id"):
        assert _int32(getattr(m, name)), (name, getattr(m, name))
    assert 0 <= m.num_keys <= INT64_MAX and 0 <= m.value_bytes <= INT64_MAX
    assert 0 < m.total_bytes <= INT64_MAX
    assert all(0 <= k < 2**64 for k in m.key_sample)
    assert 0 <= wm.seq_first < 2**32 and 0 <= wm.seq_end < 2**32
    for col, v in wm.stages.items():
        assert col.endswith(":null") or _time(v), (col, v)


def _check_call(c) -> None:
    assert _int32(c.tgid) and _int32(c.tid), (c.tgid, c.tid)
    assert _time(c.enter_ts_ns) and _time(c.exit_ts_ns)
    assert 0 <= c.local[1] < 65536 and 0 <= c.remote[1] < 65536
    assert safe_text(c.comm) == c.comm, c.comm   # a traced process names itself: no escapes


def _end_of(dec: StreamDecoder) -> list:
    """The end of the input: every connection's parsers closed, their last messages.
    advance() (every connection idle by then) where the decoder bounds its connection
    state, else forget() each."""
    if hasattr(dec, "advance"):
        return dec.advance(2**63 - 1)
    return [wm for conn in list(dec.conns.values()) for wm in dec.forget(conn)]


def one_input(data: bytes) -> None:
    if not data:
        return
    ring, body = RINGS[data[0] & 3], data[1:]
    if ring in ("prefix", "items"):
        asm, dec = SockcallAssembler(ring), StreamDecoder()
        for call in _decoded(asm.feed, body):
            if call is not None:
                _check_call(call)
                for wm in dec.feed(call):
                    _check_wire(wm)
        for wm in _end_of(dec):
            _check_wire(wm)
    elif ring == "framework":
        for fm in _decoded(FrameworkDecoder().feed, body):
            if fm is not None:
                assert _int32(fm.tgid) and _int32(fm.tid)
                for t in (fm.ts_ns, fm.call_ts_ns, fm.ret_ts_ns, fm.first_ret_ts_ns):
                    assert _time(t), t
                if fm.meta is not None:
                    for name in ("app_id", "customer_id", "timestamp", "sender", "recver", "control_cmd"):
                        assert _int32(getattr(fm.meta, name)), (name, getattr(fm.meta, name))
    else:
        for ev in _decoded(NetstackEvent.decode, body):
            for name, _ in ev._fields_:
                v = getattr(ev, name)
                if name.endswith("_ns"):
                    assert _time(v), (name, v)
                elif name in ("tgid", "tid"):
                    assert _int32(v), (name, v)
