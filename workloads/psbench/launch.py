"""Start a whole psbench job (scheduler, M servers, N workers) as processes,
locally on loopback or spread over the hosts of a virtual cluster, and watch it.

Each process is `python -m workloads.psbench` with ps-lite's DMLC_* variables
set for its role; its stdout and stderr go to <out>/logs/<role>-<i>.log.
Placement in a cluster: server i on hosts[i], worker j on hosts[M+j], the
scheduler on hosts[0] on its own port.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd

from core.errors import UserError
from workloads.psbench.options import Workload
from workloads.psbench.truth import read_truth

CLUSTER_SCHEDULER_PORT = 9091  # below the ephemeral range: never taken by a node's own bind
STOP_GRACE_S = 5.0
POLL_S = 0.05
ERROR_TAIL_LINES = 15


@dataclass
class Proc:
    role: str
    index: int
    popen: subprocess.Popen
    log: Path


@dataclass
class Job:
    """A running psbench job. Use as a context manager (stops it on exit)."""
    out_dir: Path
    procs: list[Proc]
    workload: Workload
    scheduler: tuple[str, int]
    _finished: bool = field(default=False, repr=False)

    @property
    def pids(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {"scheduler": [], "server": [], "worker": []}
        for p in self.procs:
            out[p.role].append(p.popen.pid)
        return out

    def _failure(self) -> Proc | None:
        return next((p for p in self.procs if p.popen.poll() not in (None, 0)), None)

    def _raise_failure(self, p: Proc) -> None:
        self.stop()
        try:
            tail = p.log.read_text(errors="replace").strip().splitlines()[-ERROR_TAIL_LINES:]
        except OSError:
            tail = []
        detail = " | ".join(line.strip() for line in tail if line.strip()) or "no output"
        raise UserError(f"psbench {p.role} {p.index} (pid {p.popen.pid}) exited with {p.popen.returncode}: "
                        f"{detail}; full log in {p.log}")

    def wait(self, timeout_s: float | None = None) -> None:
        """Return when every process ended well; raise UserError (after
        stopping the rest) as soon as one fails, or on timeout."""
        limit = self.workload.duration_s + 2 * self.workload.start_timeout_s + 60 if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        while True:
            failed = self._failure()
            if failed is not None:
                self._raise_failure(failed)
            if all(p.popen.poll() == 0 for p in self.procs):
                self._finished = True
                return
            if time.monotonic() > deadline:
                self.stop()
                raise UserError(f"psbench job in {self.out_dir} still running after {limit:g} s; "
                                "stopped it: see its logs")
            time.sleep(POLL_S)

    def wait_ready(self, timeout_s: float | None = None) -> dict[int, dict]:
        """Block until every node has joined the job and passed the start
        barrier (each writes <out>/nodes/<id>.json); returns those files by node id."""
        limit = self.workload.start_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        nodes_dir = self.out_dir / "nodes"
        while True:
            failed = self._failure()
            if failed is not None:
                self._raise_failure(failed)
            files = list(nodes_dir.glob("*.json"))
            if len(files) == len(self.procs):
                return {int(f.stem): json.loads(f.read_text()) for f in files}
            if time.monotonic() > deadline:
                self.stop()
                raise UserError(f"psbench job did not start within {limit:g} s ({len(files)} of "
                                f"{len(self.procs)} nodes ready); see logs in {self.out_dir / 'logs'}")
            time.sleep(POLL_S)

    def stop(self) -> None:
        """SIGTERM every process still running (they flush their ground truth),
        SIGKILL what is left after a grace period."""
        live = [p for p in self.procs if p.popen.poll() is None]
        for p in live:
            _signal(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for p in live:
            try:
                p.popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal(p.popen, signal.SIGKILL)
                p.popen.wait()

    def truth(self) -> pd.DataFrame:
        return read_truth(self.out_dir)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _signal(popen: subprocess.Popen, sig: int) -> None:
    try:
        popen.send_signal(sig)
    except ProcessLookupError:
        pass


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


Popen = Callable[..., subprocess.Popen]


def launch(out_dir: Path, placements: list[tuple[str, object, str]], popen: Popen, scheduler: tuple[str, int],
           workload: Workload, host_ids: list[str] | None = None, die_with_parent: bool = False) -> Job:
    """Start one process per (role, host handle, node address) in `placements`
    through `popen(host, argv, env=..., **popen_kw)`. die_with_parent only
    where popen starts the process directly (a wrapper that exits would take
    the node with it); without it, an orphaned job still ends by itself after
    duration_s."""
    out_dir = Path(out_dir)
    if any((out_dir / "truth").glob("*.parquet")):
        raise UserError(f"{out_dir} already holds a run's ground truth, which this job's would mix with; "
                        "pass a new output directory")
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    for stale in (out_dir / "nodes").glob("*.json"):
        stale.unlink()  # a reused out dir must not look ready already
    n_servers = sum(1 for r, _, _ in placements if r == "server")
    n_workers = sum(1 for r, _, _ in placements if r == "worker")
    base_env = {**os.environ, "DMLC_PS_ROOT_URI": scheduler[0], "DMLC_PS_ROOT_PORT": str(scheduler[1]),
                "DMLC_NUM_SERVER": str(n_servers), "DMLC_NUM_WORKER": str(n_workers), "PYTHONUNBUFFERED": "1"}
    (out_dir / "job.json").write_text(json.dumps({
        "servers": n_servers, "workers": n_workers, "scheduler": list(scheduler),
        "workload": workload.__dict__}, indent=1, default=str))
    procs: list[Proc] = []
    counters: dict[str, int] = {}
    try:
        for k, (role, host, addr) in enumerate(placements):
            index = counters[role] = counters.get(role, -1) + 1
            argv = [sys.executable, "-m", "workloads.psbench", "--role", role, "--out", str(out_dir),
                    *workload.to_argv()] + (["--die-with-parent"] if die_with_parent else [])
            if host_ids:
                argv += ["--host-id", host_ids[k]]
            env = {**base_env, "DMLC_ROLE": role, "DMLC_NODE_HOST": addr}
            log = out_dir / "logs" / f"{role}-{index}.log"
            with open(log, "wb") as f:
                p = popen(host, argv, env=env, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            procs.append(Proc(role, index, p, log))
    except BaseException:
        Job(out_dir, procs, workload, scheduler).stop()
        raise
    return Job(out_dir, procs, workload, scheduler)


def _roles(servers: int, workers: int) -> list[str]:
    if servers < 1 or workers < 1:
        raise UserError(f"psbench needs at least 1 server and 1 worker, got {servers} and {workers}; "
                        "pass --servers/--workers >= 1")
    return ["scheduler"] + ["server"] * servers + ["worker"] * workers


def launch_local(out_dir: Path, servers: int, workers: int, duration_s: float, **opts) -> Job:
    """A whole job on this host's loopback (127.0.0.1)."""
    workload = Workload.from_kwargs(duration_s=duration_s, **opts)
    addr = "127.0.0.1"
    roles = _roles(servers, workers)
    return launch(out_dir, [(r, None, addr) for r in roles],
                  lambda _host, argv, **kw: subprocess.Popen(argv, **kw),
                  (addr, _free_port(addr)), workload, die_with_parent=True)


def launch_in_cluster(cluster, out_dir: Path, servers: int, workers: int, duration_s: float,
                      scheduler_port: int = CLUSTER_SCHEDULER_PORT, **opts) -> Job:
    """A job spread over a workloads.cluster Cluster: server i on hosts[i],
    worker j on hosts[servers + j], the scheduler on hosts[0]."""
    workload = Workload.from_kwargs(duration_s=duration_s, **opts)
    roles = _roles(servers, workers)
    hosts = list(cluster.hosts)
    if len(hosts) < servers + workers:
        raise UserError(f"psbench with {servers} servers and {workers} workers needs {servers + workers} "
                        f"hosts, the cluster has {len(hosts)}; bring it up with --hosts {servers + workers}")
    placed = [hosts[0]] + hosts[:servers] + hosts[servers:servers + workers]
    return launch(out_dir, [(r, h, h.addr) for r, h in zip(roles, placed)], cluster.popen,
                  (hosts[0].addr, scheduler_port), workload, host_ids=[h.name for h in placed])
