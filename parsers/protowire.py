"""Protobuf's wire format, read by hand where the protobuf library cannot go: a
field at a time in bytes cut by a capture (ps-lite's PBMeta frames, the first 64
bytes each) or inside a message too large to decode whole (Paddle's requests)."""
from __future__ import annotations


def varint(buf, i: int, end: int) -> tuple[int, int] | None:
    """(value, next index) of the varint at buf[i] (read no further than end), or None
    if it is cut or longer than protobuf's 10 bytes."""
    value = shift = 0
    while i < end and shift < 70:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7
    return None
