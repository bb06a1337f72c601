"""`pslat top` in a real terminal (tmux, 80x24).

--agent: against a live agent tracing psbench in the virtual cluster (1 server, 2
workers, one host each): the screen shows the ops with their rates on the hosts, `d`
switches to the finer components, `q` quits.
Its own probes (no agent; --comm, --no-netstack, --sample-rate 1): psbench on loopback: the screen shows push and pull
at psbench's rate, the peer and psbench's hottest keys; `q` quits with exit status 0
and no BPF object of it left in the kernel."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

import numpy as np

from agent.child import AgentProcess
from probes.zmq_layout import pyzmq_libzmq
from test_faults import assert_nothing_left, bpf_objects
from workloads.cluster.cluster import Cluster
from workloads.psbench.keys import KeyPermutation, KeySpace
from workloads.psbench.launch import launch_in_cluster, launch_local

pytestmark = pytest.mark.privileged
ROOT = Path(__file__).resolve().parents[2]
SESSION = "pslat-top-test"


def _screen(tmux=("tmux",)) -> str:
    return subprocess.run([*tmux, "capture-pane", "-p", "-t", SESSION], capture_output=True, text=True).stdout


def _wait_screen(cond, what: str, timeout_s: float = 30.0, tmux=("tmux",)) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        s = _screen(tmux)
        if cond(s):
            return s
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not on screen within {timeout_s:g} s:\n{s}")
        time.sleep(0.2)   # polling the pane for a condition, not waiting for a guessed time


def test_top_shows_ops_rates_and_hosts_and_takes_keys(tmp_path):
    with Cluster(3, wait_s=300, log_dir=tmp_path / "wire") as cluster:
        names = [h.name for h in cluster.hosts]
        args = ["--lib", str(pyzmq_libzmq()), "--listen", "127.0.0.1:0", "--no-netstack"]
        for h in names:
            args += ["--netns", h]
        with AgentProcess(tmp_path / "agent", args) as agent:
            port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", "".join(agent.lines)).group(1))
            with launch_in_cluster(cluster, tmp_path / "ps", servers=1, workers=2, duration_s=30.0,
                                   rate=50.0) as job:   # open loop: a closed loop floods the agent on 2 shared cores
                job.wait_ready()
                cmd = (f"cd {shlex.quote(str(ROOT))} && LANG=C.UTF-8 exec {shlex.quote(sys.executable)} "
                       f"-m pslat.cli top --agent 127.0.0.1:{port}")
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


# --------------------------------------------------------------- own probes
PROC_NAME = "psbench-top"    # psbench --proc-name: what --comm selects (the thread group leader's comm)
RATE_PER_S = 100.0           # open loop, per worker: psbench alternates pull and push
ROWS = re.compile(r"^(\S+)\s+(cli|srv)\s+(push|pull)\s+(\S+)\s+([\d.,]+)\s", re.M)
WINDOW = re.compile(r"last (\d+) s")
KEYS = re.compile(r"0x([0-9a-f]+) (\d+\.\d)%")
HEALTH = re.compile(r"\d[\d,]* ev/s, cpu [\d.]+%, sampling 100%")   # its own agent's line


def _hottest_wire_keys(n: int, key_space: int = 1_000_000, seed: int = 1) -> list[int]:
    """psbench's n most popular keys (Zipf ranks 1..n through its key permutation)."""
    space = KeySpace(key_space, 1)
    return [int(k) for k in space.wire_keys(KeyPermutation(key_space, seed)(np.arange(n, dtype=np.uint64)))]


def test_top_with_its_own_probes_shows_traffic_and_detaches_on_q(tmp_path):
    tmux = ("tmux", "-L", f"pslat-top-own-{os.getpid()}")   # a server of its own: kill-server ends only it
    rc_file = tmp_path / "top.rc"
    cmd = (f"cd {shlex.quote(str(ROOT))} && LANG=C.UTF-8 {shlex.quote(sys.executable)} -m pslat.cli top "
           # --no-netstack starts faster; --sample-rate 1: shedding could drop the one host pair
           f"--comm {PROC_NAME} --lib {shlex.quote(str(pyzmq_libzmq()))} --no-netstack --sample-rate 1; "
           f"echo $? > {shlex.quote(str(rc_file))}")
    t0 = time.monotonic()
    subprocess.run([*tmux, "-u", "new-session", "-d", "-s", SESSION, "-x", "80", "-y", "24", cmd], check=True)
    # the job starts while top compiles its probes (--comm selects its processes whenever they start)
    job = launch_local(tmp_path / "ps", servers=1, workers=1, duration_s=40.0, rate=RATE_PER_S,
                       proc_name=PROC_NAME)
    try:
        _wait_screen(lambda s: "ready:" in s.split("\n", 1)[0], "top's probes ready", 60, tmux)
        t_ready = time.monotonic() - t0
        shell = subprocess.run([*tmux, "display", "-p", "-t", SESSION, "#{pane_pid}"], capture_output=True,
                               text=True, check=True).stdout.strip()
        (top_pid,) = map(int, Path(f"/proc/{shell}/task/{shell}/children").read_text().split())
        objs = bpf_objects(top_pid)
        with job:
            job.wait_ready()

            def traffic(s: str) -> bool:   # both ops on both sides over a window of 4 s or more, its health
                w = WINDOW.search(s)
                return (w is not None and int(w[1]) >= 4 and KEYS.search(s) is not None
                        and HEALTH.search(s) is not None
                        and {(m[1], m[2]) for m in ROWS.findall(s)} >= {(r, o) for r in ("cli", "srv")
                                                                       for o in ("push", "pull")})
            s = _wait_screen(traffic, "push and pull rows, hot keys", 30, tmux)
            t_traffic = time.monotonic() - t0
            (tmp_path / "screen-own-probes.txt").write_text(s)
            print(f"\n{s}")
            rates = {}
            for host, role, op, peer, rate in ROWS.findall(s):
                # one host (loopback): both ends on it, so the peer is this host itself
                assert peer == "self", s
                rates[role, op] = float(rate.replace(",", ""))
                # at most what psbench issues (its rate per op); the window counts from top's first
                # message of the job, before the open loop began, so no tight lower bound
                assert 0 < rates[role, op] <= 1.3 * RATE_PER_S / 2, s
            for op in ("push", "pull"):   # both ends of the same requests, seen by the same probes
                assert rates["cli", op] == pytest.approx(rates["srv", op], rel=0.1), s
            shown = [int(k, 16) for k, _ in KEYS.findall(s.split("hot keys", 1)[1].split("connections", 1)[0])]
            hottest = _hottest_wire_keys(8)
            assert shown[0] == hottest[0] and set(shown) <= set(hottest), (shown, hottest)
            assert all(len(line) <= 80 for line in s.splitlines()) and len(s.splitlines()) <= 24
            t_q = time.monotonic()
            subprocess.run([*tmux, "send-keys", "-t", SESSION, "q"], check=True)
            deadline = time.monotonic() + 20
            while not rc_file.exists() or not rc_file.read_text().strip():
                assert time.monotonic() < deadline, f"top did not quit on q:\n{_screen(tmux)}"
                time.sleep(0.1)   # polling for the exit status the shell writes
            t_exit = time.monotonic() - t_q
            assert rc_file.read_text().strip() == "0", _screen(tmux)
            assert_nothing_left(top_pid, objs)   # its programs, links and uprobes are gone
    finally:
        job.stop()
        subprocess.run([*tmux, "kill-server"], capture_output=True)
    print(f"probes ready {t_ready:.1f} s, traffic on screen {t_traffic:.1f} s, exit after q {t_exit:.1f} s, "
          f"total {time.monotonic() - t0:.1f} s")
