"""Tracepoint field layouts, read from tracefs at run time.

A tracepoint program reads its context at the offsets the kernel publishes in
`events/<category>/<event>/format`; the loader passes them in as -D constants
(the same way as BTF offsets), so a kernel that moves a field breaks nothing
silently: it either still works or the loader says which field is missing.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError

TRACEFS_MOUNTS = (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing"))

_FIELD = re.compile(r"^\s*field:(?P<decl>[^;]+);\s*offset:(?P<off>\d+);\s*size:(?P<size>\d+);\s*signed:(?P<signed>\d+);")


@dataclass(frozen=True)
class TpField:
    name: str
    offset_bytes: int
    size_bytes: int
    signed: bool


def tracefs_root(candidates=TRACEFS_MOUNTS) -> Path:
    for root in candidates:
        if (root / "events").is_dir():
            return root
    raise UserError(
        "tracefs is not mounted (no /sys/kernel/tracing/events); "
        "mount it as root: mount -t tracefs nodev /sys/kernel/tracing"
    )


def parse_format(text: str) -> dict[str, TpField]:
    """Fields of one tracepoint `format` file, by name."""
    fields: dict[str, TpField] = {}
    for line in text.splitlines():
        m = _FIELD.match(line)
        if not m:
            continue
        decl = m.group("decl").strip()
        # "const char * buf", "__u8 saddr[4]", "int __syscall_nr": the name is
        # the last identifier, before any array brackets.
        name = re.sub(r"\[.*\]$", "", decl).split()[-1].lstrip("*")
        fields[name] = TpField(name, int(m.group("off")), int(m.group("size")), m.group("signed") == "1")
    return fields


def tracepoint_format(tracepoint: str, root: Path | None = None) -> dict[str, TpField]:
    """`category:event` -> its fields."""
    category, sep, event = tracepoint.partition(":")
    if not sep or not category or not event or "/" in tracepoint or ".." in tracepoint:
        raise UserError(f"bad tracepoint name '{tracepoint}'; write it as category:event")
    root = root or tracefs_root()
    path = root / "events" / category / event / "format"
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UserError(f"this kernel has no tracepoint {tracepoint} ({path} is missing); "
                        "pslat needs it: check the kernel's tracing configuration") from None
    except PermissionError:
        raise UserError(f"cannot read {path} (permission denied); run pslat as root") from None
    fields = parse_format(text)
    if not fields:
        raise UserError(f"{path} has no fields pslat can read; its format is unexpected: please report it")
    return fields
