"""Run ps.py (PyTorch RPC over TensorPipe) with one process per host of a cluster.

Placement: rank 0 (the server, "ps", and the rendezvous store) on hosts[0], trainer
rank r on hosts[r], wrapping around when there are fewer hosts. The cluster is
anything with `.hosts` (objects with .name, .addr, .ifname) and `.popen(host, argv,
env=None, **popen_kw)`: workloads.cluster.Cluster. TensorPipe listens on the address
of the interface TP_SOCKET_IFNAME names, and the Gloo group that the RPC agent makes
for its barriers on GLOO_SOCKET_IFNAME's: the host's own. Their default, the address of
the machine's hostname, is no host's in the cluster (namespaces share one hostname).
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from core.errors import UserError
from workloads.procs import kill_and_reap, log_tail, popen_logged

from .venv import require_venv

PS_SCRIPT = Path(__file__).resolve().with_name("ps.py")
MASTER_PORT = 29500        # inside a namespace host: its own port space
DEFAULT_TIMEOUT_S = 90.0
POLL_INTERVAL_S = 0.05
STDERR_TAIL_LINES = 5
QUIET_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


@dataclass
class TorchProc:
    rank: int
    host: str          # host name (the netns name in workloads.cluster)
    addr: str
    pid: int
    log: Path          # its stdout and stderr
    returncode: int | None = None


@dataclass
class TorchResult:
    out_dir: Path
    wall_s: float      # first process started -> last process exited
    processes: list[TorchProc] = field(default_factory=list)

    def counts(self) -> dict[int, dict]:
        """What each process wrote (ps.py: rank-N.json), by rank."""
        return {p.rank: json.loads((self.out_dir / f"rank-{p.rank}.json").read_text()) for p in self.processes}


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    return log_tail(path, lines)


class TorchJob:
    """ps.py on the cluster: start() returns at once, wait() collects it, stop() kills it."""

    def __init__(self, cluster: Any, out_dir: str | os.PathLike, trainers: int = 2,
                 script_args: Sequence[str] = (), python: str | os.PathLike | None = None,
                 master_port: int = MASTER_PORT):
        if trainers < 1:
            raise UserError(f"need at least 1 trainer, not {trainers}")
        hosts = list(cluster.hosts)
        if not hosts:
            raise UserError("the cluster has no hosts; bring it up with at least 1 host")
        self.cluster = cluster
        self.out_dir = Path(out_dir)
        self.python = Path(python) if python else require_venv()
        self.script_args = [str(a) for a in script_args]
        self.world = trainers + 1
        self.placed = [hosts[r % len(hosts)] for r in range(self.world)]
        self.master_port = master_port
        self.procs: list[tuple[TorchProc, subprocess.Popen]] = []
        self._t_start = 0.0

    def _env(self, rank: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")}
        env.update(QUIET_ENV)
        host = self.placed[rank]
        env.update({"RANK": str(rank), "WORLD_SIZE": str(self.world), "MASTER_ADDR": self.placed[0].addr,
                    "MASTER_PORT": str(self.master_port), "TP_SOCKET_IFNAME": host.ifname,
                    "GLOO_SOCKET_IFNAME": host.ifname})
        return env

    def start(self) -> "TorchJob":
        logs = self.out_dir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        for stale in self.out_dir.glob("rank-*.json"):
            stale.unlink()   # a previous run's counts would pass for this one's
        argv = [str(self.python), str(PS_SCRIPT), "--out", str(self.out_dir), *self.script_args]
        self._t_start = time.monotonic()
        try:
            for rank, host in enumerate(self.placed):
                log = logs / f"rank-{rank}.log"
                p = popen_logged(self.cluster, host, argv, self._env(rank), log)
                self.procs.append((TorchProc(rank, host.name, host.addr, p.pid, log), p))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """SIGKILL what still runs (each process's whole group) and reap it."""
        for (info, _p), rc in zip(self.procs, kill_and_reap([p for _, p in self.procs])):
            if rc is not None:
                info.returncode = rc

    def _fail(self, why: str) -> UserError:
        self.stop()
        failed = [f"rank {i.rank} on {i.host} (rc {i.returncode}): {_tail(i.log)}"
                  for i, _ in self.procs if i.returncode]
        return UserError(f"PyTorch RPC job failed: {why}. {'; '.join(failed)} Full logs in {self.out_dir / 'logs'}")

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> TorchResult:
        """Until every process exited; UserError (after killing the rest) on a failure or timeout."""
        deadline = self._t_start + timeout_s
        while True:
            for info, p in self.procs:
                if info.returncode is None:
                    info.returncode = p.poll()
                if info.returncode not in (None, 0):
                    raise self._fail(f"rank {info.rank} on {info.host} exited with {info.returncode}")
            if all(i.returncode == 0 for i, _ in self.procs):
                break
            if time.monotonic() > deadline:
                left = [f"rank {i.rank}" for i, _ in self.procs if i.returncode is None]
                raise self._fail(f"timed out after {timeout_s:.0f} s; still running: {', '.join(left)}")
            time.sleep(POLL_INTERVAL_S)
        return TorchResult(self.out_dir, time.monotonic() - self._t_start, [i for i, _ in self.procs])

    def __enter__(self) -> "TorchJob":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_in_cluster(cluster: Any, out_dir: str | os.PathLike, trainers: int = 2, script_args: Sequence[str] = (),
                   timeout_s: float = DEFAULT_TIMEOUT_S, **job_kw: Any) -> TorchResult:
    """ps.py on the cluster's hosts, waited for; UserError if a process fails or it outlives timeout_s."""
    return TorchJob(cluster, out_dir, trainers, script_args, **job_kw).start().wait(timeout_s)
