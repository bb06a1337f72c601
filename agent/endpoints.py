"""A TCP connection's ends as text, and its id: the same string on both of its ends."""
from __future__ import annotations

import socket

from probes.events import AF_INET, AF_INET6

_addr_cache: dict[bytes, str] = {}


def addr_text(family: int, raw: bytes) -> str:
    """An address of a probe's record (16 bytes; IPv4 in the first 4) as text."""
    key = raw if family == AF_INET6 else raw[:4]
    s = _addr_cache.get(key)
    if s is None:
        if family == AF_INET6:
            s = socket.inet_ntop(socket.AF_INET6, raw)
        elif family == AF_INET:
            s = socket.inet_ntop(socket.AF_INET, raw[:4])
        else:
            s = raw.hex()
        if len(_addr_cache) < 65536:
            _addr_cache[key] = s
    return s


def conn_id_of(local, remote, isn_local: int, isn_remote: int, known: bool) -> tuple[str, tuple]:
    """A connection's id, the same string on both of its ends: endpoints sorted, each
    with its ISN ('?' when unknown)."""
    a = (local[0], local[1], isn_local if known else None)
    b = (remote[0], remote[1], isn_remote if known else None)
    lo, hi = sorted((a, b), key=lambda e: (e[0], e[1]))

    def fmt(e):
        host = f"[{e[0]}]" if ":" in e[0] else e[0]
        return f"{host}:{e[1]}#{'?' if e[2] is None else e[2]}"

    return f"{fmt(lo)}-{fmt(hi)}", ((lo[0], lo[1]), (hi[0], hi[1]))
