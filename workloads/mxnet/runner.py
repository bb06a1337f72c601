"""Run a script on MXNet's real ps-lite: scheduler, servers and workers spread over hosts.

One call: `run_in_cluster(cluster, script_args, out_dir)`. The cluster is
anything with `.hosts` (objects with .name and .addr) and
`.popen(host, argv, env=None, **popen_kw) -> subprocess.Popen` that runs argv
on that host: workloads.cluster.Cluster (hosts are network namespaces), or
`LoopbackCluster` here for debugging without root.

Placement, as psbench does it: the scheduler on hosts[0], server i on
hosts[i], worker j on hosts[servers + j], wrapping around when there are
fewer hosts than processes. Every process gets the DMLC_* variables of its
role; DMLC_NODE_HOST is its own host's address, which ps-lite announces to
its peers (without it ps-lite guesses an interface, wrongly in a namespace).

`MxnetJob` is the same without the wait, for callers (the agent's tests) that
need the pids while the job runs. With gated=True its workers stop after
loading MXNet and before opening any connection: `wait_ready()` returns once
every worker is there (all pids known, no worker traffic yet), `release()`
lets them go.
"""
from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from core.errors import UserError
from workloads.procs import kill_and_reap, log_tail, popen_logged

from . import oplog
from .venv import ensure_venv

SPARSE_KV = Path(__file__).resolve().with_name("sparse_kv.py")
MODES = ("dist_async", "dist_sync")
# The scheduler's port inside a namespace host: each namespace has its own
# port space, so a fixed port cannot clash with the machine's services.
DEFAULT_ROOT_PORT = 9091
DEFAULT_TIMEOUT_S = 120.0
# After the workers are done, rank 0 stops the servers and the scheduler
# leaves its final barrier: this long is plenty on an idle machine.
SHUTDOWN_GRACE_S = 20.0
POLL_INTERVAL_S = 0.05
STDERR_TAIL_LINES = 5

# Keep MXNet from spawning a thread per core per pool: the machine has 2
# cores shared by every process of the job (and by the tracer).
QUIET_ENV = {
    "OMP_NUM_THREADS": "1",
    "MXNET_CPU_WORKER_NTHREADS": "1",
    "MXNET_CPU_PRIORITY_NTHREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MXNET_USE_OPERATOR_TUNING": "0",  # skips a timing pass at import
    "PYTHONUNBUFFERED": "1",
}


@dataclass(frozen=True)
class LocalHost:
    name: str
    addr: str = "127.0.0.1"


class LoopbackCluster:
    """Stand-in for workloads.cluster.Cluster: n "hosts" that are all this machine's loopback."""

    def __init__(self, hosts: int = 1):
        if hosts < 1:
            raise UserError(f"a loopback cluster needs at least 1 host, not {hosts}")
        self.hosts = [LocalHost(f"lo{i}") for i in range(hosts)]

    def popen(self, host: Any, argv: Sequence[str], env: dict | None = None,
              **popen_kw: Any) -> subprocess.Popen:
        return subprocess.Popen(list(argv), env=env, **popen_kw)

    def __enter__(self) -> "LoopbackCluster":
        return self

    def __exit__(self, *exc: Any) -> None:
        pass


@dataclass(frozen=True)
class ProcSpec:
    # "scheduler", "server-0", "worker-1": the placement index, NOT the rank;
    # ps-lite's scheduler hands out ranks in order of arrival (see ProcInfo.rank).
    name: str
    role: str          # DMLC_ROLE
    host: Any          # the cluster's host object


def place(hosts: Sequence[Any], servers: int, workers: int) -> list[ProcSpec]:
    """scheduler on hosts[0], server i on hosts[i], worker j on hosts[servers + j] (wrapping)."""
    if not hosts:
        raise UserError("the cluster has no hosts; bring it up with at least 1 host")
    n = len(hosts)
    specs = [ProcSpec("scheduler", "scheduler", hosts[0])]
    specs += [ProcSpec(f"server-{i}", "server", hosts[i % n]) for i in range(servers)]
    specs += [ProcSpec(f"worker-{j}", "worker", hosts[(servers + j) % n]) for j in range(workers)]
    return specs


@dataclass
class ProcInfo:
    name: str
    role: str
    host: str          # host name (the netns name in workloads.cluster)
    addr: str
    pid: int
    log: Path          # its stdout and stderr
    returncode: int | None = None
    # ps-lite's node id (scheduler 1, server rank r: 8 + 2r, worker rank r:
    # 9 + 2r), the sender/recver in every PBMeta; read from ps-lite's own log
    # line "W[11] is connected to others" (needs PS_VERBOSE >= 1).
    node_id: int | None = None

    @property
    def rank(self) -> int | None:
        """Server or worker rank, from the node id."""
        if self.node_id is None or self.role == "scheduler":
            return None
        return (self.node_id - (8 if self.role == "server" else 9)) // 2


@dataclass
class MxnetResult:
    out_dir: Path
    mode: str
    servers: int
    workers: int
    root_uri: str
    root_port: int
    wall_s: float      # first process started (gated: release) -> last process exited
    processes: list[ProcInfo] = field(default_factory=list)

    def op_logs(self) -> dict[int, list[oplog.OpRecord]]:
        """What every worker issued (see workloads/mxnet/oplog.py), by rank."""
        return oplog.read_op_logs(self.out_dir)

    def pids(self, role: str | None = None) -> list[int]:
        return [p.pid for p in self.processes if role is None or p.role == role]


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    return log_tail(path, lines)


_CONNECTED = re.compile(rb"\b[HSW]\[(\d+)\] is connected to others")


def _node_id(log: Path) -> int | None:
    try:
        m = _CONNECTED.search(log.read_bytes())
    except OSError:
        return None
    return int(m.group(1)) if m else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MxnetJob:
    """A running MXNet ps-lite job: start() returns at once, wait() collects it."""

    def __init__(self, cluster: Any, script_args: Sequence[str], out_dir: str | os.PathLike,
                 servers: int = 1, workers: int = 2, mode: str = "dist_async",
                 root_port: int = DEFAULT_ROOT_PORT, script: str | os.PathLike = SPARSE_KV,
                 ps_verbose: int = 1, env: dict[str, str] | None = None,
                 python: str | os.PathLike | None = None, gated: bool = False):
        if mode not in MODES:
            raise UserError(f"unknown kvstore mode {mode!r}; use one of {', '.join(MODES)}")
        if servers < 1 or workers < 1:
            raise UserError(f"need at least 1 server and 1 worker, not {servers} and {workers}")
        if not 0 < root_port < 65536:
            raise UserError(f"scheduler port {root_port} is not a TCP port; use 1-65535")
        if any(str(a) == "--mode" or str(a).startswith("--mode=") for a in script_args):
            raise UserError("pass the kvstore mode as mode=..., not --mode in script_args")
        self.script = Path(script)
        if not self.script.is_file():
            raise UserError(f"no MXNet script at {self.script}; pass an existing file")
        self.cluster = cluster
        self.script_args = [str(a) for a in script_args]
        self.out_dir = Path(out_dir)
        self.servers, self.workers, self.mode = servers, workers, mode
        self.root_port = root_port
        self.ps_verbose = ps_verbose
        self.extra_env = dict(env or {})
        self.python = Path(python) if python else ensure_venv()
        self.specs = place(list(cluster.hosts), servers, workers)
        self.root_uri = self.specs[0].host.addr
        self.procs: list[tuple[ProcInfo, subprocess.Popen]] = []
        self._t_start = 0.0
        self.gate_file = self.out_dir / "gate" if gated else None
        if self.gate_file:
            self.script_args += ["--gate-file", str(self.gate_file)]

    def _env(self, spec: ProcSpec) -> dict[str, str]:
        # Start from ours minus any DMLC_*/PS_* left over, so nothing leaks in
        # from a caller's shell and changes the topology.
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DMLC_", "PS_", "MXNET_KVSTORE_"))}
        env.update(QUIET_ENV)
        env.update({
            "DMLC_ROLE": spec.role,
            "DMLC_PS_ROOT_URI": self.root_uri,
            "DMLC_PS_ROOT_PORT": str(self.root_port),
            "DMLC_NUM_SERVER": str(self.servers),
            "DMLC_NUM_WORKER": str(self.workers),
            "DMLC_NODE_HOST": spec.host.addr,
            oplog.OUT_DIR_ENV: str(self.out_dir),
        })
        # 1 (default) logs only set-up lines, among them each node's id;
        # 2 logs every message's meta (slow, for debugging).
        env["PS_VERBOSE"] = str(self.ps_verbose)
        env.update(self.extra_env)
        return env

    def start(self) -> "MxnetJob":
        log_dir = self.out_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        # A previous run's files in the same dir would mix into this run's
        # ground truth, and its gate file would open this run's gate at once.
        for pattern in ("worker-*.jsonl", "worker-*.json", "ready-*", "gate"):
            for stale in self.out_dir.glob(pattern):
                stale.unlink()
        argv = [str(self.python), str(self.script), "--mode", self.mode, *self.script_args]
        self._t_start = time.monotonic()
        try:
            for spec in self.specs:
                log = log_dir / f"{spec.name}.log"
                p = popen_logged(self.cluster, spec.host, argv, self._env(spec), log)
                info = ProcInfo(spec.name, spec.role, spec.host.name, spec.host.addr, p.pid, log)
                self.procs.append((info, p))
        except BaseException:
            self.stop()
            raise
        return self

    def _check_alive(self) -> None:
        for info, p in self.procs:
            if info.returncode is None:
                info.returncode = p.poll()
            if info.returncode is not None:
                raise self._fail(f"{info.name} on {info.host} exited with {info.returncode} "
                                 "before the gate opened")

    def wait_ready(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
        """Gated job: wait until every worker waits at the gate; pid by process name."""
        if not self.gate_file:
            raise UserError("wait_ready() needs a job made with gated=True")
        deadline = time.monotonic() + timeout_s
        workers = [i for i, _ in self.procs if i.role == "worker"]
        while not all((self.out_dir / f"ready-{i.pid}").exists() for i in workers):
            self._check_alive()
            if time.monotonic() > deadline:
                raise self._fail(f"workers not ready within {timeout_s:.0f} s")
            time.sleep(POLL_INTERVAL_S)
        return {i.name: i.pid for i, _ in self.procs}

    def release(self) -> None:
        """Gated job: let the workers connect and run."""
        if not self.gate_file:
            raise UserError("release() needs a job made with gated=True")
        self._t_start = time.monotonic()  # wait()'s timeout counts from here
        self.gate_file.touch()

    def stop(self) -> None:
        """Kill every process of the job still running (by its process group)."""
        for (info, _p), rc in zip(self.procs, kill_and_reap([p for _, p in self.procs])):
            if rc is not None:
                info.returncode = rc

    def _fail(self, why: str) -> UserError:
        self.stop()
        details = "; ".join(f"{i.name} on {i.host} (rc {i.returncode}): {_tail(i.log)}"
                            for i, _ in self.procs if i.returncode not in (0, None))
        return UserError(f"MXNet job failed: {why}. {details} Full logs in "
                         f"{self.out_dir / 'logs'}; rerun with ps_verbose=2 for every message")

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> MxnetResult:
        """Wait until every process exited; UserError (after killing the rest) on a failure."""
        deadline = self._t_start + timeout_s
        workers_done_at: float | None = None
        while True:
            now = time.monotonic()
            for info, p in self.procs:
                if info.returncode is None:
                    info.returncode = p.poll()
                if info.returncode not in (None, 0):
                    raise self._fail(f"{info.name} on {info.host} exited with {info.returncode}")
            if all(i.returncode == 0 for i, _ in self.procs):
                break
            if workers_done_at is None and all(
                    i.returncode == 0 for i, _ in self.procs if i.role == "worker"):
                workers_done_at = now
            if workers_done_at is not None and now > workers_done_at + SHUTDOWN_GRACE_S:
                left = [i.name for i, _ in self.procs if i.returncode is None]
                raise self._fail(f"workers finished but {', '.join(left)} did not exit "
                                 f"within {SHUTDOWN_GRACE_S:.0f} s")
            if now > deadline:
                left = [i.name for i, _ in self.procs if i.returncode is None]
                raise self._fail(f"timed out after {timeout_s:.0f} s; still running: "
                                 f"{', '.join(left)}")
            time.sleep(POLL_INTERVAL_S)
        for info, _p in self.procs:
            # ps-lite's scheduler is always node 1 and logs no "connected" line.
            info.node_id = 1 if info.role == "scheduler" else _node_id(info.log)
        return MxnetResult(self.out_dir, self.mode, self.servers, self.workers, self.root_uri,
                           self.root_port, time.monotonic() - self._t_start,
                           [i for i, _ in self.procs])

    def __enter__(self) -> "MxnetJob":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_in_cluster(cluster: Any, script_args: Sequence[str], out_dir: str | os.PathLike,
                   servers: int = 1, workers: int = 2, mode: str = "dist_async",
                   timeout_s: float = DEFAULT_TIMEOUT_S, **job_kw: Any) -> MxnetResult:
    """Run the script (default: sparse_kv.py) on the cluster's hosts and wait for it.

    job_kw: root_port, script, ps_verbose, env (extra variables), python.
    Raises UserError if a process fails or the job outlives timeout_s.
    """
    return MxnetJob(cluster, script_args, out_dir, servers, workers, mode, **job_kw) \
        .start().wait(timeout_s)


def run_local(script_args: Sequence[str], out_dir: str | os.PathLike, servers: int = 1,
              workers: int = 2, mode: str = "dist_async",
              timeout_s: float = DEFAULT_TIMEOUT_S, **job_kw: Any) -> MxnetResult:
    """run_in_cluster on this machine's loopback (no root needed): for debugging."""
    job_kw.setdefault("root_port", _free_port())
    return run_in_cluster(LoopbackCluster(), script_args, out_dir, servers, workers, mode,
                          timeout_s, **job_kw)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run sparse_kv.py on MXNet's ps-lite over loopback.")
    p.add_argument("--out", required=True, help="output dir (worker logs, process logs)")
    p.add_argument("--servers", type=int, default=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--mode", choices=MODES, default="dist_async")
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--ps-verbose", type=int, default=1,
                   help="ps-lite's PS_VERBOSE: 2 logs every message's meta")
    args, script_args = p.parse_known_args(argv)
    try:
        res = run_local(script_args, args.out, args.servers, args.workers, args.mode,
                        args.timeout_s, ps_verbose=args.ps_verbose)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    counts = {r: len(v) for r, v in res.op_logs().items()}
    print(f"ok: {res.mode} {res.servers}x{res.workers} in {res.wall_s:.2f} s; "
          f"ops per worker rank: {counts}; logs in {res.out_dir}")
    for i in res.processes:
        print(f"  {i.name:<10} node {i.node_id} pid {i.pid} on {i.host} ({i.addr})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
