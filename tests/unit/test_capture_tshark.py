"""pslat's TCP reassembly against Wireshark's (issue 17, item 4): tshark, from outside the
code under test, dissects the same captures through pyshark (which streams, which
packets are retransmissions, out of order, after a lost segment) and follows each
stream (`-z follow,tcp,raw`: its own reassembly of each direction's bytes). pslat's
reassembly must give the same streams, the same bytes in each direction, and count
what tshark flags: on a real capture, and on one crafted from it with segments
reordered, sent twice (whole and in part) and lost."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pyshark
import pytest

import capture_craft as cc
from capture.decode import COUNTERS, decode
from capture.point import CapturePoint
from capture.read import CaptureReader
from parsers.protocol import ParserStats

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"


class Collector:
    """A stream parser that keeps what reassembly hands it: bytes, and gaps."""
    PROTOCOL = None

    def __init__(self, **_):
        self.data = bytearray()
        self.gaps = 0

    def feed(self, data):
        self.data += data
        return []

    def gap(self, n):
        self.gaps += n
        return []

    def close(self):
        return []

    def recognised(self):
        return False

    def stats(self):
        return ParserStats(len(self.data), self.gaps, 0, 0, len(self.data), 0, 0, 0, 0, 0)


def _pslat(path: Path):
    """{(src, sport, dst, dport): Collector} and the point's counters, as pslat reassembles it."""
    parsers = {}

    def make(src, dst, **_):
        return parsers.setdefault((*src, *dst), Collector())

    point = CapturePoint("p", lambda table, row: None, set(), make_parser=make)
    counts = dict.fromkeys(COUNTERS, 0)
    with CaptureReader(path) as r:
        for ts, link, data, wire_len in r:
            s = decode(link, data, wire_len, ts, counts)
            if s is not None:
                point.segment(s)
    point.finish()
    return parsers, point.stats.directions


def _tshark_packets(path: Path):
    """Per packet with payload, as tshark dissects it: stream, flow, length and analysis flags."""
    out = []
    cap = pyshark.FileCapture(str(path), display_filter="tcp.len > 0", keep_packets=False)
    try:
        for p in cap:
            t = p.tcp
            flags = {f.removeprefix("analysis_") for f in t.field_names if f.startswith("analysis_")}
            out.append({"stream": int(t.stream), "flow": (p.ip.src, int(t.srcport), p.ip.dst, int(t.dstport)),
                        "len": int(t.len), "flags": flags})
    finally:
        cap.close()
    return out


MISSING = re.compile(rb"\[(\d+) bytes missing in capture file\]\x00?")   # as a C string


def _tshark_follow(path: Path, streams: int) -> dict[tuple, tuple[bytes, int]]:
    """Each direction's bytes as tshark's follow reassembles them, and the bytes it says are
    missing (it writes "[N bytes missing in capture file]" in their place):
    {(src, sport, dst, dport): (bytes, missing)}."""
    argv = ["tshark", "-r", str(path), "-q"]
    for i in range(streams):
        argv += ["-z", f"follow,tcp,raw,{i}"]
    text = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    out: dict[tuple, bytearray] = {}
    nodes: list[tuple] = []
    for line in text.splitlines():
        if line.startswith("Node "):
            host, port = line.split(": ", 1)[1].rsplit(":", 1)
            nodes.append((host, int(port)))
            if len(nodes) == 2:
                a, b = nodes
                out.setdefault((*a, *b), bytearray())
                out.setdefault((*b, *a), bytearray())
        elif line.startswith("===") or line.startswith("Follow") or line.startswith("Filter"):
            if line.startswith("==="):
                nodes = []
        elif line.strip() and len(nodes) == 2:
            a, b = nodes if not line.startswith("\t") else nodes[::-1]
            out[(*a, *b)] += bytes.fromhex(line.strip())
    return {k: (MISSING.sub(b"", bytes(v)), sum(int(n) for n in MISSING.findall(bytes(v)))) for k, v in out.items()}


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """h1.pcap with, in its busiest flow: two pairs of segments swapped, one segment sent
    again whole and one again without its first 100 bytes, two segments lost."""
    recs = cc.read(DATA / "h1.pcap")
    ix = cc.data_indices(recs, cc.busiest_flow(recs))
    out = list(recs)
    for a in (ix[5], ix[20]):   # swapped with the next segment of its flow
        b = ix[ix.index(a) + 1]
        out[a], out[b] = out[b], out[a]
    full = [i for i in ix[25:38] if cc.payload_len(recs[i]) > 1000]
    again = [out[full[0]], cc.tail_of(out[full[1]], 100)]
    lost = {ix[40], ix[41]}
    out = [r for i, r in enumerate(out) if i not in lost]
    at = out.index(recs[ix[36]])
    out[at + 1:at + 1] = again
    lost_bytes = sum(cc.payload_len(recs[i]) for i in lost)
    again_bytes = sum(cc.payload_len(r) for r in again)
    return cc.write(tmp_path_factory.mktemp("crafted") / "crafted.pcap", out), lost_bytes, again_bytes


@pytest.mark.parametrize("which", ["recorded", "crafted"])
def test_same_streams_and_bytes_as_tshark(which, crafted):
    path = DATA / "h1.pcap" if which == "recorded" else crafted[0]
    packets = _tshark_packets(path)
    streams = {p["stream"] for p in packets}
    follow = _tshark_follow(path, max(streams) + 1)
    mine, stats = _pslat(path)
    moved = {k for k, c in mine.items() if c.data or c.gaps}
    assert moved == {p["flow"] for p in packets}                # the same directions carry bytes
    assert {k: (bytes(c.data), c.gaps) for k, c in mine.items() if k in moved} == {k: follow[k] for k in moved}
    # what tshark flags, pslat counts (tshark takes a late segment for a retransmission and the
    # one before it for a loss: its flags bound pslat's counts, they do not equal them)
    again = sum(p["len"] for p in packets if "retransmission" in p["flags"])
    after_hole = sum(1 for p in packets if "lost_segment" in p["flags"])
    assert stats.lost_bytes == sum(c.gaps for c in mine.values()) == sum(m for _, m in follow.values())
    if which == "recorded":
        assert again == after_hole == stats.lost_bytes == stats.retransmitted_bytes == stats.ahead_segments == 0
    else:
        _, lost_bytes, again_bytes = crafted
        assert stats.lost_bytes == lost_bytes and stats.retransmitted_bytes == again_bytes <= again
        assert after_hole == 3 and stats.ahead_segments >= 2
