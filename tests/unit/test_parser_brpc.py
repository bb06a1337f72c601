"""The brpc (baidu_std) stream parser: fields, Paddle's table ops, pairing, any chunking,
mid-stream starts, garbage, gaps, the magic inside attachments, bounded buffering and
hostile input; on streams built by parsers.brpc.encode."""
from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers.brpc import PAIRING_SCOPE, BrpcStreamParser
from parsers.brpc import encode as enc
from parsers.brpc.paddle import CMD_IDS, CMDS, PS_SERVICE, read_request_head
from parsers.brpc.parser import KEYS_SKIPPED
from parsers.brpc.rpcmeta import MAGIC, TEXT_MAX_CHARS, RpcMeta
from parsers.keysample import sample_keys

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def identity_holds(p: BrpcStreamParser) -> bool:
    s = p.stats()
    return s.fed_bytes + s.gap_bytes == (s.message_bytes + s.handshake_bytes + s.unparsed_bytes
                                         + s.lost_bytes + s.pending_bytes)


def parse(data: bytes, chunk: int | None = None, **kw) -> tuple[list, BrpcStreamParser]:
    p = BrpcStreamParser(**kw)
    out = []
    step = chunk or len(data) or 1
    for i in range(0, len(data), step):
        out += p.feed(data[i:i + step])
        assert identity_holds(p)
    out += p.close()
    assert identity_holds(p) and p.stats().pending_bytes == 0
    return out, p


# ---------------------------------------------------------------- fields
def test_request_and_response_round_trip_every_field():
    req = enc.RpcSpec(correlation_id=2**62 + 5, service_name="echo.EchoService",
                      method_name="Echo", log_id=-7, trace_id=11, span_id=12, parent_span_id=13,
                      request_id="r-1", timeout_ms=500, compress_type=0, payload=b"\x0a\x02hi",
                      attachment=b"PRPC" + bytes(60), meta_extra=b"\x3a\x03abc")  # field 7: unknown
    resp = enc.RpcSpec(request=False, correlation_id=2**62 + 5, error_code=1003,
                       error_text="E" * 1000, compress_type=2, payload=b"\x01\x02\x03",
                       attachment=b"\xff" * 9)
    data, spans = enc.encode_stream([req, resp])
    msgs, p = parse(data)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in msgs] == spans
    q, r = msgs
    assert q.request and not r.request
    assert q.end_offset == spans[0][1] + 1 == r.first_byte_offset
    assert q.total_bytes == spans[0][1] + 1
    assert (q.correlation_id, q.service_name, q.method_name, q.log_id) == (
        2**62 + 5, "echo.EchoService", "Echo", -7)
    meta_len = len(req.meta().SerializeToString()) + 5
    assert (q.meta_bytes, q.payload_bytes, q.attachment_bytes) == (meta_len, 4, 64)
    assert q.op == "rpc" and q.cmd_id is None and q.protocol == "brpc"
    assert q.error_code is None and q.compress_type == 0
    assert r.correlation_id == q.correlation_id and r.error_code == 1003
    assert r.error_text == "E" * TEXT_MAX_CHARS   # bounded
    assert (r.compress_type, r.payload_bytes, r.attachment_bytes) == (2, 3, 9)
    assert r.op is None and r.ps_err_code is None   # compressed: not read
    s = p.stats()
    assert (s.messages, s.message_bytes, s.unparsed_bytes, s.resyncs, s.desyncs) == (
        2, len(data), 0, 0, 0)
    assert PAIRING_SCOPE == "connection"


# ---------------------------------------------------------------- Paddle
TABLE_KEYS = [2**64 - 1, 3, 7, 10**12] + list(range(1000, 1100))


def test_paddle_cmd_ids_are_those_of_3_0_0():
    assert len(CMDS) == 52 and max(CMDS) == 201
    assert (CMD_IDS["PS_PULL_DENSE_TABLE"], CMD_IDS["PS_PUSH_DENSE_TABLE"],
            CMD_IDS["PS_PULL_SPARSE_TABLE"], CMD_IDS["PS_PUSH_SPARSE_TABLE"]) == (0, 1, 2, 3)
    assert (CMD_IDS["PS_BARRIER"], CMD_IDS["PS_CHECK_SAVE_PRE_PATCH_DONE"],
            CMD_IDS["PS_S2S_MSG"]) == (25, 48, 101)
    assert {op for _, op in CMDS.values()} == {"pull", "push", "control", "rpc"}


def test_paddle_table_ops_and_responses_paired_by_correlation_id():
    requests = [enc.pull_sparse(3, TABLE_KEYS, correlation_id=101, log_id=1712345678901),
                enc.push_sparse(4, TABLE_KEYS[:40], value_bytes=36, correlation_id=102),
                enc.pull_dense(1, 1000, correlation_id=103),
                enc.push_dense(2, 250, correlation_id=104),
                enc.control("PS_BARRIER", params=[b"0"], correlation_id=105)]
    # a pooled channel answers in any order
    responses = [enc.response(104), enc.response(101, attachment=bytes(12 * len(TABLE_KEYS))),
                 enc.response(103, err_code=-1, err_msg="pull dense failed",
                              attachment=bytes(4000)),
                 enc.response(105), enc.response(102)]
    sent, _ = enc.encode_stream(requests)
    answered, _ = enc.encode_stream(responses)
    reqs, _ = parse(sent, chunk=97)
    resps, _ = parse(answered, chunk=13)
    by_id = {m.correlation_id: m for m in reqs}
    pairs = {r.correlation_id: (by_id[r.correlation_id], r) for r in resps}
    assert sorted(pairs) == [101, 102, 103, 104, 105]
    got = {cid: (q.op, q.cmd_name, q.cmd_id, q.table_id, q.num_keys, q.key_sample, q.keys_reason,
                 q.dense_values, r.ps_err_code)
           for cid, (q, r) in pairs.items()}
    assert got == {
        101: ("pull", "PS_PULL_SPARSE_TABLE", 2, 3, len(TABLE_KEYS), sample_keys(TABLE_KEYS, 16),
              None, None, 0),
        102: ("push", "PS_PUSH_SPARSE_TABLE", 3, 4, 40, sample_keys(TABLE_KEYS[:40], 16), None,
              None, 0),
        103: ("pull", "PS_PULL_DENSE_TABLE", 0, 1, 0, (), None, 1000, -1),
        104: ("push", "PS_PUSH_DENSE_TABLE", 1, 2, 0, (), None, 250, 0),
        105: ("control", "PS_BARRIER", 25, 0, 0, (), None, None, 0),
    }
    assert pairs[103][1].ps_err_msg == "pull dense failed"
    assert all(q.service_name == PS_SERVICE and q.method_name == "service" for q in reqs)
    assert reqs[0].log_id == 1712345678901


def test_paddle_keys_said_where_they_cannot_be_read():
    compressed = enc.push_sparse(4, TABLE_KEYS, correlation_id=1, compress_type=1)
    compressed.payload = b"\x00snappy bytes"   # what brpc sends is compressed whole
    bad_attachment = enc.pull_sparse(3, TABLE_KEYS, correlation_id=2)
    bad_attachment.attachment += b"\x00"
    unknown_cmd = enc.RpcSpec(correlation_id=3, payload=enc.ps_request(77, 9))
    geo = enc.control("PS_PULL_GRAPH_LIST", table_id=5, correlation_id=4)
    msgs, _ = parse(enc.encode_stream([compressed, bad_attachment, unknown_cmd, geo])[0])
    c, a, u, g = msgs
    assert (c.op, c.cmd_id, c.num_keys, c.keys_reason) == (None, None, None,
                                                           "payload compressed (snappy)")
    assert a.cmd_name == "PS_PULL_SPARSE_TABLE" and a.num_keys is None and a.key_sample == ()
    assert a.keys_reason == "attachment of %d bytes, not 1 + 12 x %d keys" % (
        12 * len(TABLE_KEYS) + 2, len(TABLE_KEYS))
    assert (u.op, u.cmd_id, u.cmd_name, u.table_id) == ("rpc", 77, None, 9)
    assert (g.op, g.num_keys, g.keys_reason) == ("pull", None,
                                                 "key layout of PS_PULL_GRAPH_LIST not read")


def test_push_sparse_keys_past_the_payload_prefix_and_a_gap_among_them():
    keys = list(range(5000))   # 40 KB of keys: most pass after the 1 KiB prefix
    data, _ = enc.encode_stream([enc.push_sparse(4, keys, value_bytes=8)])
    (m,), _ = parse(data, chunk=1500)
    assert (m.num_keys, m.key_sample, m.key_sample_complete) == (5000, sample_keys(keys, 16), True)
    p = BrpcStreamParser()
    head = 2000   # inside the keys
    out = p.feed(data[:head]) + p.gap(800) + p.feed(data[head + 800:]) + p.close()
    (g,) = out
    assert (g.num_keys, g.key_sample_complete, g.lost_bytes) == (5000, False, 800)
    assert set(g.key_sample) <= set(keys) and len(g.key_sample) == 16
    assert p.stats().message_bytes == len(data) and identity_holds(p)


def walker_view(data: bytes, spans, copy_after_meta: int = 64) -> list:
    """The stream as the kernel's brpc framing hands it over: each header, its meta
    and copy_after_meta payload bytes as bytes, the rest of each body as a skip."""
    out = []
    for first, last in spans:
        body, meta = struct.unpack_from(">II", data, first + 4)
        k = 12 + min(body, meta + copy_after_meta)
        out.append(data[first:first + k])
        if last + 1 - first > k:
            out.append(last + 1 - first - k)
    return out


def test_skipped_body_bytes_are_known_not_lost_and_keys_in_them_unsampled():
    few, many = [5, 9], list(range(1000, 1300))
    specs = [enc.pull_sparse(3, few, correlation_id=1), enc.pull_sparse(3, many, correlation_id=2),
             enc.push_sparse(4, many, correlation_id=3), enc.push_dense(0, 50, correlation_id=4),
             enc.response(2, attachment=b"v" * 2400)]
    data, spans = enc.encode_stream(specs)
    p = BrpcStreamParser()
    out = []
    for x in walker_view(data, spans):
        out += p.feed(x) if isinstance(x, bytes) else p.skip(x)
        assert identity_holds(p)
    out += p.close()
    a, b, c, d, r = out
    # ids, commands, tables and key counts from the copied prefix; nothing lost
    assert [(m.correlation_id, m.table_id, m.num_keys, m.lost_bytes) for m in out] == [
        (1, 3, 2, 0), (2, 3, 300, 0), (3, 4, 300, 0), (4, 0, 0, 0), (2, None, None, 0)]
    assert (a.key_sample, a.key_sample_complete, a.keys_reason) == ((5, 9), True, None)
    for m in (b, c):   # the keys were skipped: no sample of the first ones, and said why
        assert (m.key_sample, m.key_sample_complete, m.keys_reason) == ((), False, KEYS_SKIPPED)
    assert (d.dense_values, r.request, r.ps_err_code, r.attachment_bytes) == (50, False, 0, 2400)
    s = p.stats()
    assert (s.message_bytes, s.unparsed_bytes, s.lost_bytes) == (len(data), 0, 0)
    # keys given after a skip among them are not sampled either
    first, last = spans[1]
    k = len(walker_view(data, [spans[1]])[0])
    p = BrpcStreamParser(start_offset=first)
    (m,) = p.feed(data[first:first + k]) + p.skip(100) + p.feed(data[first + k + 100:last + 1])
    assert (m.num_keys, m.key_sample, m.keys_reason) == (300, (), KEYS_SKIPPED)
    # outside a body a skip is a gap: the stream breaks there, the next header resyncs
    p = BrpcStreamParser()
    out = p.feed(data[:spans[1][0]]) + p.skip(10) + p.feed(data[spans[1][0] + 10:]) + p.close()
    assert [m.correlation_id for m in out] == [1, 3, 4, 2]
    assert identity_holds(p) and p.stats().lost_bytes == 10


def test_request_head_walks_a_prefix_like_protobuf_reads_the_whole():
    payload = enc.ps_request(3, 7, [b"\x05\x00\x00\x00", b"x" * 300], -2, b"\x01" * 5000)
    head = read_request_head(payload[:400], len(payload))
    assert (head.cmd_id, head.table_id, head.client_id, head.data_bytes) == (3, 7, -2, 5000)
    assert head.params == (b"\x05\x00\x00\x00", b"x" * 8)
    assert payload[head.data_at:head.data_at + 5000] == b"\x01" * 5000
    assert read_request_head(payload[:3], len(payload)).reason == "payload prefix cut inside a field"


# ---------------------------------------------------------------- streams
@st.composite
def rpc_specs(draw, cid):
    kind = draw(st.integers(0, 5))
    if kind == 0:
        keys = draw(st.lists(st.integers(0, 2**64 - 1), max_size=40))
        return enc.pull_sparse(draw(st.integers(0, 9)), keys, correlation_id=cid)
    if kind == 1:
        keys = draw(st.lists(st.integers(0, 2**64 - 1), max_size=40))
        return enc.push_sparse(draw(st.integers(0, 9)), keys, correlation_id=cid)
    if kind == 2:
        return enc.pull_dense(draw(st.integers(0, 9)), draw(st.integers(0, 5000)), correlation_id=cid)
    # other services and responses, with the magic (and whole headers) in attachments
    att = draw(st.sampled_from([b"", b"PRPC", b"xxPRPC\x00\x00\x00\x10\x00\x00\x00\x04abcd",
                                enc.message_bytes(enc.pull_dense(1, 2, correlation_id=cid))
                                + b"tail"]))
    att += draw(st.binary(max_size=40))
    if kind == 3:
        return enc.RpcSpec(correlation_id=cid, service_name="s.S", method_name="m",
                           payload=draw(st.binary(max_size=60)), attachment=att)
    return enc.response(cid, err_code=draw(st.integers(-3, 3)), attachment=att)


GARBAGE = st.one_of(st.binary(min_size=1, max_size=40),
                    st.builds(lambda a, b: a + MAGIC + b, st.binary(max_size=8),
                              st.binary(max_size=30)))


@st.composite
def streams(draw):
    """(bytes, [(span, fields)], [follows a break: garbage before it]) of real messages."""
    n = draw(st.integers(1, 8))
    parts, real, after_garbage = [], [], []
    pos = 0
    for i in range(n):
        garbage = draw(st.one_of(st.just(b""), GARBAGE)) if i else b""
        parts.append(garbage)
        pos += len(garbage)
        spec = draw(rpc_specs(cid=100 + i))
        b = enc.message_bytes(spec)
        parts.append(b)
        real.append((pos, pos + len(b) - 1))
        after_garbage.append(bool(garbage))
        pos += len(b)
    return b"".join(parts), real, after_garbage


def fields(m):
    return (m.first_byte_offset, m.last_byte_offset, m.request, m.correlation_id, m.op,
            m.cmd_id, m.table_id, m.num_keys, m.key_sample, m.dense_values, m.attachment_bytes)


@SETTINGS
@given(streams(), st.data())
def test_any_chunking_mid_stream_start_and_garbage(stream, data):
    raw, spans, after_garbage = stream
    reference, _ = parse(b"".join(raw[a:b + 1] for a, b in spans))   # the same messages, clean
    by_index = {i: fields(m) for i, m in enumerate(reference)}
    start = data.draw(st.integers(0, len(raw) - 1)) if data.draw(st.booleans()) else 0
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=12)))
    p = BrpcStreamParser(mid_stream=start > 0, start_offset=start)
    out, last = [], start
    for c in [c for c in cuts if c > start] + [len(raw)]:
        out += p.feed(raw[last:c])
        assert identity_holds(p)
        last = c
    out += p.close()
    assert identity_holds(p) and p.stats().pending_bytes == 0
    assert p.stats().messages == len(out)
    # what is found is real, with the same fields as in a clean stream
    index_at = {a: i for i, (a, _) in enumerate(spans)}
    for m in out:
        i = index_at[m.first_byte_offset]
        shift = m.first_byte_offset - reference[i].first_byte_offset
        want = by_index[i]
        assert fields(m) == (want[0] + shift, want[1] + shift) + want[2:]
    # and every message is found that the stream lets be told apart: any in sync;
    # one found by hunting (first after the start or after garbage) when the next
    # header or the end follows it
    found = {m.first_byte_offset for m in out}
    first = min((i for i, (a, _) in enumerate(spans) if a >= start), default=len(spans))
    for i in range(first, len(spans)):
        hunted = after_garbage[i] or (i == first and start > 0)
        confirmable = i + 1 == len(spans) or not after_garbage[i + 1]
        if not hunted or confirmable:
            assert spans[i][0] in found, (i, spans, after_garbage, start)


@SETTINGS
@given(streams(), st.data())
def test_a_gap_anywhere(stream, data):
    raw, spans, after_garbage = stream
    raw = b"".join(raw[a:b + 1] for a, b in spans)   # no garbage: the gap is the break
    ref, _ = parse(raw)
    at = data.draw(st.integers(0, len(raw) - 1))
    n = data.draw(st.integers(1, len(raw) - at))
    chunk = data.draw(st.integers(1, 64))
    p = BrpcStreamParser()
    out = []
    for part_from, part_to in ((0, at), (at + n, len(raw))):
        for i in range(part_from, part_to, chunk):
            out += p.feed(raw[i:min(i + chunk, part_to)])
            assert identity_holds(p)
        if part_from == 0:
            out += p.gap(n)
            assert identity_holds(p)
    out += p.close()
    s = p.stats()
    assert identity_holds(p) and s.pending_bytes == 0 and s.gap_bytes == n
    found = {m.first_byte_offset: m for m in out}
    ends = {m.first_byte_offset: m.last_byte_offset for m in ref}
    assert all(ends.get(a) == m.last_byte_offset for a, m in found.items())
    for m in ref:
        if m.last_byte_offset < at or m.first_byte_offset >= at + n:
            assert m.first_byte_offset in found
            assert fields(found[m.first_byte_offset]) == fields(m)
        elif m.first_byte_offset + 12 + m.meta_bytes <= at and at + n <= m.end_offset:
            # the gap began inside its body: it is walked, its keys may be short
            g = found[m.first_byte_offset]
            assert (g.correlation_id, g.last_byte_offset) == (m.correlation_id, m.last_byte_offset)


def test_whole_message_inside_an_attachment_is_not_believed():
    inner = enc.message_bytes(enc.pull_dense(9, 9, correlation_id=999))
    outer = enc.RpcSpec(correlation_id=1, service_name="s.S", method_name="m",
                        attachment=b"head" + inner + b"not a header")
    after = enc.pull_sparse(3, [1, 2, 3], correlation_id=2)
    data, spans = enc.encode_stream([outer, after, enc.response(2)])
    synced, _ = parse(data)
    assert [m.correlation_id for m in synced] == [1, 2, 2]
    # joined inside the outer message, before the inner one: that one is followed,
    # and given up when no header follows it
    join = data.index(inner) - 3
    msgs, p = parse(data[join:], chunk=7, mid_stream=True, start_offset=join)
    assert [m.correlation_id for m in msgs] == [2, 2]
    assert p.stats().resyncs == 1
    assert p.stats().unparsed_bytes == spans[1][0] - join


def test_garbage_in_a_synced_stream_desyncs_and_resyncs():
    a, b = enc.pull_dense(1, 10, correlation_id=1), enc.pull_dense(1, 20, correlation_id=2)
    c = enc.pull_dense(1, 30, correlation_id=3)
    garbage = b"PRPC\x00\x00\x00\x05\x00\x00\x00\x05\x01garbage"   # its meta does not parse
    data, _ = enc.encode_stream([a, garbage, b, c])
    msgs, p = parse(data, chunk=5)
    assert [m.dense_values for m in msgs] == [10, 20, 30]
    s = p.stats()
    assert (s.desyncs, s.resyncs, s.unparsed_bytes) == (1, 1, len(garbage))


def test_unparsed_bytes_break_the_stream():
    data, spans = enc.encode_stream([enc.pull_dense(1, 10, correlation_id=i) for i in range(4)])
    p = BrpcStreamParser()
    cut = spans[1][0] + 5
    out = p.feed(data[:cut]) + p.unparsed(spans[2][0] - cut) + p.feed(data[spans[2][0]:]) + p.close()
    assert [m.correlation_id for m in out] == [0, 2, 3]
    s = p.stats()
    assert identity_holds(p) and s.unparsed_bytes == spans[2][0] - spans[1][0] and s.lost_bytes == 0


# ---------------------------------------------------------------- bounds and hostile input
ATTACHMENT_BYTES = 100 * 2**20


@pytest.mark.parametrize("mid_stream", [False, True])
def test_a_100_mb_attachment_is_walked_not_buffered(mid_stream):
    spec = enc.pull_sparse(3, list(range(100)), correlation_id=7)
    spec.attachment_size = ATTACHMENT_BYTES   # announced; the bytes are fed below
    spec.attachment = b""
    head = enc.message_bytes(spec)
    tail, _ = enc.encode_stream([enc.pull_dense(1, 5, correlation_id=8)])
    block = memoryview(bytes(2**20))
    p = BrpcStreamParser(mid_stream=mid_stream)
    tracemalloc.start()
    try:
        out = p.feed(head)
        for _ in range(ATTACHMENT_BYTES // len(block)):
            out += p.feed(block)
        out += p.feed(tail) + p.close()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * 2**20 if not mid_stream else peak < 2 * 2**20 + p.replay_max_bytes
    assert [m.correlation_id for m in out] == [7, 8]
    big = out[0]
    assert big.attachment_bytes == ATTACHMENT_BYTES
    assert big.num_keys is None and big.keys_reason.startswith("attachment of 104857600 bytes")
    assert p.stats().message_bytes == len(head) + ATTACHMENT_BYTES + len(tail)


def test_huge_sizes_and_broken_metas_are_unparsed():
    good, _ = enc.encode_stream([enc.pull_dense(1, 5, correlation_id=8)])
    hostile = [MAGIC + struct.pack(">II", 2**32 - 1, 2**32 - 1),
               MAGIC + struct.pack(">II", 2**32 - 1, 10) + b"\x0a\xff\xff\xff\xff\x0f",
               MAGIC + struct.pack(">II", 6, 6) + b"\x12\x04\x08",   # truncated protobuf
               MAGIC + struct.pack(">II", 3, 9),   # meta larger than body
               MAGIC + struct.pack(">II", 4, 4) + RpcMeta(correlation_id=1).SerializeToString()]
    for bad in hostile:
        for mid in (False, True):
            msgs, p = parse(bad + good, chunk=3, mid_stream=mid)
            assert [m.correlation_id for m in msgs] == [8], bad
            assert p.stats().unparsed_bytes == len(bad)


@settings(max_examples=150, deadline=None)
@given(st.binary(max_size=600), st.booleans(), st.integers(1, 50))
def test_random_bytes_never_raise(data, mid, chunk):
    msgs, p = parse(MAGIC + data if data[:1] == b"P" else data, chunk=chunk, mid_stream=mid)
    assert p.stats().messages == len(msgs)
