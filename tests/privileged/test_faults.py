"""Faults the agent must survive (issue 6 "Faults", issue 3 "Bad input and faults"),
each against the real `pslat agent` (a child process) and real traffic on loopback:

- kill -9 mid-run: the closed shards read, `pslat report` builds from them, nothing of
  the agent's stays loaded in the kernel, and the next agent starts;
- the traced processes killed and restarted: traced again, and the report names the gap;
- the output disk fills up (a tmpfs): one line on stderr, bounded memory, rows dropped
  and counted, the job unharmed, what was written readable;
- SIGTERM under closed-loop load: exit within 2 s, nothing left loaded, meta.json final;
- random bytes on a traced connection between valid ps-lite messages: counted as
  unparsed, the messages after them found with their ids.

psbench runs under its own process name (COMM, set with prctl before psbench starts)
so that --comm selects it and nothing else on this shared machine. The agent attaches
no TC filter (probes/ has none): what a killed agent could leave behind is BPF
programs, links and tracefs uprobe events, and those are checked.

Run as a script (`python test_faults.py recv|send ...`) it is the plain-TCP peer of
the unparsed-bytes test.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))   # script mode: the peers import parsers.pslite

COMM = "psb-faults"            # the psbench processes' name, selected by --comm
SIGTERM_BUDGET_S = 2.0
RSS_BUDGET_MB = 400            # issue 3's budget for the agent
GARBAGE_BYTES = 4096
MSGS_BEFORE, MSGS_AFTER = 20, 30
READY_S = 60


# ---------------------------------------------------------------- plain-TCP peers

def _peer_recv() -> None:
    """Accepts one connection, reads to EOF, prints {"port"} then {"bytes"}."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    conn, _ = srv.accept()
    n = 0
    while chunk := conn.recv(65536):
        n += len(chunk)
    print(json.dumps({"bytes": n}), flush=True)


def _peer_send(port: int, seed: int) -> None:
    """ZMTP greeting + READY, MSGS_BEFORE push requests, GARBAGE_BYTES random bytes,
    MSGS_AFTER more; one send per message. Prints what it sent."""
    from parsers.pslite.encode import MessageSpec, greeting_bytes, message_bytes, ready_bytes

    rnd = random.Random(seed)
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(greeting_bytes() + ready_bytes(b"DEALER", b"ps9"))

    def send_msg(ts: int) -> None:
        keys = sorted(rnd.sample(range(1 << 20), 8))
        spec = MessageSpec(request=True, push=True, app_id=0, customer_id=0, timestamp=ts,
                           keys=keys, vals=rnd.randbytes(4 * len(keys)))
        s.sendall(message_bytes(spec.frames()))

    for ts in range(MSGS_BEFORE):
        send_msg(ts)
    s.sendall(rnd.randbytes(GARBAGE_BYTES))
    for ts in range(MSGS_BEFORE, MSGS_BEFORE + MSGS_AFTER):
        send_msg(ts)
    s.close()
    print(json.dumps({"sent": MSGS_BEFORE + MSGS_AFTER, "garbage_bytes": GARBAGE_BYTES}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        _peer_recv()
    else:
        _peer_send(int(sys.argv[2]), int(sys.argv[3]))
    sys.exit(0)


# ---------------------------------------------------------------- the tests

import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from agent.child import AgentProcess  # noqa: E402
from agent.rundir import RunDirWriter, read_run_dir  # noqa: E402
from workloads.psbench.launch import Job, launch  # noqa: E402
from workloads.psbench.options import Workload  # noqa: E402

pytestmark = pytest.mark.privileged

# psbench's own entry point, run after naming the process (the group leader, which
# --comm matches; libzmq renames its I/O threads, not the leader)
_NAMED = ("import ctypes, runpy, sys; ctypes.CDLL(None).prctl(15, sys.argv.pop(1).encode(), 0, 0, 0); "
          "runpy.run_module('workloads.psbench', run_name='__main__', alter_sys=True)")


def psbench(out: Path, duration_s: float, servers: int = 1, workers: int = 2, **opts) -> Job:
    """A psbench job on loopback whose processes are named COMM."""
    def popen(_host, argv, **kw):
        assert argv[1:3] == ["-m", "workloads.psbench"], argv
        return subprocess.Popen([argv[0], "-c", _NAMED, COMM, *argv[3:]], cwd=ROOT, **kw)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
    return launch(out, [(r, None, "127.0.0.1") for r in roles], popen, ("127.0.0.1", port),
                  Workload.from_kwargs(duration_s=duration_s, **opts), die_with_parent=True)


def agent(out: Path, *args: str) -> AgentProcess:
    return AgentProcess(out, list(args), ready_timeout_s=120)


def wait_for(what: str, check, timeout_s: float, poll_s: float = 0.05):
    """check() until it returns something true; its value. Fails saying what was awaited."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}")
        time.sleep(poll_s)


def shards(out: Path) -> list[Path]:
    return sorted(out.glob("*/messages-*.parquet"))


def host_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _bpftool(*args: str) -> list[dict]:
    return json.loads(subprocess.run(["bpftool", *args, "--json"], capture_output=True, text=True,
                                     check=True).stdout or "[]")


def bpf_objects(pid: int) -> dict[str, set[int]]:
    """The BPF programs and links a live process holds (its fds), and the programs it
    attached through perf events (tracepoints, uprobes)."""
    progs, links = set(), set()
    for f in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            fields = dict(line.split(":", 1) for line in f.read_text().splitlines() if ":" in line)
        except OSError:
            continue   # closed meanwhile
        if "link_id" in fields:
            links.add(int(fields["link_id"]))
        elif "prog_id" in fields:
            progs.add(int(fields["prog_id"]))
    perf = {e["prog_id"] for e in _bpftool("perf", "show") if e.get("pid") == pid and "prog_id" in e}
    return {"progs": progs | perf, "links": links, "perf_progs": perf}


def left_behind(pid: int, objs: dict[str, set[int]]) -> dict[str, list]:
    """What of a gone process's BPF objects the kernel still has."""
    uprobes = Path("/sys/kernel/tracing/uprobe_events")
    return {k: v for k, v in {
        "progs": sorted(objs["progs"] & {p["id"] for p in _bpftool("prog", "show")}),
        "links": sorted(objs["links"] & {lk["id"] for lk in _bpftool("link", "show")}),
        "perf": [e for e in _bpftool("perf", "show") if e.get("pid") == pid],
        # bcc names a tracefs uprobe event it had to create after its pid
        "uprobe_events": [ln for ln in (uprobes.read_text().splitlines() if uprobes.exists() else [])
                          if f"bcc_{pid}" in ln],
    }.items() if v}


def assert_nothing_left(pid: int, objs: dict[str, set[int]]) -> None:
    assert objs["progs"] and objs["perf_progs"], f"found none of the agent's BPF programs: {objs}"
    # links and programs are freed from a workqueue after the last fd closes: wait for it
    deadline = time.monotonic() + 10
    while (left := left_behind(pid, objs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"the agent (pid {pid}) left BPF objects behind: {left}"


def report(*args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "agent.cli", "report", *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def figure(name: str, value) -> None:
    """Measured figures, for the note (pytest -s shows them)."""
    print(f"FIGURE {name} = {value}")


# ---------------------------------------------------------------- 1. kill -9

def test_kill9_keeps_closed_shards_and_leaves_nothing_loaded(tmp_path):
    out = tmp_path / "agent"
    a = agent(out, "--comm", COMM)
    try:
        with psbench(tmp_path / "ps", duration_s=60, rate=100) as job:
            job.wait_ready()
            wait_for("two closed messages shards", lambda: len(shards(out)) >= 2, 30)
            objs = bpf_objects(a.pid)
            a.kill()   # SIGKILL
            assert a.proc.returncode == -signal.SIGKILL
            assert_nothing_left(a.pid, objs)

            rd = read_run_dir(host_dir(out))
            assert rd.problems == []
            assert "closed" not in rd.meta        # it never got to close: the kill was real
            msgs = rd.tables["messages"]
            assert len(msgs) > 0 and set(msgs["pid"]) <= set(sum(job.pids.values(), []))
            summary = json.loads(report(host_dir(out), "-f", "json").stdout)
            assert summary["requests"] > 0, summary
            term = report(host_dir(out)).stdout
            assert f"{summary['requests']:,} requests paired" in term, term[:2000]

            # the next agent starts, traces the job that still runs, and stops cleanly
            out2 = tmp_path / "agent2"
            b = agent(out2, "--comm", COMM)
            wait_for("the next agent's first shard", lambda: shards(out2), 30)
            assert b.stop() == 0, b.log_tail()
    finally:
        a.kill()
    assert len(read_run_dir(host_dir(out2)).tables["messages"]) > 0


# ---------------------------------------------------------------- 4. SIGTERM under load

def test_sigterm_under_closed_loop_load_detaches_within_2s(tmp_path):
    out = tmp_path / "agent"
    a = agent(out, "--comm", COMM)
    try:
        with psbench(tmp_path / "ps", duration_s=60, servers=1, workers=2, rate=0) as job:
            job.wait_ready()
            wait_for("a closed messages shard", lambda: shards(out), 30)
            objs = bpf_objects(a.pid)
            rc, took_s = a.terminate()
            figure("sigterm_to_exit_s", round(took_s, 3))
            assert rc == 0, a.log_tail()
            assert took_s < SIGTERM_BUDGET_S, f"SIGTERM to exit took {took_s:.2f} s: {a.log_tail()}"
            assert_nothing_left(a.pid, objs)
    finally:
        a.kill()
    rd = read_run_dir(host_dir(out))
    assert rd.problems == [] and rd.meta["closed"] is True
    probes = rd.meta["counters"]["probes"]
    # what the stop could not decode is counted as lost, by name, never dropped silently
    at_stop = {p: c.get("lost_at_stop", 0) for p, c in probes.items()}
    figure("lost_at_stop", at_stop)
    for p, c in probes.items():
        assert c.get("lost", 0) >= c.get("lost_at_stop", 0)
    assert len(rd.tables["messages"]) > 0
