"""Records a short psbench job's TCP byte streams from the loopback, for the parser tests.

Runs scheduler, 1 server and 2 workers (workloads.psbench, open loop, with
reconnects and heartbeats) on a loopback address of their own, captures it with
tcpdump, reassembles every TCP direction from the pcap with scapy (by 4-tuple and
initial sequence number: a reconnect on a reused port is a new stream), and saves:

  psbench.streams.bin  the bytes each side of each connection sent, one stream
                       after the other
  psbench.json.gz      per stream: where it is in that file, addresses, ports, ISN;
                       the job's node ids and ports; psbench's ground truth (one row
                       per request slice and process that logged it)

Needs root (tcpdump). Run from the repository root:
  .venv/bin/python tests/data/pslite/record_psbench.py
"""
from __future__ import annotations

import gzip
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from scapy.all import IP, TCP, rdpcap  # noqa: E402

from workloads.psbench.launch import launch  # noqa: E402
from workloads.psbench.options import Workload  # noqa: E402

HERE = Path(__file__).resolve().parent
ADDR = "127.0.0.77"  # a loopback address no other test uses, so the capture is ours alone
WORKLOAD = dict(duration_s=1.0, rate=150.0, reconnect_every=60, heartbeat_interval_s=0.3,
                keys_per_request=24, embedding_dim=4, key_space=100_000)
TRUTH_COLUMNS = ["role", "node_id", "timestamp", "sender", "recver", "op", "num_keys",
                 "req_bytes", "resp_bytes", "new_connection"]


def capture(pcap: Path):
    """Start tcpdump on lo for ADDR; returns once it is listening."""
    p = subprocess.Popen(["tcpdump", "-i", "lo", "-s", "0", "-U", "-w", str(pcap), f"host {ADDR}"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    line = p.stderr.readline().decode()
    if "listening" not in line:
        p.kill()
        raise RuntimeError(f"tcpdump did not start: {line}")
    return p


def drain(pcap: Path, quiet_s: float = 0.5, limit_s: float = 10.0) -> None:
    """Wait until tcpdump has written the job's last packets: the file stops growing."""
    last, since, deadline = -1, time.monotonic(), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        size = pcap.stat().st_size
        if size != last:
            last, since = size, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.05)


def run_job(out: Path) -> dict[int, dict]:
    with socket.socket() as s:
        s.bind((ADDR, 0))
        port = s.getsockname()[1]
    roles = ["scheduler", "server", "worker", "worker"]
    job = launch(out, [(r, None, ADDR) for r in roles], lambda _h, argv, **kw: subprocess.Popen(argv, **kw),
                 (ADDR, port), Workload.from_kwargs(**WORKLOAD), die_with_parent=True)
    with job:
        nodes = job.wait_ready()
        job.wait(timeout_s=60)
        truth = job.truth()
    return nodes, truth


def reassemble(pcap: Path) -> list[dict]:
    """Every TCP direction with payload, as bytes in sequence order."""
    streams: dict[tuple, dict] = {}
    for pkt in rdpcap(str(pcap)):
        if IP not in pkt or TCP not in pkt:
            continue
        ip, tcp = pkt[IP], pkt[TCP]
        key = (ip.src, tcp.sport, ip.dst, tcp.dport)
        if tcp.flags & 0x02:  # SYN: a new connection in this direction
            streams[key] = {"src": ip.src, "sport": tcp.sport, "dst": ip.dst, "dport": tcp.dport,
                            "isn": tcp.seq, "segments": []}
            continue
        n = ip.len - ip.ihl * 4 - tcp.dataofs * 4
        if n <= 0 or key not in streams:
            continue
        st = streams[key]
        off = (tcp.seq - st["isn"] - 1) % (1 << 32)
        st["segments"].append((off, bytes(tcp.payload)[:n]))
        # the next SYN on the same 4-tuple starts a new stream: keep this one under its ISN
        streams[key + (st["isn"],)] = st
    out, seen = [], set()
    for st in streams.values():
        if id(st) in seen or not st["segments"]:
            continue
        seen.add(id(st))
        data = bytearray()
        for off, b in sorted(st["segments"]):
            if off > len(data):
                raise RuntimeError(f"hole in {st['sport']}->{st['dport']} at {len(data)}")
            data[off:off + len(b)] = b  # retransmissions overwrite the same bytes
        out.append({**{k: st[k] for k in ("src", "sport", "dst", "dport", "isn")}, "data": bytes(data)})
    return sorted(out, key=lambda s: (s["isn"], s["sport"]))


def main():
    for old in HERE.glob("psbench.*"):
        old.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        pcap = Path(tmp) / "job.pcap"
        dump = capture(pcap)
        try:
            nodes, truth = run_job(Path(tmp) / "run")
            drain(pcap)
        finally:
            dump.send_signal(signal.SIGINT)  # tcpdump writes what it holds, then exits
            dump.wait(10)
        streams = reassemble(pcap)
    index, blob = [], bytearray()
    for st in streams:
        data = st.pop("data")
        index.append({"offset": len(blob), "length": len(data), **st})
        blob += data
    (HERE / "psbench.streams.bin").write_bytes(bytes(blob))
    rows = truth[TRUTH_COLUMNS].astype(object).where(truth[TRUTH_COLUMNS].notna(), None)
    doc = {"workload": WORKLOAD, "addr": ADDR,
           "nodes": {str(k): {"role": v["role"], "port": v["port"]} for k, v in nodes.items()},
           "streams": index, "truth": rows.to_dict(orient="records")}
    (HERE / "psbench.json.gz").write_bytes(gzip.compress(json.dumps(doc, default=int).encode(), mtime=0))
    print(f"{len(index)} streams, {len(blob)} bytes, {len(rows)} truth rows")


if __name__ == "__main__":
    main()
