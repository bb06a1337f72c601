"""parsers.sniff and parsers.registry: a stream's protocol from its first bytes, or
by hunting with every registered parser when joined mid-stream; the interface of
parsers/protocol.py held by every registered protocol's messages."""
from __future__ import annotations

import random

import pytest

from parsers import registry
from parsers.brpc import BrpcStreamParser
from parsers.brpc import encode as benc
from parsers.grpc import encode as genc
from parsers.protocol import DATA_OPS, OPS, PAIR_SCOPES, UNRECOGNISED
from parsers.pslite import PsliteStreamParser
from parsers.pslite import encode as penc
from parsers.sniff import HUNT_BYTES_MAX, OpaqueStream, SniffingParser


def _pslite_stream(n: int = 30) -> bytes:
    msgs = [penc.MessageSpec(request=i % 2 == 0, push=i % 4 == 0, timestamp=i, keys=[i, i + 7], vals=b"\0" * 16)
            for i in range(n)]
    return penc.encode_stream(msgs)[0]


def _brpc_stream(n: int = 30) -> bytes:
    specs = []
    for i in range(n):
        specs.append(benc.pull_sparse(3, list(range(i, i + 5)), correlation_id=i + 1))
        specs.append(benc.response(i + 1, data=b"\1" * 40))
    return benc.encode_stream(specs)[0]


def _grpc_stream(n: int = 30) -> bytes:
    c = genc.Side(True)
    for i in range(n):
        sid = 2 * i + 1
        c.headers(sid, genc.request_headers("/pslat.ps.PS/Pull"))
        c.data(sid, genc.grpc_message(bytes([i]) * (40 + i)), end_stream=True)
    return bytes(c.out)


STREAMS = {"pslite": _pslite_stream, "brpc": _brpc_stream, "grpc": _grpc_stream}


def _run(parser, data: bytes, rng: random.Random | None = None) -> list:
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 300) if rng else len(data)
        out += parser.feed(data[i:i + n])
        i += n
    return out + parser.close()


def _ident(m) -> tuple:
    return (m.protocol, m.first_byte_offset, m.last_byte_offset, m.request, m.op, m.call_id, m.num_keys)


def _identity_holds(s) -> bool:
    return s.fed_bytes + s.gap_bytes == (s.message_bytes + s.handshake_bytes + s.unparsed_bytes
                                         + s.lost_bytes + s.pending_bytes)


def test_detect_from_first_bytes():
    assert registry.detect(b"") is None
    assert registry.detect(b"PR") is None
    assert registry.detect(b"PRPC\0\0") == "brpc"
    assert registry.detect(_pslite_stream(1)[:11]) == "pslite"
    assert registry.detect(b"\xff" + b"\0" * 8) is None          # a ZMTP greeting, not yet decided
    assert registry.detect(b"GET / HTTP/1.1\r\n") == UNRECOGNISED
    assert registry.detect(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") == "grpc"


@pytest.mark.parametrize("name", sorted(STREAMS))
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_from_the_start_the_first_bytes_choose(name, seed):
    data = STREAMS[name]()
    want = [_ident(m) for m in _run(registry.parser_class(name)(), data)]
    p = SniffingParser()
    got = [_ident(m) for m in _run(p, data, random.Random(seed))]
    assert got == want and len(want) >= 30
    assert p.verdict == name and p.recognised() and _identity_holds(p.stats())


@pytest.mark.parametrize("name", sorted(STREAMS))
@pytest.mark.parametrize("seed", [4, 5, 6])
def test_mid_stream_the_hunters_choose(name, seed):
    rng = random.Random(seed)
    data = STREAMS[name](60)
    cut = rng.randint(1, len(data) // 3)
    direct = [_ident(m) for m in _run(registry.parser_class(name)(mid_stream=True, start_offset=cut), data[cut:])]
    p = SniffingParser(mid_stream=True, start_offset=cut)
    got = [_ident(m) for m in _run(p, data[cut:], rng)]
    assert p.verdict == name
    # the sniffer may choose a chunk later than a parser fed all at once confirms its chain
    assert got and set(got) <= set(direct) and len(got) >= len(direct) - 2
    assert _identity_holds(p.stats())


def test_an_unknown_stream_is_opaque_and_counted():
    data = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 100
    p = SniffingParser()
    assert _run(p, data, random.Random(7)) == []
    assert p.verdict == UNRECOGNISED and isinstance(p.chosen, OpaqueStream) and not p.recognised()
    s = p.stats()
    assert s.fed_bytes == len(data) and s.unparsed_bytes == len(data) and _identity_holds(s)


def test_a_gap_before_the_first_bytes_decide_starts_a_hunt():
    data = _brpc_stream(10)
    p = SniffingParser()
    assert p.feed(data[:2]) == []
    p.gap(5)
    got = _run(p, data[7:], random.Random(8))
    assert p.verdict == "brpc" and len(got) >= 17


def test_mid_stream_garbage_gives_up_hunting_after_a_bound():
    rng = random.Random(9)
    p = SniffingParser(mid_stream=True, start_offset=1000)
    chunk = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    fed = 0
    while p.verdict is None and fed < 2 * HUNT_BYTES_MAX:
        p.feed(chunk)
        fed += len(chunk)
    assert p.verdict == UNRECOGNISED and fed <= HUNT_BYTES_MAX + len(chunk)
    p.feed(b"more")
    s = p.stats()
    assert s.fed_bytes == fed + 4 and _identity_holds(s)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_every_protocol_gives_the_interface(name):
    cls = registry.parser_class(name)
    assert cls.PROTOCOL == name and cls.starts_stream(STREAMS[name]()[:16]) is True
    msgs = _run(cls(), STREAMS[name]())
    for m in msgs:
        assert m.protocol == name and m.pair_scope in PAIR_SCOPES
        assert (m.op or "unknown") in OPS and isinstance(m.control, bool)
        assert m.request in (True, False, None)
        assert m.total_bytes == m.end_offset - m.first_byte_offset > 0
        assert m.call_id is None or isinstance(m.call_id, int)
        assert m.call_space is None or -(1 << 63) <= m.call_space < 1 << 63
        assert isinstance(m.detail(), dict) and all(isinstance(k, str) for k in m.detail())
        assert list(m.key_sample) == sorted(m.key_sample) and isinstance(m.nodes, tuple)
    assert any(m.request for m in msgs) and any((m.op in DATA_OPS) for m in msgs)
    p = cls()
    data = STREAMS[name]()
    p.feed(data[:len(data) // 2])
    sync = p.next_sync()
    assert sync is None or sync[0] <= len(data) // 2


def test_a_chain_through_a_data_frame_longer_than_the_hunt_bound_is_followed(monkeypatch):
    """Joined in the middle of a ps-lite stream whose next message carries more than
    HUNT_BYTES_MAX of values: the hunter following it keeps the stream from being
    given up as opaque."""
    import parsers.sniff as sniff

    monkeypatch.setattr(sniff, "HUNT_BYTES_MAX", 1 << 20)
    big = penc.MessageSpec(request=True, push=True, timestamp=7, keys=list(range(4)), vals=b"\1" * (3 << 20))
    small = [penc.MessageSpec(request=True, push=True, timestamp=8 + i, keys=[i], vals=b"\0" * 8) for i in range(3)]
    data = penc.encode_stream([penc.MessageSpec(timestamp=6, keys=[1], vals=b"\0" * 8), big, *small])[0]
    cut = 120   # inside the first message: the hunt starts before the big one's meta
    p = SniffingParser(mid_stream=True, start_offset=cut)
    got = _run(p, data[cut:], random.Random(10))
    assert p.verdict == "pslite" and [m.call_id for m in got][-4:] == [7, 8, 9, 10]


def test_forced_protocols_are_checked():
    assert registry.parse_forced(["8500=brpc", "9000=pslite"]) == {8500: "brpc", 9000: "pslite"}
    for bad in ["8500", "x=brpc", "0=brpc", "70000=brpc", "8500=thrift"]:
        with pytest.raises(ValueError):
            registry.parse_forced([bad])
    with pytest.raises(ValueError):
        registry.parse_forced(["1=brpc", "1=pslite"])


def test_a_brpc_stream_is_not_taken_for_pslite_or_back():
    assert BrpcStreamParser.starts_stream(_pslite_stream(1)[:16]) is False
    assert PsliteStreamParser.starts_stream(_brpc_stream(1)[:16]) is False
