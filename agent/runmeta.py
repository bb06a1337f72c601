"""A run dir's meta.json as a reader takes it: read safely, every field a reader uses type-checked.

    meta, problems = read_meta_checked(run_dir / META_FILE)   # MetaError (says what is wrong) when unusable

Run dirs come from other hosts and from anyone who can write a directory, so
meta.json is outside data (DESIGN.md, "What the agent trusts"). It is read only
when a regular file of at most MAX_META_BYTES, JSON nested at most MAX_JSON_DEPTH
(agent.safefile). Then each field in FIELDS that is present must have its type and
range; one that does not is removed, and a sentence naming it is returned, so
readers see only values they can use (a count that is an int, a time that fits
int64 ns, a rate in (0, 1]) and the report says what it ignored. A field that is
absent stays absent (older agents wrote fewer); fields no reader uses are kept
as they are. Without a host id (a string) the meta.json is unusable.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

from agent.bypass import REPORTED_MAX as BYPASS_REPORTED_MAX
from agent.safefile import JsonTooDeep, parse_json, read_regular

# The agent's meta.json is a few KiB; its sampling history grows by one pair per rate
# change (at most one a second): a day of changes is ~3 MB.
MAX_META_BYTES = 32 << 20
MAX_JSON_DEPTH = 64             # the agent writes 4 levels
MAX_TEXT_CHARS = 4096           # a host id, boot id, run id: far less
MAX_PROBES = 256                # counters.probes entries (the agent has a handful)
# CLOCK_MONOTONIC times and realtime offsets within +-2^62 ns (146 years): sums and
# differences of two of them still fit int64, where the report computes with them.
TIME_LIMIT_NS = 1 << 62


class MetaError(ValueError):
    """meta.json cannot be used at all; str() says why, naming the file."""


def _count(v: Any) -> bool:
    return type(v) is int and 0 <= v < 1 << 63   # bool is an int subclass: refused


def _realtime_ns(v: Any) -> bool:
    return type(v) is int and 0 <= v < 1 << 63   # 1970 to 2262, what a pandas Timestamp holds


def _monotonic_ns(v: Any) -> bool:
    return type(v) is int and 0 <= v < TIME_LIMIT_NS


def _offset_ns(v: Any) -> bool:
    return type(v) is int and -TIME_LIMIT_NS < v < TIME_LIMIT_NS


def _number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v) and 0 <= v < 1e18


def _rate(v: Any) -> bool:
    return type(v) in (int, float) and 0 < v <= 1   # NaN compares false


def _text(v: Any) -> bool:
    return type(v) is str and len(v) <= MAX_TEXT_CHARS


def _id(v: Any) -> bool:
    return _text(v) or _count(v)


def _flag(v: Any) -> bool:
    return type(v) is bool


def _object(v: Any) -> bool:
    return type(v) is dict


def _bypass_list(v: Any) -> bool:
    return (type(v) is list and len(v) <= BYPASS_REPORTED_MAX
            and all(type(e) is dict and _count(e.get("pid"))
                    and all(_text(e.get(k)) for k in ("comm", "protocol", "transport", "setting"))
                    for e in v))


# (path, check, what the value must be); a container before what is inside it
Check = Callable[[Any], bool]
FIELDS: list[tuple[tuple[str, ...], Check, str]] = [
    (("run_id",), _id, "a string"),
    (("closed",), _flag, "true or false"),
    (("disk_full",), _flag, "true or false"),
    (("format_version",), _count, "a count"),
    (("started_realtime_ns",), _realtime_ns, "a time in ns"),
    (("updated_realtime_ns",), _realtime_ns, "a time in ns"),
    (("boot_id",), _text, "a string"),
    (("kernel",), _object, "an object"),
    (("kernel", "boot_id"), _text, "a string"),
    (("clock",), _object, "an object"),
    (("clock", "offset_ns"), _offset_ns, "an offset in ns"),
    (("clock", "uncertainty_ns"), _number, "a duration in ns"),
    (("clock", "taken_monotonic_ns"), _monotonic_ns, "a time in ns"),
    (("clock", "injected"), _object, "an object"),
    (("clock_discipline",), _object, "an object"),
    (("clock_discipline", "synced"), _flag, "true or false"),
    (("clock_discipline", "esterror_us"), _number, "a duration in us"),
    (("kernel_bypass",), _bypass_list, "a list of processes (pid, comm, protocol, transport, setting)"),
    (("counters",), _object, "an object"),
    *((("counters", c), _count, "a count") for c in ("messages", "rows_dropped", "shards_failed",
                                                      "meta_write_failures", "unparsed_bytes", "lost_bytes")),
    (("counters", "consumer_cpu_s"), _number, "a duration in s"),
    (("counters", "probes"), _object, "an object"),
    (("sampling",), _object, "an object"),
    (("sampling", "rate"), _rate, "a rate in (0, 1]"),
    (("sampling", "effective_rate"), _rate, "a rate in (0, 1]"),
]


def describe(v: Any) -> str:
    """A value as a problem sentence shows it: containers by kind, scalars by value (cut short)."""
    if isinstance(v, dict):
        return "an object"
    if isinstance(v, list):
        return "a list"
    text = "null" if v is None else repr(v)
    return text if len(text) <= 40 else text[:39] + "…"


def check_meta(meta: Any, where: Path) -> tuple[dict, list[str]]:
    """meta.json's value -> (the value with every field of FIELDS that failed its check
    removed, one sentence per removal). MetaError when it has no usable host id."""
    if not isinstance(meta, dict):
        raise MetaError(f"{where} holds {describe(meta)}, not an object with a host_id")
    if "host_id" not in meta:
        raise MetaError(f"{where} has no host_id")
    if not _text(meta["host_id"]) or not meta["host_id"]:
        raise MetaError(f"{where}: host_id is {describe(meta['host_id'])}, not a string")
    problems: list[str] = []
    for path, ok, what in FIELDS:
        parent = meta
        for k in path[:-1]:
            parent = parent.get(k) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue
        v = parent[path[-1]]
        if not ok(v):
            del parent[path[-1]]
            problems.append(f"{where}: {'.'.join(path)} is {describe(v)}, not {what}: ignored")
    probes = (meta.get("counters") or {}).get("probes")
    if probes is not None:
        good = {p: v for p, v in list(probes.items())[:MAX_PROBES]
                if _text(p) and _object(v) and all(_count(v.get(k, 0)) for k in ("seen", "lost"))}
        if len(good) < len(probes):
            problems.append(f"{where}: {len(probes) - len(good)} of counters.probes' {len(probes)} entries are "
                            "not {\"seen\": count, \"lost\": count}: ignored")
            meta["counters"]["probes"] = good
    return meta, problems


def read_meta_checked(f: Path) -> tuple[dict, list[str]]:
    """A run dir's meta.json (agent.rundir.META_FILE), read and checked (see the module
    docstring); MetaError saying what is wrong with it when it cannot be used (missing,
    not a regular file, too large, not JSON, too deep, no host id)."""
    try:
        data = read_regular(f, MAX_META_BYTES)
    except FileNotFoundError:
        raise MetaError(f"{f} is missing") from None
    except OSError as e:   # safefile's refusals name the file and say what it is
        raise MetaError(str(e) if e.errno is None else f"{f} is unreadable ({e.strerror})") from None
    try:
        value = parse_json(data, MAX_JSON_DEPTH)
    except JsonTooDeep as e:
        raise MetaError(f"{f} is {e}") from None
    except ValueError as e:
        raise MetaError(f"{f} is unreadable: corrupt or truncated ({e})") from None
    return check_meta(value, f)
