"""Run dirs in, one messages DataFrame out, with every problem named (never a traceback).

`pslat report` is given the run dirs of one traced run, one per host (or a
parent dir holding them, as `pslat agent --out DIR` leaves). What can go wrong
is reported as a sentence naming the file, and what can still be used is used:

- meta.json unreadable or truncated: the shards are still read; the host id
  comes from their rows (every row carries it); the clock mapping is lost, so
  that host's clocks are estimated from the traffic.
- a corrupt shard: skipped and named (the rest of the host is used).
- rows missing: a closed run dir whose meta.json counted more message rows
  than its shards hold (a shard deleted or unreadable).
- a host with no messages: named; the other hosts are reported.
- run dirs of different runs: grouped by meta.json's run id when every run dir
  has one, else by the time each was written (start to last update, realtime);
  the group with the most messages is used and the others are named.
- the same host id twice in one run: the run dir with more rows is used.
"""
from __future__ import annotations

import ctypes
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from agent.errors import UserError
from agent.records import MESSAGES_SCHEMA
from agent.rundir import META_FILE, SHARD_SUFFIX

TABLE = "messages"
# Not needed by the report (key_sample is the heaviest column: a list per row).
SKIPPED_COLUMNS = frozenset({"key_sample", "tid", "comm", "netns_ino", "cmd", "key_sample_complete",
                             "framework_layer", "ts_send_last_exit_ns"})
# Realtime clocks of undisciplined hosts may disagree by this much: run dirs whose
# [start, last update] intervals are further apart than this are different runs.
RUN_GAP_TOLERANCE_NS = 300 * 10**9


@dataclass
class HostRun:
    """One host's run dir as the report uses it."""
    host_id: str
    path: Path
    meta: dict[str, Any]                      # {} when meta.json could not be read
    table: pa.Table | None                    # its message rows; dropped by load() once converted
    problems: list[str] = field(default_factory=list)
    rows: int = 0                             # message rows read


@dataclass
class Loaded:
    hosts: list[HostRun]
    messages: pd.DataFrame                    # every used host's rows
    problems: list[str]                       # what was wrong, naming the file, and what was done


def nullable(t: pa.DataType):
    """Arrow -> pandas types that keep int64 nanoseconds exact when a value is null."""
    if pa.types.is_integer(t):
        return pd.Int64Dtype()
    if pa.types.is_boolean(t):
        return pd.BooleanDtype()
    return None


def _wanted_schema() -> pa.Schema:
    """MESSAGES_SCHEMA's columns that the report reads, text dictionary-encoded (categories)."""
    return pa.schema([pa.field(f.name, pa.dictionary(pa.int32(), f.type) if pa.types.is_string(f.type) else f.type)
                      for f in MESSAGES_SCHEMA if f.name not in SKIPPED_COLUMNS])


def to_frame(tbl: pa.Table) -> pd.DataFrame:
    df = tbl.to_pandas(types_mapper=nullable, self_destruct=True, split_blocks=True)
    release_memory()
    return df


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:   # not glibc: nothing to trim
        return None


_LIBC = _glibc()


def release_memory() -> None:
    """Give memory freed so far back to the OS. The report's peak RSS comes from a few large
    steps in a row (read, pair ends, pair requests); glibc keeps what numpy and Arrow freed for
    reuse (its mmap threshold grows with each large array freed), so without this the garbage
    of one step stays resident under the next (1M requests: 1.5 GB after reading alone)."""
    pa.default_memory_pool().release_unused()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


@contextmanager
def system_allocator():
    """Arrow buffers from malloc while reading: its default (mimalloc) kept the freed buffers
    of the shards resident after their conversion to pandas; malloc's can be trimmed."""
    old = pa.default_memory_pool()
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(old)


def read_shards(path: Path) -> tuple[pa.Table, list[str]]:
    """The messages table of one run dir, with the columns of agent.records.MESSAGES_SCHEMA
    the report reads (one an older agent did not write is all null), and the shards that
    could not be read."""
    want = _wanted_schema()
    parts, problems = [], []
    for shard in sorted(Path(path).glob(f"{TABLE}-*{SHARD_SUFFIX}")):
        try:
            have = pq.read_schema(shard).names
            tbl = pq.read_table(shard, columns=[n for n in want.names if n in have],
                                read_dictionary=[f.name for f in want
                                                 if f.name in have and pa.types.is_dictionary(f.type)])
            cols = [(tbl.column(f.name) if f.name in tbl.column_names else pa.nulls(len(tbl), f.type)).cast(f.type)
                    for f in want]
            parts.append(pa.table(cols, schema=want))
        except Exception as e:  # pyarrow raises several types for a damaged or foreign file
            problems.append(f"{shard}: unreadable shard skipped ({type(e).__name__}: {e})")
    return (pa.concat_tables(parts) if parts else want.empty_table()), problems


def host_shards(path: Path, host: str, table: str, columns: list[str],
                dictionary: tuple[str, ...] = ()) -> Iterator[pa.Table]:
    """The rows of `table` in one host's run dir, a shard at a time, with these columns (one
    an older agent did not write is all null; the text columns in `dictionary` dictionary-
    encoded). Shards that cannot be read are skipped (for messages, read_shards names them).
    One run dir is one host: rows of other hosts are left out, as read_host does."""
    for shard in sorted(Path(path).glob(f"{table}-*{SHARD_SUFFIX}")):
        try:
            have = set(pq.read_schema(shard).names)
            t = pq.read_table(shard, columns=[c for c in columns if c in have],
                              read_dictionary=[c for c in dictionary if c in have])
        except Exception:  # pyarrow raises several types for a damaged file
            continue
        t = pa.table([t.column(c) if c in t.column_names else pa.nulls(len(t)) for c in columns], names=columns)
        if "host_id" in columns:
            mine = pc.fill_null(pc.equal(t.column("host_id").cast(pa.string()), host), False)
            if not pc.all(mine).as_py():   # a filter copies every column (key samples)
                t = t.filter(mine)
        yield t


def _read_meta(path: Path) -> tuple[dict, str | None]:
    f = path / META_FILE
    try:
        meta = json.loads(f.read_text())
    except FileNotFoundError:
        return {}, f"{f} is missing"
    except (OSError, ValueError) as e:
        return {}, f"{f} is unreadable or truncated ({type(e).__name__}: {e})"
    if not isinstance(meta, dict) or not isinstance(meta.get("host_id"), str):
        return {}, f"{f} has no host_id"
    return meta, None


def _is_run_dir(p: Path) -> bool:
    return (p / META_FILE).exists() or any(p.glob(f"{TABLE}-*{SHARD_SUFFIX}"))


def expand(paths: list[Path]) -> list[Path]:
    """Run dirs as given, a parent dir standing for the run dirs inside it."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise UserError(f"{p} is not a directory; give run dirs written by `pslat agent --out DIR` "
                            "(DIR itself or DIR/<host>)")
        if _is_run_dir(p):
            out.append(p)
            continue
        inner = sorted(c for c in p.iterdir() if c.is_dir() and _is_run_dir(c))
        if not inner:
            raise UserError(f"{p} holds no run dir (no {META_FILE}, no {TABLE} shards); give the dir "
                            "that `pslat agent --out` wrote, or the run dirs inside it")
        out.extend(inner)
    return list(dict.fromkeys(out))


def _host_ids(tbl: pa.Table) -> list[str]:
    return [str(x) for x in pc.unique(tbl.column("host_id").cast(pa.string())).drop_null().to_pylist()]


def read_host(path: Path) -> HostRun:
    """One run dir; host_id "" when nothing in it is usable (the reason in .problems)."""
    path = Path(path)
    meta, meta_problem = _read_meta(path)
    tbl, problems = read_shards(path)
    host = meta.get("host_id")
    if meta_problem:
        ids = _host_ids(tbl)
        if len(ids) == 1:
            host = ids[0]
            problems.insert(0, f"{meta_problem}: host id {host!r} taken from its rows; its clock "
                               "mapping is unknown, so its clock is estimated from the traffic")
        else:
            why = "no message rows to take the host id from" if not ids else \
                f"its rows name several hosts ({', '.join(ids)})"
            problems.insert(0, f"{meta_problem} and {why}: {path} is left out")
            return HostRun(host_id="", path=path, meta={}, table=None, problems=problems)
    mine = pc.equal(tbl.column("host_id").cast(pa.string()), host)
    if tbl.num_rows and not pc.all(mine).as_py():
        # one run dir is one host: rows of another host mean it was assembled by hand
        problems.append(f"{path}: {tbl.num_rows - pc.sum(mine).as_py()} rows name another host than "
                        f"{host!r}; they are left out")
        tbl = tbl.filter(mine)
    n = tbl.num_rows
    counters = meta.get("counters") or {}
    expected = counters.get("messages")
    if meta.get("closed") and isinstance(expected, int):
        # rows_dropped counts every table's dropped rows: an upper bound for this one
        missing = expected - int(counters.get("rows_dropped") or 0) - n
        if missing > 0:
            problems.append(f"{path}: {missing} of {expected} message rows are missing (a shard deleted "
                            "or unreadable); the rest is used")
    elif meta and not meta.get("closed"):
        problems.append(f"{path}/{META_FILE}: the agent did not close this run dir (still running, or "
                        "killed): rows of its last seconds may be missing")
    if counters.get("rows_dropped"):
        problems.append(f"{path}: the agent dropped {counters['rows_dropped']} rows (disk full or too slow)")
    if n == 0:
        problems.append(f"{path}: host {host!r} has no messages (no traffic traced there)")
    return HostRun(host_id=host, path=path, meta=meta, table=tbl, problems=problems, rows=n)


def _interval(meta: dict) -> tuple[int, int] | None:
    a, b = meta.get("started_realtime_ns"), meta.get("updated_realtime_ns")
    if isinstance(a, int) and isinstance(b, int):
        return a, max(a, b)
    return None


def _runs(hosts: list[HostRun]) -> list[list[HostRun]]:
    """Groups of run dirs that belong to one run (see the module docstring)."""
    if all(h.meta.get("run_id") for h in hosts):
        groups: dict[str, list[HostRun]] = {}
        for h in hosts:
            groups.setdefault(str(h.meta["run_id"]), []).append(h)
        return list(groups.values())
    timed = sorted((iv, i) for i, h in enumerate(hosts) if (iv := _interval(h.meta)) is not None)
    untimed = [h for h in hosts if _interval(h.meta) is None]
    groups_t: list[list[HostRun]] = []
    end = None
    for (a, b), i in timed:
        if end is None or a > end + RUN_GAP_TOLERANCE_NS:
            groups_t.append([])
            end = b
        groups_t[-1].append(hosts[i])
        end = max(end, b)
    if not groups_t:
        return [untimed]
    # a run dir whose times are unknown cannot be told apart: it joins the largest run
    best = max(groups_t, key=lambda g: sum(h.rows for h in g))
    best.extend(untimed)
    return groups_t


def _when(h: HostRun) -> str:
    iv = _interval(h.meta)
    if iv is None:
        return "unknown time"
    fmt = lambda ns: pd.Timestamp(ns, unit="ns").strftime("%Y-%m-%d %H:%M:%S")  # noqa: E731
    return f"{fmt(iv[0])} to {fmt(iv[1])} UTC"


def load(paths: list[Path]) -> Loaded:
    """See the module docstring. Raises UserError only when nothing at all can be used."""
    with system_allocator():
        return _load(paths)


def _load(paths: list[Path]) -> Loaded:
    dirs = expand(paths)
    problems: list[str] = []
    hosts: list[HostRun] = []
    for d in dirs:
        h = read_host(d)
        problems.extend(h.problems)
        if h.host_id:
            hosts.append(h)
    if not hosts:
        raise UserError("no usable run dir among " + ", ".join(map(str, dirs)) + "; "
                        + (problems[0] if problems else "see above"))
    runs = _runs(hosts)
    if len(runs) > 1:
        runs.sort(key=lambda g: sum(h.rows for h in g), reverse=True)
        for g in runs[1:]:
            for h in g:
                problems.append(f"{h.path}/{META_FILE}: from a different run than "
                                f"{runs[0][0].path} ({_when(h)} vs {_when(runs[0][0])}); left out: "
                                "give the run dirs of one run")
        hosts = runs[0]
    by_id: dict[str, HostRun] = {}
    for h in hosts:
        other = by_id.get(h.host_id)
        if other is None:
            by_id[h.host_id] = h
            continue
        keep, drop = (h, other) if h.rows > other.rows else (other, h)
        by_id[h.host_id] = keep
        problems.append(f"{drop.path} and {keep.path} are both host {h.host_id!r}; {drop.path} is left out")
    hosts = sorted(by_id.values(), key=lambda h: h.host_id)
    tables = [h.table for h in hosts if h.rows] or [_wanted_schema().empty_table()]
    for h in hosts:   # one copy of the rows, not two
        h.table = None
    table = pa.concat_tables(tables).unify_dictionaries()
    del tables        # to_pandas(self_destruct) frees each column as it goes only when nothing else holds it
    msgs = to_frame(table)
    del table
    release_memory()
    return Loaded(hosts=hosts, messages=_categorical(msgs), problems=problems)


def _categorical(msgs: pd.DataFrame) -> pd.DataFrame:
    """Text columns repeat (hosts, addresses, connections, reasons): as categories, joins
    and takes work on integer codes. Both address columns share one set of categories, so
    that a tx row's local address and an rx row's remote address compare as codes."""
    ips = pd.api.types.union_categoricals([msgs["local_ip"], msgs["remote_ip"]]).categories
    for c in ("local_ip", "remote_ip"):
        msgs[c] = msgs[c].cat.set_categories(ips)
    return msgs
