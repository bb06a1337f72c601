"""Fuzz target: one direction of a ps-lite/ZMTP stream, in any chunking, with gaps.

The first two bytes choose how the rest is fed: byte 0's low bit starts the parser
mid-stream, its other bits pick the chunk size (1-128 bytes, or whole; at least a
64th of the input); byte 1 says
every how many chunks a gap of a few bytes is announced (0: never). After close()
every byte must be accounted for exactly once (ParserStats' invariant)."""
from __future__ import annotations

from pathlib import Path

from parsers.pslite.encode import MessageSpec, encode_stream
from parsers.pslite.parser import PsliteStreamParser

KIND = "parser"
READS_MAX = 64
# a few messages an input (a meta, keys and values are tens to hundreds of bytes): what
# kept 1M inputs within reach (~0.5 ms an input of 500 bytes uninstrumented)
MAX_LEN = 512
_DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "pslite"


def seeds() -> list[bytes]:
    out = []
    for name in ("psbench.streams.bin", "mxnet.w2s.dealer.bin", "mxnet.s2w.dealer.bin",
                 "pslite.w2s.router.bin"):
        raw = (_DATA / name).read_bytes()
        # short inputs: a few messages each, so the fuzzer runs thousands a second
        out += [b"\x00\x00" + raw[:510], b"\x21\x00" + raw[:300], b"\x03\x07" + raw[1000:1510]]
    # BytePS's RawMeta both ways: a worker's push into a server's ROUTER, and the
    # server's answers behind its sender-id frame (packed as its PackMeta packs them)
    push = MessageSpec(request=True, push=True, head=1, timestamp=1, keys=[5 << 16], vals=bytes(32), lens=[32])
    answer = MessageSpec(request=False, push=True, head=1, timestamp=1)
    w2s = encode_stream([push.raw_frames()] * 4, identity=b"ps9")[0]
    s2w = encode_stream([answer.raw_frames(routing_id=b"ps8")] * 5, identity=None, socket_type=b"ROUTER")[0]
    out += [b"\x00\x00" + w2s[:510], b"\x03\x05" + w2s[100:510], b"\x00\x00" + s2w[:510], b"\x21\x00" + s2w[60:400]]
    return out


def one_input(data: bytes) -> None:
    if len(data) < 2:
        return
    mode, gaps, body = data[0], data[1], memoryview(data[2:])
    # at most READS_MAX reads an input: 1-byte reads of 2 KiB cost ~5 ms under atheris
    # (25 inputs/s on the shared machine); tiny reads are still fuzzed on short inputs
    chunk = max(((mode >> 1) % 129) or len(body) or 1, len(body) // READS_MAX)
    p = PsliteStreamParser(mid_stream=bool(mode & 1))
    msgs = 0
    for i, at in enumerate(range(0, len(body), chunk)):
        msgs += len(p.feed(body[at:at + chunk]))
        if gaps and i % gaps == gaps - 1:
            msgs += len(p.gap(1 + i % 7))
    msgs += len(p.close())
    s = p.stats()
    assert s.fed_bytes + s.gap_bytes == (s.message_bytes + s.handshake_bytes + s.unparsed_bytes
                                         + s.lost_bytes + s.pending_bytes), s
    assert s.messages == msgs, (s.messages, msgs)
