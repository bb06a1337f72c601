"""MXNet's real ps-lite (mxnet==1.9.1) runs sparse_kv.py across network-namespace hosts.

Every worker must finish, and its log must show every pull and push it issued
as completed, with row counts that add up over the wire slices.
"""
from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass

import pytest

from agent.errors import UserError
from workloads.mxnet import oplog, runner, venv

pytestmark = [pytest.mark.privileged, pytest.mark.mxnet]

ITERS = 8
# Small table (64k rows x 8 floats) but over the bigarray bound we set, so
# MXNet splits it over both servers by row range, as a real embedding is.
SCRIPT_ARGS = ["--iters", str(ITERS), "--num-rows", "65536", "--dim", "8", "--rows-per-pull", "64"]
BIGARRAY_BOUND_ELEMS = 100_000
JOB_TIMEOUT_S = 60.0


def _cluster_class():
    try:
        from workloads.cluster.cluster import Cluster  # the project's virtual cluster
        return Cluster
    except ImportError:
        return None


@dataclass(frozen=True)
class _Host:
    name: str
    addr: str


class _NetnsHosts:
    """Fallback while workloads.cluster.Cluster is not there: n namespaces on one
    bridge (itself in a namespace of its own, so nothing touches the root
    namespace), no wire delay."""

    def __init__(self, n: int):
        tag = f"pmx{os.getpid() % 100000}"
        self.sw = f"{tag}-sw"
        self.hosts = [_Host(f"{tag}-h{i}", f"10.231.0.{i + 1}") for i in range(n)]

    def _ip(self, *args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)

    def __enter__(self):
        try:
            self._ip("netns", "add", self.sw)
            self._ip("-n", self.sw, "link", "add", "br0", "type", "bridge")
            self._ip("-n", self.sw, "link", "set", "br0", "up")
            for i, h in enumerate(self.hosts):
                self._ip("netns", "add", h.name)
                self._ip("-n", h.name, "link", "set", "lo", "up")
                self._ip("-n", h.name, "link", "add", "eth0", "type", "veth",
                         "peer", "name", f"p{i}", "netns", self.sw)
                self._ip("-n", h.name, "addr", "add", f"{h.addr}/24", "dev", "eth0")
                self._ip("-n", h.name, "link", "set", "eth0", "up")
                self._ip("-n", self.sw, "link", "set", f"p{i}", "master", "br0")
                self._ip("-n", self.sw, "link", "set", f"p{i}", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        for ns in [self.sw] + [h.name for h in self.hosts]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)

    def popen(self, host, argv, env=None, **kw):
        return subprocess.Popen(["ip", "netns", "exec", host.name, *argv], env=env, **kw)


def _make_cluster(n: int):
    Cluster = _cluster_class()
    return Cluster(n) if Cluster else _NetnsHosts(n)


@pytest.fixture(scope="module")
def mxnet_python():
    return venv.ensure_venv()  # creates the venv on first use, like the runner


def _check_logs(res: runner.MxnetResult, servers: int, workers: int) -> None:
    logs = res.op_logs()
    assert sorted(logs) == list(range(workers))
    summaries = oplog.read_summaries(res.out_dir)
    for rank, recs in logs.items():
        assert summaries[rank]["finished"] is True
        pulls = [r for r in recs if r.op == "pull"]
        pushes = [r for r in recs if r.op == "push"]
        assert [r.iter for r in pulls] == list(range(ITERS))
        assert [r.iter for r in pushes] == list(range(ITERS))
        for pull, push in zip(pulls, pushes):
            # The gradient goes to exactly the rows that were pulled.
            assert pull.rows == push.rows >= 1
            # Split by row range over every server, each slice a master key + rows.
            assert [s.server for s in pull.slices] == list(range(servers))
            assert sum(s.rows for s in pull.slices) == pull.rows
            assert all(s.wire_keys == s.rows + 1 for s in pull.slices)
            assert pull.t_after_ns > pull.t_before_ns
            assert push.t_before_ns >= pull.t_after_ns  # one op at a time, in order
        init = next(r for r in recs if r.op == "init")
        assert init.rows == (65536 if rank == 0 else 0)
    # The processes ran where the placement put them, with ps-lite's ids.
    by_name = {p.name: p for p in res.processes}
    assert by_name["scheduler"].node_id == 1
    assert sorted(p.rank for p in res.processes if p.role == "worker") == list(range(workers))
    assert sorted(p.rank for p in res.processes if p.role == "server") == list(range(servers))
    for p in res.processes:
        if p.role == "worker":
            assert summaries[p.rank]["pid"] == p.pid
            assert summaries[p.rank]["node_host"] == p.addr


@pytest.mark.parametrize("servers, workers, mode", [
    (1, 2, "dist_async"),
    (2, 2, "dist_sync"),
])
def test_sparse_kv_across_hosts(tmp_path, mxnet_python, servers, workers, mode):
    t0 = time.monotonic()
    with _make_cluster(servers + workers) as cluster:
        res = runner.run_in_cluster(cluster, SCRIPT_ARGS, tmp_path / "out", servers=servers,
                                    workers=workers, mode=mode, timeout_s=JOB_TIMEOUT_S,
                                    env={"MXNET_KVSTORE_BIGARRAY_BOUND": str(BIGARRAY_BOUND_ELEMS)})
    wall_s = time.monotonic() - t0
    assert all(p.returncode == 0 for p in res.processes)
    # Every host got its processes: server i on hosts[i], worker j on hosts[servers + j].
    addrs = {p.name: p.addr for p in res.processes}
    host_addrs = [h.addr for h in cluster.hosts]
    assert addrs["scheduler"] == host_addrs[0]
    for i in range(servers):
        assert addrs[f"server-{i}"] == host_addrs[i]
    for j in range(workers):
        assert addrs[f"worker-{j}"] == host_addrs[servers + j]
    _check_logs(res, servers, workers)
    print(f"\n{mode} {servers}x{workers}, {ITERS} iters: job {res.wall_s:.2f} s, "
          f"with cluster set-up and teardown {wall_s:.2f} s")


def test_failing_job_is_reported_and_cleaned_up(tmp_path, mxnet_python):
    """A worker that dies: a UserError naming it, and no process of the job left."""
    bad = tmp_path / "bad.py"
    # Servers and scheduler run as MXNet's; the worker exits at once with 3,
    # so they would wait for it forever if the runner did not kill them.
    bad.write_text("import os, sys\n"
                   "if os.environ['DMLC_ROLE'] != 'worker':\n    import mxnet\n"
                   "sys.exit(3)\n")
    with _make_cluster(2) as cluster:
        job = runner.MxnetJob(cluster, [], tmp_path / "out", servers=1, workers=1, script=bad)
        job.start()
        with pytest.raises(UserError, match=r"worker-0 .*exited with 3"):
            job.wait(timeout_s=JOB_TIMEOUT_S)
    for info, p in job.procs:
        assert p.poll() is not None, f"{info.name} still running"
