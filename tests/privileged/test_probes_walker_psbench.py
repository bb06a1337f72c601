"""The ZMTP walker joining a running psbench job (ps-lite's wire protocol).

A psbench job (2 servers, 4 workers, on loopback) with large request slices
(2000 keys x 16 floats over 2 servers: about 76 KB each, more than one call)
runs for a while before the probe attaches (and is stopped a few seconds
after it is ready, whatever its compile took): every connection is joined
mid-stream and must be synced by the walker itself (no hints are given). Of
the requests the workers issued after the probe was ready, at least 99% must
be rebuilt from the walker's records on the worker's send side and on the
server's receive side, with their ids, op and key count (psbench's ground
truth), and the walker must count no desync.
"""
from __future__ import annotations

import threading
import time

import pytest
from test_probes_walker import Capture, directions

JOIN_AFTER_S = 1.5
TRACE_S = 4.0       # traced after the probe is ready; then the job is stopped
DURATION_S = 120.0  # longer than any compile: the job never ends by itself first


@pytest.mark.privileged
def test_walker_joins_a_running_psbench_job(tmp_path):
    from probes.events import WalkProtocol
    from probes.filters import Filters
    from probes.loader import ProbeProgram
    from probes.sockcalls import SOCKCALLS, install_walker
    from workloads.psbench.launch import launch_local

    # 50 requests/s per worker: ~16 MB/s of slices, ~10k ring events/s for the test's
    # Python consumer (at 100, a CI run with other work on the machine lost 12,495 of 81,420)
    job = launch_local(tmp_path / "job", servers=2, workers=4, duration_s=DURATION_S, rate=50,
                       keys_per_request=2000, embedding_dim=16)
    with job:
        nodes = job.wait_ready()
        time.sleep(JOIN_AFTER_S)  # the job's traffic is under way: joined mid-stream
        # 16 MiB ring, as the agent's: this test's consumer is Python, on a shared machine
        with ProbeProgram.start([SOCKCALLS], Filters.build(pids=[n["pid"] for n in nodes.values()]),
                                overrides={"SOCKCALLS_RING_PAGES": 4096}) as prog:
            install_walker(prog, (WalkProtocol.ZMTP,))
            cap = Capture(prog)
            ready_ns = time.monotonic_ns()
            until = time.monotonic() + TRACE_S
            while time.monotonic() < until:
                assert all(p.popen.poll() is None for p in job.procs), "a psbench process ended early"
                prog.poll(50)
            stopped_ns = time.monotonic_ns()
            # SIGTERM: the processes flush their ground truth (a second or more), while
            # the rings go on being read
            stopping = threading.Thread(target=job.stop)
            stopping.start()
            while stopping.is_alive():
                prog.poll(50)
            stopping.join()
            cap.drain()
            counters = prog.counters()["sockcalls"]
    truth = job.truth()
    workers = {n["pid"] for n in nodes.values() if n["role"] == "worker"}
    servers = {n["pid"] for n in nodes.values() if n["role"] == "server"}
    # issued after the probe was ready, answered before the job was stopped
    sent = truth[(truth.role == "worker") & (truth.t_issued_ns > ready_ns) & (truth.t_completed_ns < stopped_ns)]
    want = {(r.app_id, r.customer_id, r.timestamp, r.op, r.num_keys) for r in sent.itertuples()}
    assert len(want) > 100
    for pids, is_send in ((workers, True), (servers, False)):
        got = set()
        for key, d in directions(cap.calls, mid_stream=True).items():
            if key[0] in pids and key[2] == is_send:
                got |= {(m.app_id, m.customer_id, m.timestamp, m.ps_op.value, m.num_keys)
                        for m in d.messages if m.request and m.kind.value == "data"}
        found = len(want & got)
        print(f"\n{'worker sends' if is_send else 'server receives'}: {found} of {len(want)} requests")
        assert found >= 0.99 * len(want)
    print("counters:", counters)
    assert counters["lost"] == 0 and counters["desyncs"] == 0 and counters["self_syncs"] > 0
    assert counters["hints_applied"] == 0
