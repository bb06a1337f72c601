"""`pslat agent` on MXNet's real ps-lite (mxnet 1.9.1, workloads/mxnet) in the virtual
cluster: 1 server x 2 workers, one agent for every host, uprobes on libmxnet.so.

Ground truth is the workers' op logs (workloads/mxnet/oplog.py): every pull and push
a worker issued, its slices (one ps-lite request per server) and their wire keys.
Each slice must be found as a request on the worker's host (sent) and on the
server's host (received), with the op, the key count and keys consistent with the
key sample; its ps-layer framework time (ps::ZMQVan::SendMsg on the worker,
RecvMsg's return on the server) must lie inside the op's t_before..t_after; and its
response must be found on both hosts. No data request is invented: the agent's
push/pull requests of a worker are exactly the log's slices (init included).
Both kvstore modes run under the same agent and cluster (a job's rows are told
apart by the processes' pids).

The report on the same run dirs (issue 4): every logged push and pull paired
across the hosts with every component, and in dist_sync the push barrier
visible in server_user (no push answered before its round's last push arrived;
in dist_async some are).

The sub-component inputs (agent/netrows.py) on the same traffic: on receive rows
runq_wait + busy_wait = data-ready -> recv exit exactly, both >= 0, given for most
messages and null only with a reason; on send rows cwnd_wait and rwnd_wait are
given for every message with a driver handoff, >= 0, and the measured waits never
exceed kernel_tx (first send entry -> driver handoff of the last segment).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from agent.child import AgentProcess
from agent.rundir import read_run_dir
from parsers.pslite.legacy import ps_ids
from reports.dissect import dissect
from workloads.cluster.cluster import Cluster
from workloads.mxnet import oplog, runner, venv

pytestmark = [pytest.mark.privileged, pytest.mark.mxnet]

WAIT_S = 300
SCRIPT_ARGS = ["--iters", "6", "--num-rows", "4096", "--dim", "8", "--rows-per-pull", "32"]
JOB_TIMEOUT_S = 90.0
SERVER_NODE = 8          # ps-lite: server rank 0
IDS = ["app_id", "customer_id", "timestamp"]


def _worker_node(rank: int) -> int:
    return 9 + 2 * rank


def _tables(out: Path) -> pd.DataFrame:
    frames = []
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        rd = read_run_dir(d)
        assert rd.problems == []
        if "messages" in rd.tables:
            frames.append(rd.tables["messages"])
    m = pd.concat(frames, ignore_index=True)
    return pd.concat([m, ps_ids(m)], axis=1)   # ps-lite's ids, to compare with the op logs


def _run_job(cluster, tmp_path: Path, mode: str) -> runner.MxnetResult:
    job = runner.MxnetJob(cluster, SCRIPT_ARGS, tmp_path / mode, servers=1, workers=2, mode=mode,
                          gated=True)
    with job:
        job.wait_ready()
        job.release()
        return job.wait(JOB_TIMEOUT_S)


def _find(rows: pd.DataFrame, op: str, keys: list[int]) -> pd.DataFrame:
    """Data requests of this op carrying exactly these keys (count, and the sample among them)."""
    ks = set(keys)
    c = rows[(rows.op == op) & (rows.num_keys == len(keys))]
    return c[c.key_sample.map(lambda s: len(s) > 0 and set(s) <= ks)]


def _check_job(msgs: pd.DataFrame, res: runner.MxnetResult) -> dict:
    procs = {p.name: p for p in res.processes}
    server = procs["server-0"]
    assert server.node_id == SERVER_NODE
    logs = res.op_logs()
    stats = {"slices": 0, "by_ids": {}}   # (worker, server, app, customer, timestamp) -> (op, iter)
    srv = msgs[(msgs.pid == server.pid) & ~msgs.control]
    for w in (p for p in res.processes if p.role == "worker"):
        rank = w.rank
        recs = [r for r in logs[rank] if r.op in ("pull", "push", "init") and r.slices]
        mine = msgs[(msgs.pid == w.pid) & ~msgs.control]
        wtx = mine[(mine.direction == "tx") & mine.request.fillna(False)]
        wrx = mine[(mine.direction == "rx") & ~mine.request.fillna(True)]
        stx = srv[(srv.direction == "tx") & ~srv.request.fillna(True) & (srv.recver == w.node_id)]
        srx = srv[(srv.direction == "rx") & srv.request.fillna(False) & (srv.sender == w.node_id)]
        used_w, used_s = set(), set()
        for r in recs:
            op = "pull" if r.op == "pull" else "push"
            if r.row_ids is None:   # init: every row, keys not logged; count only
                key_lists = [(s.server, None, s.wire_keys) for s in r.slices]
            else:
                key_lists = [(s, keys, len(keys)) for s, keys in oplog.wire_key_ids(r, res.servers)]
            for srank, keys, n in key_lists:
                stats["slices"] += 1
                what = f"{res.mode} rank {rank} {r.op} iter {r.iter} ({n} keys)"
                if keys is None:
                    cw = wtx[(wtx.op == op) & (wtx.num_keys == n)]
                    cs = srx[(srx.op == op) & (srx.num_keys == n)]
                else:
                    cw, cs = _find(wtx, op, keys), _find(srx, op, keys)
                cw = cw[~cw.index.isin(used_w)]
                in_win = cw[(cw.ts_framework_ns >= r.t_before_ns) & (cw.ts_framework_ns <= r.t_after_ns)]
                assert len(in_win) >= 1, (f"{what}: not sent on the worker's host with its ps-layer time "
                                          f"in the op's window; candidates:\n{cw[['op', 'num_keys', 'ts_framework_ns', 'framework_layer', 'null_reasons']]}")
                row = in_win.iloc[0]
                used_w.add(in_win.index[0])
                stats["by_ids"][(w.node_id, int(row.recver), *(int(row[c]) for c in IDS))] = (r.op, r.iter)
                assert row.framework_layer == "ps", what
                assert row.recver == SERVER_NODE + 2 * srank, what
                # the same request on the server's host: the same ids
                same = cs[(cs[IDS] == row[IDS].values).all(axis=1)]
                same = same[~same.index.isin(used_s)]
                assert len(same) == 1, f"{what}: {len(same)} receptions on the server's host"
                got = same.iloc[0]
                used_s.add(same.index[0])
                assert got.framework_layer == "ps", f"{what}: server side without the ps-layer time"
                assert r.t_before_ns <= got.ts_framework_ns <= r.t_after_ns, what
                assert got.ts_recv_last_exit_ns <= got.ts_framework_ns, what
                # its response, on both hosts
                for side, tbl in (("server sends", stx), ("worker receives", wrx)):
                    resp = tbl[(tbl[IDS] == row[IDS].values).all(axis=1)]
                    assert len(resp) == 1, f"{what}: response ({side}) found {len(resp)} times"
                    if op == "pull":
                        assert resp.iloc[0].num_keys == n, f"{what}: pull response keys ({side})"
                    if side == "worker receives":
                        t = resp.iloc[0].ts_framework_ns
                        assert not pd.isna(t) and r.t_before_ns <= t <= r.t_after_ns, \
                            f"{what}: response hand-over {t} outside the op's window"
        # none invented: every data request of the worker is one of the log's slices
        data = wtx[wtx.op.isin(["push", "pull"])]
        assert len(used_w) == len(data), f"rank {rank}: {len(data) - len(used_w)} requests not in the log"
        data_s = srx[srx.op.isin(["push", "pull"])]
        assert len(used_s) == len(data_s), f"rank {rank}: server got {len(data_s) - len(used_s)} extra"
    return stats


def _check_subcomponents(msgs: pd.DataFrame) -> None:
    rx = msgs[(msgs.direction == "rx") & msgs.ts_data_ready_ns.notna() & msgs.ts_recv_last_exit_ns.notna()]
    sock = rx.ts_recv_last_exit_ns - rx.ts_data_ready_ns
    have = rx.runq_wait_ns.notna()
    assert (have == rx.busy_wait_ns.notna()).all()
    assert have.mean() >= 0.6, f"runq/busy given for {have.mean():.0%} of {len(rx)} received messages"
    assert ((rx.runq_wait_ns + rx.busy_wait_ns)[have] == sock[have]).all()
    assert (rx.runq_wait_ns[have] >= 0).all() and (rx.busy_wait_ns[have] >= 0).all()
    assert rx[~have].null_reasons.str.contains("runq_wait_ns=").all()
    tx = msgs[(msgs.direction == "tx") & msgs.ts_xmit_last_ns.notna() & msgs.ts_send_first_enter_ns.notna()]
    assert len(tx) and tx.cwnd_wait_ns.notna().all() and tx.rwnd_wait_ns.notna().all()
    assert (tx.cwnd_wait_ns >= 0).all() and (tx.rwnd_wait_ns >= 0).all()
    waits = tx.cwnd_wait_ns + tx.rwnd_wait_ns + tx.qdisc_wait_ns.fillna(0)
    assert (waits <= tx.ts_xmit_last_ns - tx.ts_send_first_enter_ns).all()


# The report's server side of a request, in absolute time on the (shared) clock:
# the server's recv exit of the request's last byte, and its first send of the response.
UP_TO_SERVER_RX = ["client_user_tx", "client_kernel_tx", "client_nic_tx", "wire_req", "server_nic_rx",
                   "server_kernel_rx"]


def _check_report(out: Path, results, stats_by_mode: dict) -> dict:
    """Issue 4 on MXNet: `pslat report`'s dissection pairs every push and pull of both
    jobs, with every component, and dist_sync's push barrier shows in server_user: the
    server answers a push only after every worker's push of that round arrived."""
    d = dissect([out])
    figures = {}
    for res in results:
        by_ids = stats_by_mode[res.mode]["by_ids"]
        pids = {p.pid for p in res.processes}
        q = d.complete[d.complete.worker_pid.isin(pids)].copy()
        ids = ps_ids(q)
        q["key"] = list(zip(q.worker.astype(int), q.server.astype(int), ids.app_id.astype(int),
                            ids.customer_id.astype(int), ids.timestamp.astype(int)))
        data = q[q.op.isin(["push", "pull"])]
        assert set(by_ids) <= set(data.key), \
            f"{res.mode}: {len(set(by_ids) - set(data.key))} of {len(by_ids)} logged slices not paired in the report"
        data = data[data.key.isin(by_ids)]
        # veth has no TX completion: *_nic_tx is null and folded into the wire
        for c in ["client_user_tx", "client_kernel_tx", "wire_req", "server_nic_rx", "server_kernel_rx",
                  "server_user", "server_kernel_tx", "wire_resp", "client_nic_rx", "client_kernel_rx",
                  "client_user_rx", "e2e"]:
            assert data[c].notna().all(), f"{res.mode}: {data[c].isna().sum()} requests without {c}"
        assert ((data.e2e_from == "framework") & (data.e2e_to == "framework")).all()
        pushes = data[data.key.map(lambda k: by_ids[k][0] == "push")].copy()
        pushes["iter"] = pushes.key.map(lambda k: by_ids[k][1])
        pushes["srv_rx"] = pushes.start_ns + pushes[UP_TO_SERVER_RX].fillna(0).sum(axis=1)
        pushes["srv_tx"] = pushes.srv_rx + pushes.server_user
        rounds = pushes.groupby(["iter", "server"]).agg(n=("srv_rx", "size"), last_rx=("srv_rx", "max"),
                                                        first_tx=("srv_tx", "min"))
        rounds = rounds[rounds.n == len([p for p in res.processes if p.role == "worker"])]
        assert len(rounds) >= 4, rounds
        held = rounds.first_tx >= rounds.last_rx          # no answer before the round's last push arrived
        figures[res.mode] = {"requests": len(data), "push server_user p50 us": pushes.server_user.median() / 1e3,
                             "rounds answered after their last push": f"{held.sum()} of {len(rounds)}"}
        if res.mode == "dist_sync":
            assert held.all(), f"dist_sync: a push answered before its round's last push arrived:\n{rounds}"
        else:   # async: each push is answered on its own, no waiting for the other worker
            assert not held.all(), f"dist_async: every round looks held back:\n{rounds}"
    print(f"\nMXNet report: {figures}")
    return figures


def test_agent_finds_every_mxnet_push_and_pull(tmp_path):
    lib = venv.libmxnet_path()
    with Cluster(3, wait_s=WAIT_S, log_dir=tmp_path / "wire") as cluster:
        args = ["--lib", str(lib)]
        for h in cluster.hosts:
            args += ["--netns", h.name]
        with AgentProcess(tmp_path / "agent", args) as agent:
            results = [_run_job(cluster, tmp_path, m) for m in ("dist_async", "dist_sync")]
            assert agent.stop() == 0, agent.log_tail(30)
    msgs = _tables(tmp_path / "agent")
    _check_subcomponents(msgs)
    stats = {}
    for res in results:
        stats[res.mode] = _check_job(msgs, res)
        assert stats[res.mode]["slices"] >= 2 * 2 * 6, stats[res.mode]["slices"]
    _check_report(tmp_path / "agent", results, stats)
