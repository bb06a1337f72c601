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
- run dirs of different runs: the run dirs one agent wrote (one run id in
  meta.json) stay together; agents (each host's its own, as on real machines)
  whose times overlap, within RUN_GAP_TOLERANCE_NS (start to last update,
  realtime), are one run, unless they traced the same host (a restart); the run
  with the most messages is used and the others are named.
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

from core.errors import UserError
from agent.records import CLOCK_SAMPLES_SCHEMA, CONNECTIONS_SCHEMA, MESSAGES_SCHEMA, STREAMS_SCHEMA
from agent.rundir import META_FILE, SHARD_SUFFIX
from agent.runmeta import TIME_LIMIT_NS, MetaError, read_meta_checked
from agent.safefile import NotRegularFile, open_regular
from core.safetext import safe_text
from parsers.registry import LEGACY_MESSAGE_COLUMNS, upgrade_messages

TABLE = "messages"
# Not needed by the report (key_sample is the heaviest column: a list per row).
SKIPPED_COLUMNS = frozenset({"key_sample", "tid", "comm", "netns_ino", "key_sample_complete",
                             "framework_layer", "ts_send_last_exit_ns", "detail"})
# Realtime clocks of undisciplined hosts may disagree by this much: run dirs whose
# [start, last update] intervals are further apart than this are different runs.
RUN_GAP_TOLERANCE_NS = 300 * 10**9
TABLE_SCHEMAS = {TABLE: MESSAGES_SCHEMA, "connections": CONNECTIONS_SCHEMA, "clock_samples": CLOCK_SAMPLES_SCHEMA,
                 "streams": STREAMS_SCHEMA}
# Shards come from other hosts: a FIFO, a device or a huge file must not hang or exhaust the
# report. The agent's writer holds at most 200,000 rows (agent.rundir max_buffered_rows) per
# shard; ten times that is refused, as a footer claiming more rows than any agent writes.
MAX_SHARD_BYTES = 4 << 30
MAX_SHARD_ROWS = 2_000_000
MAX_MESSAGE_BYTES = 1 << 40    # byte and key counts above this fit no message (1 TiB)


class ShardError(Exception):
    """A shard that cannot be used; str() names it, says why and that it was skipped."""


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


def _family(t: pa.DataType) -> str:
    """What a column's values are, whatever their width or encoding: the unit of agreement
    between a shard and the schema (older shards, and tables written by pandas, have other
    widths: a nullable int as double, text as large_string)."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return f"list of {_family(t.value_type)}"
    return str(t)


def _type_name(t: pa.DataType) -> str:
    return str(t.value_type if pa.types.is_dictionary(t) else t)


def _value_limits(name: str) -> tuple[int, int, str] | None:
    """The range of an integer column's values that the report computes with safely, by
    its name's unit, and what it is; None for the rest (ids and ports: any value fits)."""
    if name.startswith("ts_") and name.endswith("_ns"):
        return 0, TIME_LIMIT_NS - 1, "a CLOCK_MONOTONIC time"
    if name.endswith("_ns"):
        return -TIME_LIMIT_NS + 1, TIME_LIMIT_NS - 1, "a duration"
    if name.endswith("bytes") or name == "num_keys":
        return 0, MAX_MESSAGE_BYTES, "a size of one message"
    return None


def read_shard(shard: Path, schema: pa.Schema, columns: list[str],
               dictionary: tuple[str, ...] = (), upgrade=None) -> tuple[pa.Table, list[str]]:
    """One shard's `columns`, each of its type in `schema` (the text columns in `dictionary`
    dictionary-encoded; a column an older agent did not write is all null), and what was
    wrong with some of its values (set to null, named). upgrade: (columns, table as read,
    with the columns it names too) -> the table in today's columns, for older formats. ShardError naming the shard when it
    cannot be used: not a regular file, too large, not Parquet, a column of another kind
    (text where a time should be) or whose values do not fit its type."""
    try:
        with open_regular(shard, MAX_SHARD_BYTES) as f:
            pf = pq.ParquetFile(f)
            if dictionary:   # only the columns the shard has (an older format lacks some): else KeyError
                pf = pq.ParquetFile(f, read_dictionary=[c for c in dictionary if c in pf.schema_arrow.names])
            md = pf.metadata   # the footer's count and its row groups' may disagree in a forged file
            rows = max(md.num_rows, sum(md.row_group(i).num_rows for i in range(md.num_row_groups)))
            if rows > MAX_SHARD_ROWS:
                raise ShardError(f"{shard}: {rows:,} rows, more than the {MAX_SHARD_ROWS:,} a shard of the "
                                 "agent holds: shard skipped")
            have = pf.schema_arrow
            for c in columns:
                if c in have.names and c in schema.names \
                        and _family(have.field(c).type) not in ("null", _family(schema.field(c).type)):
                    raise ShardError(f"{shard}: column {c} is {_type_name(have.field(c).type)}, not "
                                     f"{_type_name(schema.field(c).type)}: shard skipped")
            if upgrade is not None:
                extra, fix = upgrade
                tbl = fix(pf.read(columns=[c for c in dict.fromkeys([*columns, *extra]) if c in have.names]))
            else:
                tbl = pf.read(columns=[c for c in columns if c in have.names])
    except NotRegularFile as e:
        raise ShardError(f"{e}: shard skipped") from None
    except ShardError:
        raise
    except Exception as e:  # pyarrow raises several types for a damaged or foreign file
        raise ShardError(f"{shard}: unreadable shard skipped ({type(e).__name__}: {str(e)[:300]})") from None
    cols, names, problems = [], [], []
    for c in columns:
        want = schema.field(c).type if c in schema.names else None
        if want is not None and c in dictionary and pa.types.is_string(want):
            want = pa.dictionary(pa.int32(), want)
        col = tbl.column(c) if c in tbl.column_names else pa.nulls(len(tbl), want or pa.null())
        if want is not None:
            try:
                col = col.cast(want)   # safe: a fraction or an overflow raises
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise ShardError(f"{shard}: column {c}'s values do not fit {_type_name(want)} "
                                 f"({str(e)[:100]}): shard skipped") from None
            limits = _value_limits(c) if pa.types.is_integer(want) else None
            if limits is not None:
                lo, hi, what = limits
                bad = pc.fill_null(pc.or_(pc.less(col, lo), pc.greater(col, hi)), False)
                n = pc.sum(bad).as_py() or 0
                if n:
                    col = pc.if_else(bad, pa.scalar(None, want), col)
                    problems.append(f"{shard}: {n} values of {c} are not {what} in {lo:,}..{hi:,}: set to null")
        cols.append(col)
        names.append(c)
    return pa.table(cols, names=names), problems


def read_shards(path: Path) -> tuple[pa.Table, list[str]]:
    """The messages table of one run dir, with the columns of agent.records.MESSAGES_SCHEMA
    the report reads (see read_shard), and what was wrong with its shards."""
    want = _wanted_schema()
    parts, problems = [], []
    dictionary = tuple(f.name for f in want if pa.types.is_dictionary(f.type))
    for shard in sorted(Path(path).glob(f"{TABLE}-*{SHARD_SUFFIX}")):
        try:
            tbl, why = read_shard(shard, MESSAGES_SCHEMA, want.names, dictionary,
                                  upgrade=(LEGACY_MESSAGE_COLUMNS, upgrade_messages))
        except ShardError as e:
            problems.append(str(e))
            continue
        parts.append(tbl.cast(want))
        problems.extend(why)
    return (pa.concat_tables(parts) if parts else want.empty_table()), problems


def _of_host(t: pa.Table, host: str) -> pa.Array:
    """True for the rows that name this host (a null host id names none)."""
    return pc.fill_null(pc.equal(t.column("host_id").cast(pa.string()), host), False)


def host_shards(path: Path, host: str, table: str, columns: list[str],
                dictionary: tuple[str, ...] = ()) -> Iterator[pa.Table]:
    """The rows of `table` in one host's run dir, a shard at a time, with these columns (see
    read_shard; the text columns in `dictionary` dictionary-encoded). Shards that cannot be
    used are skipped (for messages, read_shards names them). One run dir is one host: rows
    of other hosts are left out, as read_host does."""
    schema = TABLE_SCHEMAS.get(table, pa.schema([]))
    for shard in sorted(Path(path).glob(f"{table}-*{SHARD_SUFFIX}")):
        try:
            t, _ = read_shard(shard, schema, columns, dictionary)
        except ShardError:
            continue
        if "host_id" in columns:
            mine = _of_host(t, host)
            if not pc.all(mine).as_py():   # a filter copies every column (key samples)
                t = t.filter(mine)
        yield t


def read_host_meta(path: Path) -> tuple[dict, list[str], str | None]:
    """A run dir's meta.json as agent.runmeta checks it: (meta, the fields it ignored, None),
    or ({}, [], why) when it cannot be used."""
    try:
        meta, ignored = read_meta_checked(Path(path) / META_FILE)
    except MetaError as e:
        return {}, [], str(e)
    return meta, ignored, None


def _is_run_dir(p: Path) -> bool:
    return (p / META_FILE).exists() or any(p.glob(f"{TABLE}-*{SHARD_SUFFIX}"))


def expand(paths: list[Path]) -> list[Path]:
    """Run dirs as given, a parent dir standing for the run dirs inside it."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise UserError(f"{p} is not a directory; give run dirs written by `pslat agent --out DIR` "
                            "(DIR itself or DIR/<host>), or capture files (pcap, pcapng)")
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
    meta, ignored, meta_problem = read_host_meta(path)
    tbl, problems = read_shards(path)
    problems[:0] = ignored
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
    mine = _of_host(tbl, host)
    if tbl.num_rows and not pc.all(mine).as_py():
        # one run dir is one host: rows of another host mean it was assembled by hand
        problems.append(f"{path}: {tbl.num_rows - (pc.sum(mine).as_py() or 0)} rows name no host or another "
                        f"host than {host!r}; they are left out")
        tbl = tbl.filter(mine)
    n = tbl.num_rows
    counters = meta.get("counters") or {}
    expected = counters.get("messages")
    if meta.get("closed") and isinstance(expected, int):
        # rows_dropped counts every table's dropped rows: an upper bound for this one
        missing = expected - counters.get("rows_dropped", 0) - n
        if missing > 0:
            problems.append(f"{path}: {missing} of {expected} message rows are missing (a shard deleted "
                            "or unreadable); the rest is used")
    elif meta and not meta.get("closed"):
        problems.append(f"{path}/{META_FILE}: the agent did not close this run dir (still running, or "
                        "killed): rows of its last seconds may be missing")
    if counters.get("rows_dropped"):
        rejected = counters.get("rows_rejected")
        rejected = sum(v for v in rejected.values() if isinstance(v, int)) if isinstance(rejected, dict) else 0
        why = "disk full or too slow" if not rejected else (
            f"{rejected} with values no column could hold, the rest: disk full or too slow" if
            rejected < counters["rows_dropped"] else "values no column could hold")
        problems.append(f"{path}: the agent dropped {counters['rows_dropped']} rows ({why})")
    if n == 0:
        problems.append(f"{path}: host {host!r} has no messages" + _traffic_without_messages(path, host))
    return HostRun(host_id=host, path=path, meta=meta, table=tbl, problems=problems, rows=n)


def _traffic_without_messages(path: Path, host: str) -> str:
    """Why a host has no messages: traced traffic that no parser recognised (the streams
    table), or none traced."""
    n = moved = 0
    for t in host_shards(path, host, "streams", ["host_id", "protocol", "bytes_tx", "bytes_rx"]):
        other = t.filter(pc.equal(t["protocol"], "unrecognised"))
        n += other.num_rows
        moved += (pc.sum(other["bytes_tx"]).as_py() or 0) + (pc.sum(other["bytes_rx"]).as_py() or 0)
    if n:
        return f" it understood: {n:,} connections with {moved:,} bytes traced there, protocol not recognised"
    return " (no traffic traced there)"


def _interval(meta: dict) -> tuple[int, int] | None:
    a, b = meta.get("started_realtime_ns"), meta.get("updated_realtime_ns")
    if isinstance(a, int) and isinstance(b, int):
        return a, max(a, b)
    return None


def _runs(hosts: list[HostRun]) -> list[list[HostRun]]:
    """Groups of run dirs that belong to one run (see the module docstring)."""
    agents: dict[str, list[HostRun]] = {}
    for i, h in enumerate(hosts):
        agents.setdefault(str(h.meta.get("run_id") or f"no run id #{i}"), []).append(h)
    timed, untimed = [], []
    for dirs in agents.values():
        ivs = [iv for h in dirs if (iv := _interval(h.meta)) is not None]
        if ivs:
            timed.append((min(a for a, _ in ivs), max(b for _, b in ivs), len(timed), dirs))
        else:
            untimed.append(dirs)
    groups: list[list[HostRun]] = []
    end = None
    host_end: dict[str, int] = {}     # in the current run: each host's last update
    for a, b, _, dirs in sorted(timed, key=lambda t: t[:3]):
        # a host traced again after its run dir closed (a restart into the same --out)
        # starts another run; the same host at the same time is one run (a copy)
        again = any(a > host_end[h.host_id] for h in dirs if h.host_id in host_end)
        if end is None or a > end + RUN_GAP_TOLERANCE_NS or again:
            groups.append([])
            end, host_end = b, {}
        groups[-1].extend(dirs)
        end = max(end, b)
        for h in dirs:
            host_end[h.host_id] = max(host_end.get(h.host_id, b), b)
    if not groups:
        return [[h for dirs in untimed for h in dirs]]
    # an agent whose times are unknown cannot be told apart: it joins the largest run
    best = max(groups, key=lambda g: sum(h.rows for h in g))
    for dirs in untimed:
        best.extend(dirs)
    return groups


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
    if not hosts:   # one line: what came from the run dirs made safe for a terminal
        raise UserError(safe_text("no usable run dir among " + ", ".join(map(str, dirs)) + "; "
                                  + (problems[0] if problems else "see above"), max_chars=2000))
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
