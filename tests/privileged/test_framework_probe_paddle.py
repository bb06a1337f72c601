"""The framework-boundary probe on PaddlePaddle's real parameter server (paddlepaddle 3.0.0,
brpc's baidu_std linked into libpaddle.so; workloads/paddle): uprobes on brpc's four RPC
ends (probes/framework.bpf.c, "brpc") in every process of a 2 servers x 2 trainers job in
the virtual cluster, attached after the job loaded and before any RPC.

The oracle is outside the probe: the wire, captured in the wire namespace by tcpdump and
parsed by parsers/brpc (workloads/capture.py), and the trainers' own step times
(trainer-<id>.json, CLOCK_MONOTONIC like the probe's). On every trainer the client-send
records' correlation ids are exactly the multiset of its requests' ids on the wire, the
client-recv ones those of its responses; on every server the server-send ids exactly those
of its responses, each with a server-recv record of the same id before it on the same
thread. In time: each step of a trainer holds at least one RPC of it sent and answered
inside its exe.run; nothing of a trainer's is before its release or after its
stop_worker; and every RPC's four records come in causal order across the hosts (one
kernel, one clock): client send < server recv < server send < client recv.
"""
from __future__ import annotations

import itertools
import json
import time
from collections import Counter, defaultdict

import pytest
from test_paddle_job import paddle_venv  # noqa: F401  (the venv, or a skip CI turns into a failure)

from parsers.brpc import BrpcStreamParser
from agent.framework_records import FrameworkDecoder
from probes.framework import FrameworkProbe, targets_of_pid
from workloads import capture
from workloads.cluster.cluster import Cluster
from workloads.paddle import runner

pytestmark = [pytest.mark.privileged, pytest.mark.paddle]

SERVERS, TRAINERS = 2, 2
STEPS = 20
WIRE_DELAY_MS = 1.0
JOB_TIMEOUT_S = 60.0
CLUSTER_WAIT_S = 300.0   # one cluster per machine: another test's may be up
BAIDU_STD_MAGIC = b"PRPC"


def _wire_ids(cap_path) -> tuple[dict, dict]:
    """By host address: Counters of the correlation ids of the requests it sent and
    received and of the responses it sent and received, from the capture alone; and
    (server addr, id) -> the trainer addresses whose request to it had that id."""
    ids = defaultdict(lambda: {k: Counter() for k in ("req_out", "req_in", "resp_out", "resp_in")})
    askers = defaultdict(set)
    for d in capture.tcp_streams(cap_path):
        if not d.data.startswith(BAIDU_STD_MAGIC):
            continue
        p = BrpcStreamParser()
        msgs = p.feed(d.data) + p.close()
        assert p.stats().unparsed_bytes == 0, f"{d.key}: bytes parsers/brpc did not parse"
        for m in msgs:
            ids[d.src]["req_out" if m.request else "resp_out"][m.correlation_id] += 1
            ids[d.dst]["req_in" if m.request else "resp_in"][m.correlation_id] += 1
            if m.request:
                askers[(d.dst, m.correlation_id)].add(d.src)
    return ids, askers


def test_brpc_ends_carry_the_wires_correlation_ids(tmp_path, paddle_venv):  # noqa: F811
    with Cluster(SERVERS + TRAINERS, wire_delay_ms=WIRE_DELAY_MS, wait_s=CLUSTER_WAIT_S) as cluster:
        with capture.WireCapture(tmp_path / "wire.pcap") as cap, \
                runner.PaddleJob(cluster, tmp_path / "out", SERVERS, TRAINERS, STEPS,
                                 python=paddle_venv) as job:
            pids = job.wait_ready(JOB_TIMEOUT_S)
            # found as the agent finds a job's libraries: in each process's maps
            targets = [t for pid in pids.values() for t in targets_of_pid(pid) if t.layer == "brpc"]
            assert sorted(t.pid for t in targets) == sorted(pids.values()), targets
            t0 = time.monotonic()
            with FrameworkProbe(targets, decoder=FrameworkDecoder()) as probe:
                attach_s = time.monotonic() - t0
                job.release()
                t_release_ns = time.monotonic_ns()
                # ~4 records of 128 bytes per RPC, ~220 RPCs: the 1 MiB ring holds them all
                job.wait_trainers(JOB_TIMEOUT_S)
                records = probe.drain()
                counters = probe.counters()
            summaries = {j: json.loads((job.out_dir / runner.TRAINER_JSON.format(j)).read_text())
                         for j in range(TRAINERS)}
        assert not cap.dropped, f"tcpdump lost packets: {cap.stats}"
    addr_of = {i.pid: i.addr for i, _ in job.procs}
    role_of = {i.pid: i.role for i, _ in job.procs}
    assert counters["lost"] == 0 and counters["unpaired"] == 0, counters
    assert all(r.layer == "brpc" and r.tgid in addr_of for r in records)
    wire, askers = _wire_ids(cap.path)

    by = defaultdict(list)   # (pid, side, direction) -> records
    for r in records:
        # a client sends requests, a server responses
        side = "client" if (r.direction == "send") == r.call_key[2] else "server"
        by[(r.tgid, side, r.direction)].append(r)
    kinds = Counter()
    for pid, addr in addr_of.items():
        w = wire[addr]
        got = {k: Counter(r.call_key[1] for r in by[(pid, *k)])
               for k in (("client", "send"), ("client", "recv"), ("server", "recv"), ("server", "send"))}
        for k, c in got.items():
            kinds[(role_of[pid], *k)] += sum(c.values())
        assert got[("client", "send")] == w["req_out"], (pid, "client send")
        assert got[("client", "recv")] == w["resp_in"], (pid, "client recv")
        assert got[("server", "send")] == w["resp_out"], (pid, "server send")
        assert got[("server", "recv")] == w["req_in"], (pid, "server recv")
        if role_of[pid] == "PSERVER":
            assert w["resp_out"] and w["resp_out"] == w["req_in"]
        else:
            assert w["req_out"] and w["req_out"] == w["resp_in"]

    # each server send has its server recv: same thread, same id, before it
    for pid in addr_of:
        recvs = defaultdict(list)
        for r in by[(pid, "server", "recv")]:
            recvs[(r.tid, r.call_key[1])].append(r)
        for s in by[(pid, "server", "send")]:
            mine = recvs[(s.tid, s.call_key[1])]
            assert mine, s
            r = mine.pop(0)
            assert r.ts_ns < s.ts_ns and r.ret_ts_ns == s.ts_ns, (r, s)

    # in time, against the trainers' own clock readings
    trainer_pid = {i.index: i.pid for i, _ in job.procs if i.role == "TRAINER"}
    steps_with_rpc = 0
    for j, s in summaries.items():
        pid = trainer_pid[j]
        sends = by[(pid, "client", "send")]
        recvs = {r.call_key[1]: r for r in by[(pid, "client", "recv")]}
        for r in sends + list(recvs.values()):
            assert t_release_ns < r.ts_ns < s["t_stop_worker_done_ns"], (j, r)
        for st in s["steps"]:
            inside = [x for x in sends if st["t_before_ns"] < x.ts_ns and x.call_key[1] in recvs
                      and recvs[x.call_key[1]].ts_ns < st["t_after_ns"]]
            assert inside, (j, st["step"], "no RPC sent and answered inside the step")
            steps_with_rpc += 1
    # across hosts: each server's records of an id against the RPCs of that id its
    # askers made (two trainers running one program use the same ids: some order of
    # them must fit, and with one asker that order is the only one)
    server_pid = {i.addr: i.pid for i, _ in job.procs if i.role == "PSERVER"}
    pid_of_addr = {a: p for p, a in addr_of.items()}
    ordered = shared = 0
    for saddr, spid in server_pid.items():
        handled = defaultdict(list)   # id -> (server recv, server send) times
        recv_at = {(r.tid, r.call_key[1], r.ret_ts_ns): r.ts_ns for r in by[(spid, "server", "recv")]}
        for s in by[(spid, "server", "send")]:
            handled[s.call_key[1]].append((recv_at[(s.tid, s.call_key[1], s.ts_ns)], s.ts_ns))
        for cid, ends in handled.items():
            chains = []
            for asker in askers[(saddr, cid)]:
                tpid = pid_of_addr[asker]
                (sent,) = [x.ts_ns for x in by[(tpid, "client", "send")] if x.call_key[1] == cid]
                (back,) = [x.ts_ns for x in by[(tpid, "client", "recv")] if x.call_key[1] == cid]
                chains.append((sent, back))
            assert len(chains) == len(ends), (saddr, cid)
            assert any(all(c[0] < e[0] < e[1] < c[1] for c, e in zip(chains, order))
                       for order in itertools.permutations(ends)), (saddr, cid, chains, ends)
            ordered += len(ends)
            shared += len(ends) > 1
    print(f"\npaddle brpc framework probe, {SERVERS}x{TRAINERS}, {STEPS} steps: attach "
          f"{attach_s:.1f} s for {len(targets)} processes; records {dict(sorted(kinds.items()))}; "
          f"{steps_with_rpc} steps with an RPC inside; causal order checked on {ordered} RPCs, "
          f"{shared} ids used by both trainers on one server; counters {counters}")

