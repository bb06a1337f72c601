"""Fuzz target: one direction of a brpc (baidu_std) stream, in reads of varying size,
with gaps.

Byte 0's low bit starts the parser mid-stream; byte 1 is a plan: read i takes
1 + (plan x (i + 1) x 37) mod 128 bytes (at least a 64th of the input), and when the
plan's top bit is set every fifth read is followed by a gap of 1-7 bytes. After
close() every byte must be accounted for exactly once (ParserStats' identity). Seeds
are built by parsers.brpc.encode (Paddle's four table ops, a response, another
service, the magic in an attachment)."""
from __future__ import annotations

from parsers.brpc import encode
from parsers.brpc.parser import BrpcStreamParser

KIND = "parser"
READS_MAX = 64
MAX_LEN = 512   # a few messages an input, as for pslite_stream


def seeds() -> list[bytes]:
    raw, _ = encode.encode_stream([
        encode.pull_sparse(3, [1, 5, 2**63], correlation_id=1),
        encode.response(1, attachment=bytes(36)),
        encode.push_sparse(4, [7, 8], value_bytes=8, correlation_id=2),
        encode.pull_dense(1, 100, correlation_id=3),
        encode.push_dense(1, 4, correlation_id=4),
        encode.RpcSpec(correlation_id=5, service_name="s.S", method_name="m", payload=b"x",
                       attachment=b"PRPC" + bytes(8))])
    return [b"\x00\x00" + raw[:510], b"\x01\x21" + raw[:300], b"\x01\x85" + raw[40:550]]


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    mid_stream, plan, body = bool(data[0] & 1), data[1], memoryview(data[2:])
    p = BrpcStreamParser(mid_stream=mid_stream)
    released = at = i = 0
    while at < len(body):
        size = max(1 + plan * (i + 1) * 37 % 128, len(body) // READS_MAX)
        released += len(p.feed(body[at:at + size]))
        at += size
        if plan & 0x80 and i % 5 == 4:
            released += len(p.gap(1 + i % 7))
        i += 1
    released += len(p.close())
    s = p.stats()
    counted = s.message_bytes + s.unparsed_bytes + s.lost_bytes + s.pending_bytes
    assert s.fed_bytes + s.gap_bytes == counted + s.handshake_bytes and not s.pending_bytes, s
    assert s.messages == released, (s.messages, released)
