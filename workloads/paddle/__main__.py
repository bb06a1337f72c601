"""python -m workloads.paddle --out DIR [--record DATA_DIR]: one Paddle job on a fresh
virtual cluster (root), then its own counts as JSON. With --record, the wire is captured
and every trainer<->server connection written to DATA_DIR (record.py). For looking at
the job by hand and for making tests/data/brpc/; the tests use runner.py."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from core.errors import UserError, run_main
from workloads import capture
from workloads.cluster.cluster import Cluster

from . import record
from .runner import run_in_cluster


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path,
                   help="output dir (logs, trainer and server counts)")
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--trainers", type=int, default=2)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--wire-delay-ms", type=float, default=1.0)
    p.add_argument("--record", type=Path, help="write the recording here (tests/data/brpc)")
    p.add_argument("--wait-s", type=float, default=0.0,
                   help="wait this long for another cluster on the machine to go")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with Cluster(args.servers + args.trainers, wire_delay_ms=args.wire_delay_ms,
                 wait_s=args.wait_s) as cluster:
        if args.record:
            with capture.WireCapture(args.out / "wire.pcap") as cap:
                res = run_in_cluster(cluster, args.out, args.servers, args.trainers, args.steps)
        else:
            res = run_in_cluster(cluster, args.out, args.servers, args.trainers, args.steps)
    if args.record:
        if cap.dropped:
            raise UserError(f"tcpdump lost packets ({cap.stats}); record again")
        record.write_recording(capture.tcp_streams(cap.path), res, args.record)
    print(json.dumps({"wall_s": round(res.wall_s, 2), "counts": res.counts()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(run_main("paddle", main))
