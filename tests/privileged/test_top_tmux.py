"""`pslat top --agent` in a real terminal (tmux, 80x24) against a live agent tracing
psbench in the virtual cluster (1 server, 2 workers, one host each): the screen shows
the ops with their rates on the hosts, `d` switches to the finer components, `q` quits."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.child import AgentProcess
from workloads.cluster.cluster import Cluster
from workloads.psbench.launch import launch_in_cluster

pytestmark = pytest.mark.privileged
ROOT = Path(__file__).resolve().parents[2]
SESSION = "pslat-top-test"


def _libzmq() -> Path:
    import zmq
    return sorted(Path(zmq.__file__).parent.parent.glob("pyzmq.libs/libzmq*.so*"))[0]


def _screen() -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", SESSION], capture_output=True, text=True).stdout


def _wait_screen(cond, what: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        s = _screen()
        if cond(s):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not on screen within {timeout_s:g} s:\n{s}")
        time.sleep(0.2)   # polling the pane for a condition, not waiting for a guessed time


def test_top_shows_ops_rates_and_hosts_and_takes_keys(tmp_path):
    with Cluster(3, wait_s=300, log_dir=tmp_path / "wire") as cluster:
        names = [h.name for h in cluster.hosts]
        args = ["--lib", str(_libzmq()), "--listen", "127.0.0.1:0", "--no-netstack"]
        for h in names:
            args += ["--netns", h]
        with AgentProcess(tmp_path / "agent", args) as agent:
            port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", "".join(agent.lines)).group(1))
            with launch_in_cluster(cluster, tmp_path / "ps", servers=1, workers=2, duration_s=30.0,
                                   rate=50.0) as job:   # open loop: a closed loop floods the agent on 2 shared cores
                job.wait_ready()
                cmd = (f"cd {shlex.quote(str(ROOT))} && LANG=C.UTF-8 exec {shlex.quote(sys.executable)} "
                       f"-m agent.cli top --agent 127.0.0.1:{port}")
                subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
                subprocess.run(["tmux", "-u", "new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", cmd],
                               check=True)
                try:
                    rows = re.compile(r"^(h\d+)\s+(cli|srv)\s+(push|pull)\s+\S+\s+([\d.,]+)\s", re.M)
                    s = _wait_screen(lambda s: {m[2] for m in rows.findall(s)} >= {"push", "pull"}
                                     and {m[1] for m in rows.findall(s)} == {"cli", "srv"}, "push and pull rows")
                    found = rows.findall(s)
                    assert {h for h, *_ in found} == set(names)   # the server host and both workers
                    assert all(float(r.replace(",", "")) > 0 for *_, r in found)
                    assert "groups (d)" in s and "agents" in s and "ev/s" in s
                    assert all(len(line) <= 80 for line in s.splitlines()) and len(s.splitlines()) <= 24
                    subprocess.run(["tmux", "send-keys", "-t", SESSION, "d"], check=True)
                    s = _wait_screen(lambda s: "detail (d)" in s, "the detail view")
                    assert "u/U user" in s and "S server user" in s and "n/N NIC (tx/RX)" in s
                    (tmp_path / "screen.txt").write_text(s)
                    subprocess.run(["tmux", "send-keys", "-t", SESSION, "q"], check=True)
                    deadline = time.monotonic() + 10
                    while subprocess.run(["tmux", "has-session", "-t", SESSION], capture_output=True).returncode == 0:
                        assert time.monotonic() < deadline, "top did not quit on q"
                        time.sleep(0.1)
                finally:
                    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
                job.stop()
