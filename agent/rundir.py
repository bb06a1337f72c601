"""A run dir: one host's view of a traced run (DESIGN.md, "Data flow").

    RUN_DIR/meta.json                 host id, kernel, netns, clock mapping, config,
                                      version, counters; rewritten atomically
    RUN_DIR/<table>-<seq>.parquet     shards, closed every few seconds

Shards are written under a temporary name and renamed when complete, so a
crash (even kill -9) loses at most the rows not yet in a closed shard, and a
reader never sees half a shard. When a write fails (a full disk, most often)
the writer drops that shard's rows, removes its temporary (so that meta.json,
small, still fits), counts them in meta.json's counters (rows_dropped,
shards_failed, meta_write_failures), says so once on stderr and again when
writing resumes, and tries meta.json again at every flush; its memory stays
bounded and it never raises into the tracing loop.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from agent.errors import UserError
from agent.runmeta import MetaError, read_meta_checked
from agent.safefile import open_regular

META_FILE = "meta.json"
SHARD_SUFFIX = ".parquet"
FORMAT_VERSION = 1
BATCH_ROWS = 256   # rows of a typed table converted to Arrow together, before the shard closes


def _write_atomic(path: Path, data: bytes) -> None:
    """Whole or not at all; a failed write leaves the old file and no temporary behind
    (on a full disk the temporary's blocks are what the next try needs)."""
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
    print(f"pslat agent: {msg}", file=sys.stderr, flush=True)


class RunDirWriter:
    """Buffers rows per table and closes a shard every `shard_interval_s`."""

    def __init__(self, path: Path, meta: dict[str, Any], shard_interval_s: float = 2.0,
                 max_buffered_rows: int = 200_000, warn: Callable[[str], None] = _default_warn):
        self.warn = warn
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
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
        self.rows_dropped = 0
        self.shards_failed = 0
        self.meta_write_failures = 0
        self.disk_full = False        # the last write failed; the next flush tries again
        self.write_meta()

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
                self._batches.setdefault(table, []).append(_batch(rows, schema))
                self._rows[table] = []

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last_flush >= self.shard_interval_s:
            self.flush()

    def flush(self) -> None:
        self._last_flush = time.monotonic()
        for table, rows in self._rows.items():
            batches = self._batches.pop(table, [])
            if not rows and not batches:
                continue
            name = f"{table}-{self._seq:06d}{SHARD_SUFFIX}"
            self._seq += 1
            schema = self._schemas.get(table)
            if batches:
                if rows:
                    batches.append(_batch(rows, schema))
                tbl = pa.Table.from_batches(batches, schema=schema)
            else:
                tbl = pa.Table.from_pylist(rows, schema=schema)
            tmp = self.path / f".{name}.tmp"
            try:
                pq.write_table(tbl, tmp)
                os.replace(tmp, self.path / name)
            except OSError as e:   # pyarrow's IO errors are OSErrors too, often without errno
                _unlink_quietly(tmp)   # frees what the half shard took: meta.json must still fit
                self.rows_dropped += tbl.num_rows
                self.shards_failed += 1
                self._failed(f"cannot write a shard to {self.path} ({_why(e)})")
            else:
                self._wrote()
            self._buffered -= tbl.num_rows
            rows.clear()
        self.write_meta()

    def _failed(self, what: str) -> None:
        if not self.disk_full:   # once per episode: one line, not one per shard
            self.warn(f"{what}: dropping rows until it can write again (counted in meta.json as "
                      "counters.rows_dropped); tracing goes on")
        self.disk_full = True

    def _wrote(self) -> None:
        if self.disk_full:
            self.warn(f"writing to {self.path} again ({self.rows_dropped} rows dropped so far)")
        self.disk_full = False

    def write_meta(self) -> None:
        """Rewrites meta.json atomically; on failure the previous one stays, and the next
        flush tries again (so the final counters land once space is back)."""
        c = self.meta["counters"]
        c["rows_dropped"] = self.rows_dropped
        c["shards_failed"] = self.shards_failed
        c["meta_write_failures"] = self.meta_write_failures
        self.meta["disk_full"] = self.disk_full
        self.meta["updated_realtime_ns"] = time.time_ns()
        try:
            _write_atomic(self.path / META_FILE, json.dumps(self.meta, indent=1, sort_keys=True).encode())
        except OSError as e:
            self.meta_write_failures += 1
            self._failed(f"cannot write {self.path / META_FILE} ({_why(e)})")

    def close(self) -> None:
        self.meta["closed"] = True
        self.flush()


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
