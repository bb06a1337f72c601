"""`pslat agent` on psbench in the virtual cluster: 2 servers x 4 workers, one agent
for every host (--netns each). Every request slice of psbench's ground truth must
appear on the worker's host (request sent, response received) and on the server's
host (request received, response sent) with the right op, ids and key count, none
invented; the stages present in causal order, each null one with its reason; the
framework-boundary times within 200 us of psbench's own log. An agent started
while the job runs joins mid-stream and finds >= 99% of the requests issued after it
was ready.

The jobs share one cluster, each on a group of hosts of its own; the every-slice jobs
run one after the other under one agent.

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

from agent.calls import sockcall_format
from probes import sockcalls as sockcalls_probe
from agent.rundir import read_run_dir
from parsers.pslite.legacy import ps_ids
from workloads.cluster.cluster import Cluster
from workloads.psbench.launch import launch_in_cluster
from walked_tables import assert_same_tables, replayed_tables

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 300                # another test's cluster may be up (one per machine)
READY_TIMEOUT_S = 120
FRAMEWORK_TOLERANCE_NS = 200_000
IDS = ["app_id", "customer_id", "timestamp", "sender", "recver"]
GROUP = 6                   # 2 servers + 4 workers, one host each: every job's shape
GROUPS = 3                  # the module's cluster: GROUPS groups of GROUP hosts
LARGE_WIRE_MS = 2.0         # group 2's wire
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
        argv = [sys.executable, "-m", "pslat.cli", "agent", "--out", str(out), "--lib", str(_libzmq()), *extra]
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
    m = pd.concat(frames, ignore_index=True)
    return pd.concat([m, ps_ids(m)], axis=1), metas   # ps-lite's ids, to compare with psbench's


class _Group:
    """GROUP hosts of the module's cluster, as launch_in_cluster takes a cluster."""

    def __init__(self, cluster, index: int):
        self.hosts = cluster.hosts[index * GROUP:(index + 1) * GROUP]
        self.popen = cluster.popen
        self.names = [h.name for h in self.hosts]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """One cluster for every job here (each brought up its own: 5 set-ups), in groups of
    GROUP hosts: groups 0 and 1 on a 0 ms wire, group 2 on LARGE_WIRE_MS among its own
    hosts. A job runs on one group; nothing crosses groups."""
    names = [f"h{i}" for i in range(GROUPS * GROUP)]
    slow = names[2 * GROUP:]
    pairs = {(a, b): LARGE_WIRE_MS for a in slow for b in slow if a != b}
    with Cluster(names, pair_delay_ms=pairs, wait_s=WAIT_S, log_dir=tmp_path_factory.mktemp("wire")) as c:
        yield c


def _of_hosts(tables: tuple[pd.DataFrame, dict], hosts: list[str]) -> tuple[pd.DataFrame, dict]:
    """_tables' rows and metas of these hosts."""
    msgs, metas = tables
    return msgs[msgs.host_id.isin(hosts)].reset_index(drop=True), {h: metas[h] for h in hosts if h in metas}


@pytest.fixture(scope="module")
def traced_jobs(cluster, tmp_path_factory):
    """The every-slice cases, one job after the other, each on a group of its own, under
    one agent started first (one compile, not three): {case: (msgs, metas, truth, log)},
    the rows and metas of that job's hosts, and "recording": the agent's --record file."""
    tmp = tmp_path_factory.mktemp("traced")
    groups = {case: _Group(cluster, g) for case, g in EVERY_SLICE_GROUP.items()}
    agent = Agent(tmp / "agent", [n for g in groups.values() for n in g.names],
                  extra=(*FULL, "--record", str(tmp / "agent.rec")))
    truths = {}
    try:
        for case, workload in EVERY_SLICE.items():
            with launch_in_cluster(groups[case], tmp / case, servers=2, workers=4, duration_s=3.0,
                                   **{"rate": 100, **workload}) as job:
                job.wait_ready()
                job.wait()
            truths[case] = job.truth()
        log = agent.stop()
        (tmp / "agent.log").write_text(log + f"\nready_ns {agent.ready_ns}\n")
    finally:
        agent.kill()
    tables = _tables(tmp / "agent")
    out = {case: (*_of_hosts(tables, groups[case].names), truths[case], log) for case in EVERY_SLICE}
    out["recording"] = tmp / "agent.rec"
    return out


def _joined(cluster, tmp: Path, case: str):
    """A mid-job case on its group: the agent starts JOIN_AFTER_S into the job (then its
    compile), traces JOIN_TRACE_S and the job is stopped (SIGTERM: it writes its truth).
    (msgs, truth, ready_ns). One case at a time: with both jobs at once the agent, still
    catching up on their backlog, lost events."""
    group = _Group(cluster, JOIN_GROUP[case])
    agent = None
    try:
        with launch_in_cluster(group, tmp / "ps", servers=2, workers=4, duration_s=120.0, rate=50,
                               **JOIN[case]) as job:
            job.wait_ready()
            time.sleep(JOIN_AFTER_S)   # the job runs: the agent must join mid-stream
            agent = Agent(tmp / "agent", group.names, extra=FULL)
            time.sleep(JOIN_TRACE_S)   # traffic while the agent traces
            job.stop()
        log = agent.stop()
        (tmp / "agent.log").write_text(log + f"\nready_ns {agent.ready_ns}\n")
    finally:
        if agent is not None:
            agent.kill()
    return _of_hosts(_tables(tmp / "agent"), group.names)[0], job.truth(), agent.ready_ns


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


# ~78 KB requests and responses (50+ segments), on group 2's 2 ms wire, a reconnect every 10 requests
LARGE = dict(keys_per_request=1024, embedding_dim=16, reconnect_every=10, rate=40)

EVERY_SLICE = {"small": SMALL, "default": {}, "wire2ms-large-reconnect10": LARGE}
EVERY_SLICE_GROUP = {"small": 0, "default": 1, "wire2ms-large-reconnect10": 2}
JOIN = {"small": SMALL, "default": {}}
JOIN_GROUP = {"small": 0, "default": 1}
JOIN_AFTER_S, JOIN_TRACE_S = 4.0, 3.0


@pytest.mark.parametrize("case", [
    pytest.param("small"),
    pytest.param("default", marks=needs_walker),
    pytest.param("wire2ms-large-reconnect10", marks=needs_walker),
])
def test_every_slice_on_both_hosts_with_ids_stages_and_framework_times(traced_jobs, case):
    min_found = MIN_FOUND_SMALL if EVERY_SLICE[case] == SMALL else 1.0
    msgs, metas, truth, log = traced_jobs[case]
    assert len(metas) == GROUP and set(truth.host) <= set(metas)
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


def test_the_recording_gives_the_same_tables_with_and_without_the_walked_calls_way(traced_jobs, tmp_path):
    """The stream decoder's fast way for calls the kernel walked whole (agent/calls.py
    whole_messages, parsers/pslite/walked.py) against the stream view, on the three jobs'
    live traffic: 1024 keys per request in the large case (slices of ~512 keys, which the
    walker samples by hash: the parser samples what it kept) and ~78 KB messages over many
    calls, with reconnects (directions joined anew). Every table and counter the same."""
    rec = traced_jobs["recording"]
    slow, _ = replayed_tables(rec, tmp_path / "slow", walked=False)
    fast, p_fast = replayed_tables(rec, tmp_path / "fast", walked=True)
    assert_same_tables(slow, fast)
    msgs = pd.concat([df for (_host, table), df in slow.items() if table == "messages"])
    sampled = (msgs.key_sample_complete == "False") & (msgs.num_keys.astype(int) > 16)
    assert sampled.sum() > 200 and (msgs.msg_bytes.astype(int) > 16384).sum() > 200
    assert p_fast.decoder.calls_walked_whole > 0.3 * p_fast.decoder.calls


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


@pytest.mark.parametrize("case", ["small", "default"])
def test_an_agent_started_during_the_job_finds_the_requests_issued_after(cluster, tmp_path, case):
    """The issue's case: the agent starts during the job (4 s in, then its compile) and joins
    its connections mid-stream."""
    msgs, truth, ready_ns = _joined(cluster, tmp_path, case)
    workload = JOIN[case]
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
