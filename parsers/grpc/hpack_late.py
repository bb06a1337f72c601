"""HPACK (RFC 7541) header blocks for a decoder that may have joined late.

The `hpack` library's Decoder aborts a whole block on an index it never saw; a
tracer that joined a connection mid-way sees such indices all the time (gRPC indexes
`:path` once per connection). This decoder keeps its own dynamic table in which the
entries inserted before it joined are unknown: a field naming one gives the value
None and is counted, the rest of the block still decodes. The static table and the
Huffman code come from the `hpack` library (its tables, not its decoder).
"""
from __future__ import annotations

from collections import deque

from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

STATIC = HeaderTable.STATIC_TABLE          # 61 (name, value) pairs, index 1..61
STATIC_LEN = len(STATIC)
ENTRY_OVERHEAD = 32                        # RFC 7541 4.1
DEFAULT_TABLE_BYTES = 4096
STRING_MAX_BYTES = 8192                    # a longer name or value: the block is refused


class BlockError(ValueError):
    """A header block that is not HPACK (or too large): the table is now unknown."""


def _int(buf, i: int, prefix_bits: int) -> tuple[int, int]:
    if i >= len(buf):
        raise BlockError("cut integer")
    mask = (1 << prefix_bits) - 1
    v = buf[i] & mask
    i += 1
    if v < mask:
        return v, i
    shift = 0
    while True:
        if i >= len(buf) or shift > 28:
            raise BlockError("bad integer")
        b = buf[i]
        i += 1
        v += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return v, i


def _str(buf, i: int) -> tuple[bytes, int]:
    if i >= len(buf):
        raise BlockError("cut string")
    huff = buf[i] & 0x80
    n, i = _int(buf, i, 7)
    if n > STRING_MAX_BYTES or i + n > len(buf):
        raise BlockError("string too long or cut")
    raw = bytes(buf[i:i + n])
    if huff:
        try:
            raw = decode_huffman(raw)
        except Exception as e:   # the library's own error types: any of them is bad input
            raise BlockError("bad Huffman string") from e
    return raw, i + n


class LateTable:
    """One direction's HPACK decoding context. `complete`: every entry is known (the
    decoder saw the connection from its start and lost nothing)."""

    def __init__(self, complete: bool):
        self.entries: deque = deque()      # newest first: (name, value, size)
        self.known_bytes = 0
        self.max_bytes = DEFAULT_TABLE_BYTES
        self.complete = complete
        self.unknown_refs = 0              # fields that named an entry the decoder never saw

    def lose(self) -> None:
        """Bytes were lost: insertions may have been missed, every index is uncertain."""
        self.entries.clear()
        self.known_bytes = 0
        self.complete = False

    def _get(self, index: int):
        if index == 0:
            raise BlockError("index 0")
        if index <= STATIC_LEN:
            return STATIC[index - 1]
        k = index - STATIC_LEN - 1
        if k < len(self.entries):
            return self.entries[k][:2]
        if self.complete:
            raise BlockError("index past the table")
        self.unknown_refs += 1
        return None

    def _add(self, name: bytes | None, value: bytes, size: int) -> None:
        self.entries.appendleft((name, value, size))
        self.known_bytes += size
        self._evict()

    def _evict(self) -> None:
        while self.entries and self.known_bytes > self.max_bytes:
            self.known_bytes -= self.entries.pop()[2]

    def decode(self, block) -> list[tuple[bytes, bytes | None]]:
        """The fields of one whole header block; a value None where it named an unknown
        entry (a name None likewise: (None, value) or (None, None)). BlockError on bad
        bytes (the table is then lost: lose() was called)."""
        try:
            return self._decode(block)
        except BlockError:
            self.lose()
            raise

    def _decode(self, buf) -> list:
        out, i, n = [], 0, len(buf)
        while i < n:
            b = buf[i]
            if b & 0x80:                         # indexed field
                idx, i = _int(buf, i, 7)
                e = self._get(idx)
                out.append(e if e is not None else (None, None))
            elif b & 0xE0 == 0x20:               # dynamic table size update
                size, i = _int(buf, i, 5)
                if size > 1 << 20:
                    raise BlockError("table size update too large")
                self.max_bytes = size
                self._evict()
            else:
                incremental = b & 0xC0 == 0x40
                idx, i = _int(buf, i, 6 if incremental else 4)
                if idx:
                    e = self._get(idx)
                    name = e[0] if e is not None else None
                else:
                    name, i = _str(buf, i)
                value, i = _str(buf, i)
                if incremental:
                    # a name we do not know: its size is a guess (the value's), so
                    # what it evicts may be too: the table is no longer complete
                    if name is None:
                        self.complete = False
                    self._add(name, value, len(name or b"") + len(value) + ENTRY_OVERHEAD)
                out.append((name, value))
        return out
