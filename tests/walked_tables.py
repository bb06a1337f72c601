"""The tables of a recording replayed with and without the stream decoder's fast way for
calls the kernel walked whole (agent/streams.py StreamDecoder(walked=...)), made
comparable: every table of every host sorted, and meta.json's counters."""
from __future__ import annotations

from pathlib import Path

from agent.daemon import replay
from agent.rundir import read_run_dir

# what the run's own CPU and the fast way's share change, and nothing else may
NOT_COMPARED = {"consumer_cpu_s", "calls_walked_whole"}


def replayed_tables(rec: Path, out: Path, walked: bool) -> tuple[dict, object]:
    """{(host, table): sorted text frame, (host, "counters"): dict} and the pipeline."""
    pipeline, _ = replay(Path(rec), Path(out), walked=walked)
    got: dict = {}
    for d in sorted(Path(out).iterdir()):
        rd = read_run_dir(d)
        assert not rd.problems, rd.problems
        for table, df in rd.tables.items():
            cols = sorted(df.columns)
            got[(d.name, table)] = df[cols].astype(str).sort_values(cols).reset_index(drop=True)
        got[(d.name, "counters")] = {k: v for k, v in rd.meta["counters"].items() if k not in NOT_COMPARED}
    return got, pipeline


def assert_same_tables(slow: dict, fast: dict) -> None:
    assert slow.keys() == fast.keys()
    for key, want in slow.items():
        got = fast[key]
        if isinstance(want, dict):
            assert got == want, key
        else:
            assert len(got) == len(want) and got.equals(want), key
