"""Records a short real run of `pslat agent --record` for the agent's unit tests.

A psbench job (scheduler, 2 servers, 2 workers, open loop, small requests) runs
on the loopback of a network namespace made here; one agent traces that
namespace (--netns, framework uprobes on pyzmq's libzmq through --lib) and
records its raw events. Saved next to this file:

  psbench.rec.gz             the recording (raw events of every probe), gzipped
  psbench.messages.parquet   the messages table the live agent wrote (the replay
                             must give the same rows)
  psbench.truth.parquet      psbench's ground truth for the same run

netstack.rec.gz (every probe, for the golden tables of
tests/unit/test_agent_replay.py) was made with
  python -m bench.consumer --record netstack.rec --servers 2 --workers 2 --rate 20 --duration-s 2
then gzipped.

Needs root (BPF). Run from the repository root of the tree whose probes you want
recorded (a clean checkout of a commit, so the format is one that landed):
  /work/main/.venv/bin/python tests/data/agent/record.py
"""
from __future__ import annotations

import glob
import gzip
import os
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))

PSBENCH = ["--servers", "2", "--workers", "2", "--duration-s", "1", "--rate", "20",
           "--keys-per-request", "16", "--key-space", "100000"]
# sockcalls (with the ZMTP walker) and the framework uprobes. No netstack probe:
# tests/unit/test_report_recorded.py checks the report's "host and network
# unsplit" path on this data.
AGENT_FLAGS = ["--no-netstack"]


def main() -> None:
    import pandas as pd

    from agent.rundir import read_run_dir
    from bench.consumer import record
    from workloads.psbench.truth import read_truth

    tmp = Path(tempfile.mkdtemp(prefix="pslat-agent-rec-"))
    try:
        record(tmp / "rec.bin", PSBENCH, AGENT_FLAGS, out=tmp / "out", psbench_out=tmp / "ps")
        with open(tmp / "rec.bin", "rb") as f, gzip.open(HERE / "psbench.rec.gz", "wb", compresslevel=9) as g:
            shutil.copyfileobj(f, g)
        frames = [read_run_dir(d).tables["messages"] for d in sorted(glob.glob(str(tmp / "out" / "*/")))]
        msgs = pd.concat(frames, ignore_index=True)
        msgs.to_parquet(HERE / "psbench.messages.parquet", index=False)
        read_truth(tmp / "ps").to_parquet(HERE / "psbench.truth.parquet", index=False)
        print(f"{len(msgs)} messages; recording {os.path.getsize(HERE / 'psbench.rec.gz')} bytes gzipped",
              file=sys.stderr)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
