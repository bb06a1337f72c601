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
the chain. numpy does the scan, so hunting through megabytes of values is not a
Python loop per byte.
"""
from __future__ import annotations

import numpy as np

PB_FIRST_TAGS = (0x08, 0x12, 0x1A, 0x20, 0x28, 0x30, 0x38, 0x40, 0x48, 0x4A, 0x50, 0x58)
_TAG_OK = np.zeros(256, dtype=bool)
_TAG_OK[list(PB_FIRST_TAGS)] = True
# The longest pattern (greeting signature + major version) spans 11 bytes: a match may
# still begin in the last 10 bytes of a buffer once more bytes arrive.
TAIL_BYTES = 10


def candidates(buf) -> list[int]:
    """Sorted positions in `buf` where a whole pattern above matches."""
    a = np.frombuffer(buf, dtype=np.uint8)
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
    return np.sort(np.concatenate(found)).tolist()
