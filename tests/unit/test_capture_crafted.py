"""Message rows from captures crafted out of the real one (tests/unit/capture_craft.py):
reordering and retransmission change no message; a loss, a start mid-connection, a snap
length and a file cut off lose messages but invent none, and each is counted and said."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import capture_craft as cc
from capture.rundir import write_run_dir
from reports.load import host_shards

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
KEY = ["direction", "local_port", "remote_port", "seq_first", "seq_end"]
WHAT = ["protocol", "control", "request", "op", "call_id", "sender", "recver", "msg_bytes", "num_keys"]


def _rows(path: Path, out: Path) -> tuple[pd.DataFrame, dict, list[str]]:
    meta, problems = write_run_dir("h1", path, out)
    cols = ["host_id"] + KEY + WHAT + ["ts_xmit_last_ns", "ts_netif_rx_last_ns"]
    rows = pd.concat([t.to_pandas() for t in host_shards(out, "h1", "messages", cols)], ignore_index=True)
    return rows, meta, problems


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    return cc.read(DATA / "h1.pcap"), _rows(DATA / "h1.pcap", tmp_path_factory.mktemp("orig") / "rd")[0]


def _same_messages(got: pd.DataFrame, want: pd.DataFrame) -> pd.DataFrame:
    """Every row of `got` is a row of `want` with the same message (none invented)."""
    j = got.merge(want, on=KEY, how="left", suffixes=("", "_want"), indicator=True)
    assert (j._merge == "both").all(), j[j._merge != "both"][KEY]
    for c in WHAT:
        a, b = j[c], j[f"{c}_want"]
        assert ((a == b) | a.isna()).all(), c   # a mid-stream row may lack the sender the READY named
    return j


def test_reordered_and_retransmitted_segments_change_no_message(original, tmp_path):
    recs, want = original
    out = list(recs)
    ix = cc.data_indices(out)
    for a in ix[3::9]:   # each swapped with the next record
        out[a], out[a + 1] = out[a + 1], out[a]
    again = [cc.tail_of(recs[i], 10) for i in ix[7::11] if cc.payload_len(recs[i]) > 10]
    for k, r in enumerate(again):
        out.insert(min(len(out), 20 + 17 * k), r)
    got, meta, problems = _rows(cc.write(tmp_path / "x.pcap", out), tmp_path / "rd")
    assert problems == []
    c = meta["counters"]
    assert c["stream_ahead_segments"] > 0 and c["stream_retransmitted_bytes"] >= sum(map(cc.payload_len, again))
    assert len(got) == len(want)
    _same_messages(got, want)


def test_lost_segments_lose_messages_and_are_counted(original, tmp_path):
    recs, want = original
    flow = cc.busiest_flow(recs)
    ix = cc.data_indices(recs, flow)
    lost = set(ix[10:13]) | {ix[30]}
    got, meta, problems = _rows(cc.write(tmp_path / "x.pcap", [r for i, r in enumerate(recs) if i not in lost]),
                                tmp_path / "rd")
    assert meta["counters"]["stream_lost_bytes"] == sum(cc.payload_len(recs[i]) for i in lost)
    assert any("not in the capture" in p for p in problems)
    assert len(want) - 6 <= len(got) < len(want)
    _same_messages(got, want)


def test_a_capture_that_starts_mid_connection(original, tmp_path):
    """The first 40% of the records gone: no handshake, no READY, no node table. The parsers
    hunt for sync; the messages they find are the original's; ids they cannot know stay null."""
    recs, want = original
    got, meta, problems = _rows(cc.write(tmp_path / "x.pcap", recs[int(len(recs) * 0.4):]), tmp_path / "rd")
    assert problems == []
    assert len(got) >= 0.4 * len(want)
    j = _same_messages(got, want)
    assert j.sender.isna().any()   # the READY that named the sender is not in this capture


def test_a_snap_length_cuts_payload_counted(original, tmp_path):
    recs, want = original
    cut = [[ts, data[:200], wire] if cc.payload_len([ts, data, wire]) > 1000 else [ts, data, wire]
           for ts, data, wire in recs]
    missing = sum(len(a[1]) - len(b[1]) for a, b in zip(recs, cut))
    got, meta, problems = _rows(cc.write(tmp_path / "x.pcap", cut, snaplen=200), tmp_path / "rd")
    assert meta["counters"]["stream_truncated_bytes"] == missing > 0
    assert any("snap length" in p for p in problems)
    _same_messages(got, want)
    assert len(got) > 0.3 * len(want)   # the small messages fit in 200 bytes


def test_a_file_cut_off_mid_record(original, tmp_path):
    recs, want = original
    path = cc.write(tmp_path / "x.pcap", recs)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2 + 7])
    got, meta, problems = _rows(path, tmp_path / "rd")
    assert meta["capture"]["truncated_tail"] and any("ends inside a packet record" in p for p in problems)
    assert 0.3 * len(want) < len(got) < len(want)
    _same_messages(got, want)
