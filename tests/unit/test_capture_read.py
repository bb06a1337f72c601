"""The capture reader against files written by other writers: editcap (Wireshark's) turns
the recorded capture into microsecond pcap, nanosecond pcap and pcapng; a big-endian
pcap is written here by hand. Each must give the same records, times to the precision
the format keeps."""
from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from capture.read import CaptureReader

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"


def _records(path: Path) -> list[tuple[int, int, bytes, int]]:
    with CaptureReader(path) as r:
        out = [(ts, link, bytes(data), wire) for ts, link, data, wire in r]
        assert not r.stats.truncated_tail and not r.stats.corrupt
    return out


@pytest.fixture(scope="module")
def original():
    return _records(DATA / "h1.pcap")


@pytest.mark.parametrize("fmt, tick_ns", [("pcap", 1000), ("nsecpcap", 1), ("pcapng", 1)])
def test_files_written_by_editcap(tmp_path, original, fmt, tick_ns):
    out = tmp_path / f"x.{fmt}"
    subprocess.run(["editcap", "-F", fmt, str(DATA / "h1.pcap"), str(out)], check=True, capture_output=True)
    got = _records(out)
    assert [(ts // tick_ns, link, data, wire) for ts, link, data, wire in got] == \
        [(ts // tick_ns, link, data, wire) for ts, link, data, wire in original]


def test_a_big_endian_pcap(tmp_path, original):
    out = tmp_path / "be.pcap"
    with open(out, "wb") as f:
        f.write(struct.pack(">IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1))
        for ts, _link, data, wire in original:
            f.write(struct.pack(">IIII", ts // 10**9, ts % 10**9, len(data), wire) + data)
    assert _records(out) == original
