"""Run BytePS's ps-lite benchmark (its own tests/test_benchmark, build.py) on the virtual
cluster: a scheduler, servers and workers, each on a host of its own.

    job = BytepsJob(cluster, out_dir, servers=1, workers=2, args=BenchmarkArgs(4096, 10))
    with job:                      # start(); stop() at the end, whatever happened
        pids = job.wait_ready()    # every process started, held at a gate: no traffic yet
        job.release()              # they exec the benchmark: register, push, pull, Finalize
        res = job.wait()           # every process exited 0, or UserError (all killed)
    res.counts()                   # the job's own counts, from its van's log (oplog.py)
    res.expected_counts()          # what the benchmark's arguments imply

Placement: server i on hosts[i], worker j on hosts[servers + j], the scheduler on
hosts[servers + workers] (each wrapping: with fewer hosts the scheduler shares server
0's). Every node gets ps-lite's variables (src/postoffice.cc, src/van.cc): DMLC_ROLE,
DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI and DMLC_PS_ROOT_PORT (the
scheduler's address and port), DMLC_NODE_HOST (its own host's address: with it set the
van looks at no interface) and PORT (its own port, so that the wire's connections say
which node they are); NUM_KEY_PER_SERVER for the benchmark, LOG_DURATION = REPEAT (one
goodput line, at the end), PS_VERBOSE=2 (every message its van sends and receives,
the oracle). Variables of ps-lite, BytePS and DMLC are never inherited from the caller.

Each process is `sh` waiting on a gate file, then exec'ing the benchmark: its pid is
the benchmark's from the start. The benchmark ends by itself (Finalize: a barrier of
every node, then the van stops); a timeout kills every process group.

Its receive threads busy-poll (ZMQ_DONTWAIT in a loop, src/zmq_van.h
CallZmqRecvThread: one per ROUTER and one per worker DEALER, eight in a 1 x 2 job) and
the fork has no knob against it (BYTEPS_ZMQ_NTHREADS sets libzmq's I/O threads,
BYTEPS_ZMQ_MAX_SOCKET its socket cap): keep a job to seconds. `nice` (default
DEFAULT_NICE) runs them below the tests and tcpdump; the wire is SCHED_FIFO.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import UserError
from workloads.procs import ProcInfo, kill_and_reap, log_tail, popen_logged

from . import oplog
from .build import benchmark_path

SCHEDULER_PORT = 9000
SERVER_PORT = 9100       # + server index
WORKER_PORT = 9200       # + worker index
DEFAULT_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.02
LOG_TAIL_LINES = 5
DEFAULT_NICE = 5
GATE_POLL_S = "0.01"
# test_benchmark.cc's modes
PUSH_THEN_PULL, PUSH_PULL, PUSH_ONLY, PULL_ONLY = 0, 1, 2, 3
KEY_MAX = 2**64 - 1      # ps::kMaxKey (include/ps/base.h); server i's keys begin at KEY_MAX // N * i
_INHERITED_NOT = ("DMLC_", "PS_", "BYTEPS_", "NUM_KEY_PER_SERVER", "LOG_DURATION", "PORT",
                  "ENABLE_", "HEAPPROFILE", "DEBUG_MODE")
_GATE_SH = 'while [ ! -e "$0" ]; do sleep ' + GATE_POLL_S + '; done; exec "$@"'


@dataclass(frozen=True)
class BenchmarkArgs:
    """test_benchmark's arguments `LEN REPEAT MODE` and its NUM_KEY_PER_SERVER."""
    length: int = 4096          # bytes of each key's value
    repeat: int = 10            # rounds after the init pushes
    mode: int = PUSH_PULL
    keys_per_server: int = 4

    def check(self) -> None:
        if self.mode not in (PUSH_THEN_PULL, PUSH_PULL, PUSH_ONLY, PULL_ONLY):
            raise UserError(f"test_benchmark has modes 0-3, not {self.mode}")
        if not (1 <= self.length <= 1 << 26 and 1 <= self.repeat <= 100_000
                and 1 <= self.keys_per_server <= 4096):
            raise UserError(f"benchmark arguments out of range: {self}; LEN 1..64 MiB, "
                            "REPEAT 1..100000, keys per server 1..4096")

    def argv(self) -> list[str]:
        return [str(self.length), str(self.repeat), str(self.mode)]


def key_begin(server: int, servers: int) -> int:
    """The first key of server `server`'s range (Postoffice::GetServerKeyRanges)."""
    return KEY_MAX // servers * server


def expected_requests(args: BenchmarkArgs, servers: int) -> list[tuple[str, int, int]]:
    """A worker's requests in the order test_benchmark.cc sends them, as (op, server,
    key on the wire): one init push per key (key index k to server k % servers, its
    key `begin + k`), then the mode's rounds."""
    total = servers * args.keys_per_server

    def one(op: str, k: int) -> tuple[str, int, int]:
        return (op, k % servers, key_begin(k % servers, servers) + k)

    out = [one("push", k) for k in range(total)]
    for _ in range(args.repeat if args.mode != PUSH_THEN_PULL else 0):
        for k in range(total):
            if args.mode in (PUSH_PULL, PUSH_ONLY):
                out.append(one("push", k))
            if args.mode in (PUSH_PULL, PULL_ONLY):
                out.append(one("pull", k))
    if args.mode == PUSH_THEN_PULL:   # key index `server` to each server, pushes then pulls
        out += [one("push", s) for _ in range(args.repeat) for s in range(servers)]
        out += [one("pull", s) for _ in range(args.repeat) for s in range(servers)]
    return out


@dataclass(frozen=True)
class ProcSpec:
    name: str          # "scheduler", "server-0", "worker-1"
    role: str          # DMLC_ROLE: scheduler, server, worker
    index: int
    host: Any          # the cluster's host object (.name, .addr)
    port: int


def place(hosts: list, servers: int, workers: int) -> list[ProcSpec]:
    if not hosts:
        raise UserError("the cluster has no hosts; bring it up with at least 1 host")
    n = len(hosts)
    specs = [ProcSpec(f"server-{i}", "server", i, hosts[i % n], SERVER_PORT + i)
             for i in range(servers)]
    specs += [ProcSpec(f"worker-{j}", "worker", j, hosts[(servers + j) % n], WORKER_PORT + j)
              for j in range(workers)]
    specs.append(ProcSpec("scheduler", "scheduler", 0, hosts[(servers + workers) % n],
                          SCHEDULER_PORT))
    return specs


@dataclass
class BytepsResult:
    out_dir: Path
    servers: int
    workers: int
    args: BenchmarkArgs
    wall_s: float      # release -> the last process exited
    processes: list[ProcInfo] = field(default_factory=list)
    _logs: dict[str, oplog.NodeLog] | None = field(default=None, repr=False)

    def pids(self, role: str | None = None) -> list[int]:
        return [p.pid for p in self.processes if role is None or p.role == role]

    def process(self, name: str) -> ProcInfo:
        return next(p for p in self.processes if p.name == name)

    def node_logs(self) -> dict[str, oplog.NodeLog]:
        """Each process's log read by oplog (once), by process name."""
        if self._logs is None:
            self._logs = {p.name: oplog.read_node_log(p.log) for p in self.processes}
        return self._logs

    def node_ids(self) -> dict[str, int | None]:
        """ps-lite's node id of each process (the scheduler's 1, servers 8, 10, ...,
        workers 9, 11, ...: the scheduler gives them by address), from its own log."""
        return {name: log.node_id for name, log in self.node_logs().items()}

    def counts(self) -> dict:
        """The job's own counts, from each node's van log, none from pslat:

        {"workers": {name: {"node_id", "sent": {"push", "pull"},     # its requests
                            "answers": {"push", "pull"},              # answers it received
                            "rounds": [goodput counts logged], "stopped": bool}},
         "servers": {name: {"node_id", "received": {"push", "pull"},  # requests
                            "answered": {"push", "pull"},             # answers it sent
                            "by_worker": {worker name: {"push", "pull"}}, "stopped"}},
         "scheduler": {"node_id", "stopped"},
         "control": {name: {"sent": {cmd: n}, "received": {cmd: n}}},
         "unread_lines": van lines of no known shape, over every log}
        """
        logs, ids = self.node_logs(), self.node_ids()
        name_of = {i: n for n, i in ids.items() if i is not None}
        out: dict[str, Any] = {"workers": {}, "servers": {}, "control": {}}
        for p in self.processes:
            log = logs[p.name]
            out["control"][p.name] = {"sent": oplog.control_counts(log.sent()),
                                      "received": oplog.control_counts(log.received())}
            if p.role == "worker":
                out["workers"][p.name] = {
                    "node_id": log.node_id, "sent": oplog.data_counts(log.sent()),
                    "answers": oplog.data_counts(log.received()),
                    "rounds": log.goodput_counts, "stopped": log.stopped}
            elif p.role == "server":
                by_worker: dict[str, dict[str, int]] = {}
                for m in log.received(data=True):
                    w = by_worker.setdefault(name_of.get(m.sender, str(m.sender)),
                                             {"push": 0, "pull": 0})
                    w[m.op] += 1
                out["servers"][p.name] = {
                    "node_id": log.node_id, "received": oplog.data_counts(log.received()),
                    "answered": oplog.data_counts(log.sent()),
                    "by_worker": dict(sorted(by_worker.items())), "stopped": log.stopped}
            else:
                out["scheduler"] = {"node_id": log.node_id, "stopped": log.stopped}
        out["unread_lines"] = sum(log.van_lines_unread + log.lines_too_long + log.truncated
                                  for log in logs.values())
        return out

    def expected_counts(self) -> dict:
        """What the benchmark's arguments imply, per worker and per server:
        {"worker": {"push", "pull"}, "server": {server name: {"push", "pull"}}} (each
        worker sends the same; a server receives that times the workers)."""
        reqs = expected_requests(self.args, self.servers)
        worker = {op: sum(1 for o, _, _ in reqs if o == op) for op in ("push", "pull")}
        server = {f"server-{i}": {op: self.workers * sum(1 for o, s, _ in reqs if o == op and s == i)
                                  for op in ("push", "pull")} for i in range(self.servers)}
        return {"worker": worker, "server": server}

    def connection_messages(self, worker: str, server: str) -> dict[str, list[oplog.LoggedMessage]]:
        """The messages the logs say went between a worker and a server, per connection
        direction, in order: "request" (the worker's DEALER into the server's ROUTER:
        everything the worker sent the server), "answer" (the server's ROUTER back on
        that connection: its data messages to the worker), "server_dealer" (the server's
        own DEALER into the worker's ROUTER: its control and SimpleApp messages to it,
        as src/zmq_van.h NonWorkerSendMsg chooses)."""
        logs, ids = self.node_logs(), self.node_ids()
        w, s = ids[worker], ids[server]
        if w is None or s is None:
            raise UserError(f"the logs of {worker} and {server} do not give their node ids; "
                            f"see {self.out_dir / 'logs'}")
        to_worker = [m for m in logs[server].sent() if m.recver == w]
        return {"request": [m for m in logs[worker].sent() if m.recver == s],
                "answer": [m for m in to_worker if m.data],
                "server_dealer": [m for m in to_worker if not m.data]}


class BytepsJob:
    """A BytePS ps-lite benchmark job: start() returns at once, wait() collects it."""

    def __init__(self, cluster: Any, out_dir: str | os.PathLike, servers: int = 1,
                 workers: int = 2, args: BenchmarkArgs = BenchmarkArgs(),
                 env: dict[str, str] | None = None, binary: str | os.PathLike | None = None,
                 nice: int = DEFAULT_NICE):
        if servers < 1 or workers < 1:
            raise UserError(f"need at least 1 server and 1 worker, not {servers} and {workers}")
        if not 0 <= nice <= 19:
            raise UserError(f"nice is 0..19, not {nice}")
        args.check()
        self.cluster = cluster
        self.out_dir = Path(out_dir)
        self.servers, self.workers, self.args = servers, workers, args
        self.extra_env = dict(env or {})
        self.binary = Path(binary) if binary else benchmark_path()
        self.nice = nice
        self.specs = place(list(cluster.hosts), servers, workers)
        self.scheduler = next(s for s in self.specs if s.role == "scheduler")
        self.gate_file = self.out_dir / "gate"
        self.procs: list[tuple[ProcInfo, subprocess.Popen]] = []
        self._t_release = 0.0
        self._wall_s: float | None = None

    def _env(self, spec: ProcSpec) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_INHERITED_NOT)}
        env.update({
            "DMLC_ROLE": spec.role,
            "DMLC_NUM_SERVER": str(self.servers),
            "DMLC_NUM_WORKER": str(self.workers),
            "DMLC_PS_ROOT_URI": self.scheduler.host.addr,
            "DMLC_PS_ROOT_PORT": str(self.scheduler.port),
            "NUM_KEY_PER_SERVER": str(self.args.keys_per_server),
            "LOG_DURATION": str(self.args.repeat),
            "PS_VERBOSE": "2",
            "BYTEPS_ZMQ_NTHREADS": "1",
        })
        if spec.role != "scheduler":
            env["DMLC_NODE_HOST"] = spec.host.addr
            env["PORT"] = str(spec.port)
        env.update(self.extra_env)
        return env

    def start(self) -> "BytepsJob":
        log_dir = self.out_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        self.gate_file.unlink(missing_ok=True)
        cmd = [str(self.binary), *self.args.argv()]
        if self.nice:
            cmd = ["nice", "-n", str(self.nice), *cmd]
        argv = ["sh", "-c", _GATE_SH, str(self.gate_file), *cmd]
        try:
            for spec in self.specs:
                log = log_dir / f"{spec.name}.log"
                p = popen_logged(self.cluster, spec.host, argv, self._env(spec), log)
                self.procs.append((ProcInfo(spec.name, spec.role, spec.index, spec.host.name,
                                            spec.host.addr, spec.port, p.pid, log), p))
        except BaseException:
            self.stop()
            raise
        return self

    def wait_ready(self) -> dict[str, int]:
        """Every process started and held at the gate (nothing sent yet): pid by name.
        The pid stays the benchmark's when it is released (sh execs it)."""
        if not self.procs:
            raise UserError("wait_ready() comes after start()")
        self._poll()
        return {i.name: i.pid for i, _ in self.procs}

    def release(self) -> None:
        """Let every process exec the benchmark (after start())."""
        self._t_release = time.monotonic()
        self.gate_file.touch()

    def _poll(self) -> None:
        for info, p in self.procs:
            if info.returncode is None:
                info.returncode = p.poll()
            if info.returncode not in (None, 0):
                raise self._fail(f"{info.name} on {info.host} exited with {info.returncode}")

    def wait(self, timeout_s: float = DEFAULT_TIMEOUT_S) -> BytepsResult:
        """Release if not yet, wait until every process exited 0 (UserError, every process
        killed, on a failure or after timeout_s), then the result."""
        if not self.gate_file.exists():
            self.release()
        deadline = self._t_release + timeout_s
        while not all(i.returncode == 0 for i, _ in self.procs):
            self._poll()
            if time.monotonic() > deadline:
                left = [i.name for i, _ in self.procs if i.returncode is None]
                raise self._fail(f"timed out after {timeout_s:.0f} s; still running: "
                                 f"{', '.join(left)}")
            time.sleep(POLL_INTERVAL_S)
        self._wall_s = time.monotonic() - self._t_release
        return BytepsResult(self.out_dir, self.servers, self.workers, self.args, self._wall_s,
                            [i for i, _ in self.procs])

    def stop(self) -> None:
        """Kill every process of the job still running (its whole group) and reap it: the
        benchmark ends by itself, so this is for a failure or a timeout."""
        for (info, _p), rc in zip(self.procs, kill_and_reap([p for _, p in self.procs])):
            if rc is not None:
                info.returncode = rc

    def _fail(self, why: str) -> UserError:
        self.stop()
        details = "; ".join(f"{i.name} on {i.host} (rc {i.returncode}): {log_tail(i.log, LOG_TAIL_LINES)}"
                            for i, _ in self.procs if i.returncode != 0)
        return UserError(f"BytePS benchmark failed: {why}. {details} Full logs in "
                         f"{self.out_dir / 'logs'}")

    def __enter__(self) -> "BytepsJob":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_in_cluster(cluster: Any, out_dir: str | os.PathLike, servers: int = 1, workers: int = 2,
                   args: BenchmarkArgs = BenchmarkArgs(), timeout_s: float = DEFAULT_TIMEOUT_S,
                   **job_kw: Any) -> BytepsResult:
    """Start, release and wait for a job on the cluster's hosts."""
    with BytepsJob(cluster, out_dir, servers, workers, args, **job_kw) as job:
        return job.wait(timeout_s)
