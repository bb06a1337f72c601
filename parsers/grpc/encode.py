"""HTTP/2 + gRPC bytes for tests: frames, HPACK blocks (the `hpack` library's encoder,
an implementation independent of the decoder under test), gRPC messages."""
from __future__ import annotations

import struct

from hpack import Encoder

from .parser import CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS, PREFACE, RST_STREAM, SETTINGS


def frame(t: int, flags: int, sid: int, payload: bytes) -> bytes:
    n = len(payload)
    return struct.pack(">HBBBI", n >> 8, n & 0xFF, t, flags, sid) + payload


def grpc_message(body: bytes, compressed: bool = False) -> bytes:
    return bytes([int(compressed)]) + struct.pack(">I", len(body)) + body


class Side:
    """One direction: an HPACK encoder and its frames."""

    def __init__(self, client: bool):
        self.enc = Encoder()
        self.out = bytearray(PREFACE if client else b"")
        self.out += frame(SETTINGS, 0, 0, b"")

    def headers(self, sid: int, fields, end_stream: bool = False, split: int = 0) -> None:
        block = self.enc.encode(fields)
        fl = END_STREAM if end_stream else 0
        if split and split < len(block):
            self.out += frame(HEADERS, fl, sid, block[:split])
            self.out += frame(CONTINUATION, END_HEADERS, sid, block[split:])
        else:
            self.out += frame(HEADERS, fl | END_HEADERS, sid, block)

    def data(self, sid: int, payload: bytes, end_stream: bool = False, frame_bytes: int = 16384) -> None:
        for i in range(0, max(1, len(payload)), frame_bytes):
            last = i + frame_bytes >= len(payload)
            self.out += frame(DATA, END_STREAM if (end_stream and last) else 0, sid, payload[i:i + frame_bytes])

    def rst(self, sid: int) -> None:
        self.out += frame(RST_STREAM, 0, sid, struct.pack(">I", 8))

    def goaway(self, last_sid: int) -> None:
        self.out += frame(GOAWAY, 0, 0, struct.pack(">II", last_sid, 0))


def request_headers(path: str) -> list:
    return [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "ps0:2222"),
            ("content-type", "application/grpc"), ("te", "trailers")]


RESPONSE_HEADERS = [(":status", "200"), ("content-type", "application/grpc")]
