"""The README's guide, "Tracing your own job on two hosts", followed on the virtual
cluster as if its namespaces were two machines: one agent per host, started on its
own with its own --host-id, psbench run meanwhile, the agents stopped, their run
dirs copied together, and `pslat report --clocks estimate` of the copies (agents on
one kernel share a clock; real hosts do not, so the clocks come from the traffic).
The oracle is psbench's own log: every request it completed, per op, and its mean
latency; the wire's configured delay for the wire components."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_agent_cluster import Agent  # noqa: E402  (the agent as a child process, ready on its signal)

from workloads.cluster.cluster import Cluster  # noqa: E402
from workloads.psbench.launch import launch_in_cluster  # noqa: E402

pytestmark = pytest.mark.privileged

WIRE_MS = 1.0
HOSTS = {"h0": "server0", "h1": "worker0"}   # namespace -> the host id its agent is given


def test_the_readme_guide_on_two_namespaces_as_hosts(tmp_path):
    with Cluster(list(HOSTS), wire_delay_ms=WIRE_MS, wait_s=60) as cluster:
        agents = {}
        try:
            for ns, host_id in HOSTS.items():
                agents[ns] = Agent(tmp_path / f"on-{ns}", [ns], extra=("--host-id", host_id, "--sample-rate", "1"))
            with launch_in_cluster(cluster, tmp_path / "ps", servers=1, workers=1, duration_s=3.0, rate=50,
                                   keys_per_request=64, embedding_dim=8) as job:
                job.wait_ready()
                job.wait()
                truth = job.truth()
            for a in agents.values():
                a.stop()
        finally:
            for a in agents.values():
                a.kill()
    runs = tmp_path / "runs"   # "bring the run dirs together"
    for ns, host_id in HOSTS.items():
        assert [p.name for p in (tmp_path / f"on-{ns}").iterdir()] == [host_id]
        shutil.copytree(tmp_path / f"on-{ns}" / host_id, runs / host_id)
    out = tmp_path / "summary.json"
    subprocess.run([sys.executable, "-m", "pslat.cli", "report", *(str(runs / h) for h in HOSTS.values()),
                    "--clocks", "estimate", "--keep-warmup", "-f", "json", "-o", str(out)], cwd=ROOT, check=True,
                   capture_output=True, timeout=120)
    s = json.loads(out.read_text())
    done = truth[(truth.role == "worker") & truth.t_completed_ns.notna()]
    assert sorted(s["hosts"]) == sorted(HOSTS.values())
    assert s["requests"] == len(done) > 100
    assert {op: v["count"] for op, v in s["by_op"].items()} == done.op.value_counts().to_dict()
    truth_mean_us = float((done.t_completed_ns - done.t_issued_ns).mean()) / 1e3
    for op, v in s["by_op"].items():
        e2e = v["e2e_us"]["mean"]
        want = float((done[done.op == op].t_completed_ns - done[done.op == op].t_issued_ns).mean()) / 1e3
        assert abs(e2e - want) <= max(0.05 * want, 50), (op, e2e, want)
        wire = v["groups_us"]["wire"]["mean"]
        assert 2 * WIRE_MS * 1e3 * 0.95 <= wire <= 2 * WIRE_MS * 1e3 * 1.25, (op, wire)
    print(f"\n{s['requests']} requests, as psbench's log; psbench's mean {truth_mean_us:.0f} us; "
          + "; ".join(f"{op}: e2e {v['e2e_us']['mean']:.0f} us, wire {v['groups_us']['wire']['mean']:.0f} us"
                      for op, v in s["by_op"].items()))
