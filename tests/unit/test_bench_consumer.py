"""bench/consumer: the replay cost of a recording, in a child process, beside a
baseline git revision's agent on the same file."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench.consumer import ROOT, WARMUP, main, summary

REC = Path(__file__).resolve().parents[1] / "data" / "agent" / "netstack.rec.gz"


def _in_git() -> bool:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode == 0


def test_replay_cost_and_a_baseline_side_by_side(capsys):
    if not _in_git():
        pytest.skip("no git history here")
    main([str(REC), "--repeat", "1", "--baseline", "HEAD"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for r in (out, out["baseline"]):
        assert r["messages"] == 706 and r["events"] > r["messages"]   # the golden tables' count
        assert r["cpu_us_per_message"] > 0 and r["cpu_s"] > 0
        assert 50 < r["peak_rss_mb"] < 2000
    assert out["baseline"]["rev"] == "HEAD"
    assert out["cpu_per_message_ratio"] == round(out["baseline"]["cpu_us_per_message"] / out["cpu_us_per_message"], 2)


def test_summary_takes_medians():
    runs = [{"cpu_us_per_message": c, "peak_rss_mb": m, "cpu_s": c, "wall_s": 1.0, "messages": 5, "events": 9,
             "events_per_message": 1.8} for c, m in ((3.0, 10.0), (1.0, 30.0), (2.0, 20.0))]
    s = summary(runs)
    assert s["cpu_us_per_message"] == 2.0 and s["peak_rss_mb"] == 20.0 and s["messages"] == 5


def test_warmup_recording_exists():
    assert WARMUP.is_file() and WARMUP.stat().st_size < 2 << 20
