"""`pslat agent --replay` on damaged or hostile recordings (issue 11): a header that is
not what a recording's is gives one clear line (a UserError), never a traceback; and a
traced peer's out-of-range ZMQ identity leaves a complete run dir."""
from __future__ import annotations

import gzip
import json
import struct

import pytest

from agent.daemon import replay
from core.errors import UserError
from agent.rundir import read_run_dir
from agent.sources import RECORD_MAGIC, RECORD_VERSION, RecordWriter, read_recording
from parsers.pslite.encode import MessageSpec, encode_stream
from test_agent_decode import ISN_C, record


def _recording(path, header_bytes: bytes, n: int | None = None) -> None:
    n = len(header_bytes) if n is None else n
    path.write_bytes(RECORD_MAGIC + struct.pack("<II", RECORD_VERSION, n) + header_bytes)


@pytest.mark.parametrize("header", [
    b"[]", b'"x"', b"{}", b'{"probes": "sockcalls"}', b'{"probes": [1]}', b'{"probes": []}',
    b'{"probes": ["sockcalls"], "netns_names": {"x": "h"}}',
    b'{"probes": ["sockcalls"], "netns_names": []}',
    b'{"probes": ["sockcalls"], "host_id": 5}',
    b'{"probes": ["sockcalls"], "config": []}',
    b'{"probes": ["sockcalls"], "config": {"probes": 3}}',
    b'{"probes": ["sockcalls"], "sockcall_format": "bogus"}',
    b"[" * 100_000,                  # deeper than the JSON decoder recurses
    b"\xff\xfe{}",                   # not UTF-8
])
def test_a_bad_header_is_one_clear_line(tmp_path, header):
    path = tmp_path / "bad.rec"
    _recording(path, header)
    with pytest.raises(UserError) as e:
        replay(path, tmp_path / "out")
    assert "header is corrupt" in str(e.value) and "\n" not in str(e.value)


def test_a_header_length_past_any_header_is_refused_unread(tmp_path):
    path = tmp_path / "huge.rec"
    _recording(path, b"{}", n=2**32 - 1)
    with pytest.raises(UserError, match="header is corrupt"):
        read_recording(path)


def test_a_damaged_compressed_recording_ends_at_its_last_whole_event(tmp_path):
    good = gzip.compress(RECORD_MAGIC + struct.pack("<II", RECORD_VERSION, 26)
                         + b'{"probes": ["sockcalls"]} ' + b"\x00\x00\x00\x00\x04\x00\x00\x00abcd" * 4000)
    path = tmp_path / "damaged.rec.gz"
    path.write_bytes(good[:len(good) // 2] + bytes(64) + good[len(good) // 2 + 64:])
    header, events = read_recording(path)
    assert header["probes"] == ["sockcalls"]
    got = list(events)   # before: zlib.error or BadGzipFile out of the iterator
    assert len(got) < 4000 and set(got) <= {("sockcalls", b"abcd")}


def test_an_out_of_range_identity_leaves_a_complete_run_dir(tmp_path):
    """Issue 11, finding 2: READY with identity ps3000000000 (3e9 does not fit the
    int32 `sender` column). Before: the writer raised on every append, no shard was
    written and meta.json was never closed. This test depends on the parser half
    (parsers.pslite.meta.node_id_of_identity refuses the id and the parser counts it):
    the writer never sees the value. The writer half (agent/rundir.py never raising)
    is tested where it is made."""
    specs = [MessageSpec(timestamp=i, keys=[i], vals=b"\0" * 4) for i in range(3)]
    data, _ = encode_stream(specs, identity=b"ps3000000000")
    rec = tmp_path / "hostile.rec"
    w = RecordWriter(rec, {"probes": ["sockcalls"], "sockcall_format": "prefix", "host_id": "victim",
                           "netns_names": {}})
    for at in range(0, len(data), 200):
        w.write("sockcalls", record(True, ISN_C + 1 + at, len(data[at:at + 200]), data[at:at + 200],
                                    ts=1_000_000 + at))
    w.close()
    pipeline, _ = replay(rec, tmp_path / "out")
    rd = read_run_dir(tmp_path / "out" / "victim")
    assert rd.meta["closed"] is True
    msgs = rd.tables["messages"]
    assert list(msgs.call_id) == [0, 1, 2] and msgs.sender.isna().all()
    assert rd.meta["counters"]["values_rejected"] == 1
    assert rd.meta["counters"]["events_undecodable"] == {}
