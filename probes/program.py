"""Turns probe declarations into the text and constants bcc compiles.

No bcc here, so the generated program can be printed (`--print-bpf`) and
tested without root. Everything variable reaches C as a validated integer
`-DNAME=value`: BTF offsets, tracepoint field offsets, filter switches, map
sizes. The C sources themselves are used as written; only our own
`#include "x.h"` lines are expanded so the printed program is complete.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError
from probes import btf as btfmod
from probes import tracefs
from probes.declare import COMMON_KERNEL_FIELDS, PROBES_DIR, Probe
from probes.filters import Filters

_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]+"([A-Za-z0-9_.-]+)"[ \t]*$', re.M)


@dataclass(frozen=True)
class GeneratedProgram:
    probes: tuple[Probe, ...]
    filters: Filters
    constants: dict[str, int]
    text: str

    @property
    def cflags(self) -> list[str]:
        return [f"-D{name}={value}" for name, value in sorted(self.constants.items())]

    def render(self) -> str:
        """The program as bcc compiles it: the -D constants spelled as
        #defines, then the source."""
        names = ", ".join(p.name for p in self.probes)
        head = [f"/* pslat probes: {names}. Constants below are passed to bcc as -D flags. */"]
        head += [f"#define {name} {value}" for name, value in sorted(self.constants.items())]
        return "\n".join(head) + "\n\n" + self.text


def expand_includes(path: Path, seen: set[str] | None = None) -> str:
    """The file with our own headers inlined once each (system headers are left to bcc)."""
    seen = set() if seen is None else seen

    def sub(m: re.Match) -> str:
        name = m.group(1)
        inc = PROBES_DIR / name
        if not inc.is_file():
            return m.group(0)
        if name in seen:
            return f"/* {name}: already included */"
        seen.add(name)
        return f"/* ---- {name} ---- */\n" + expand_includes(inc, seen) + f"\n/* ---- end {name} ---- */"

    return _LOCAL_INCLUDE.sub(sub, path.read_text())


def _check_int(name: str, value, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{name} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise UserError(f"{name}={value} is out of range; give a value in {low}..{high}")
    if name.endswith("_RING_PAGES") and value & (value - 1):
        raise UserError(f"{name}={value} must be a power of two (ring buffers are page-count powers of two)")
    return value


def kernel_constants(probes, btf) -> dict[str, int]:
    """BTF offsets of every member the probes (and common.bpf.h) read."""
    out: dict[str, int] = {}
    fields = list(COMMON_KERNEL_FIELDS) + [f for p in probes for f in p.kernel_fields]
    for f in fields:
        m = btf.member(f.path)
        if m.size_bytes != f.size_bytes:
            raise btfmod.BtfError(
                f"this kernel's {f.path} is {m.size_bytes} bytes ({m.type_name}) but the probe reads "
                f"{f.size_bytes}; pslat does not support this kernel's layout: please report it")
        off = m.offset_bytes  # refuses bitfields
        if out.get(f.const, off) != off:
            raise ValueError(f"{f.const} declared twice with different members")
        out[f.const] = off
    return out


def tracepoint_constants(probes, root: Path | None = None) -> dict[str, int]:
    """Offsets of the tracepoint context fields the probes read."""
    out: dict[str, int] = {}
    formats: dict[str, dict] = {}
    for p in probes:
        for f in p.tracepoint_fields:
            offsets = set()
            for tp in f.tracepoints:
                if tp not in formats:
                    formats[tp] = tracefs.tracepoint_format(tp, root)
                field = formats[tp].get(f.field)
                if field is None:
                    raise UserError(f"tracepoint {tp} has no field '{f.field}' on this kernel; "
                                    "pslat does not support this kernel version: please report it")
                if field.size_bytes != f.size_bytes:
                    raise UserError(f"tracepoint {tp} field '{f.field}' is {field.size_bytes} bytes, "
                                    f"the probe reads {f.size_bytes}; please report this kernel version")
                offsets.add(field.offset_bytes)
            if len(offsets) != 1:
                raise UserError(f"tracepoints {', '.join(f.tracepoints)} disagree on where '{f.field}' is "
                                f"({sorted(offsets)}); please report this kernel version")
            out[f.const] = offsets.pop()
    return out


def generate(probes, filters: Filters | None = None, btf=None, tracefs_root: Path | None = None,
             overrides: dict[str, int] | None = None) -> GeneratedProgram:
    probes = tuple(probes)
    if not probes:
        raise ValueError("no probes to build")
    if len({p.name for p in probes}) != len(probes):
        raise ValueError("probe names must be unique")
    filters = filters or Filters()
    btf = btf or btfmod.load()
    constants: dict[str, int] = {}
    constants.update(kernel_constants(probes, btf))
    constants.update(tracepoint_constants(probes, tracefs_root))
    constants.update(filters.constants())
    overrides = dict(overrides or {})
    for p in probes:
        for name, (default, low, high) in p.constants.items():
            constants[name] = _check_int(name, overrides.pop(name, default), low, high)
    if overrides:
        raise UserError(f"unknown probe setting(s): {', '.join(sorted(overrides))}")
    seen: set[str] = set()
    text = "\n\n".join(
        f"/* ==== probe {p.name}: {p.source} ==== */\n" + expand_includes(p.source_path, seen) for p in probes
    )
    return GeneratedProgram(probes, filters, constants, text)
