"""`pslat report` of real captures (tests/data/capture, recorded by record.py there:
psbench 1 server x 1 worker in the virtual cluster, a 1 ms wire, tcpdump in both hosts,
the agent tracing both meanwhile), against psbench's own log and the agent's report of
the same traffic."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from capture.rundir import parse_points, write_run_dirs
from reports.dissect import dissect
from reports.load import host_shards

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "capture"
IDS = ["op", "call_id", "worker", "server"]


def _dissect(tmp_path: Path, *files: str):
    dirs, problems = write_run_dirs(parse_points([DATA / f for f in files], []), tmp_path)
    return dissect(dirs), dirs, problems


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    return _dissect(tmp_path_factory.mktemp("both"), "h0.pcap", "h1.pcap")


@pytest.fixture(scope="module")
def agent():
    return dissect([DATA / "agent"])


def _truth() -> pd.DataFrame:
    t = pd.read_parquet(DATA / "truth.parquet")
    w = t[t.role == "worker"]
    return pd.DataFrame({"op": w.op.astype(str), "call_id": w.timestamp.astype("int64"),
                         "worker": w.sender.astype("int64"), "server": w.recver.astype("int64"),
                         "num_keys": w.num_keys.astype("int64")})


def _ids(req: pd.DataFrame) -> pd.DataFrame:
    return req.astype({"op": str, "call_id": "int64", "worker": "int64", "server": "int64"})


def test_every_request_of_the_job_is_paired_from_the_two_captures(both):
    d, dirs, problems = both
    assert problems == []
    metas = [json.loads((p / "meta.json").read_text()) for p in dirs]
    assert [(m["host_id"], m["capture"]["local_ips"], m["capture"]["point"]) for m in metas] == [
        ("h0", ["10.77.0.1"], "host"), ("h1", ["10.77.0.2"], "host")]
    assert all(m["counters"]["stream_lost_bytes"] == 0 and m["counters"]["unrecognised_connections"] == 0
               for m in metas)
    req = _ids(d.complete)
    truth = _truth()
    assert len(req) == len(truth) == d.stats.requests == 30
    j = req.merge(truth, on=IDS, suffixes=("", "_truth"), validate="one_to_one")
    assert len(j) == 30 and (j.num_keys == j.num_keys_truth).all()
    assert set(req.worker_host) == {"h1"} and set(req.server_host) == {"h0"}
    assert d.ends.tx_only == d.ends.rx_only == 0 and d.ends.paired > 60   # both ends of every message
    # what two capture points tell: the wire each way, the server host between them; nothing of the client
    assert set(req.folded) == {"client_nic_tx+server_nic_rx>wire_req;server_kernel_rx+server_user+"
                               "server_kernel_tx>unsplit;server_nic_tx+client_nic_rx>wire_resp"}
    assert req.client_user_tx.isna().all() and req.client_kernel_rx.isna().all()
    assert set(req.e2e_from) == {"driver"} and set(req.e2e_to) == {"netif"}
    # the wire forwarder holds each frame 1 ms: a message's last segment crosses in a little more
    for c in ("wire_req", "wire_resp"):
        assert 1_000_000 <= req[c].median() < 1_100_000, c
    clock = d.clocks[("h0", "h1")]
    assert clock.source == "estimated" and abs(clock.offset_ns) <= clock.uncertainty_ns   # one kernel: truth 0


def test_null_stages_say_why(both):
    _, dirs, _ = both
    t = next(host_shards(dirs[1], "h1", "messages", ["host_id", "direction", "ts_xmit_last_ns",
                                                      "ts_netif_rx_last_ns", "ts_send_first_enter_ns",
                                                      "null_reasons"])).to_pandas()
    tx, rx = t[t.direction == "tx"], t[t.direction == "rx"]
    assert tx.ts_xmit_last_ns.notna().all() and rx.ts_netif_rx_last_ns.notna().all()
    assert tx.ts_send_first_enter_ns.isna().all()
    assert tx.null_reasons.str.contains("ts_send_first_enter_ns=a packet capture sees no syscalls").all()
    assert rx.null_reasons.str.contains("ts_nic_rx_last_ns=a packet capture sees a receive at netif_receive").all()


def test_the_captures_network_time_is_the_agents_wire_and_nic(both, agent):
    """The same requests, traced by the agent (BPF, CLOCK_MONOTONIC) and captured (AF_PACKET,
    CLOCK_REALTIME): the round trip between the capture points is the agent's wire + NIC
    components. (Recorded on a machine whose realtime clock steps: a request straddling a step
    would be off by it; this recording has none near a request's wire time.)"""
    d, _, _ = both
    cap = _ids(d.complete)
    ag = _ids(agent.complete)
    assert len(ag) == 30
    net = ["client_nic_tx", "wire_req", "server_nic_rx", "server_nic_tx", "wire_resp", "client_nic_rx"]
    ag = ag.assign(agent_ns=sum(ag[c].fillna(0).astype("int64") for c in net))
    cap = cap.assign(cap_ns=cap.wire_req.astype("int64") + cap.wire_resp.astype("int64"))
    j = cap[IDS + ["cap_ns", "req_bytes", "resp_bytes"]].merge(
        ag[IDS + ["agent_ns", "req_bytes", "resp_bytes"]], on=IDS, suffixes=("", "_agent"), validate="one_to_one")
    assert len(j) == 30
    assert (j.req_bytes == j.req_bytes_agent).all() and (j.resp_bytes == j.resp_bytes_agent).all()
    err = (j.cap_ns - j.agent_ns).abs()
    assert (err <= np.maximum(50_000, 0.05 * j.agent_ns)).all()
    assert err.median() < 10_000


def test_a_pcapng_of_two_interfaces_and_a_cooked_capture_give_the_same_requests(both, tmp_path):
    """dumpcap on h0's eth0 and lo (pcapng, two interface blocks) and tcpdump -i any on h1
    (Linux cooked v2): the same data requests as the plain captures, and h0's lo traffic
    (the scheduler and the server on one host) as both ends of each message there."""
    d, dirs, problems = _dissect(tmp_path, "h0.pcapng", "h1-any.pcap")
    assert problems == []
    metas = [json.loads((p / "meta.json").read_text()) for p in dirs]
    assert metas[0]["capture"]["format"] == "pcapng" and metas[0]["capture"]["interfaces"] == 2
    assert metas[1]["capture"]["link_types"] == [276]
    req, plain = _ids(d.complete), _ids(both[0].complete)
    assert sorted(map(tuple, req[IDS].to_numpy())) == sorted(map(tuple, plain[IDS].to_numpy()))
    lo = next(host_shards(dirs[0], "h0", "messages", ["host_id", "direction", "local_ip", "remote_ip"])).to_pandas()
    lo = lo[lo.local_ip == lo.remote_ip]
    assert len(lo) > 0 and (lo.direction == "tx").sum() == (lo.direction == "rx").sum()


def test_one_capture_point_tells_network_and_remote(tmp_path):
    """The worker's capture alone: each request's time after the capture point, the server
    host included (network_and_remote); the client's own host is not in a capture."""
    d, _, _ = _dissect(tmp_path, "h1.pcap")
    req = d.complete
    assert len(req) == 30
    assert set(req.folded) == {"client_nic_tx+wire_req+server_nic_rx+server_kernel_rx+server_user+"
                               "server_kernel_tx+server_nic_tx+wire_resp+client_nic_rx>network_and_remote"}
    assert (req.network_and_remote == req.e2e).all() and (req.e2e > 2_000_000).all()


def test_the_cli_reports_captures(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "report", "--capture", f"worker={DATA / 'h1.pcap'}",
                        "--capture", f"server={DATA / 'h0.pcap'}", "-o", str(tmp_path / "r.json")],
                       capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "r.json").read_text())
    assert s["requests"] == 30 and sorted(s["hosts"]) == ["server", "worker"]
    assert "30 requests" in r.stderr


def test_a_capture_and_an_agents_run_dir_in_one_report(tmp_path):
    """The worker captured (CLOCK_REALTIME), the server traced by the agent (CLOCK_MONOTONIC):
    one run by the times they cover, the clocks related by the traffic, the server's host
    split by the agent's stages and the wire by the capture's."""
    dirs, problems = write_run_dirs(parse_points([DATA / "h1.pcap"], []), tmp_path)
    d = dissect([DATA / "agent" / "h0", *dirs])
    assert problems == [] and d.hosts == ["h0", "h1"] and not any("different run" in p for p in d.problems)
    clock = d.clocks[("h0", "h1")]
    assert clock.source == "estimated" and clock.uncertainty_ns < 1_100_000
    req = d.complete
    assert len(req) == 30
    assert req.server_kernel_rx.notna().all() and req.server_user.notna().all()
    assert (req.wire_req > 1_000_000).all() and (req.wire_resp > 1_000_000).all()
