"""python -m workloads.byteps --out DIR [--record DATA_DIR]: one BytePS ps-lite benchmark
job on a fresh virtual cluster (root), then its own counts as JSON. With --record, the
wire is captured and every worker<->server connection written to DATA_DIR (record.py).
For looking at the job by hand and for making tests/data/byteps/; the tests use
runner.py."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from core.errors import UserError, run_main
from workloads import capture
from workloads.cluster.cluster import Cluster

from . import record
from .runner import BenchmarkArgs, run_in_cluster


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="output dir (the nodes' logs)")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--len", type=int, default=BenchmarkArgs.length, dest="length",
                   help="bytes of each key's value (the benchmark's LEN)")
    p.add_argument("--repeat", type=int, default=BenchmarkArgs.repeat)
    p.add_argument("--mode", type=int, default=BenchmarkArgs.mode,
                   help="0 push then pull, 1 push-pull, 2 push only, 3 pull only")
    p.add_argument("--keys-per-server", type=int, default=BenchmarkArgs.keys_per_server)
    p.add_argument("--wire-delay-ms", type=float, default=1.0)
    p.add_argument("--record", type=Path, help="write the recording here (tests/data/byteps)")
    p.add_argument("--wait-s", type=float, default=0.0,
                   help="wait this long for another cluster on the machine to go")
    a = p.parse_args(argv)
    args = BenchmarkArgs(a.length, a.repeat, a.mode, a.keys_per_server)
    a.out.mkdir(parents=True, exist_ok=True)
    # the scheduler on a host of its own: every connection between a worker's host and
    # a server's is then one of theirs
    with Cluster(a.servers + a.workers + 1, wire_delay_ms=a.wire_delay_ms,
                 wait_s=a.wait_s) as cluster:
        t0 = time.monotonic()
        if a.record:
            with capture.WireCapture(a.out / "wire.pcap") as cap:
                res = run_in_cluster(cluster, a.out, a.servers, a.workers, args)
        else:
            res = run_in_cluster(cluster, a.out, a.servers, a.workers, args)
        with_capture_s = time.monotonic() - t0
    if a.record:
        if cap.dropped:
            raise UserError(f"tcpdump lost packets ({cap.stats}); record again")
        record.write_recording(capture.tcp_streams(cap.path), res, a.record)
    print(json.dumps({"wall_s": round(res.wall_s, 2), "with_capture_s": round(with_capture_s, 2),
                      "counts": res.counts(), "expected": res.expected_counts()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_main("byteps", main))
