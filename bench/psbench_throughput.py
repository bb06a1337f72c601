"""psbench's own throughput on this machine: closed loop, small requests, on
loopback, for 1 server x 1 worker and 2 servers x 4 workers. Counted from the
job's ground truth (workloads.psbench.summary): request slices/s (one
message to one server and its response) and whole requests/s.

    python -m bench.psbench_throughput [--duration-s 5] [--keys-per-request 4]

Prints one line per configuration, then one JSON line with all figures.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile

from workloads.psbench.launch import launch_local
from workloads.psbench.summary import summarize

CONFIGS = [(1, 1), (2, 4)]


def measure(servers: int, workers: int, duration_s: float, keys: int, dim: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="psbench-bench-") as out:
        with launch_local(out, servers, workers, duration_s, keys_per_request=keys, embedding_dim=dim) as job:
            job.wait()
            s = summarize(job.truth())
    total = s["total"]
    return {"servers": servers, "workers": workers, "duration_s": s["duration_s"],
            "slices_per_s": total["slices_per_s"], "requests_per_s": total["requests_per_s"],
            "slice_latency_us": total["slice_latency_us"], "req_bytes_mean": total["req_bytes_mean"],
            "resp_bytes_mean": total["resp_bytes_mean"], "unanswered_slices": s["unanswered_slices"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration-s", type=float, default=5.0)
    ap.add_argument("--keys-per-request", type=int, default=4)
    ap.add_argument("--embedding-dim", type=int, default=8)
    args = ap.parse_args()
    results = {}
    for servers, workers in CONFIGS:
        r = measure(servers, workers, args.duration_s, args.keys_per_request, args.embedding_dim)
        results[f"{servers}x{workers}"] = r
        lat = r["slice_latency_us"]
        print(f"psbench {servers} server(s) x {workers} worker(s), closed loop, {args.keys_per_request} keys "
              f"x {args.embedding_dim} floats: {r['slices_per_s']:,.0f} slices/s, {r['requests_per_s']:,.0f} "
              f"requests/s, slice latency p50 {lat['p50']:.0f} us p99 {lat['p99']:.0f} us")
    print(json.dumps({"bench": "psbench_throughput", "cpus": os.cpu_count(), "python": platform.python_version(),
                      "load_avg_1m": os.getloadavg()[0], "keys_per_request": args.keys_per_request,
                      "embedding_dim": args.embedding_dim, "results": results}))


if __name__ == "__main__":
    main()
