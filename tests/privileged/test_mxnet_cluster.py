"""MXNet's real ps-lite (mxnet==1.9.1) runs sparse_kv.py across network-namespace hosts.

Every worker must finish, and its log must show every pull and push it issued
as completed, with row counts that add up over the wire slices; and the keys
the log says each slice carries must be on the wire, in a tcpdump capture on
the worker's host decoded here with struct only (independent of pslat).
The tests share one cluster, each job on hosts of its own wire delay.
"""
from __future__ import annotations

import struct
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from core.errors import UserError
from workloads.cluster.cluster import Cluster
from workloads.mxnet import oplog, runner, venv

pytestmark = [pytest.mark.privileged, pytest.mark.mxnet]

ITERS = 8
NUM_ROWS = 16384
# A small table (16k rows x 8 floats, a 512 KiB init push) but over the
# bigarray bound we set, so MXNet splits it over both servers by row range,
# as it does a real embedding table.
SCRIPT_ARGS = ["--iters", str(ITERS), "--num-rows", str(NUM_ROWS), "--dim", "8",
               "--rows-per-pull", "64"]
BIGARRAY_BOUND_ELEMS = 100_000
JOB_TIMEOUT_S = 60.0
MARKER_PORT = 1  # closed in every host: a SYN there marks the end of a capture


WAIT_S = 300                # another test's cluster may be up (one per machine)
# One cluster for the module (each test brought up its own: 4 set-ups): a job runs on
# the hosts of one group, which are on the wire delay of that group among themselves.
GROUPS = {0.0: ["h0", "h1", "h2"], 1.0: ["h3", "h4", "h5", "h6"]}   # wire delay (ms) -> hosts


class _Hosts:
    """Some hosts of the module's cluster, as the runner takes a cluster."""

    def __init__(self, cluster, names: list[str]):
        self.hosts = [cluster.host(n) for n in names]
        self.popen = cluster.popen


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    pairs = {(a, b): ms for ms, names in GROUPS.items() for a in names for b in names if a != b}
    with Cluster([n for names in GROUPS.values() for n in names], pair_delay_ms=pairs, wait_s=WAIT_S,
                 log_dir=tmp_path_factory.mktemp("wire")) as c:
        yield c


def _group(cluster, n: int, wire_delay_ms: float = 0.0) -> _Hosts:
    """n hosts on this wire delay."""
    names = GROUPS[wire_delay_ms]
    assert n <= len(names), f"the module's cluster has {len(names)} hosts on a {wire_delay_ms} ms wire"
    return _Hosts(cluster, names[:n])


class _Capture:
    """tcpdump on one host, for the duration of a with-block."""

    def __init__(self, cluster, host, path):
        self.path = path
        self.cluster, self.host = cluster, host
        # --immediate-mode makes libpcap use fixed ring slots sized by the snap
        # length: -s 0 (256 KiB) leaves 8 slots in the default 2 MiB buffer and
        # drops most of a burst. 2048 holds a whole 1500-byte frame (the cluster
        # turns segmentation offloads off); -B gives 32 MiB of slots.
        self.proc = cluster.popen(host, ["tcpdump", "--immediate-mode", "-U", "-n", "-i", "any",
                                         "-s", "2048", "-B", "32768", "-w", str(path), "tcp"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  start_new_session=True)

    def __enter__(self):
        # Ready signal: tcpdump says "listening on" once its socket is open.
        seen = []
        for line in iter(self.proc.stderr.readline, b""):
            seen.append(line)
            if b"listening on" in line:
                return self
        self.proc.kill()
        raise RuntimeError(f"tcpdump did not start: {b''.join(seen)!r}")

    def drain(self, timeout_s: float = 10.0) -> None:
        """Return once tcpdump has written everything sent so far.

        On a busy 2-core machine tcpdump lags, and a SIGTERM drops what is
        still in its socket. So send a marker (a SYN to a closed port on the
        host's loopback) and wait until it is in the file.
        """
        from scapy.all import TCP, PcapReader
        self.cluster.run(self.host, [sys.executable, "-c", "import socket; socket.socket()"
                                     f".connect_ex(('127.0.0.1', {MARKER_PORT}))"], check=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with PcapReader(str(self.path)) as r:
                if any(TCP in p and p[TCP].dport == MARKER_PORT for p in r):
                    return
            time.sleep(0.05)
        raise RuntimeError(f"tcpdump on {self.host.name} did not catch up within {timeout_s} s")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait(timeout=10)
        # tcpdump's last words: "N packets captured ... M packets dropped by kernel"
        self.stats = self.proc.stderr.read().decode(errors="replace").strip()
        self.dropped = "\n0 packets dropped by kernel" not in "\n" + self.stats
        self.proc.stderr.close()


def _tcp_streams(pcap) -> list[bytes]:
    """Each TCP direction's payload in sequence order (retransmissions dropped)."""
    from scapy.all import TCP, rdpcap
    segs = defaultdict(dict)
    for pkt in rdpcap(str(pcap)):
        if TCP in pkt and len(pkt[TCP].payload):
            t = pkt[TCP]
            flow = (pkt[TCP].underlayer.src, pkt[TCP].underlayer.dst, t.sport, t.dport)
            segs[flow].setdefault(t.seq, bytes(t.payload))
    streams = []
    for by_seq in segs.values():
        buf, end = bytearray(), None
        for seq in sorted(by_seq):
            data = by_seq[seq]
            if end is not None and seq < end:  # overlap: keep the new part only
                data = data[end - seq:]
            buf += data
            end = max(end or 0, seq + len(by_seq[seq]))
        streams.append(bytes(buf))
    return streams


def _check_wire(res: runner.MxnetResult, servers: int, captures: dict[int, _Capture]) -> None:
    """Every pull/push slice's keys frame (uint64 little-endian) is in its worker's capture."""
    missing, found = [], 0
    for rank, recs in res.op_logs().items():
        streams = _tcp_streams(captures[rank].path)
        for r in recs:
            if r.op not in ("pull", "push"):
                continue
            for server, keys in oplog.wire_key_ids(r, servers):
                blob = struct.pack(f"<{len(keys)}Q", *keys)
                if any(blob in st for st in streams):
                    found += 1
                else:
                    missing.append((rank, r.op, r.iter, server))
    stats = " / ".join(c.stats.replace("\n", ", ") for c in captures.values())
    assert not any(c.dropped for c in captures.values()), f"tcpdump lost packets: {stats}"
    assert not missing, (f"{len(missing)} slices not on the wire (found {found}): {missing[:5]}; "
                         f"tcpdump: {stats}")
    assert found == 2 * ITERS * servers * len(captures)


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
        assert init.rows == (NUM_ROWS if rank == 0 else 0)
    # The processes ran where the placement put them, with ps-lite's ids.
    by_name = {p.name: p for p in res.processes}
    assert by_name["scheduler"].node_id == 1
    assert sorted(p.rank for p in res.processes if p.role == "worker") == list(range(workers))
    assert sorted(p.rank for p in res.processes if p.role == "server") == list(range(servers))
    for p in res.processes:
        if p.role == "worker":
            assert summaries[p.rank]["pid"] == p.pid
            assert summaries[p.rank]["node_host"] == p.addr


@pytest.mark.parametrize("servers, workers, mode, wire_delay_ms", [
    (1, 2, "dist_async", 0.0),
    (2, 2, "dist_sync", 1.0),
])
def test_sparse_kv_across_hosts(tmp_path, cluster, mxnet_python, servers, workers, mode, wire_delay_ms):
    t0 = time.monotonic()
    hosts = _group(cluster, servers + workers, wire_delay_ms)
    job = runner.MxnetJob(hosts, SCRIPT_ARGS, tmp_path / "out", servers=servers,
                          workers=workers, mode=mode,
                          env={"MXNET_KVSTORE_BIGARRAY_BOUND": str(BIGARRAY_BOUND_ELEMS)})
    worker_hosts = [s.host for s in job.specs if s.role == "worker"]
    caps = [_Capture(cluster, h, tmp_path / f"{h.name}.pcap") for h in worker_hosts]
    for c in caps:
        c.__enter__()
    try:
        with job:
            res = job.wait(timeout_s=JOB_TIMEOUT_S)
        for c in caps:
            c.drain()
    finally:
        for c in caps:
            c.__exit__()
    wall_s = time.monotonic() - t0
    assert all(p.returncode == 0 for p in res.processes)
    # Every host got its processes: server i on hosts[i], worker j on hosts[servers + j].
    addrs = {p.name: p.addr for p in res.processes}
    host_addrs = [h.addr for h in hosts.hosts]
    assert addrs["scheduler"] == host_addrs[0]
    for i in range(servers):
        assert addrs[f"server-{i}"] == host_addrs[i]
    for j in range(workers):
        assert addrs[f"worker-{j}"] == host_addrs[servers + j]
    _check_logs(res, servers, workers)
    # A pull crosses the wire twice (request, response), so it cannot beat the round trip.
    for recs in res.op_logs().values():
        for r in recs:
            if r.op == "pull":
                assert r.latency_ns >= 2 * wire_delay_ms * 1e6
    # Captures by rank: a worker's host is where its process ran.
    cap_by_host = {h.name: c for h, c in zip(worker_hosts, caps)}
    _check_wire(res, servers, {p.rank: cap_by_host[p.host]
                               for p in res.processes if p.role == "worker"})
    print(f"\n{mode} {servers}x{workers}, {ITERS} iters: job {res.wall_s:.2f} s, "
          f"with its captures {wall_s:.2f} s")


def test_failing_job_is_reported_and_cleaned_up(tmp_path, cluster, mxnet_python):
    """A worker that dies: a UserError naming it, and no process of the job left."""
    bad = tmp_path / "bad.py"
    # Servers and scheduler run as MXNet's; the worker exits at once with 3,
    # so they would wait for it forever if the runner did not kill them.
    bad.write_text("import os, sys\n"
                   "if os.environ['DMLC_ROLE'] != 'worker':\n    import mxnet\n"
                   "sys.exit(3)\n")
    job = runner.MxnetJob(_group(cluster, 2), [], tmp_path / "out", servers=1, workers=1, script=bad)
    job.start()
    with pytest.raises(UserError, match=r"worker-0 .*exited with 3"):
        job.wait(timeout_s=JOB_TIMEOUT_S)
    for info, p in job.procs:
        assert p.poll() is not None, f"{info.name} still running"


def test_gated_job_holds_workers_until_released(tmp_path, cluster, mxnet_python):
    """Gated: every pid is known and no worker has connected before release()."""
    job = runner.MxnetJob(_group(cluster, 2), ["--iters", "2", "--num-rows", "1024", "--dim", "4"],
                          tmp_path / "out", servers=1, workers=1, gated=True)
    with job:
        pids = job.wait_ready(timeout_s=JOB_TIMEOUT_S)
        assert set(pids) == {"scheduler", "server-0", "worker-0"}
        worker_host = next(s.host for s in job.specs if s.role == "worker")
        # No TCP connection from the worker's host yet: it waits before kv.create.
        ss = cluster.run(worker_host, ["ss", "-Htn", "state", "established"],
                         capture_output=True, text=True, check=True).stdout
        assert ss.strip() == ""
        assert not list((tmp_path / "out").glob("worker-*.jsonl"))
        job.release()
        res = job.wait(timeout_s=JOB_TIMEOUT_S)
    assert [r.op for r in res.op_logs()[0]].count("pull") == 2
