"""`pslat agent --out` with the live agent (issue 11, finding 6):

- an --out it cannot write (a file in the way, a dir under a file, a read-only
  mount) is one `pslat: error:` line and exit 2, and the check comes before any
  probe is loaded: strace sees no bpf() call at all;
- a restart into the same --out (the agent stopped and started again, as a
  service manager does) writes a new run dir beside the first, which stays as it
  was, and `pslat report OUT` reads them, naming the run it left out.

The same through replay, without root: tests/unit/test_agent_out.py.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.child import AgentProcess
from agent.rundir import read_run_dir
from workloads.psbench.launch import launch_local

pytestmark = pytest.mark.privileged

ROOT = Path(__file__).resolve().parents[2]
COMM = "psb-out"   # psbench's process name, selected by --comm: nothing else on this machine


@pytest.fixture
def read_only_dir(tmp_path):
    d = tmp_path / "ro"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(d)], check=True)
    yield d
    subprocess.run(["umount", "-l", str(d)], check=False)


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to count the agent's bpf() calls")
@pytest.mark.parametrize("how", ["a file", "under a file", "read-only"])
def test_an_unwritable_out_is_one_line_before_any_probe_is_loaded(tmp_path, request, how):
    (tmp_path / "f").write_text("in the way")
    out = {"a file": lambda: tmp_path / "f", "under a file": lambda: tmp_path / "f" / "out",
           "read-only": lambda: request.getfixturevalue("read_only_dir") / "out"}[how]()
    log = tmp_path / "strace.log"
    r = subprocess.run(["strace", "-f", "-e", "trace=bpf,perf_event_open", "-o", log, sys.executable, "-m",
                        "pslat.cli", "agent", "--comm", COMM, "--out", out, "--duration", "5"],
                       cwd=ROOT, capture_output=True, text=True, timeout=180)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith(f"pslat: error: --out {out}"), lines
    loaded = [ln for ln in log.read_text().splitlines() if " bpf(" in ln or "perf_event_open(" in ln]
    assert not loaded, f"the agent loaded {len(loaded)} BPF objects before checking --out: {loaded[:3]}"
    assert (tmp_path / "f").read_text() == "in the way"


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def traced_run(out: Path, ps_out: Path) -> AgentProcess:
    """One agent from start to stop around a short psbench job; its log lines."""
    a = AgentProcess(out, ["--comm", COMM, "--no-netstack"], ready_timeout_s=120)
    try:
        with launch_local(ps_out, 1, 1, 2.0, proc_name=COMM, rate=200) as job:
            job.wait_ready()
            job.wait()
        assert a.stop() == 0, a.log_tail()
    finally:
        a.kill()
    return a


def test_a_restart_into_the_same_out_keeps_both_runs(tmp_path):
    out = tmp_path / "agent"
    traced_run(out, tmp_path / "ps1")
    [first] = list(out.iterdir())
    before = digests(first)
    second_agent = traced_run(out, tmp_path / "ps2")
    second = out / f"{first.name}.1"
    assert sorted(p.name for p in out.iterdir()) == [first.name, second.name]
    assert any(str(second) in ln for ln in second_agent.lines), second_agent.log_tail()
    assert digests(first) == before, "the second run changed the first run's files"
    runs = [read_run_dir(d) for d in (first, second)]
    for rd in runs:
        assert rd.meta["closed"] is True and rd.problems == [] and rd.meta["host_id"] == first.name
        assert len(rd.tables["messages"]) > 100
        assert len(rd.tables["messages"]) == rd.meta["counters"]["messages"]
    assert runs[0].meta["run_id"] != runs[1].meta["run_id"]
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "report", str(out), "-f", "json"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["requests"] > 0
    # one run is reported (two runs of one host are never merged); the other is named
    assert any("different run" in p for p in summary["problems"]), summary["problems"]
