"""Sizes as a person reads them, the same in the report and the live view."""
from __future__ import annotations


def fmt_bytes(n_bytes: int) -> str:
    """14.5 MB, 900 bytes (decimal units, as the wire's rates are given)."""
    for unit, k in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n_bytes >= k:
            return f"{n_bytes / k:.1f} {unit}"
    return f"{n_bytes} bytes"
