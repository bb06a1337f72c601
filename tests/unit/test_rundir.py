"""Run dir writer/reader: shards survive, corrupt shards are named, meta is required."""
import json

import pytest

from core.errors import UserError
from agent.rundir import RunDirWriter, read_run_dir


def test_shards_roundtrip(tmp_path):
    w = RunDirWriter(tmp_path / "h0", {"host_id": "h0"}, shard_interval_s=3600)
    for i in range(10):
        w.append("messages", {"i": i, "ts_ns": 1000 + i})
    w.flush()
    w.append("messages", {"i": 10, "ts_ns": 1010})
    w.close()
    rd = read_run_dir(tmp_path / "h0")
    assert list(rd.tables["messages"]["i"]) == list(range(11))
    assert rd.meta["closed"] is True and rd.problems == []


def test_unclosed_rows_lost_but_closed_shards_readable(tmp_path):
    w = RunDirWriter(tmp_path / "h0", {"host_id": "h0"}, shard_interval_s=3600)
    w.append("messages", {"i": 1})
    w.flush()
    w.append("messages", {"i": 2})  # never flushed: as after a kill -9
    rd = read_run_dir(tmp_path / "h0")
    assert list(rd.tables["messages"]["i"]) == [1]
    assert "closed" not in rd.meta


def test_corrupt_shard_is_named(tmp_path):
    w = RunDirWriter(tmp_path / "h0", {"host_id": "h0"})
    w.append("messages", {"i": 1})
    w.close()
    (tmp_path / "h0" / "messages-999999.parquet").write_bytes(b"PAR1garbage")
    rd = read_run_dir(tmp_path / "h0")
    assert len(rd.tables["messages"]) == 1
    assert len(rd.problems) == 1 and "messages-999999.parquet" in rd.problems[0]


def test_missing_or_truncated_meta(tmp_path):
    with pytest.raises(UserError, match="meta.json is missing"):
        read_run_dir(tmp_path)
    (tmp_path / "meta.json").write_text(json.dumps({"host_id": "h0"})[:-3])
    with pytest.raises(UserError, match="corrupt"):
        read_run_dir(tmp_path)


def test_buffer_bounded(tmp_path):
    w = RunDirWriter(tmp_path / "h0", {"host_id": "h0"}, max_buffered_rows=5)
    for i in range(8):
        w.append("messages", {"i": i})
    assert w.rows_dropped == 3
    w.close()
    assert read_run_dir(tmp_path / "h0").meta["counters"]["rows_dropped"] == 3
