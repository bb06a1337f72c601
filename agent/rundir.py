"""A run dir: one host's view of a traced run (DESIGN.md, "Data flow").

    OUT/<host>/meta.json              host id, kernel, netns, clock mapping, config,
                                      version, counters; rewritten atomically
    OUT/<host>/<table>-<seq>.parquet  shards, closed every few seconds
    OUT/<host>.1/, OUT/<host>.2/ ...  later runs into the same OUT (claim_run_dir)

Shards are written under a temporary name, fsynced and renamed when complete, and
the directory is fsynced after meta.json, so a crash (even kill -9 or a power
loss) loses at most the rows not yet in a closed shard, and a reader never sees
half a shard. A restart into the same OUT makes a new run dir beside the old one:
a run never overwrites another's shards.

The writer never raises into the tracing loop. A row that does not fit its
table's columns (a value out of range, of the wrong type) is rejected alone and
counted per table (counters.rows_rejected). When a write fails (a full disk, most
often) the writer drops that shard's rows, removes its temporary (so that
meta.json, small, still fits), counts them in meta.json's counters (rows_dropped:
every row that did not reach a shard, for any reason; shards_failed,
meta_write_failures, fsync_failures), says so once on stderr and again when
writing resumes, and tries meta.json again at every flush; its memory stays
bounded.
"""
from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from core.errors import UserError, say
from agent.runmeta import MetaError, read_meta_checked
from agent.safefile import open_regular

META_FILE = "meta.json"
SHARD_SUFFIX = ".parquet"
FORMAT_VERSION = 2   # 2: protocol-neutral message ids (parsers/protocol.py); 1: ps-lite's own
BATCH_ROWS = 256   # rows of a typed table converted to Arrow together, before the shard closes


def check_out(out: Path) -> None:
    """`--out` before anything is attached or read: a directory (made when missing) in
    which this process can create files; else a UserError saying so."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file, not a directory; give a directory to hold the run dirs "
                        "(one per traced host)")
    try:
        out.mkdir(parents=True, exist_ok=True)
        # root passes every permission check but a read-only mount's or an immutable
        # dir's: only creating a file tells
        fd, probe = tempfile.mkstemp(dir=out, prefix=".pslat-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"--out {out}: cannot create files there ({_why(e)}); give a directory this "
                        "user can write") from None


def claim_run_dir(out: Path, host: str) -> Path:
    """A run dir of this run's own for `host`: OUT/host, or OUT/host.1, OUT/host.2, ...
    when an earlier run's is there (a restart into the same --out, by hand or by a
    service manager), so that no run overwrites another's shards or meta.json. The
    mkdir is exclusive, so the dir is this run's alone; an empty dir (made by hand)
    is taken as it is. When OUT cannot be written it returns OUT/host, whose writer
    counts the rows it cannot write (check_out told the user first)."""
    out = Path(out)
    for n in itertools.count():
        path = out / (host if n == 0 else f"{host}.{n}")
        try:
            path.mkdir(parents=True)
        except FileExistsError:
            if _empty_dir(path):
                return path
            continue
        except OSError:
            return path
        _fsync_dir(out)   # the new entry: a run dir whose name was lost in a crash is lost whole
        return path
    raise AssertionError("unreachable")


def _empty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError:
        return False


def _fsync_dir(path: Path) -> bool:
    """A rename or a new entry is on disk only once its directory is fsynced; False when that failed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def _fsync_file(path: Path) -> None:
    """A file written by path (pyarrow's writer): its data to disk before it is renamed into place."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """Whole or not at all; a failed write leaves the old file and no temporary behind
    (on a full disk the temporary's blocks are what the next try needs). The caller
    fsyncs the directory (once for everything it renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        _unlink_quietly(tmp)
        raise


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass


def _default_warn(msg: str) -> None:
    say("pslat agent", msg)


def _jsonable(o: Any) -> Any:
    """A counter that is not plain JSON (a numpy integer, a set) still lands in meta.json."""
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, (set, frozenset)):
        return sorted(o, key=str)
    return str(o)


class RunDirWriter:
    """Buffers rows per table and closes a shard every `shard_interval_s`. No method
    raises (see the module docstring): what it cannot write is counted and dropped."""

    def __init__(self, path: Path, meta: dict[str, Any], shard_interval_s: float = 2.0,
                 max_buffered_rows: int = 200_000, warn: Callable[[str], None] = _default_warn):
        self.warn = warn
        self.path = Path(path)
        self.meta = dict(meta, format_version=FORMAT_VERSION)
        self.meta.setdefault("counters", {})
        self.shard_interval_s = shard_interval_s
        self.max_buffered_rows = max_buffered_rows
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._batches: dict[str, list[pa.RecordBatch]] = {}   # rows already converted (typed tables)
        self._buffered = 0   # rows held, as dicts or in batches
        self._schemas: dict[str, pa.Schema] = {}
        self._seq = 0
        self._last_flush = time.monotonic()
        self.rows_dropped = 0          # every row that did not reach a shard, for any reason
        self.rows_rejected: dict[str, int] = {}   # table -> rows whose values did not fit its columns
        self.shards_failed = 0
        self.meta_write_failures = 0
        self.fsync_failures = 0        # directory fsyncs that failed: renames may not survive a power loss
        self.disk_full = False        # the last write failed; the next flush tries again
        self._warned: set[str] = set()
        self._made = self._make_dir()
        self.write_meta()

    def _make_dir(self) -> bool:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._failed(f"cannot create {self.path} ({_why(e)})")
            return False
        return True

    def set_schema(self, table: str, schema: pa.Schema) -> None:
        """Fix a table's column types so that shards agree even when a shard's values are all null."""
        self._schemas[table] = schema

    def append(self, table: str, row: dict[str, Any]) -> None:
        rows = self._rows.get(table)
        if rows is None:
            rows = self._rows[table] = []
        if self._buffered >= self.max_buffered_rows:
            # The disk cannot keep up (or is full): drop rather than grow without bound.
            self.rows_dropped += 1
            return
        rows.append(row)
        self._buffered += 1
        if len(rows) >= BATCH_ROWS:
            schema = self._schemas.get(table)
            if schema is not None:
                # into Arrow now, a batch at a time: thousands of row dicts held until the
                # shard closes were walked by every garbage collection (~4x the memory too)
                batches = self._convert(table, rows, schema)
                self._batches.setdefault(table, []).extend(batches)
                self._buffered -= len(rows) - sum(b.num_rows for b in batches)   # the rejected ones
                self._rows[table] = []

    def _convert(self, table: str, rows: list[dict[str, Any]], schema: pa.Schema) -> list[pa.RecordBatch]:
        """Rows -> batches of the table's schema, without the rows that do not convert
        (counted as rejected, each alone): the rest of a batch is not lost for one bad row."""
        rejected: list[BaseException] = []
        batches = _to_batches(rows, schema, rejected)
        if rejected:
            self._reject(table, len(rejected), rejected[0])
        return batches

    def _reject(self, table: str, n: int, e: BaseException) -> None:
        self.rows_rejected[table] = self.rows_rejected.get(table, 0) + n
        self.rows_dropped += n
        self._warn_once(f"reject {table}", f"a {table} row does not fit its columns ({_what(e)}): rejected "
                        f"(counted in meta.json as counters.rows_rejected.{table}); tracing goes on")

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.shard_interval_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        if not self._made:
            self._made = self._make_dir()
        for table in list(self._rows):
            rows, batches = self._rows[table], self._batches.pop(table, [])
            if not rows and not batches:
                continue
            self._rows[table] = []
            # written, rejected or dropped below: none of them stays held
            self._buffered -= len(rows) + sum(b.num_rows for b in batches)
            tbl = self._table(table, rows, batches)
            if tbl is not None and tbl.num_rows:
                self._write_shard(table, tbl)
        self.write_meta()

    def _table(self, table: str, rows: list[dict[str, Any]], batches: list[pa.RecordBatch]) -> pa.Table | None:
        """The shard's rows as one table; None when none of them can be (counted)."""
        schema = self._schemas.get(table)
        if schema is None:
            try:   # types inferred from the rows: a row cannot be told bad on its own
                return pa.Table.from_pylist(rows)
            except Exception as e:
                self._reject(table, len(rows), e)
                return None
        if rows:
            batches = batches + self._convert(table, rows, schema)
        try:
            return pa.Table.from_batches(batches, schema=schema)
        except Exception as e:
            n = sum(b.num_rows for b in batches)
            self.rows_dropped += n
            self.shards_failed += 1
            self._warn_once(f"table {table}", f"cannot assemble a {table} shard ({_what(e)}): {n} rows "
                            "dropped (counted in meta.json as counters.rows_dropped); tracing goes on")
            return None

    def _write_shard(self, table: str, tbl: pa.Table) -> None:
        name = f"{table}-{self._seq:06d}{SHARD_SUFFIX}"
        self._seq += 1
        tmp = self.path / f".{name}.tmp"
        try:
            pq.write_table(tbl, tmp)
            _fsync_file(tmp)
            os.replace(tmp, self.path / name)   # the directory is fsynced after meta.json
        except Exception as e:   # pyarrow's IO errors are OSErrors too, often without errno
            _unlink_quietly(tmp)   # frees what the half shard took: meta.json must still fit
            self.rows_dropped += tbl.num_rows
            self.shards_failed += 1
            if isinstance(e, OSError):
                self._failed(f"cannot write a shard to {self.path} ({_why(e)})")
            else:
                self._warn_once(f"write {table}", f"cannot write a {table} shard to {self.path} ({_what(e)}): "
                                f"{tbl.num_rows} rows dropped (counted in meta.json as counters.rows_dropped); "
                                "tracing goes on")
        else:
            self._wrote()

    def _warn_once(self, key: str, msg: str) -> None:
        """Faults that traced data can repeat at will: one line each, the rest in the counters."""
        if key not in self._warned:
            self._warned.add(key)
            self._say(msg)

    def _say(self, msg: str) -> None:
        try:
            self.warn(msg)
        except Exception:   # stderr gone (a closed pipe): the counters in meta.json still say it
            pass

    def _failed(self, what: str) -> None:
        if not self.disk_full:   # once per episode: one line, not one per shard
            self._say(f"{what}: dropping rows until it can write again (counted in meta.json as "
                      "counters.rows_dropped); tracing goes on")
        self.disk_full = True

    def _wrote(self) -> None:
        if self.disk_full:
            self._say(f"writing to {self.path} again ({self.rows_dropped} rows dropped so far)")
        self.disk_full = False

    def write_meta(self) -> None:
        """Rewrites meta.json atomically, then fsyncs the directory (this flush's shard
        renames with it); on failure the previous one stays, and the next flush tries
        again (so the final counters land once space is back)."""
        c = self.meta["counters"]
        c["rows_dropped"] = self.rows_dropped
        c["rows_rejected"] = dict(self.rows_rejected)
        c["shards_failed"] = self.shards_failed
        c["meta_write_failures"] = self.meta_write_failures
        c["fsync_failures"] = self.fsync_failures
        self.meta["disk_full"] = self.disk_full
        self.meta["updated_realtime_ns"] = time.time_ns()
        try:
            data = json.dumps(self.meta, indent=1, sort_keys=True, default=_jsonable).encode()
            _write_atomic(self.path / META_FILE, data)
        except OSError as e:
            self.meta_write_failures += 1
            self._failed(f"cannot write {self.path / META_FILE} ({_why(e)})")
        except Exception as e:   # meta.json's contents: a bug, but never a stop of the tracing
            self.meta_write_failures += 1
            self._warn_once("meta", f"cannot write {self.path / META_FILE} ({_what(e)}); the previous one "
                            "stays, tried again at every flush")
        if self._made and not _fsync_dir(self.path):
            self.fsync_failures += 1

    def close(self) -> None:
        self.meta["closed"] = True
        self.flush()


def _to_batches(rows: list[dict[str, Any]], schema: pa.Schema, rejected: list[BaseException]) -> list[pa.RecordBatch]:
    """Rows -> batches of this schema, leaving out (into `rejected`) each row that does
    not convert: halves are tried until a bad row is alone, so k bad rows among n cost
    about k * log2(n) conversions and good rows stay in order."""
    try:
        return [_batch(rows, schema)]
    except Exception as e:   # ArrowInvalid, OverflowError, TypeError, ...: whatever the value made pyarrow raise
        if len(rows) <= 1:
            rejected.extend([e] * len(rows))
            return []
        mid = len(rows) // 2
        return _to_batches(rows[:mid], schema, rejected) + _to_batches(rows[mid:], schema, rejected)


def _batch(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    """Rows -> a batch of this schema (a key a row lacks is null), as RecordBatch.from_pylist
    gives it; through a struct array, the rows' dicts are read in C++ (~12% faster)."""
    if schema.metadata:
        return pa.RecordBatch.from_pylist(rows, schema=schema)
    return pa.RecordBatch.from_struct_array(pa.array(rows, type=pa.struct(list(schema))))


def _why(e: OSError) -> str:
    if e.errno is not None:
        return os.strerror(e.errno)
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _what(e: BaseException) -> str:
    """An exception as a short clause for a warning line: its type and first line."""
    first = str(e).splitlines()[0][:200] if str(e) else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


@dataclass
class RunDir:
    """What a reader got from one run dir, with the problems it met (never raised per shard)."""

    path: Path
    meta: dict[str, Any]
    tables: dict[str, Any] = field(default_factory=dict)  # table -> pandas.DataFrame
    problems: list[str] = field(default_factory=list)


def read_meta(path: Path) -> dict[str, Any]:
    """RUN_DIR/meta.json, read and type-checked by agent.runmeta (a field of the wrong type is
    left out; read_run_dir says which); UserError when it cannot be used at all."""
    return _read_meta(path)[0]


def _read_meta(path: Path) -> tuple[dict[str, Any], list[str]]:
    try:
        return read_meta_checked(Path(path) / META_FILE)
    except MetaError as e:
        raise UserError(f"{e}; the run dir cannot be used") from None


def read_run_dir(path: Path) -> RunDir:
    """Reads meta.json and every closed shard; a corrupt shard, or one that is no regular
    file (a FIFO would block the read for good), is named in .problems and skipped."""
    import pandas as pd

    path = Path(path)
    meta, problems = _read_meta(path)
    rd = RunDir(path=path, meta=meta, problems=problems)
    parts: dict[str, list[Any]] = {}
    for shard in sorted(path.glob(f"*{SHARD_SUFFIX}")):
        table = shard.name.rsplit("-", 1)[0]
        try:
            with open_regular(shard) as f:
                parts.setdefault(table, []).append(pq.read_table(f).to_pandas())
        except Exception as e:  # pyarrow raises several types for a damaged file
            rd.problems.append(f"{shard}: unreadable shard skipped ({type(e).__name__}: {e})")
    for table, frames in parts.items():
        rd.tables[table] = pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
    return rd
