"""A small deterministic byte mutator, for brief fuzzing without atheris.

The mutations are the usual ones of byte-level fuzzers (bit flips, interesting
integers at any width and byte order, inserts, deletes, duplicated ranges,
splices with another seed, truncation), stacked 1-4 deep, all drawn from one
seeded random.Random so a run is reproducible from its seed.
"""
from __future__ import annotations

import random
import struct

_INTERESTING = (0, 1, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000,
                0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1, 1 << 63,
                (1 << 64) - 1)
_WIDTHS = ((1, "B"), (2, "H"), (4, "I"), (8, "Q"))


def _interesting(rnd: random.Random, buf: bytearray) -> None:
    width, code = rnd.choice(_WIDTHS)
    if len(buf) < width:
        return
    value = rnd.choice(_INTERESTING) & ((1 << (8 * width)) - 1)
    at = rnd.randrange(len(buf) - width + 1)
    struct.pack_into(rnd.choice("<>") + code, buf, at, value)


def mutate(rnd: random.Random, data: bytes, others: list[bytes], max_len: int = 1 << 20) -> bytes:
    buf = bytearray(data)
    for _ in range(rnd.randint(1, 4)):
        op = rnd.randrange(8)
        n = len(buf)
        if op == 0 and n:
            buf[rnd.randrange(n)] ^= 1 << rnd.randrange(8)
        elif op == 1:
            _interesting(rnd, buf)
        elif op == 2:
            at = rnd.randint(0, n)
            buf[at:at] = rnd.randbytes(rnd.choice((1, 2, 4, 8, 64)))
        elif op == 3 and n:
            a = rnd.randrange(n)
            del buf[a:a + rnd.randint(1, max(1, min(64, n - a)))]
        elif op == 4 and n:
            a = rnd.randrange(n)
            b = min(n, a + rnd.randint(1, 256))
            at = rnd.randint(0, n)
            buf[at:at] = buf[a:b] * rnd.choice((1, 2, 16))
        elif op == 5 and others:
            other = rnd.choice(others)
            if other:
                a = rnd.randrange(len(other))
                cut = rnd.randint(0, n)
                buf[cut:] = other[a:a + rnd.randint(1, 4096)]
        elif op == 6 and n:
            del buf[rnd.randint(0, n - 1):]
        elif n:
            buf[rnd.randrange(n)] = rnd.randrange(256)
    return bytes(buf[:max_len])
