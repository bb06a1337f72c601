"""Records real captures of a psbench job in the virtual cluster for the capture unit tests.

psbench (1 server with the scheduler on h0, 1 worker on h1, open loop, a 1 ms wire)
runs while tcpdump captures eth0 in both hosts (nanosecond times, snap length 0).
Saved next to this file:

  h0.pcap, h1.pcap      the two capture points (the server's host, the worker's)
  h0.pcapng             dumpcap on h0's eth0 and lo at once: a pcapng with two
                        interfaces (the scheduler and the server talk over lo)
  h1-any.pcap           tcpdump -i any on h1: Linux cooked (SLL2) frames
  agent/                `pslat agent` tracing both hosts meanwhile (its run dirs): the
                        report of the same traffic from BPF, to compare with
  truth.parquet         psbench's own log: every request with its ids and sizes
  recording.json        how they were made

The tcpdump helpers are shared with tests/privileged/test_capture_agent.py. Needs
root; run from the repository root:
  /work/main/.venv/bin/python tests/data/capture/record.py
"""
from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

MARKER_PORT = 9
MARKER = b"pslat-capture-end-marker"
WORKLOAD = dict(keys_per_request=64, embedding_dim=8, duration_s=1.0, rate=30, key_space=10_000)


FILTER = f"tcp or udp port {MARKER_PORT}"


def start_tcpdump(cluster, host: str, pcap: Path, interface: str = "eth0") -> subprocess.Popen:
    """tcpdump on the host's eth0, ready once it says it is listening (its ready signal)."""
    return _start(cluster, host, ["tcpdump", "-i", interface, "-U", "-s", "0", "-B", "65536",
                                  "--time-stamp-precision", "nano", "-w", str(pcap), FILTER], "listening on")


def start_dumpcap(cluster, host: str, pcapng: Path, interfaces: list[str]) -> subprocess.Popen:
    """dumpcap on several interfaces into one pcapng, ready once it says it is capturing."""
    argv = ["dumpcap", "-q", "-f", FILTER, "-w", str(pcapng)]
    for i in interfaces:
        argv += ["-i", i]
    return _start(cluster, host, argv, "Capturing on")


def _start(cluster, host: str, argv: list[str], ready: str) -> subprocess.Popen:
    cap = cluster.popen(host, argv, stderr=subprocess.PIPE, text=True)
    for line in cap.stderr:
        if ready in line:
            return cap
    raise RuntimeError(f"{argv[0]} in {host} did not start: rc={cap.wait()}")


def stop_tcpdump(cluster, host: str, peer_addr: str, cap: subprocess.Popen, pcap: Path) -> None:
    """tcpdump drops what is still in its ring when interrupted: a marker datagram goes out
    after the job, and tcpdump is stopped once the marker is on file (it writes in order)."""
    cluster.run(host, [sys.executable, "-c", "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                       f".sendto({MARKER!r}, ({peer_addr!r}, {MARKER_PORT}))"])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cap.poll() is None:
        if MARKER in pcap.read_bytes():
            break
        time.sleep(0.05)   # polls the file for the marker (the capture's own ready signal)
    else:
        raise RuntimeError(f"the capture in {host} never saw its end marker")
    cap.send_signal(signal.SIGINT)
    cap.wait(timeout=20)


def main() -> None:
    import tempfile

    sys.path.insert(0, str(ROOT / "tests" / "privileged"))
    from test_agent_cluster import Agent  # the agent as a child process, ready on its signal

    from workloads.cluster.cluster import Cluster
    from workloads.psbench.launch import launch_in_cluster

    shutil.rmtree(HERE / "agent", ignore_errors=True)
    with tempfile.TemporaryDirectory() as tmp, Cluster(2, wire_delay_ms=1.0, wait_s=120) as cluster:
        agent = Agent(HERE / "agent", [h.name for h in cluster.hosts], extra=("--sample-rate", "1"))
        caps = {h.name: start_tcpdump(cluster, h.name, HERE / f"{h.name}.pcap") for h in cluster.hosts}
        more = {"h0": (start_dumpcap(cluster, "h0", HERE / "h0.pcapng", ["eth0", "lo"]), HERE / "h0.pcapng"),
                "h1": (start_tcpdump(cluster, "h1", HERE / "h1-any.pcap", "any"), HERE / "h1-any.pcap")}
        with launch_in_cluster(cluster, Path(tmp) / "ps", servers=1, workers=1, **WORKLOAD) as job:
            job.wait_ready()
            job.wait()
        addrs = [h.addr for h in cluster.hosts]
        for i, h in enumerate(cluster.hosts):
            stop_tcpdump(cluster, h.name, addrs[1 - i], caps[h.name], HERE / f"{h.name}.pcap")
            stop_tcpdump(cluster, h.name, addrs[1 - i], *more[h.name])
        agent.stop()
        job.truth().to_parquet(HERE / "truth.parquet", index=False)
    (HERE / "recording.json").write_text(json.dumps({
        "job": "psbench, 1 server (h0, with the scheduler) x 1 worker (h1), virtual cluster, 1 ms wire",
        "workload": WORKLOAD, "capture": "tcpdump -i eth0 -s 0 --time-stamp-precision nano, in each host; "
                                         "dumpcap -i eth0 -i lo in h0 (h0.pcapng); tcpdump -i any in h1 (h1-any.pcap)",
    }, indent=1) + "\n")
    for p in sorted(HERE.glob("*.pcap*")):
        shutil.chown(p, "root", "root")   # tcpdump gives its files to its own user, dumpcap mode 600
        p.chmod(0o644)
        print(p.name, p.stat().st_size)


if __name__ == "__main__":
    main()
