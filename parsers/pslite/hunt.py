"""Where, in bytes of unknown alignment, a ps-lite message or a ZMTP greeting may start.

Used by a parser that is hunting for sync (joined mid-stream, or after a gap or
garbage). A position is returned when the bytes there look like:
- a short frame header that can start a message: flags 0x00 or 0x01 (MORE), a size
  of at least 4 (a PBMeta holding `request` and `push` needs 4 bytes), then the first
  tag of a PBMeta (a field 1..11 with its wire type; ps-lite always sets `head`,
  field 1, so in practice 0x08);
- a long frame header (flags 0x02/0x03) with a size of 256..65535 (libzmq uses the
  long form only above 255, and a meta is small) and the same first tag;
- a greeting: 0xFF, 8 octets of padding, 0x7F, major version >= 3.
These are cheap necessary conditions; the parser then decodes the meta and follows
the chain. The scan is never a Python loop per byte: numpy through megabytes of
values, a regular expression (the same patterns) through the few bytes a small read
adds, where numpy's ~80 us per call cost 30 times the rest of the hunt.
"""
from __future__ import annotations

import re

import numpy as np

PB_FIRST_TAGS = (0x08, 0x12, 0x1A, 0x20, 0x28, 0x30, 0x38, 0x40, 0x48, 0x4A, 0x50, 0x58)
_TAG_OK = np.zeros(256, dtype=bool)
_TAG_OK[list(PB_FIRST_TAGS)] = True
# The longest pattern (greeting signature + major version) spans 11 bytes: a match may
# still begin in the last 10 bytes of a buffer once more bytes arrive.
TAIL_BYTES = 10
# Below this many bytes the regular expression is the faster scan (measured: 2.5 us
# against 80 us for 20 bytes, 70 against 95 us for 1,500; 65 ms against 15 ms for 1 MiB).
REGEX_MAX_BYTES = 2048
_TAGS = b"".join(re.escape(bytes([t])) for t in PB_FIRST_TAGS)
# Each match is the one byte a pattern starts at (the rest is a lookahead, so matches
# may overlap): the engine skips bytes that start none of them without trying the rest.
_SHORT = rb"[\x00\x01](?=[\x04-\xff][" + _TAGS + rb"])"
_LONG = rb"[\x02\x03](?=\x00{6}[\x01-\xff].[" + _TAGS + rb"])"
_GREETING = rb"\xff(?=.{8}\x7f[\x03-\xff])"
_PATTERNS = re.compile(b"|".join((_SHORT, _LONG, _GREETING)), re.S)
_SHORT_PATTERN = re.compile(_SHORT, re.S)
# A short header's pattern spans 3 bytes: a match may begin in the last 2 of a buffer.
SHORT_TAIL_BYTES = 2
# A long header or greeting is judged no sooner than 64 bytes after it starts (a greeting
# is 64 bytes, a long frame 9 + at least 256), so a hunt may look for them only every
# this many bytes and still find each before it could be judged, as every read did:
# 64 less the TAIL_BYTES they may straddle at the end of the previous scan.
LONG_SCAN_BYTES = 64 - TAIL_BYTES


def candidates(buf, start: int = 0) -> list[int]:
    """Sorted positions from `start` on in `buf` where a whole pattern above matches."""
    if len(buf) - start < REGEX_MAX_BYTES:
        return [m.start() for m in _PATTERNS.finditer(buf, start)]
    return _candidates_np(buf, start)


def short_candidates(buf, start: int = 0) -> list[int]:
    """candidates() of the short frame header's pattern only."""
    if len(buf) - start < REGEX_MAX_BYTES:
        return [m.start() for m in _SHORT_PATTERN.finditer(buf, start)]
    a = np.frombuffer(buf, dtype=np.uint8)[start:]
    p = np.flatnonzero(a[:len(a) - 2] <= 1)
    p = p[a[p + 1] >= 4]
    return (p[_TAG_OK[a[p + 2]]] + start).tolist()


def _candidates_np(buf, start: int = 0) -> list[int]:
    a = np.frombuffer(buf, dtype=np.uint8)[start:]
    n = len(a)
    found = []
    if n >= 3:
        p = np.flatnonzero(a[:n - 2] <= 1)
        p = p[a[p + 1] >= 4]
        found.append(p[_TAG_OK[a[p + 2]]])
    if n >= 10:
        q = np.flatnonzero((a[:n - 9] | 1) == 3)  # 0x02 or 0x03
        for k in range(1, 7):  # size < 65536: the six high octets are zero
            q = q[a[q + k] == 0]
        q = q[a[q + 7] >= 1]  # size >= 256
        found.append(q[_TAG_OK[a[q + 9]]])
    if n >= 11:
        g = np.flatnonzero(a[:n - 10] == 0xFF)
        found.append(g[(a[g + 9] == 0x7F) & (a[g + 10] >= 3)])
    if not found:
        return []
    return (np.sort(np.concatenate(found)) + start).tolist()
