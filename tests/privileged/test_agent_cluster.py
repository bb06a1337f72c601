"""`pslat agent` on psbench in the virtual cluster: 2 servers x 4 workers, one agent
for every host (--netns each). Every request slice of psbench's ground truth must
appear on the worker's host (request sent, response received) and on the server's
host (request received, response sent) with the right op, ids and key count, none
invented; the stages present in causal order, each null one with its reason; the
framework-boundary times within 200 us of psbench's own log. An agent started
while the job runs joins mid-stream and finds >= 99% of the requests issued after it
was ready.

The 256-byte payload prefix of the landed sockcalls probe cannot carry psbench's
pushes (~430 bytes): until the in-kernel ZMTP walker lands (sockcall format
"items") these tests are expected to fail, and say so.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from agent.decode import sockcall_format
from probes import sockcalls as sockcalls_probe
from agent.rundir import read_run_dir
from workloads.cluster.cluster import Cluster
from workloads.psbench.launch import launch_in_cluster

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 300                # another test's cluster may be up (one per machine)
READY_TIMEOUT_S = 120
FRAMEWORK_TOLERANCE_NS = 200_000
IDS = ["app_id", "customer_id", "timestamp", "sender", "recver"]
HOSTS = 6                   # 2 servers + 4 workers, one host each
# every host pair: these tests find every request; shedding has its own (test_load_shedding)
FULL = ("--sample-rate", "1")

# the walker's items format, with its tail-call program installed by the loader
WALKER = sockcall_format() == "items" and hasattr(sockcalls_probe, "install_walker")
needs_walker = pytest.mark.xfail(not WALKER, strict=False,
                                 reason="the landed sockcalls probe copies a 256-byte prefix per call; "
                                        "psbench's pushes are longer: needs the in-kernel ZMTP walker")

pytestmark = pytest.mark.privileged


def _libzmq() -> Path:
    import zmq
    return sorted(Path(zmq.__file__).parent.parent.glob("pyzmq.libs/libzmq*.so*"))[0]


class Agent:
    """`pslat agent` as a child process; ready once it says so on stderr."""

    def __init__(self, out: Path, hosts: list[str], extra: tuple[str, ...] = ()):
        argv = [sys.executable, "-m", "agent.cli", "agent", "--out", str(out), "--lib", str(_libzmq()), *extra]
        for h in hosts:
            argv += ["--netns", h]
        self.proc = subprocess.Popen(argv, cwd=ROOT, stderr=subprocess.PIPE, text=True)
        self.log: list[str] = []
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stderr], [], [], left)[0]:
                self.proc.kill()
                pytest.fail("the agent did not get ready: " + "".join(self.log))
            line = self.proc.stderr.readline()
            if not line:
                pytest.fail(f"the agent exited ({self.proc.wait()}): " + "".join(self.log))
            self.log.append(line)
            if "ready:" in line:
                self.ready_ns = time.monotonic_ns()
                return

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        rest = self.proc.stderr.read()
        assert self.proc.wait(120) == 0, "".join(self.log) + rest
        return "".join(self.log) + rest

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _tables(out: Path) -> tuple[pd.DataFrame, dict]:
    frames, metas = [], {}
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        rd = read_run_dir(d)
        assert rd.problems == []
        metas[rd.meta["host_id"]] = rd.meta
        if "messages" in rd.tables:
            frames.append(rd.tables["messages"])
    return pd.concat(frames, ignore_index=True), metas


def _run(tmp_path: Path, duration_s: float, join_after_s: float | None, wire_delay_ms: float = 0.0,
         **workload):
    """psbench in the cluster, traced by one agent. join_after_s None: the agent starts
    first and the job runs duration_s. Else the agent starts join_after_s into a long
    job, traces duration_s of it, and the job is stopped (SIGTERM: it writes its truth)."""
    with Cluster(HOSTS, wire_delay_ms=wire_delay_ms, wait_s=WAIT_S, log_dir=tmp_path / "wire") as cluster:
        names = [h.name for h in cluster.hosts]
        agent = None
        try:
            if join_after_s is None:
                agent = Agent(tmp_path / "agent", names, extra=FULL)
            job_s = duration_s if join_after_s is None else 120.0
            with launch_in_cluster(cluster, tmp_path / "ps", servers=2, workers=4, duration_s=job_s,
                                   **workload) as job:
                job.wait_ready()
                if join_after_s is None:
                    job.wait()
                else:
                    time.sleep(join_after_s)   # the job runs: the agent must join mid-stream
                    agent = Agent(tmp_path / "agent", names, extra=FULL)
                    time.sleep(duration_s)     # traffic while the agent traces
                    job.stop()
            stopped_ns = time.monotonic_ns()
            log = agent.stop()
            (tmp_path / "agent.log").write_text(log + f"\nready_ns {agent.ready_ns}\n")
        finally:
            if agent is not None:
                agent.kill()
        truth = job.truth()
    msgs, metas = _tables(tmp_path / "agent")
    return msgs, metas, truth, (agent.ready_ns, stopped_ns), log


def _side(msgs, host, direction, request):
    d = msgs[(msgs.host_id == host) & (msgs.direction == direction) & (msgs.request == request) & ~msgs.control]
    if not request:   # the response goes from the server (its sender) to the worker
        d = d.rename(columns={"sender": "recver", "recver": "sender"})
    return d


SIDES = (("worker", "tx", True, "t_issued_ns"), ("worker", "rx", False, "t_completed_ns"),
         ("server", "rx", True, "t_received_ns"), ("server", "tx", False, "t_replied_ns"))
# psbench brackets each zmq boundary: the calls lie between these stamps
BRACKETS = {"t_issued_ns": ("t_issued_ns", "t_issued_after_ns"),
            "t_completed_ns": ("t_completed_before_ns", "t_completed_ns"),
            "t_received_ns": ("t_received_before_ns", "t_received_ns"),
            "t_replied_ns": ("t_replied_ns", "t_replied_after_ns")}


# Requests and responses that fit in one call's 256-byte prefix (4 keys of 2 floats,
# no lens). Without the walker, libzmq's batching (several messages in one send
# when a worker catches up) still puts some past the prefix: >= 95% then, all of
# them with the walker.
SMALL = dict(keys_per_request=4, embedding_dim=2, lens=False)
MIN_FOUND_SMALL = 1.0 if WALKER else 0.95


# ~78 KB requests and responses (50+ segments), a 2 ms wire, a reconnect every 10 requests
LARGE = dict(keys_per_request=1024, embedding_dim=16, reconnect_every=10, wire_delay_ms=2.0, rate=40)


@pytest.mark.parametrize("workload", [
    pytest.param(SMALL, id="small"),
    pytest.param({}, id="default", marks=needs_walker),
    pytest.param(LARGE, id="wire2ms-large-reconnect10", marks=needs_walker),
])
def test_every_slice_on_both_hosts_with_ids_stages_and_framework_times(tmp_path, workload):
    min_found = MIN_FOUND_SMALL if workload == SMALL else 1.0
    msgs, metas, truth, _, log = _run(tmp_path, duration_s=3.0, join_after_s=None, **{"rate": 100, **workload})
    assert len(metas) == HOSTS
    for meta in metas.values():
        for probe, c in meta["counters"]["probes"].items():
            assert c["lost"] == 0, f"{probe} lost events: {log}"
    for role, direction, request, t_col in SIDES:
        t = truth[truth.role == role]
        for host, th in t.groupby("host"):
            d = _side(msgs, host, direction, request)
            m = th.merge(d, on=IDS, how="outer", suffixes=("_truth", ""), indicator=True)
            missing, invented = (m._merge == "left_only").sum(), (m._merge == "right_only").sum()
            assert invented == 0, f"{role} {direction} on {host}: {invented} messages not in the ground truth"
            assert missing <= (1 - min_found) * len(th), f"{role} {direction} on {host}: {missing} of {len(th)} missing"
            m = m[m._merge == "both"]
            assert len(m) == len(th) - missing, f"{role} {direction} on {host}: a slice found twice"
            assert (m.op == m.op_truth).all()
            if request:
                assert (m.num_keys == m.num_keys_truth).all()
            # psbench stamps next to the zmq calls, in Python, before and after them: a
            # thread switch (GIL, or a CPU taken on 2 shared cores) between a call and a
            # stamp widens the bracket (a single stamp was up to milliseconds off on a
            # busy machine); the framework time must lie in it, give or take the tolerance.
            lo, hi = (m[c].astype("float64") for c in BRACKETS[t_col])
            t = m.ts_framework_ns.astype("float64")
            assert t.notna().all(), \
                f"{role} {direction} on {host}: {t.isna().sum()} of {len(t)} slices without a framework time"
            lo, hi, t = lo[t.notna()], hi[t.notna()], t[t.notna()]
            outside = np.maximum(np.maximum(lo - t, t - hi), 0)
            assert (outside <= FRAMEWORK_TOLERANCE_NS).all(), \
                f"{role} {direction} on {host}: framework time outside psbench's bracket by up to {outside.max()} ns"
    _check_stages(msgs, metas)


def _check_stages(msgs, metas):
    """Present stages in causal order along each chain, every null one with a reason.
    The send syscall's exit is not on the chain: veth and loopback hand the skb to the
    driver inside the syscall, so the last segment's handoff may precede its exit."""
    tx, rx = msgs[msgs.direction == "tx"], msgs[msgs.direction == "rx"]
    chain_tx = ["ts_framework_ns", "ts_send_first_enter_ns", "ts_xmit_last_ns", "ts_txdone_last_ns"]
    cols_tx = chain_tx + ["ts_send_last_exit_ns"]
    chain_rx = ["ts_nic_rx_last_ns", "ts_netif_rx_last_ns", "ts_data_ready_ns", "ts_recv_last_exit_ns",
                "ts_framework_ns"]
    for df, chain, cols in ((tx, chain_tx, cols_tx), (rx, chain_rx, chain_rx)):
        for _, row in df[~df.control].iterrows():
            reasons = dict(x.split("=", 1) for x in row.null_reasons.split(";") if x)
            present = [row[c] for c in chain if not pd.isna(row[c])]
            assert present == sorted(present), f"stages out of order: {row[cols].to_dict()}"
            if row.direction == "tx":
                assert row.ts_send_first_enter_ns <= row.ts_send_last_exit_ns
            for c in cols:
                assert pd.isna(row[c]) == (c in reasons), (c, row.null_reasons)
    if WALKER:   # veth has a driver handoff, netif_receive and data-ready
        broken = {m["config"].get("walker_error") for m in metas.values()} - {None}
        if broken:
            pytest.xfail(f"the walker's message-end lookups did not load: {broken.pop()}")
        data_tx, data_rx = tx[~tx.control], rx[~rx.control]
        assert data_tx.ts_xmit_last_ns.notna().mean() >= 0.99
        assert data_rx.ts_netif_rx_last_ns.notna().mean() >= 0.99
        assert data_rx.ts_data_ready_ns.notna().mean() >= 0.99


@pytest.mark.parametrize("workload", [
    pytest.param(SMALL, id="small"),
    pytest.param({}, id="default"),
])
def test_an_agent_started_during_the_job_finds_the_requests_issued_after(tmp_path, workload):
    """The issue's case: the agent starts during the job (4 s in, then its compile) and joins
    its connections mid-stream."""
    msgs, _, truth, (ready_ns, _), _ = _run(tmp_path, duration_s=3.0, join_after_s=4.0, rate=50, **workload)
    min_found = min(0.99, MIN_FOUND_SMALL) if workload else 0.99
    # requests issued after the agent was ready and answered before the job was stopped
    t = truth[(truth.role == "worker") & (truth.t_issued_ns > ready_ns) & truth.t_completed_ns.notna()]
    assert len(t) > 200
    for direction, request in (("tx", True), ("rx", False)):
        found = 0
        for host, th in t.groupby("host"):
            d = _side(msgs, host, direction, request)
            found += len(th.merge(d, on=IDS, how="inner").drop_duplicates(IDS))
        assert found >= min_found * len(t), f"worker {direction}: {found} of {len(t)} found"
    s = truth[(truth.role == "server") & (truth.t_received_ns > ready_ns + 10_000_000) & truth.t_replied_ns.notna()]
    found = sum(len(th.merge(_side(msgs, host, "rx", True), on=IDS, how="inner").drop_duplicates(IDS))
                for host, th in s.groupby("host"))
    assert found >= min_found * len(s)
