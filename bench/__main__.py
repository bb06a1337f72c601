"""`make bench`: every benchmark in bench/, one after the other (never beside
each other: they would measure each other). Each prints its figures and one
JSON line last; a failing benchmark does not stop the others, but the exit
status says it failed."""
from __future__ import annotations

import subprocess
import sys

# about 60 minutes in all with the defaults (overhead ~13, cost 22-24 at load 11-13, where
# each of its 6 agent starts took 1-2.5 min, capacity ~16 with its 10-minute memory run,
# report ~5, capture ~2 for its 1 GB, the rest ~2); each takes options for shorter runs
BENCHMARKS = ["bench.wire", "bench.psbench_throughput", "bench.overhead", "bench.cost", "bench.capacity",
              "bench.report", "bench.capture"]


def main() -> int:
    failed = []
    for mod in BENCHMARKS:
        print(f"==> {mod}", flush=True)
        if subprocess.call([sys.executable, "-m", mod]) != 0:
            failed.append(mod)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
