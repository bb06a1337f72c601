"""A stand-in agent for tests/unit/test_live_http_limits.py, in a process of its own so its
threads, file descriptors and CPU can be read from /proc: the recorded psbench run's live
aggregates served by agent.http.serve, and a run-dir writer closing a shard every 0.2 s
(what an agent's writer does, faster), with the soft RLIMIT_NOFILE given (the audit's
agent ran out of descriptors at 256 idle connections).

    python tests/unit/live_http_child.py OUT_DIR NOFILE_SOFT

Prints the endpoint's ADDR:PORT on stdout, writes until stdin closes, then prints one JSON
line of the writer's counters."""
from __future__ import annotations

import json
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa

from agent.daemon import replay
from agent.http import serve
from agent.live import LiveAggregates
from agent.rundir import RunDirWriter

REC = Path(__file__).resolve().parents[1] / "data" / "agent" / "psbench.rec.gz"


def main() -> None:
    out, soft = Path(sys.argv[1]), int(sys.argv[2])
    live = LiveAggregates(agent="recorded")
    with tempfile.TemporaryDirectory() as tmp:
        replay(REC, Path(tmp), live=live)
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    warnings: list[str] = []
    writer = RunDirWriter(out, {"host_id": "child"}, shard_interval_s=0.2, warn=warnings.append)
    writer.set_schema("rows", pa.schema([("i", pa.int64())]))
    server = serve("127.0.0.1:0", live)
    print(server.address, flush=True)
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    i = 0
    while not done.wait(0.02):
        writer.append("rows", {"i": i})
        writer.maybe_flush()
        i += 1
    writer.close()
    server.close()
    print(json.dumps({"rows": i, "shards_failed": writer.shards_failed, "rows_dropped": writer.rows_dropped,
                      "warnings": warnings}), flush=True)


if __name__ == "__main__":
    main()
