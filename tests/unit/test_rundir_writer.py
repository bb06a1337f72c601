"""The run-dir writer never raises into the tracing loop (issue 11, findings 2 and 6):
a row whose value does not fit its column is rejected alone and counted, any
exception in conversion or write costs only the rows it hit, and what it closes
(shards, meta.json, the directory entries) is fsynced."""
import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import agent.rundir as rundir
from agent.records import MESSAGES_SCHEMA
from agent.rundir import BATCH_ROWS, RunDirWriter, read_run_dir
from parsers.registry import upgrade_messages

DATA = Path(__file__).resolve().parents[1] / "data" / "agent"
INT32_TOO_BIG = 3_000_000_000   # a ZMQ identity `ps3000000000` parsed as a sender


def recorded_rows() -> list[dict]:
    """Message rows the agent wrote from a real psbench recording (386 rows; written in
    run-dir format 1: in today's columns)."""
    return upgrade_messages(pq.read_table(DATA / "psbench.messages.parquet")).to_pylist()


def writer(path: Path, lines: list | None = None) -> RunDirWriter:
    w = RunDirWriter(path, {"host_id": "h0"}, shard_interval_s=3600,
                     warn=(lines.append if lines is not None else lambda m: None))
    w.set_schema("messages", MESSAGES_SCHEMA)
    return w


def test_a_row_that_does_not_fit_its_column_is_rejected_alone(tmp_path):
    rows = recorded_rows() * 2          # 772 rows: three whole batches and a partial one
    bad = {5, BATCH_ROWS + 7, len(rows) - 1}   # in a converted batch, another, the last (partial) one
    for i in bad:
        rows[i] = dict(rows[i], sender=INT32_TOO_BIG)
    lines: list[str] = []
    w = writer(tmp_path / "h0", lines)
    for r in rows:
        w.append("messages", r)
    w.flush()
    w.append("messages", recorded_rows()[0])   # the writer goes on after it
    w.close()
    rd = read_run_dir(tmp_path / "h0")
    good = [r for i, r in enumerate(rows) if i not in bad] + [recorded_rows()[0]]
    got = rd.tables["messages"]
    assert len(got) == len(good) and rd.problems == []
    for col in ("conn_id", "call_id", "ts_recv_last_exit_ns"):   # in order, none lost
        assert [None if pd.isna(x) else x for x in got[col]] == [r[col] for r in good], col
    c = rd.meta["counters"]
    assert rd.meta["closed"] is True
    assert c["rows_rejected"] == {"messages": 3} and c["rows_dropped"] == 3, c
    assert len(lines) == 1 and "messages" in lines[0] and "rows_rejected" in lines[0], lines


def test_a_value_of_the_wrong_type_is_rejected_alone(tmp_path):
    rows = recorded_rows()[:10]
    rows[3] = dict(rows[3], pid="not a pid")
    rows[4] = dict(rows[4], key_sample=[-1])        # uint64 list
    rows[6] = "not a row"
    w = writer(tmp_path / "h0")
    for r in rows:
        w.append("messages", r)
    w.close()
    rd = read_run_dir(tmp_path / "h0")
    assert len(rd.tables["messages"]) == 7
    assert rd.meta["counters"]["rows_rejected"] == {"messages": 3}


def test_a_table_without_schema_that_cannot_convert_is_dropped_and_counted(tmp_path):
    w = RunDirWriter(tmp_path / "h0", {"host_id": "h0"}, shard_interval_s=3600, warn=lambda m: None)
    w.append("notes", {"x": 1})
    w.append("notes", {"x": "one"})    # no schema: its type cannot be inferred
    w.append("messages", {"i": 1})
    w.close()
    rd = read_run_dir(tmp_path / "h0")
    assert list(rd.tables["messages"]["i"]) == [1] and "notes" not in rd.tables
    assert rd.meta["counters"]["rows_rejected"] == {"notes": 2}
    assert rd.meta["counters"]["rows_dropped"] == 2


ERRORS = [pa.ArrowInvalid("bad"), pa.ArrowTypeError("bad"), OverflowError("bad"), TypeError("bad"),
          ValueError("bad"), RuntimeError("bad"), MemoryError(), KeyError("bad"), OSError("bad")]


@pytest.mark.parametrize("error", ERRORS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("where", ["convert", "table", "write", "meta"])
def test_any_exception_in_conversion_or_write_never_raises(tmp_path, monkeypatch, where, error):
    """Whatever fails, and however, the writer counts what it lost, goes on, and closes
    meta.json once the fault is gone."""
    fault = {"on": True}

    def failing(real):
        def f(*a, **k):
            if fault["on"]:
                raise error
            return real(*a, **k)
        return f

    if where == "table":   # pyarrow's classes are immutable: the module the writer sees is swapped
        class Table:
            from_pylist = staticmethod(pa.Table.from_pylist)
            from_batches = staticmethod(failing(pa.Table.from_batches))

        class Pyarrow:
            def __getattr__(self, name):
                return Table if name == "Table" else getattr(pa, name)

        monkeypatch.setattr(rundir, "pa", Pyarrow())
    else:
        target = {"convert": (rundir, "_batch"), "write": (rundir.pq, "write_table"),
                  "meta": (rundir.json, "dumps")}[where]
        monkeypatch.setattr(*target, failing(getattr(*target)))
    rows = recorded_rows()
    w = writer(tmp_path / "h0")
    for r in rows:                      # a batch converted in append, the rest at flush
        w.append("messages", r)
    w.flush()
    lost = w.rows_dropped
    fault["on"] = False
    for r in rows:
        w.append("messages", r)
    w.close()
    rd = read_run_dir(tmp_path / "h0")
    c = rd.meta["counters"]
    assert rd.meta["closed"] is True
    if where == "meta":
        assert lost == 0 and c["meta_write_failures"] >= 1
    else:
        assert lost > 0 and c["rows_dropped"] == lost
    assert len(rd.tables["messages"]) == 2 * len(rows) - lost


def test_a_warning_that_cannot_be_printed_does_not_raise(tmp_path):
    def closed_stderr(msg):   # `pslat agent ... 2>&1 | head` once head is gone
        raise BrokenPipeError(32, "Broken pipe")

    rows = recorded_rows()
    rows[1] = dict(rows[1], sender=INT32_TOO_BIG)
    (tmp_path / "file").write_text("in the way")
    for path in (tmp_path / "h0", tmp_path / "file" / "h0"):   # a rejected row; a dir it cannot make
        w = RunDirWriter(path, {"host_id": "h0"}, shard_interval_s=3600, warn=closed_stderr)
        w.set_schema("messages", MESSAGES_SCHEMA)
        for r in rows:
            w.append("messages", r)
        w.close()
        assert w.rows_dropped >= 1
    assert len(read_run_dir(tmp_path / "h0").tables["messages"]) == len(rows) - 1


def test_a_run_dir_that_cannot_be_made_does_not_raise(tmp_path):
    (tmp_path / "file").write_text("in the way")
    w = writer(tmp_path / "file" / "h0")
    w.append("messages", recorded_rows()[0])
    w.close()
    assert w.rows_dropped == 1 and w.shards_failed == 1 and w.meta_write_failures >= 1


def test_shards_meta_and_their_directory_are_fsynced(tmp_path, monkeypatch):
    """Each shard and meta.json reach the disk before they are renamed into place, and
    the directory after (the rename itself is durable only then); a new run dir's
    entry in --out too."""
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(a, b):
        events.append(("replace", f"{a} -> {b}"))
        return real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    out = tmp_path / "out"
    run_dir = rundir.claim_run_dir(out, "h0")
    w = writer(run_dir)
    for r in recorded_rows():
        w.append("messages", r)
    events.clear()
    w.close()
    d = str(run_dir)
    shard = d + "/messages-000000.parquet"
    tmp, meta_tmp = d + "/.messages-000000.parquet.tmp", d + "/.meta.json.tmp"
    assert events.index(("fsync", tmp)) < events.index(("replace", f"{tmp} -> {shard}"))
    assert events.index(("fsync", meta_tmp)) < events.index(("replace", f"{meta_tmp} -> {d}/meta.json"))
    last_rename = max(i for i, e in enumerate(events) if e[0] == "replace")
    assert ("fsync", d) in events[last_rename:], events
    assert json.loads((run_dir / "meta.json").read_text())["closed"] is True
    events.clear()
    rundir.claim_run_dir(out, "h0")    # a new run dir: its entry in out is made durable
    assert ("fsync", str(out)) in events, events
