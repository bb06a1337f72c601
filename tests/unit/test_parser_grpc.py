"""parsers/grpc on crafted HTTP/2 streams: frames and HPACK encoded by the `hpack`
library's encoder (independent of the decoder under test), any chunking, a late join
with unknown HPACK entries, interleaved streams, messages split across DATA frames,
RST_STREAM/GOAWAY, garbage."""
from __future__ import annotations

import random

from parsers import registry
from parsers.grpc import GrpcStreamParser
from parsers.grpc import encode as E

PATH = "/tensorflow.WorkerService/RecvTensor"


def _conn(n: int = 10, interleave: bool = False):
    """(client bytes, server bytes, the sizes of the request and response messages)."""
    c, s = E.Side(True), E.Side(False)
    req, resp = [], []
    sids = [2 * i + 1 for i in range(n)]
    for sid in sids:
        c.headers(sid, E.request_headers(PATH if sid % 4 == 1 else "/tensorflow.eager.EagerService/Enqueue"))
    for i, sid in enumerate(sids):
        body = bytes([i]) * (100 * i)
        c.data(sid, E.grpc_message(body), end_stream=True, frame_bytes=37)
        req.append((sid, 5 + len(body)))
        if not interleave:
            s.headers(sid, E.RESPONSE_HEADERS)
            for b in (b"y" * (300 * i), b"z" * 5):
                s.data(sid, E.grpc_message(b), frame_bytes=50)
                resp.append((sid, 5 + len(b)))
            s.headers(sid, [("grpc-status", "0")], end_stream=True)
    if interleave:   # every stream's responses cut into frames that alternate between streams
        for sid in sids:
            s.headers(sid, E.RESPONSE_HEADERS)
        parts = {sid: E.grpc_message(b"r" * (70 * sid)) for sid in sids}
        resp = [(sid, len(parts[sid])) for sid in sids]
        while parts:
            for sid in list(parts):
                s.data(sid, parts[sid][:23])
                parts[sid] = parts[sid][23:]
                if not parts[sid]:
                    del parts[sid]
        for sid in sids:
            s.headers(sid, [("grpc-status", "0")], end_stream=True)
    return bytes(c.out), bytes(s.out), req, resp


def _run(p, data: bytes, rng: random.Random | None = None) -> list:
    out, i = [], 0
    while i < len(data):
        k = rng.randint(1, 200) if rng else len(data)
        out += p.feed(data[i:i + k])
        i += k
    return out + p.close()


def _ok(st) -> bool:
    return st.fed_bytes + st.gap_bytes == (st.message_bytes + st.handshake_bytes + st.unparsed_bytes
                                           + st.lost_bytes + st.pending_bytes)


def test_from_the_start_any_chunking_gives_every_message():
    cli, srv, req, resp = _conn()
    for seed in (None, 1, 2):
        rng = random.Random(seed) if seed else None
        p = GrpcStreamParser()
        got = _run(p, cli, rng)
        assert [(m.stream_id, m.grpc_bytes) for m in got] == req
        assert all(m.request and m.op == "rpc" and m.path for m in got)
        assert {m.path for m in got} == {PATH, "/tensorflow.eager.EagerService/Enqueue"}
        assert _ok(p.stats()) and p.stats().pending_bytes == 0
        q = GrpcStreamParser()
        got = _run(q, srv, rng)
        data = [m for m in got if not m.control]
        assert [(m.stream_id, m.grpc_bytes) for m in data] == resp
        assert all(m.request is False for m in data)
        trailers = [m for m in got if m.control]
        assert len(trailers) == 10 and all(m.grpc_status == 0 for m in trailers)
        assert _ok(q.stats())


def test_interleaved_streams_pair_by_stream_id():
    _, srv, _, resp = _conn(6, interleave=True)
    got = [m for m in _run(GrpcStreamParser(), srv, random.Random(3)) if not m.control]
    assert sorted((m.stream_id, m.grpc_bytes) for m in got) == sorted(resp)
    assert len({m.last_byte_offset for m in got}) == len(got)


def _sequential(n: int):
    """A client's bytes whose streams go one after the other (HEADERS, then DATA): a
    parser that joined late or lost bytes sees the later streams' HEADERS."""
    c, req = E.Side(True), []
    for i in range(n):
        sid = 2 * i + 1
        c.headers(sid, E.request_headers(PATH))
        c.data(sid, E.grpc_message(b"q" * (40 * i)), end_stream=True, frame_bytes=64)
        req.append((sid, 5 + 40 * i))
    return bytes(c.out), req


def test_a_late_join_resyncs_and_counts_unknown_hpack_entries():
    cli, req = _sequential(20)
    cut = len(cli) // 2
    p = GrpcStreamParser(mid_stream=True, start_offset=cut)
    got = _run(p, cli[cut:], random.Random(4))
    assert got and p.stats().resyncs == 1 and _ok(p.stats())
    assert set((m.stream_id, m.grpc_bytes) for m in got) <= set(req)
    # the paths were indexed before the join: named by index only, unknown, counted
    assert all(m.path is None for m in got) and p.counters()["hpack_unknown_refs"] > 0
    assert all(m.detail().get("method_unknown") for m in got)


def test_rst_stream_and_goaway_are_counted():
    c = E.Side(True)
    c.headers(1, E.request_headers(PATH))
    c.rst(1)
    c.goaway(1)
    p = GrpcStreamParser()
    assert _run(p, bytes(c.out)) == []
    assert p.counters()["rst_streams"] == 1 and p.counters()["goaways"] == 1 and _ok(p.stats())


def test_garbage_is_counted_never_raises():
    rng = random.Random(5)
    cli, _, req, _ = _conn(10)
    junk = bytes(rng.getrandbits(8) for _ in range(5000))
    for data, mid in ((junk, True), (junk, False), (cli[:300] + junk + cli[300:], False)):
        p = GrpcStreamParser(mid_stream=mid)
        _run(p, data, rng)
        st = p.stats()
        assert _ok(st) and st.unparsed_bytes > 0
    cli, _ = _sequential(20)
    p = GrpcStreamParser()
    p.feed(cli[:400])
    p.gap(100)
    got = _run(p, cli[500:], rng)
    assert _ok(p.stats()) and p.stats().lost_bytes == 100 and len(got) >= 3


def test_registered_and_detected_from_the_preface():
    cli, srv, _, _ = _conn(1)
    assert registry.parser_class("grpc") is GrpcStreamParser
    assert registry.detect(cli[:16]) == "grpc" and registry.detect(srv[:16]) == "grpc"


def test_the_op_is_pull_or_push_where_the_method_says_so():
    c = E.Side(True)
    paths = ["/pslat.ps.PS/Pull", "/ps.Sparse/PushGradients", "/tensorflow.WorkerService/RecvTensor", "/x.Y/pull"]
    for i, path in enumerate(paths):
        c.headers(2 * i + 1, E.request_headers(path))
        c.data(2 * i + 1, E.grpc_message(b"k" * 12), end_stream=True)
    got = _run(GrpcStreamParser(), bytes(c.out))
    assert [(m.op_name, m.op) for m in got] == list(zip(paths, ["pull", "push", "rpc", "pull"]))
    s = E.Side(False)
    s.headers(1, E.RESPONSE_HEADERS)
    s.data(1, E.grpc_message(b"v" * 40))
    assert [m.op for m in _run(GrpcStreamParser(), bytes(s.out))] == [None]   # a response's op is its request's
