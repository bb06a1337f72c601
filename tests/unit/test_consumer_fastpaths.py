"""The consumer's shortcuts give what the general code gives: the parser's gap inside a
skipped frame (against its work loop), the PBMeta cache (against a fresh decode), and
the run dir's Arrow batches (against one conversion of every row at the shard's close)."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import rundir
from agent.records import MESSAGES_SCHEMA
from agent.rundir import BATCH_ROWS, RunDirWriter
from parsers.pslite import message
from parsers.pslite.parser import PsliteStreamParser
from parsers.pslite.states import _GAP

from test_parser_pslite_properties import holes_in, streams

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class WorkLoopParser(PsliteStreamParser):
    """gap() as it was before its shortcut: every gap through the work loop."""

    def gap(self, n_bytes):
        out = self._out = []
        if n_bytes > 0:
            self._gaps += n_bytes
            self._run([(_GAP, n_bytes)])
        return out


def _walk(p, data, holes, feed_cuts):
    """Feed data with these (start, end) byte ranges announced as gaps instead."""
    out, pos = [], 0
    for at, end in holes:
        for c in [c for c in feed_cuts if pos < c < at]:   # chunk edges inside the fed part
            out += p.feed(data[pos:c])
            pos = c
        out += p.feed(data[pos:at]) + p.gap(end - at)
        pos = end
    return out + p.feed(data[pos:]) + p.close()


@SETTINGS
@given(streams, st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 5000)), max_size=8),
       st.lists(st.integers(0, 10**6), max_size=6), st.booleans())
def test_gap_shortcut_gives_what_the_work_loop_gives(stream, gaps, cuts, mid_stream):
    _specs, data, _spans = stream
    holes = holes_in(gaps, len(data))
    cuts = [c % len(data) for c in cuts]
    fast, slow = PsliteStreamParser(mid_stream=mid_stream), WorkLoopParser(mid_stream=mid_stream)
    assert _walk(fast, data, holes, cuts) == _walk(slow, data, holes, cuts)
    assert fast.stats() == slow.stats()


def test_gaps_inside_frames_take_the_shortcut_and_lose_nothing():
    from parsers.pslite.encode import MessageSpec, encode_stream
    specs = [MessageSpec(timestamp=i, push=True, keys=[1, 2, 3], vals=bytes(3000)) for i in range(5)]
    data, spans = encode_stream(specs)
    # every values frame's body announced as a gap, as the walker's Skip: not one through
    # the work loop
    holes = [(end - 2999, end + 1) for _first, end in spans]
    p = PsliteStreamParser()
    p._run = None
    got = _walk(p, data, holes, [])
    assert [(m.first_byte_offset, m.last_byte_offset) for m in got] == spans
    s = p.stats()
    assert (s.gap_bytes, s.lost_bytes, s.unparsed_bytes) == (5 * 3000, 0, 0)


def _metas():
    from parsers.pslite.meta import PBMeta
    real = [PBMeta(head=0, request=r, push=p, simple_app=False, app_id=1, customer_id=0, timestamp=t,
                   data_type=[8, 9]).SerializeToString() for r in (True, False) for p in (True, False)
            for t in (0, 7, 2**31 - 1)]
    garbage = [b"", b"\x00", b"\xff" * 9, b"\x08\x01", real[0][:-1], real[1] + b"\x07"]
    return real + garbage


@pytest.mark.parametrize("body", _metas())
def test_meta_cache_gives_a_fresh_decode(body, monkeypatch):
    monkeypatch.setattr(message, "_meta_cache", {})
    want = message._read_meta(bytes(body))
    for form in (bytes(body), memoryview(body), bytearray(body), bytes(body)):   # the last: a hit
        assert message.read_meta(form) == want
    assert list(message._meta_cache) == [bytes(body)]


def test_meta_cache_keeps_only_small_frames_and_stays_bounded(monkeypatch):
    monkeypatch.setattr(message, "_meta_cache", {})
    monkeypatch.setattr(message, "META_CACHE_MAX", 3)
    big = b"\x08\x01" * (message.META_CACHE_BODY_MAX // 2 + 1)
    message.read_meta(big)
    assert message._meta_cache == {}
    for t in range(5):
        message.read_meta(bytes([0x40, t]))
    assert 0 < len(message._meta_cache) <= 3


def _rows(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        r = {"host_id": "h0", "direction": "tx" if i % 2 else "rx", "pid": i, "seq_first": i,
             "key_sample": [i, i + 1] if i % 3 else [], "ts_framework_ns": None if i % 5 else i * 10,
             "null_reasons": "" if i % 7 else "ts_xmit_last_ns=why"}
        if i % 4:
            r["comm"] = "w"   # a key some rows lack: null there
        rows.append(r)
    return rows


def test_batched_rows_make_the_shard_one_conversion_makes(tmp_path):
    rows = _rows(2 * BATCH_ROWS + 77)
    w = RunDirWriter(tmp_path / "h0", {"host_id": "h0"}, shard_interval_s=3600)
    w.set_schema("messages", MESSAGES_SCHEMA)
    for r in rows:
        w.append("messages", r)
        w.append("untyped", {"i": r["pid"]})
    assert len(w._batches["messages"]) == 2 and "untyped" not in w._batches
    w.close()
    [shard] = (tmp_path / "h0").glob("messages-*.parquet")
    assert pq.read_table(shard).equals(pa.Table.from_pylist(rows, schema=MESSAGES_SCHEMA))
    [other] = (tmp_path / "h0").glob("untyped-*.parquet")
    assert pq.read_table(other).column("i").to_pylist() == list(range(len(rows)))


def test_a_failed_shard_counts_its_batched_rows_and_the_buffer_bound_holds(tmp_path, monkeypatch):
    w = RunDirWriter(tmp_path / "h0", {"host_id": "h0"}, shard_interval_s=3600,
                     max_buffered_rows=BATCH_ROWS + 10, warn=lambda m: None)
    w.set_schema("messages", MESSAGES_SCHEMA)
    for r in _rows(BATCH_ROWS + 15):
        w.append("messages", r)
    assert w.rows_dropped == 5
    monkeypatch.setattr(rundir.pq, "write_table", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full")))
    w.flush()
    assert (w.rows_dropped, w.shards_failed, w._buffered) == (5 + BATCH_ROWS + 10, 1, 0)
    monkeypatch.undo()
    w.append("messages", _rows(1)[0])   # room again once the failed rows are gone
    w.close()
    assert w.rows_dropped == 5 + BATCH_ROWS + 10
    assert len(pq.read_table(next((tmp_path / "h0").glob("messages-*.parquet")))) == 1
