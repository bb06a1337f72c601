"""agent.live on the recorded psbench run (tests/data/agent/psbench.rec.gz: 2 servers x 2
workers on one namespace's loopback, no netstack probe), checked against the messages
table the same replay writes, and on hand-made rows for the folding rules."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest

from agent.daemon import replay
from agent.live import EDGES_NS, PER_DECADE, LiveAggregates, components_of, merge_snapshots, quantile_ns
from agent.rundir import read_run_dir

DATA = Path(__file__).resolve().parents[1] / "data"
REC = DATA / "agent" / "psbench.rec.gz"
SNAPSHOT = DATA / "live" / "psbench.snapshot.json"
IDS = ["protocol", "call_space", "call_id"]


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    out = tmp_path_factory.mktemp("live")
    live = LiveAggregates(agent="recorded")
    replay(REC, out, live=live)
    msgs = pd.concat([read_run_dir(d).tables["messages"] for d in out.iterdir() if d.is_dir()], ignore_index=True)
    return live, live.snapshot(), msgs


def _pairs(msgs: pd.DataFrame, role: str) -> pd.DataFrame:
    """Request/response pairs of one role on one host, joined independently of agent.live."""
    d = msgs[~msgs.control & msgs.op.isin(["push", "pull"]) | (~msgs.control & ~msgs.request)]
    req_dir, resp_dir = ("tx", "rx") if role == "client" else ("rx", "tx")
    q = d[d.request & (d.direction == req_dir)].assign(worker=lambda x: x.sender, server=lambda x: x.recver)
    p = d[~d.request & (d.direction == resp_dir)].assign(worker=lambda x: x.recver, server=lambda x: x.sender)
    return q.merge(p, on=["host_id", *IDS, "worker", "server"], suffixes=("_q", "_p"))


def _first(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    out = df[cols[0]]
    for c in cols[1:]:
        out = out.fillna(df[c])
    return out.astype("int64")


def test_every_request_is_paired_on_its_host(replayed):
    live, snap, msgs = replayed
    for role in ("client", "server"):
        want = _pairs(msgs, role).groupby("op_q").size().to_dict()
        got = {g["op"]: g["requests"] for g in snap["groups"] if g["role"] == role}
        assert got == want and sum(want.values()) == 80, (role, got, want)
    assert snap["agents"][0]["pending_requests"] == 0


def test_client_time_is_first_to_last_stage_and_components_add_up(replayed):
    _, snap, msgs = replayed
    pr = _pairs(msgs, "client")
    start = _first(pr, ["ts_framework_ns_q", "ts_send_first_enter_ns_q"])
    end = _first(pr, ["ts_framework_ns_p", "ts_recv_last_exit_ns_p"])
    want = (end - start).groupby(pr.op_q).sum().to_dict()
    for g in snap["groups"]:
        parts = sum(h["sum_ns"] for c, h in g["hists"].items()
                    if c in ("client_user_tx", "client_kernel_tx", "client_nic_tx", "network_and_remote",
                             "client_nic_rx", "client_kernel_rx", "client_user_rx", "unsplit",
                             "server_nic_rx", "server_kernel_rx", "server_user", "server_kernel_tx",
                             "server_nic_tx"))
        assert parts == g["hists"]["e2e"]["sum_ns"], g["op"]   # exact, integer ns
        if g["role"] == "client":
            assert g["hists"]["e2e"]["sum_ns"] == want[g["op"]]
            # no netstack in this recording: kernel and network cannot be told apart on this host
            assert "unsplit" in g["hists"] and "client_kernel_tx" not in g["hists"]


def test_quantiles_lie_in_the_true_quantiles_bucket(replayed):
    _, snap, msgs = replayed
    pr = _pairs(msgs, "server")
    e2e = _first(pr, ["ts_send_first_enter_ns_p"]) - _first(pr, ["ts_nic_rx_last_ns_q", "ts_netif_rx_last_ns_q",
                                                                  "ts_recv_last_exit_ns_q"])
    step = 10 ** (1 / PER_DECADE)
    for g in (g for g in snap["groups"] if g["role"] == "server"):
        true = e2e[pr.op_q == g["op"]]
        counts = {int(i): c for i, c in g["hists"]["e2e"]["counts"]}
        for q in (0.5, 0.99):
            est = quantile_ns(counts, q)
            lo, hi = true.quantile(q, interpolation="lower"), true.quantile(q, interpolation="higher")
            assert lo / step <= est <= hi * step, (g["op"], q, est, lo, hi)


def test_hot_keys_count_the_sampled_keys(replayed):
    _, snap, msgs = replayed
    d = msgs[msgs.request & ~msgs.control & msgs.op.isin(["push", "pull", "pushpull"])]
    counts = pd.Series([k for ks in d.key_sample for k in ks]).value_counts()
    got = snap["keys"][d.host_id.iloc[0]]
    assert got["sampled"] == counts.sum() > 0
    assert [n for _, n in got["top"]] == counts.head(len(got["top"])).tolist()
    assert int(got["top"][0][0]) in set(counts[counts == counts.max()].index)


def test_connections_are_the_distinct_conn_ids(replayed):
    _, snap, msgs = replayed
    c = snap["connections"][msgs.host_id.iloc[0]]
    assert c["open"] == c["opened_total"] == msgs.conn_id.nunique()
    assert c["closed_total"] == 0     # no netstack probe: no close seen, none invented


def test_window_ages_out_but_totals_stay(replayed):
    live, snap, _ = replayed
    fresh = LiveAggregates(agent="x")
    fresh.__dict__.update({k: v for k, v in live.__dict__.items() if k not in ("lock",)})
    fresh.advance((fresh.now_s + fresh.window_s + 1) * 10**9)
    later = fresh.snapshot()
    assert later["groups"] == [] and sum(h["e2e"].n for h in fresh.totals.values()) == 160


def test_merge_adds_counts_and_keeps_quantiles(replayed):
    _, snap, _ = replayed
    m = merge_snapshots([snap, snap])
    assert len(m["agents"]) == 2
    for a, b in zip(snap["groups"], m["groups"]):
        assert b["requests"] == 2 * a["requests"] and b["rate_per_s"] == pytest.approx(2 * a["rate_per_s"])
        qa = quantile_ns({int(i): c for i, c in a["hists"]["e2e"]["counts"]}, 0.99)
        qb = quantile_ns({int(i): c for i, c in b["hists"]["e2e"]["counts"]}, 0.99)
        assert qa == pytest.approx(qb)
    with pytest.raises(ValueError):
        merge_snapshots([dict(snap, edges_ns=EDGES_NS[:-1])])


def _same_but_agents(saved: Path, snap: dict) -> None:
    if os.environ.get("PSLAT_UPDATE_GOLDEN") == "1":
        saved.write_text(json.dumps(snap))
    strip = lambda s: {k: v for k, v in s.items() if k != "agents"}
    assert strip(json.loads(saved.read_text())) == strip(json.loads(json.dumps(snap)))


def test_saved_snapshot_is_what_the_replay_gives(replayed):
    """tests/data/live/psbench.snapshot.json (the top golden files' input) is current."""
    _same_but_agents(SNAPSHOT, replayed[1])


def test_saved_netstack_snapshot_is_what_the_replay_gives(tmp_path):
    """tests/data/live/netstack.snapshot.json (top's golden screens with the host/network split)
    is what the recording with every probe (tests/data/agent/netstack.rec.gz) gives."""
    live = LiveAggregates(agent="recorded")
    replay(DATA / "agent" / "netstack.rec.gz", tmp_path, live=live)
    snap = live.snapshot()
    client = [g for g in snap["groups"] if g["role"] == "client"]
    assert client and all("network_and_remote" in g["hists"] and "unsplit" not in g["hists"] for g in client)
    _same_but_agents(DATA / "live" / "netstack.snapshot.json", snap)


def _row(**kw):
    base = dict.fromkeys(["ts_framework_ns", "ts_send_first_enter_ns", "ts_xmit_last_ns", "ts_txdone_last_ns",
                          "ts_nic_rx_last_ns", "ts_netif_rx_last_ns", "ts_data_ready_ns",
                          "ts_recv_last_exit_ns"])
    return {**base, **kw}


def test_veth_nic_times_fold_into_network_and_remote():
    q = _row(ts_framework_ns=0, ts_send_first_enter_ns=10, ts_xmit_last_ns=30, runq_wait_ns=None)
    p = _row(ts_netif_rx_last_ns=130, ts_data_ready_ns=140, ts_recv_last_exit_ns=170, ts_framework_ns=175,
             runq_wait_ns=12, busy_wait_ns=18)
    comps, e2e = components_of("client", q, p)
    assert e2e == 175
    assert {k: comps[k] for k in ("client_user_tx", "client_kernel_tx", "network_and_remote",
                                  "client_kernel_rx", "client_user_rx")} == \
        {"client_user_tx": 10, "client_kernel_tx": 20, "network_and_remote": 100, "client_kernel_rx": 40,
         "client_user_rx": 5}
    assert comps["client_sock_wait"] == 30 and comps["client_stack_rx"] == 10 and comps["client_busy_wait"] == 18


def test_a_missing_host_stage_is_unsplit_and_negative_kept():
    q = _row(ts_send_first_enter_ns=100, ts_xmit_last_ns=None)
    p = _row(ts_netif_rx_last_ns=None, ts_recv_last_exit_ns=90)
    comps, e2e = components_of("client", q, p)
    assert comps == {"unsplit": -10} and e2e == -10     # a clock error stays visible
    s_comps, s_e2e = components_of("server", _row(ts_netif_rx_last_ns=5, ts_recv_last_exit_ns=9),
                                   _row(ts_send_first_enter_ns=20, ts_xmit_last_ns=26))
    assert s_comps == {"server_kernel_rx": 4, "server_user": 11, "server_kernel_tx": 6} and s_e2e == 21
