"""Bad input (issue 4): a clear message naming the file, and the report of what can be used."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import UserError
from agent.rundir import RunDirWriter
from reports.dissect import dissect
from workloads.simulated.job import Sim, simulate
from reports.summary import summary

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    out = tmp_path_factory.mktemp("pristine")
    simulate(out, Sim(requests=40, shared_clock=True, seed=41))
    return out


@pytest.fixture
def run(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "run")
    return tmp_path / "run"


def _problems(d, needle):
    return [p for p in d.problems if needle in p]


def test_clean_run_has_no_problems(run):
    d = dissect([run])
    assert d.problems == [] and d.stats.requests == 80


def test_truncated_meta_uses_the_rows(run):
    meta = run / "ps1" / "meta.json"
    meta.write_text(meta.read_text()[:40])
    d = dissect([run])
    (p,) = _problems(d, str(meta))
    assert "truncated" in p and "taken from its rows" in p
    assert "ps1" in d.hosts and d.stats.requests == 80
    # its clock mapping and boot id went with it: estimated from the traffic, said so
    assert d.clocks[("ps1", "w0")].source == "estimated" and d.clocks[("ps0", "w0")].source == "shared"


def test_corrupt_shard_is_named_and_skipped(run):
    shard = next((run / "w1").glob("messages-*.parquet"))
    shard.write_bytes(shard.read_bytes()[:100])
    d = dissect([run])
    assert _problems(d, f"{shard}: unreadable shard skipped")
    assert _problems(d, "message rows are missing")   # the count in meta.json says how many
    assert set(d.requests["worker_host"]) >= {"w0"}
    s = summary(d)
    assert s["by_op"] and set(s["by_op"]["pull"]["by_worker"]) == {"w0"}


def test_missing_shard_counts_the_missing_rows(run):
    for shard in (run / "ps0").glob("messages-*.parquet"):
        shard.unlink()
    d = dissect([run])
    (p,) = _problems(d, "message rows are missing")
    assert str(run / "ps0") in p
    assert _problems(d, "has no messages")
    # ps0's requests are still reported, from the workers' side only
    nar = d.complete[d.complete["server_host"] == "10.77.0.1"]
    assert len(nar) > 0 and nar["network_and_remote"].notna().all()


def test_host_without_traffic(run):
    w = RunDirWriter(run / "ps9", {"host_id": "ps9", "started_realtime_ns": 1_700_000_000 * 10**9,
                                   "kernel": {"boot_id": "one-boot"}})
    w.close()
    d = dissect([run])
    (p,) = _problems(d, "has no messages")
    assert "ps9" in p and d.stats.requests == 80 and "ps9" in d.hosts


def test_run_dirs_of_different_runs(run, tmp_path):
    other = tmp_path / "other"
    simulate(other, Sim(requests=10, shared_clock=True, seed=42, started_realtime_ns=1_800_000_000 * 10**9))
    d = dissect([run / "w0", run / "w1", run / "ps0", other / "ps1"])
    (p,) = _problems(d, "different run")
    assert str(other / "ps1" / "meta.json") in p and "left out" in p
    assert d.hosts == ["ps0", "w0", "w1"]
    # the run dirs one agent wrote (one run id) stay together, even where a host's clock
    # puts its times an hour apart; another agent's, at other times, is another run
    for h in ("w0", "w1", "ps0", "ps1"):
        for base, rid in ((run, "A"), (other, "B")):
            m = json.loads((base / h / "meta.json").read_text())
            m["run_id"] = rid
            (base / h / "meta.json").write_text(json.dumps(m))
    m = json.loads((run / "w1" / "meta.json").read_text())
    m["started_realtime_ns"] += 3600 * 10**9
    m["updated_realtime_ns"] = m["started_realtime_ns"] + 1
    (run / "w1" / "meta.json").write_text(json.dumps(m))
    d = dissect([run / "w0", run / "w1", other / "ps1", run / "ps0"])
    assert d.hosts == ["ps0", "w0", "w1"] and len(_problems(d, "different run")) == 1


def test_agents_of_one_run_on_several_hosts_are_one_run(run):
    """Each host's agent has its own run id (README, tracing your own job on two hosts):
    agents whose times overlap are one run."""
    for i, h in enumerate(("w0", "w1", "ps0", "ps1")):
        m = json.loads((run / h / "meta.json").read_text())
        m["run_id"] = f"agent-on-{h}"
        m["started_realtime_ns"] = m.get("started_realtime_ns", 1_700_000_000 * 10**9) + i * 10**9
        (run / h / "meta.json").write_text(json.dumps(m))
    d = dissect([run / h for h in ("w0", "w1", "ps0", "ps1")])
    assert d.hosts == ["ps0", "ps1", "w0", "w1"] and not _problems(d, "different run") and d.stats.requests == 80


def test_same_host_twice(run, tmp_path):
    shutil.copytree(run / "w0", tmp_path / "copy")
    d = dissect([run, tmp_path / "copy"])
    (p,) = _problems(d, "are both host 'w0'")
    assert "is left out" in p and d.stats.requests == 80


def test_nothing_usable_is_one_error(tmp_path):
    (tmp_path / "a").mkdir()
    with pytest.raises(UserError, match="holds no run dir"):
        dissect([tmp_path / "a"])
    (tmp_path / "a" / "meta.json").write_text("{")
    with pytest.raises(UserError, match=r"no usable run dir.*meta.json is unreadable"):
        dissect([tmp_path / "a"])


def test_cli_bad_input_never_a_traceback(run, tmp_path):
    (run / "ps1" / "meta.json").write_text("{\"host_id\": \"ps")
    out = tmp_path / "s.json"
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "report", str(run), "-o", str(out)],
                       capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ})
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert f"warning: {run / 'ps1' / 'meta.json'}" in r.stderr
    s = json.loads(out.read_text())
    assert s["requests"] == 80 and any("ps1" in p for p in s["problems"])
