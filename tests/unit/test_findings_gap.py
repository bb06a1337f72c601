"""The traffic-gap finding: spans with no message on a host, from message times."""
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from agent.records import MESSAGES_SCHEMA
from agent.rundir import RunDirWriter
from reports.extra import RunContext
from reports.findings import gap_findings, run_traffic_gaps, traffic_gaps

ROOT = Path(__file__).resolve().parents[2]
S = 1_000_000_000


def _steady(t0_s: float, t1_s: float, every_ms: float = 1.0) -> np.ndarray:
    return (np.arange(t0_s, t1_s, every_ms / 1e3) * S).astype(np.int64)


def test_a_pause_on_one_host_is_named_with_its_span():
    start = 5 * S   # the agent started at 5 s of the host's monotonic clock
    times = {"h0": start + _steady(0, 20),
             "h1": start + np.concatenate([_steady(0, 12.3), _steady(14.1, 20)])}
    gaps = traffic_gaps(times, {"h0": start, "h1": start})
    assert [(g["host"], round(g["from_s"], 2), round(g["to_s"], 2)) for g in gaps] == [("h1", 12.3, 14.1)]
    assert gap_findings({"traffic_gaps": gaps}) == [
        "Traffic gap: no messages on h1 from 12.3 s to 14.1 s of the run (the traced processes "
        "stopped, restarted or stalled, or the agent could not see them)."]


def test_a_slow_job_is_not_a_gap_and_short_pauses_are_not_either():
    times = {"slow": _steady(0, 60, every_ms=2000),                     # one message per 2 s
             "busy": np.concatenate([_steady(0, 5), _steady(5.4, 10)]),  # 0.4 s < GAP_MIN_S
             # a worker's compute phases: 100 messages, then 1 s of compute, over and over
             "steps": np.concatenate([_steady(k * 1.1, k * 1.1 + 0.1) for k in range(30)])}
    assert traffic_gaps(times, {}) == []


def test_many_gaps_name_the_longest_and_count_the_rest():
    # steady traffic for 60 s, with pauses of 2 s at 10..40 s and of 2.5 s at 50 s
    edges = [(0, 10), (12, 20), (22, 30), (32, 40), (42, 50), (52.5, 60)]
    gaps = traffic_gaps({"h": np.concatenate([_steady(a, b) for a, b in edges])}, {})
    assert len(gaps) == 5 and gaps[0]["seconds"] > gaps[1]["seconds"]
    (text,) = gap_findings({"traffic_gaps": gaps})
    assert "from 50.0 s to 52.5 s" in text and text.count(" to ") == 3 and "2 shorter gap(s)" in text


def test_recorded_psbench_run_with_a_restart_cut_in(tmp_path):
    """The recorded psbench run (continuous) has no gap; with its second half moved 3 s
    later, as when the job is restarted, the gap is found from the run dir at the split."""
    msgs = pd.read_parquet(ROOT / "tests/data/agent/psbench.messages.parquet")
    host = str(msgs.host_id.iloc[0])
    t = msgs.ts_send_first_enter_ns.fillna(msgs.ts_recv_last_exit_ns).astype("int64")
    split = int(np.sort(t)[len(t) // 2])
    cols = [c for c in msgs.columns if c.startswith("ts_") and c.endswith("_ns")]

    def run_dir(name: str, frame: pd.DataFrame) -> RunContext:
        w = RunDirWriter(tmp_path / name, {"host_id": host}, shard_interval_s=3600)
        w.set_schema("messages", MESSAGES_SCHEMA)
        for r in pa.Table.from_pandas(frame, preserve_index=False).to_pylist():
            w.append("messages", r)
        w.close()
        return RunContext(dirs={host: tmp_path / name}, metas={host: w.meta}, timeline=None)

    assert run_traffic_gaps(run_dir("asis", msgs)) == []
    moved = msgs.copy()
    late = t >= split
    for c in cols:
        moved.loc[late, c] = moved.loc[late, c] + 3 * S
    (gap,) = run_traffic_gaps(run_dir("restarted", moved))
    before = t[t < split].max()
    assert gap["host"] == host and gap["from_ns"] == before and gap["to_ns"] == split + 3 * S
    assert abs(gap["from_s"] - (before - t.min()) / S) < 1e-9   # no agent start in meta: first message
