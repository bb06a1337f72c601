"""How fast captures are read: `python -m bench.capture [--mb 1000]` (no root).

The fixed traffic mix: the worker's capture of tests/data/capture (psbench, 64 keys a
request, pushes of 2.8 KB and their 16-byte answers, pulls answered with 2.8 KB,
heartbeats, handshakes: ~490 bytes a packet), repeated with other addresses per copy
(so each copy is connections of its own, as a long capture of many hosts) and later
times, up to --mb MB. On that one file, page cache warm, each reader in turn:

1. framing only (every record's time and bytes): scapy's RawPcapReader, dpkt's
   pcap.Reader (when importable), capture.read.CaptureReader;
2. framing and headers to TCP segments (addresses, ports, seq, flags, payload): dpkt's
   Ethernet objects, scapy's dissection (on the first 20,000 packets: it is the slowest
   by far), capture.decode;
3. the whole capture -> a run dir, as `pslat report CAPTURE` does before the report
   (capture.rundir.write_run_dir: both passes, reassembly, the protocols' parsers, rows).

Prints MB/s and packets/s of each, then one JSON line (last). The target (issue 17):
1 GB in at most 60 s.
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

from capture.decode import COUNTERS, decode
from capture.read import CaptureReader
from capture.rundir import write_run_dir

ROOT = Path(__file__).resolve().parents[1]
MIX = ROOT / "tests" / "data" / "capture" / "h1.pcap"
SCAPY_DISSECT_PACKETS = 20_000
IP_SRC, IP_DST = 14 + 12, 14 + 16   # Ethernet + the IPv4 header's address fields


def build_mix(out: Path, megabytes: float) -> tuple[int, int]:
    """The fixed mix (module docstring) in `out`; returns (bytes, packets)."""
    with CaptureReader(MIX) as r:
        recs = [(ts, bytes(data), wire) for ts, _link, data, wire in r]
    span = recs[-1][0] - recs[0][0] + 1_000_000
    target = int(megabytes * 1e6)
    size, packets, copy = 24, 0, 0
    with open(out, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1))
        while size < target:
            # copy n: addresses 10.<n / 256>.<n % 256>.{1,2}, times n spans later
            hi, lo = divmod(copy % 65536, 256)
            shift = copy * span
            for ts, data, wire in recs:
                b = bytearray(data)
                if len(b) >= IP_DST + 4 and b[12:14] == b"\x08\x00":
                    b[IP_SRC + 1], b[IP_SRC + 2] = hi, lo
                    b[IP_DST + 1], b[IP_DST + 2] = hi, lo
                t = ts + shift
                f.write(struct.pack("<IIII", t // 10**9, t % 10**9, len(b), wire))
                f.write(b)
                size += 16 + len(b)
                packets += 1
            copy += 1
    return size, packets


def _timed(fn) -> tuple[float, int]:
    t = time.perf_counter()
    n = fn()
    return time.perf_counter() - t, n


def frame_ours(path: Path) -> int:
    with CaptureReader(path) as r:
        return sum(1 for _ in r)


def frame_scapy(path: Path) -> int:
    from scapy.utils import RawPcapReader
    with RawPcapReader(str(path)) as r:
        return sum(1 for _ in r)


def frame_dpkt(path: Path) -> int:
    import dpkt
    with open(path, "rb") as f:
        return sum(1 for _ in dpkt.pcap.Reader(f))


def decode_ours(path: Path) -> int:
    counts = dict.fromkeys(COUNTERS, 0)
    n = 0
    with CaptureReader(path) as r:
        for ts, link, data, wire in r:
            if decode(link, data, wire, ts, counts) is not None:
                n += 1
    return n


def decode_dpkt(path: Path) -> int:
    import dpkt
    n = 0
    with open(path, "rb") as f:
        for _ts, buf in dpkt.pcap.Reader(f):
            ip = dpkt.ethernet.Ethernet(buf).data
            if isinstance(ip, dpkt.ip.IP) and isinstance(ip.data, dpkt.tcp.TCP):
                n += 1
    return n


def decode_scapy(path: Path) -> int:
    from scapy.layers.inet import TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import RawPcapReader
    n = 0
    with RawPcapReader(str(path)) as r:
        for i, (buf, _meta) in enumerate(r):
            if i == SCAPY_DISSECT_PACKETS:
                break
            if TCP in Ether(buf):
                n += 1
    return n


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1000, help="size of the mix in MB (default 1000)")
    a = ap.parse_args(argv)
    results: dict = {"mb": a.mb}
    with tempfile.TemporaryDirectory(prefix="pslat-bench-capture-") as tmp:
        path = Path(tmp) / "mix.pcap"
        size, packets = build_mix(path, a.mb)
        mb = size / 1e6
        print(f"mix: {mb:,.0f} MB, {packets:,} packets ({size / packets:.0f} bytes each) from {MIX.name}")
        frame_ours(path)   # page cache warm for every reader
        try:
            import dpkt  # noqa: F401
            have_dpkt = True
        except ImportError:
            have_dpkt = False
            print("dpkt: not installed (pip install dpkt to compare)")
        runs = [("frame", "pslat", frame_ours), ("frame", "scapy RawPcapReader", frame_scapy)]
        if have_dpkt:
            runs += [("frame", "dpkt pcap.Reader", frame_dpkt), ("decode", "dpkt Ethernet/IP/TCP", decode_dpkt)]
        runs += [("decode", "scapy Ether()", decode_scapy), ("decode", "pslat capture.decode", decode_ours)]
        for step, name, fn in runs:
            s, n = _timed(lambda: fn(path))
            part = n / packets if fn is decode_scapy else 1.0   # scapy's dissection: a prefix only
            rate_mb = mb * (SCAPY_DISSECT_PACKETS / packets if fn is decode_scapy else 1.0) / s
            pps = (SCAPY_DISSECT_PACKETS if fn is decode_scapy else packets) / s
            results[f"{step}:{name}"] = {"s": round(s, 3), "mb_per_s": round(rate_mb, 1), "packets_per_s": round(pps)}
            print(f"{step:7s} {name:24s} {rate_mb:9,.1f} MB/s {pps:12,.0f} packets/s"
                  + (f"  (first {SCAPY_DISSECT_PACKETS:,} packets)" if fn is decode_scapy else f"  {s:7.2f} s")
                  + ("" if part else ""))
        s, meta = _timed(lambda: write_run_dir("bench", path, Path(tmp) / "rd")[0])
        c = meta["counters"]
        results["run_dir"] = {"s": round(s, 3), "mb_per_s": round(mb / s, 1), "packets_per_s": round(packets / s),
                              "messages": c["messages"], "connections": c["connections"],
                              "s_per_gb": round(s / mb * 1000, 1)}
        print(f"capture -> run dir (pslat report's reading) {mb / s:,.1f} MB/s {packets / s:,.0f} packets/s  "
              f"{s:.1f} s: {c['messages']:,} message rows, {c['connections']:,} connections; "
              f"{s / mb * 1000:.1f} s per GB (target: at most 60)")
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
