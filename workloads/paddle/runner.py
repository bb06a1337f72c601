"""Run PaddlePaddle's parameter server (workloads/paddle/ps_job.py) on the virtual cluster:
servers and trainers each on a host of their own.

    job = PaddleJob(cluster, out_dir, servers=2, trainers=2, steps=20)
    with job:                      # start(); stop() at the end, whatever happened
        pids = job.wait_ready()    # every process loaded, servers listening, no RPC yet
        job.release()              # the trainers connect and train
        res = job.wait()           # wait_trainers(), then collect(): the servers'
                                   # counters read over HTTP (/vars), servers stopped
    res.counts()                   # the job's own counts (the test oracle)

Placement: server i on hosts[i], trainer j on hosts[servers + j] (wrapping). Every
process gets the variables of Paddle's PaddleCloudRoleMaker: TRAINING_ROLE,
PADDLE_PSERVERS_IP_PORT_LIST, PADDLE_TRAINER_ENDPOINTS, PADDLE_TRAINERS_NUM,
PADDLE_TRAINER_ID, POD_IP (its host's address) and PADDLE_PORT; no gloo (fleet's
barriers then do nothing: the runner orders the start instead, see wait_ready).

Paddle's pservers never exit by themselves. Once every trainer has exited 0 (after
fleet.stop_worker, which flushes its asynchronous pushes), the runner reads each
server's own counters from brpc's /vars (brpc_vars.py), then kills the servers.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import UserError
from workloads.procs import ProcInfo, log_tail, popen_logged, signal_group

from . import brpc_vars
from .venv import ensure_venv

PS_JOB = Path(__file__).resolve().with_name("ps_job.py")
# Ports inside the namespace hosts: each has its own port space.
SERVER_PORT = 29500
TRAINER_PORT = 29600
DEFAULT_TIMEOUT_S = 120.0
POLL_INTERVAL_S = 0.05
SERVER_STOP_GRACE_S = 3.0
LOG_TAIL_LINES = 5
TRAINER_JSON = "trainer-{}.json"
SERVER_JSON = "server-{}.json"

# One thread per pool: the machine has 2 cores for every process of the job and the
# tracer. GLOG_v=0: Paddle's VLOG(0) set-up lines only.
QUIET_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "CPU_NUM": "1",
    "GLOG_v": "0",
    "GLOG_logtostderr": "1",
    "PYTHONUNBUFFERED": "1",
    # Paddle 3.0 builds static programs in PIR by default; the_one_ps's passes and
    # sparse_embedding need the legacy program (under PIR sparse_embedding fails on
    # bool(Tensor) while building).
    "FLAGS_enable_pir_api": "0",
}
# variables of the role maker, never inherited from the caller's shell
_ROLE_PREFIXES = ("PADDLE_", "TRAINING_ROLE", "POD_IP", "FLAGS_", "GLOG_", "PSLAT_PADDLE_")


@dataclass(frozen=True)
class ProcSpec:
    name: str          # "server-0", "trainer-1": server index / trainer id
    role: str          # TRAINING_ROLE: PSERVER or TRAINER
    index: int
    host: Any          # the cluster's host object (.name, .addr)


def place(hosts: list, servers: int, trainers: int) -> list[ProcSpec]:
    if not hosts:
        raise UserError("the cluster has no hosts; bring it up with at least 1 host")
    n = len(hosts)
    specs = [ProcSpec(f"server-{i}", "PSERVER", i, hosts[i % n]) for i in range(servers)]
    specs += [ProcSpec(f"trainer-{j}", "TRAINER", j, hosts[(servers + j) % n])
              for j in range(trainers)]
    return specs


@dataclass
class PaddleResult:
    out_dir: Path
    servers: int
    trainers: int
    steps: int
    wall_s: float      # release -> the last trainer exited
    processes: list[ProcInfo] = field(default_factory=list)

    def pids(self, role: str | None = None) -> list[int]:
        return [p.pid for p in self.processes if role is None or p.role == role]

    def trainer_summaries(self) -> dict[int, dict]:
        """Each trainer's own trainer-<id>.json (ps_job.py), by trainer id."""
        return {j: json.loads((self.out_dir / TRAINER_JSON.format(j)).read_text())
                for j in range(self.trainers)}

    def server_vars(self) -> dict[int, dict[str, int]]:
        """Each server's brpc counters as read at the end (brpc_vars.py), by server index."""
        return {i: json.loads((self.out_dir / SERVER_JSON.format(i)).read_text())["bvars"]
                for i in range(self.servers)}

    def counts(self) -> dict:
        """The job's own counts, none of them from pslat:

        {"trainers": {id: {"steps": int, "pull_sparse_keys": [distinct ids per step],
                           "distinct_ids_all": int,   # over every step (None: older json)
                           "tables": {"sparse": {name: table id}, "dense": [table ids]}}},
         "servers": {index: {"requests": int,            # every PsService request
                             "by_op": {PsCmdID name: int}}},  # the four table ops
         "by_op": {PsCmdID name: int}}                   # over the servers
        """
        trainers = {j: {"steps": s["steps_done"],
                        "pull_sparse_keys": [st["distinct_ids"] for st in s["steps"]],
                        "distinct_ids_all": s.get("distinct_ids_all"),
                        "tables": s["tables"]}
                    for j, s in self.trainer_summaries().items()}
        servers, total = {}, {}
        port_of = {p.index: p.port for p in self.processes if p.role == "PSERVER"}
        for i, bvars in self.server_vars().items():
            by_op = brpc_vars.op_counts(bvars)
            servers[i] = {"requests": brpc_vars.service_requests(bvars, port_of[i]),
                          "by_op": by_op}
            for op, n in by_op.items():
                total[op] = total.get(op, 0) + n
        return {"trainers": trainers, "servers": servers, "by_op": total}


def _tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    return log_tail(path, lines)


class PaddleJob:
    """A running Paddle parameter-server job: start() returns at once, wait() collects it."""

    def __init__(self, cluster: Any, out_dir: str | os.PathLike, servers: int = 2,
                 trainers: int = 2, steps: int = 20, script_args: list[str] | None = None,
                 env: dict[str, str] | None = None, python: str | os.PathLike | None = None):
        if servers < 1 or trainers < 1:
            raise UserError(f"need at least 1 server and 1 trainer, not {servers} and {trainers}")
        if steps < 1:
            raise UserError(f"need at least 1 step, not {steps}")
        self.cluster = cluster
        self.out_dir = Path(out_dir)
        self.servers, self.trainers, self.steps = servers, trainers, steps
        self.script_args = [str(a) for a in (script_args or [])]
        self.extra_env = dict(env or {})
        self.python = Path(python) if python else ensure_venv()
        self.specs = place(list(cluster.hosts), servers, trainers)
        self.gate_file = self.out_dir / "gate"
        self.procs: list[tuple[ProcInfo, subprocess.Popen]] = []
        self._t_release = 0.0
        self._wall_s: float | None = None
        self._ports = {s.name: self._port(s) for s in self.specs}

    def _port(self, spec: ProcSpec) -> int:
        # distinct per index so that processes sharing a host do not clash
        return (SERVER_PORT if spec.role == "PSERVER" else TRAINER_PORT) + spec.index

    def _endpoints(self, role: str) -> str:
        return ",".join(f"{s.host.addr}:{self._ports[s.name]}" for s in self.specs
                        if s.role == role)

    def _env(self, spec: ProcSpec) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_ROLE_PREFIXES)}
        env.update(QUIET_ENV)
        env.update({
            "TRAINING_ROLE": spec.role,
            "PADDLE_PSERVERS_IP_PORT_LIST": self._endpoints("PSERVER"),
            "PADDLE_TRAINER_ENDPOINTS": self._endpoints("TRAINER"),
            "PADDLE_TRAINERS_NUM": str(self.trainers),
            "POD_IP": spec.host.addr,
            "PADDLE_PORT": str(self._ports[spec.name]),
        })
        if spec.role == "TRAINER":
            env["PADDLE_TRAINER_ID"] = str(spec.index)
        env.update(self.extra_env)
        return env

    def start(self) -> "PaddleJob":
        log_dir = self.out_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        # a previous run's files would pass for this run's counts, its gate open at once
        for pattern in ("trainer-*.json", "server-*.json", "ready-*", "gate"):
            for stale in self.out_dir.glob(pattern):
                stale.unlink()
        argv = [str(self.python), str(PS_JOB), "--out", str(self.out_dir),
                "--steps", str(self.steps), "--gate-file", str(self.gate_file),
                *self.script_args]
        try:
            for spec in self.specs:
                log = log_dir / f"{spec.name}.log"
                p = popen_logged(self.cluster, spec.host, argv, self._env(spec), log)
                self.procs.append((ProcInfo(spec.name, spec.role, spec.index, spec.host.name,
                                            spec.host.addr, self._ports[spec.name], p.pid, log),
                                   p))
        except BaseException:
            self.stop()
            raise
        return self

    def _poll(self) -> None:
        """Returncodes so far; a failure of any process (a server at any time) ends the job."""
        for info, p in self.procs:
            if info.returncode is None:
                info.returncode = p.poll()
            if info.returncode is not None and (info.returncode != 0 or info.role == "PSERVER"):
                raise self._fail(f"{info.name} on {info.host} exited with {info.returncode}")

    def _listening(self, info: ProcInfo) -> bool:
        proc = self.cluster.run(info.host, ["ss", "-Hltn", f"sport = :{info.port}"],
                                capture_output=True, text=True)
        return proc.returncode == 0 and bool(proc.stdout.strip())

    def wait_ready(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, int]:
        """Until every trainer waits at the gate (Paddle loaded, program built) and every
        server listens: no trainer has sent anything yet. Returns pid by process name."""
        deadline = time.monotonic() + timeout_s
        trainers = [i for i, _ in self.procs if i.role == "TRAINER"]
        servers = [i for i, _ in self.procs if i.role == "PSERVER"]
        waiting = list(servers)
        while True:
            self._poll()
            waiting = [s for s in waiting if not self._listening(s)]
            if not waiting and all((self.out_dir / f"ready-{t.pid}").exists() for t in trainers):
                return {i.name: i.pid for i, _ in self.procs}
            if time.monotonic() > deadline:
                raise self._fail(f"not ready within {timeout_s:.0f} s")
            time.sleep(POLL_INTERVAL_S)

    def release(self) -> None:
        """Let the trainers connect and train (after wait_ready)."""
        self._t_release = time.monotonic()
        self.gate_file.touch()

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> PaddleResult:
        """wait_trainers(), then collect(). UserError (everything killed) on a failure."""
        self.wait_trainers(timeout_s)
        return self.collect()

    def wait_trainers(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Release the trainers if not yet and wait until every one exited 0 (the
        servers then sit idle: a tracer can stop before collect()'s HTTP reads)."""
        if not self.gate_file.exists():
            self.wait_ready(timeout_s)
            self.release()
        deadline = self._t_release + timeout_s
        trainers = [i for i, _ in self.procs if i.role == "TRAINER"]
        while not all(t.returncode == 0 for t in trainers):
            self._poll()
            if time.monotonic() > deadline:
                left = [t.name for t in trainers if t.returncode is None]
                raise self._fail(f"timed out after {timeout_s:.0f} s; still training: "
                                 f"{', '.join(left)}")
            time.sleep(POLL_INTERVAL_S)
        self._wall_s = time.monotonic() - self._t_release
        for t in trainers:
            if not (self.out_dir / TRAINER_JSON.format(t.index)).exists():
                raise self._fail(f"{t.name} exited 0 without writing its counts")

    def collect(self) -> PaddleResult:
        """After wait_trainers(): read each server's counters from brpc's /vars (one
        HTTP connection to its port each), then stop the servers."""
        if self._wall_s is None:
            raise UserError("collect() comes after wait_trainers()")
        for info, _p in self.procs:
            if info.role != "PSERVER":
                continue
            self._poll()
            host = self.cluster.host(info.host)
            bvars = brpc_vars.read_server_vars(self.cluster, host, info.port)
            (self.out_dir / SERVER_JSON.format(info.index)).write_text(
                json.dumps({"server": info.index, "addr": info.addr, "port": info.port,
                            "pid": info.pid, "bvars": bvars}))
        self.stop()
        return PaddleResult(self.out_dir, self.servers, self.trainers, self.steps, self._wall_s,
                            [i for i, _ in self.procs])

    def stop(self) -> None:
        """Stop every process still running: SIGTERM to its group, SIGKILL after a grace."""
        live = [(i, p) for i, p in self.procs if p.poll() is None]
        for _i, p in live:
            signal_group(p, signal.SIGTERM)
        deadline = time.monotonic() + SERVER_STOP_GRACE_S
        for info, p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                signal_group(p, signal.SIGKILL)
                p.wait(timeout=10)
            if info.role == "PSERVER" or info.returncode is None:
                info.returncode = p.returncode

    def _fail(self, why: str) -> UserError:
        self.stop()
        details = "; ".join(f"{i.name} on {i.host} (rc {i.returncode}): {_tail(i.log)}"
                            for i, _ in self.procs if i.returncode not in (0, None))
        return UserError(f"Paddle job failed: {why}. {details} Full logs in "
                         f"{self.out_dir / 'logs'}; rerun with env={{'GLOG_v': '3'}} for more")

    def __enter__(self) -> "PaddleJob":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_in_cluster(cluster: Any, out_dir: str | os.PathLike, servers: int = 2,
                   trainers: int = 2, steps: int = 20,
                   timeout_s: float = DEFAULT_TIMEOUT_S, **job_kw: Any) -> PaddleResult:
    """Start, release and wait for a job on the cluster's hosts."""
    with PaddleJob(cluster, out_dir, servers, trainers, steps, **job_kw) as job:
        return job.wait(timeout_s)
