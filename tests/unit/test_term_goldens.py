"""Golden terminal reports (100 columns, no colour) through the CLI, as a user runs them: a run
with a start-up the report detects and cuts, and the comparison of a slower run against it
(`--baseline`). PSLAT_UPDATE_GOLDEN=1 rewrites them (read the diff before committing)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workloads.simulated.job import Sim, simulate

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden"
UPDATE = os.environ.get("PSLAT_UPDATE_GOLDEN") == "1"
# about 11 s of closed loop per worker; its first 60 requests' server 20x slower (a start-up)
STEADY = dict(requests=400, workers=2, servers=2, think_ns=(20_000_000, 30_000_000), nic=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("goldens")
    before, after = base / "before", base / "after"
    simulate(before, Sim(**STEADY, seed=31, warmup_requests=60, warmup_factor=20.0))
    simulate(after, Sim(**STEADY, seed=32, warmup_requests=60, warmup_factor=20.0, server_user_ns=400_000))
    return before, after


def _report(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "report", *map(str, args), "-f", "term"], cwd=ROOT,
                       env=dict(os.environ, COLUMNS="100"), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text()


def test_a_detected_warmup(runs):
    text = _report(runs[0])
    assert "cut as warm-up" in text and max(len(x) for x in text.splitlines()) <= 100
    _golden("term_report_warmup.txt", text)


def test_the_comparison_report(runs):
    before, after = runs
    text = _report(after, "--baseline", before)
    assert "server_user" in text and max(len(x) for x in text.splitlines()) <= 100
    assert "…" not in text.split("compared with the baseline")[1]   # every comparison cell whole
    _golden("term_report_compare.txt", text)
