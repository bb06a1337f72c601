"""`pslat agent --out` (issue 11, finding 6), through the real CLI on a real recording:
a restart into the same --out makes a new run dir beside the first and leaves the
first intact; an --out that cannot be written is one line and exit 2 before anything
runs. (The live agent's check before its probes attach: tests/privileged/test_agent_out_live.py.)"""
import hashlib
import shutil
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.rundir import read_run_dir

ROOT = Path(__file__).resolve().parents[2]
REC = ROOT / "tests" / "data" / "agent" / "psbench.rec.gz"
MESSAGES = 386   # rows a replay of REC writes (tests/data/agent/psbench.messages.parquet)


def pslat(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pslat.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def replay(out: Path) -> subprocess.CompletedProcess:
    return pslat("agent", "--replay", REC, "--out", out)


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def test_a_restart_into_the_same_out_makes_a_new_run_dir_and_keeps_the_first(tmp_path):
    out = tmp_path / "out"
    assert replay(out).returncode == 0
    [first] = [p for p in out.iterdir()]
    before = digests(first)
    r = replay(out)
    assert r.returncode == 0, r.stderr
    second = out / f"{first.name}.1"
    assert sorted(p.name for p in out.iterdir()) == [first.name, second.name]
    assert digests(first) == before, "the second run changed the first run's files"
    for d in (first, second):
        rd = read_run_dir(d)
        assert rd.meta["closed"] is True and rd.meta["host_id"] == first.name and rd.problems == []
        assert len(rd.tables["messages"]) == MESSAGES == rd.meta["counters"]["messages"]
    assert str(second) in r.stderr, r.stderr   # the user is told where this run went
    assert replay(out).returncode == 0
    assert (out / f"{first.name}.2" / "meta.json").exists()

    # the report of OUT: one run (a host traced twice is never merged), the other named
    rep = pslat("report", out, "-f", "json")
    assert rep.returncode == 0, rep.stderr
    summary = json.loads(rep.stdout)
    assert summary["hosts"] == [first.name] and summary["requests"] > 0
    left_out = [p for p in summary["problems"] if "left out" in p]
    assert len(left_out) == 2, summary["problems"]
    # each run dir on its own is the report of that run
    for d in (first, second):
        one = json.loads(pslat("report", d, "-f", "json").stdout)
        assert one["requests"] == summary["requests"] and not one["problems"]


@pytest.mark.parametrize("how", ["a file", "under a file"])
def test_an_out_that_cannot_be_written_is_one_line_and_exit_2(tmp_path, how):
    (tmp_path / "f").write_text("in the way")
    out = tmp_path / "f" if how == "a file" else tmp_path / "f" / "out"
    r = replay(out)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("pslat: error: --out ") and str(out) in lines[0], lines
    assert (tmp_path / "f").read_text() == "in the way"


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace to see the agent's syscalls")
def test_the_replayed_run_dir_is_fsynced_file_and_directory(tmp_path):
    """What the real agent does, seen by strace: every shard and meta.json fsynced
    before its rename, the run dir after the last rename, --out after the run dir's mkdir."""
    log = tmp_path / "strace.log"
    out = tmp_path / "out"
    r = subprocess.run(["strace", "-f", "-y", "-e", "trace=fsync,rename,renameat,renameat2", "-o", log,
                        sys.executable, "-m", "pslat.cli", "agent", "--replay", REC, "--out", out],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    calls = [ln.split(None, 1)[1] for ln in log.read_text().splitlines() if str(out) in ln]
    [run_dir] = out.iterdir()
    synced = [i for i, c in enumerate(calls) if c.startswith("fsync(")]
    renames = [i for i, c in enumerate(calls) if c.startswith("rename")]
    done = {p.name for p in run_dir.iterdir()}
    assert done == {"meta.json", "messages-000000.parquet", "streams-000001.parquet"}, done
    for name in done:
        tmp = f"{run_dir}/.{name}.tmp"
        last = max(i for i in renames if f'"{tmp}", "{run_dir}/{name}"' in calls[i])
        assert any(i < last and f"<{tmp}>" in calls[i] for i in synced), (name, calls)
    assert any(i > max(renames) and calls[i].endswith(f"<{run_dir}>) = 0") for i in synced), calls
    assert any(f"<{out}>" in calls[i] for i in synced), calls


@pytest.mark.parametrize("recording", [b"not a recording", b""], ids=["garbage", "empty"])
def test_a_bad_recording_leaves_no_out_behind(tmp_path, recording):
    """Bad input is one line and exit 2, and nothing is left behind: an --out this run
    would have made is not made (or is removed again when still empty)."""
    rec = tmp_path / "bad.rec"
    rec.write_bytes(recording)
    out = tmp_path / "new" / "out"
    p = pslat("agent", "--replay", rec, "--out", out)
    assert p.returncode == 2 and p.stderr.startswith("pslat: error: "), p.stderr
    assert not out.exists()
