"""`pslat report` against the virtual cluster's truth (issue 4, "Accuracy").

psbench (2 servers x 4 workers) runs in the cluster, one `pslat agent` traces
every host, and the report's per-request figures are compared, request by
request (means over constant delays would not catch a wrong pairing), with:
- the wire forwarder's log of the request's (response's) last segment;
- psbench's server log (receive -> reply) and worker log (issued -> completed),
  each an interval: psbench brackets every zmq boundary with a stamp before
  and after its calls (a single stamp can be milliseconds off on a loaded
  2-vCPU machine: its thread waits for a CPU or the GIL next to the call);
- the clock: the namespaces share one kernel clock, so the truth is 0. The
  agent writes one server's times off a clock 5 ms ahead drifting 50 ppm
  (`--test-clock-skew`, its meta.json marked `clock.injected`): the report
  must recover that from the traffic. The test takes the skew back out of a
  copy of the run dirs (it knows it exactly) for the checks against the
  truth, and checks the traffic-only estimate (force_estimate) on that copy
  too, where the true offset is 0.

Each test prints its measured errors (p50/p99) for the note. They need the
agent's kernel stage times (driver handoff, netif_receive): where the agent
gives none, they xfail and say so.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_agent_cluster import Agent  # noqa: E402  (the agent as a child process, ready on its signal)

from reports.clocks import matched_segments  # noqa: E402
from reports.dissect import dissect  # noqa: E402
from workloads.cluster.cluster import Cluster  # noqa: E402
from workloads.psbench.launch import launch_in_cluster  # noqa: E402

pytestmark = pytest.mark.privileged

WAIT_S = 300
HOSTS = 6                     # h0, h1: servers (h0 also the scheduler); h2..h5: workers
SERVERS, WORKERS = ["h0", "h1"], ["h2", "h3", "h4", "h5"]
SMALL = dict(keys_per_request=4, embedding_dim=2, lens=False)             # one segment each way
LARGE = dict(keys_per_request=1024, embedding_dim=16)                    # ~78 KB: 50+ segments
INJECT = ("h1", 5_000_000, 50.0)   # host, offset ns, drift ppm (the agent's --test-clock-skew)


def _run(out: Path, delay_ms: float = 0.0, jitter_ms: float = 0.0, pair_delay_ms=None, duration_s: float = 3.0,
         **workload):
    """One traced psbench job, one server's clock skewed by the agent; returns
    (agent out dir, truth, wire log)."""
    host, off_ns, ppm = INJECT
    with Cluster(HOSTS, wire_delay_ms=delay_ms, jitter_ms=jitter_ms, pair_delay_ms=pair_delay_ms,
                 wait_s=WAIT_S, log_dir=out / "wire") as cluster:
        agent = Agent(out / "agent", [h.name for h in cluster.hosts],
                      # every host pair: accuracy is checked on every request, not a sample
                      extra=("--test-clock-skew", f"{host}:{off_ns / 1e3:g}:{ppm:g}", "--sample-rate", "1"))
        try:
            with launch_in_cluster(cluster, out / "ps", servers=2, workers=4, duration_s=duration_s, rate=40,
                                   **workload) as job:
                job.wait_ready()
                job.wait()
            (out / "agent.log").write_text(agent.stop())
        finally:
            agent.kill()
        truth, wire = job.truth(), cluster.wire_log()
        stats = cluster.forwarder_stats()
    # shown with a failure: a realtime step the forwarder's stamps had to ride over
    print(f"\nforwarder: {stats.get('clock_steps')} realtime clock steps (largest "
          f"{stats.get('clock_step_max_ns', 0) / 1e3:.0f} us), {stats.get('stamps_after_receive')} stamps after "
          f"their receive, latest send {stats.get('late_max_ns', 0) / 1e3:.0f} us")
    return out / "agent", truth, wire


def _truth(truth: pd.DataFrame) -> pd.DataFrame:
    """psbench's slices with its end-to-end and server times, each as the interval its
    bracketing stamps allow (the zmq calls lie between a before and an after stamp:
    a thread waiting for a CPU around a call widens the interval, it does not move it)
    and as its single stamps' difference (`*_true`, the same as psbench's summary)."""
    w = truth[truth.role == "worker"][["sender", "recver", "timestamp", "op", "t_issued_ns", "t_completed_ns",
                                       "t_issued_after_ns", "t_completed_before_ns"]]
    s = truth[truth.role == "server"][["sender", "recver", "timestamp", "t_received_ns", "t_replied_ns",
                                       "t_received_before_ns", "t_replied_after_ns"]]
    t = w.merge(s, on=["sender", "recver", "timestamp"])
    t = t[t.t_completed_ns.notna()]
    t["e2e_true"] = t.t_completed_ns - t.t_issued_ns
    t["e2e_lo"] = t.t_completed_before_ns - t.t_issued_after_ns
    t["e2e_hi"] = t.e2e_true
    t["server_true"] = t.t_replied_ns - t.t_received_ns
    t["server_lo"] = t.server_true
    t["server_hi"] = t.t_replied_after_ns - t.t_received_before_ns
    return t


def _segments(wire: pd.DataFrame) -> pd.DataFrame:
    """Data frames that got through, with their payload's place in their flow's byte
    stream (seq relative to the flow's first frame: a stream may wrap 2^32)."""
    f = wire[(wire.payload_bytes > 0) & ~wire.dropped].sort_values("t_in_mono_ns").copy()
    f["base"] = f.groupby(["sport", "dport"]).seq.transform("first")
    f["rel"] = (f.seq - f.base) % 2**32
    f["rel_end"] = f.rel + f.payload_bytes
    # a segment sent twice (a tail-loss probe or an RTO under load: the ACK was late)
    # with both copies through the wire: the receiver took the first, dropped the other
    return f.drop_duplicates(["sport", "dport", "rel"], keep="first")


def _covering(ends: pd.DataFrame, seg: pd.DataFrame, kind: str) -> pd.DataFrame:
    """For each message end (its flow and seq_end), the frame that carried its last byte:
    libzmq batches messages into one send, so a message may end inside a segment."""
    base = seg.drop_duplicates(["sport", "dport"])[["sport", "dport", "base"]]
    e = ends.merge(base, left_on=[f"{kind}_sport", f"{kind}_dport"], right_on=["sport", "dport"])
    e["byte"] = ((e[f"{kind}_seq_end"] - 1 - e.base) % 2**32).astype("float64")
    s = seg.astype({"rel": "float64"}).sort_values("rel")
    m = pd.merge_asof(e.sort_values("byte"), s[["sport", "dport", "rel", "rel_end", "delay_actual_ns",
                                                "delay_applied_ns"]],
                      left_on="byte", right_on="rel", by=["sport", "dport"], direction="backward")
    m = m[m.byte < m.rel_end]
    return m[["_row", "delay_actual_ns", "delay_applied_ns"]].rename(
        columns={"delay_actual_ns": f"{kind}_wire_actual", "delay_applied_ns": f"{kind}_wire_applied"})


def _joined(d, truth, wire):
    q = d.complete.astype({"worker": "int64", "server": "int64", "call_id": "int64"})
    j = q.merge(_truth(truth), left_on=["worker", "server", "call_id"],
                right_on=["sender", "recver", "timestamp"], suffixes=("", "_true"), validate="one_to_one")
    j["_row"] = np.arange(len(j))
    seg = _segments(wire)
    for kind in ("req", "resp"):
        ends = j[["_row", f"{kind}_sport", f"{kind}_dport", f"{kind}_seq_end"]].dropna().astype("int64")
        j = j.merge(_covering(ends, seg, kind), on="_row", how="left", validate="one_to_one")
    return j.drop(columns="_row")


def _require_stage_times(d):
    done = d.complete
    if len(done) == 0 or done["wire_req"].notna().mean() < 0.5:
        pytest.xfail("the agent gave no kernel stage times (driver handoff / netif_receive) for most "
                     "messages, so the wire cannot be measured: " + "; ".join(d.notes[-3:]))


def _err(a, b):
    return (a.astype("float64") - b.astype("float64")).abs()


def _outside(x, lo, hi):
    """How far x lies outside [lo, hi] (0 inside)."""
    x, lo, hi = (v.astype("float64") for v in (x, lo, hi))
    return np.maximum(np.maximum(lo - x, x - hi), 0.0)


def _pct(x):
    return f"p50 {np.nanpercentile(x, 50) / 1e3:.1f} us, p99 {np.nanpercentile(x, 99) / 1e3:.1f} us"


def _within(err, truth_ns, frac, floor_ns) -> bool:
    """Issue 4's bound, per request: |error| <= max(frac * truth, floor) for 99% of requests."""
    return bool((err <= np.maximum(frac * truth_ns.astype("float64"), floor_ns)).mean() >= 0.99)


# Requests whose wire time could not be measured (a kernel stage time missing on one
# end). Known gap of the agent (issues 3/4, open): the checks of accuracy on the
# measured requests run and can fail; a coverage below 99% then ends the test as an
# expected failure that says by how much, instead of hiding it.
COVERAGE_GAPS: list[str] = []

# With large requests the per-message times alone gave no unbiased sample from worker
# to server (a 1024-key pull request is 6 segments, and the last segment of a burst
# through the wire's FIFO jitter is delayed by its burst: 50-110 us above the wire's
# minimum, the offset 43-86 us off). The agents' clock_samples (each burst's first
# segment at both ends) give them; the 50 us bound holds for every case.
def _offset_within_50us(name: str, key: str, err_ns: float) -> None:
    assert abs(err_ns) <= 50_000, f"{name} {key}: offset error {err_ns / 1e3:.1f} us (issue: <= 50 us)"


def _xfail_on_coverage_gaps() -> None:
    gaps, COVERAGE_GAPS[:] = list(COVERAGE_GAPS), []
    if gaps:
        pytest.xfail("accuracy held on the measured requests, but wire times are missing for "
                     "more than 1%: " + "; ".join(gaps))


def _check(name: str, d, truth, wire, delay_ns: dict[str, float]) -> dict:
    """Issue 4's per-request bounds; returns the measured errors (also printed)."""
    j = _joined(d, truth, wire)
    t = _truth(truth)
    figures = {}
    # every slice psbench completed is a paired request, none invented
    assert len(j) == len(d.complete) and len(j) >= 0.99 * len(t), f"{len(j)} of {len(t)} slices paired"
    _require_stage_times(d)
    for kind, col in (("req", "wire_req"), ("resp", "wire_resp")):
        have = j[col].notna() & j[f"{kind}_wire_actual"].notna()
        if have.mean() < 0.99:   # the accuracy of what was measured is still checked below
            COVERAGE_GAPS.append(f"{name} {col}: {have.sum()} of {len(j)} requests measured")
        e = _err(j[have][col], j[have][f"{kind}_wire_actual"])
        figures[col] = _pct(e)
        assert np.percentile(e, 99) <= max(0.10 * delay_ns[kind], 100_000), \
            f"{name} {col}: |report - forwarder's log| {_pct(e)}"
    # psbench's server stamps receive and reply next to its zmq calls: the interval
    # between the framework hand-over and the framework call, which the report
    # gives as server_app. server_user (DESIGN.md: recv exit -> first send entry)
    # adds libzmq's own hand-offs between its I/O thread and the app thread
    # (server_framework_rx/tx), which psbench cannot see: they are checked to
    # add up, and their size is printed for the note.
    e = _outside(j["server_app"], j["server_lo"], j["server_hi"])
    figures["server_app"] = _pct(e)
    figures["server_app vs single stamps"] = _pct(_err(j["server_app"], j["server_true"]))
    figures["server_user vs single stamps"] = _pct(_err(j["server_user"], j["server_true"]))
    assert _within(e, j["server_true"], 0.10, 100_000), f"server_app {_pct(e)}"
    parts = j[["server_framework_rx", "server_app", "server_framework_tx"]]
    whole = parts.notna().all(axis=1)
    assert whole.mean() >= 0.99, f"{whole.sum()} of {len(j)} requests with both server framework times"
    assert (parts[whole].sum(axis=1) == j[whole].server_user).all()
    figures["server_framework_rx+tx"] = _pct(j[whole].server_framework_rx + j[whole].server_framework_tx)
    fw = (j.e2e_from == "framework") & (j.e2e_to == "framework")
    assert fw.mean() >= 0.99, f"only {fw.sum()} of {len(j)} requests have both framework times"
    e = _outside(j[fw]["e2e"], j[fw]["e2e_lo"], j[fw]["e2e_hi"])
    figures["e2e"] = _pct(e)
    figures["e2e vs single stamps"] = _pct(_err(j[fw]["e2e"], j[fw]["e2e_true"]))
    assert _within(e, j[fw]["e2e_true"], 0.05, 200_000), f"e2e {_pct(e)}"
    print(f"\n{name}: " + "; ".join(f"{k} {v}" for k, v in figures.items()))
    return figures


def _check_estimated_clocks(name, out: Path, exact, symmetric: bool):
    """The traffic-only estimate on a shared clock: the truth is offset 0, and `exact` (the
    report with the shared clock) gives every request's true wire split."""
    d = dissect([out], force_estimate=True)
    models = [m for m in d.clocks.values() if m.usable and m.samples >= 100]
    assert models
    for m in models:
        assert abs(m.offset_ns) <= m.uncertainty_ns, m.to_json()
        if symmetric:
            _offset_within_50us(name, m.key, m.offset_ns)
    ids = ["worker", "server", "call_id", "call_space"]
    j = d.complete.merge(exact.complete, on=ids, suffixes=("", "_exact"), validate="one_to_one")
    unc = j.apply(lambda r: d.clocks[tuple(sorted((r.worker_host, r.server_host)))].uncertainty_ns, axis=1)
    have = j[["wire_req", "wire_resp", "wire_req_exact", "wire_resp_exact"]].notna().all(axis=1)
    assert have.mean() >= 0.99, f"{have.sum()} of {len(j)} requests with a wire split"
    split = _err(j[have].wire_req, j[have].wire_req_exact)
    assert (split <= unc[have] + 1).all(), "a request's wire split error beyond the stated uncertainty"
    rt = _err(j[have].wire_req.astype("float64") + j[have].wire_resp.astype("float64"),
              j[have].wire_req_exact.astype("float64") + j[have].wire_resp_exact.astype("float64"))
    print(f"\n{name}, clocks from the traffic: |offset| max {max(abs(m.offset_ns) for m in models) / 1e3:.1f} us, "
          f"stated uncertainty {min(m.uncertainty_ns for m in models) / 1e3:.0f}.."
          f"{max(m.uncertainty_ns for m in models) / 1e3:.0f} us; wire split error {_pct(split)}; "
          f"round trip error {_pct(rt)}")
    # the issue: wire_req + wire_resp within the wire bound of the truth (the offset cancels
    # out; what is left is the estimated drift over the server's part of the request)
    exact_rt = (j[have].wire_req_exact.astype("float64") + j[have].wire_resp_exact.astype("float64")).abs()
    assert (rt <= np.maximum(0.10 * exact_rt, 100_000)).mean() >= 0.99, f"round trip error {_pct(rt)}"


def _check_clock_samples(name: str, out: Path, wire: pd.DataFrame, large: bool) -> None:
    """The agents' clock samples (each large message's first segment at both ends, paired
    by the report) against the wire's log of the same frame: the handoff before the wire
    took it, the arrival after the wire let it go; and per direction, the smallest one-way
    delay close to the wire's smallest (what keeps the offset unbiased: the per-message
    samples of large requests were 50-110 us above it). Single-segment messages get almost
    none (their own times are the samples): libzmq batches the messages that queued up
    while it sent into one segment, which can pass the size a sample needs (1 of ~1,900
    messages once)."""
    m = matched_segments([(p.name, p) for p in sorted(out.iterdir()) if p.is_dir()])
    if not large:
        assert len(m) <= 10, f"{len(m)} clock samples from single-segment messages"
        return
    w = wire[(wire.payload_bytes > 0) & ~wire.dropped].sort_values("t_in_mono_ns")
    w = w.drop_duplicates(["ip_src", "sport", "ip_dst", "dport", "seq"])   # a re-sent frame: its first copy
    j = m.astype({"src_port": "int64", "dst_port": "int64", "seq": "int64"}).merge(
        w, left_on=["src_ip", "src_port", "dst_ip", "dst_port", "seq"],
        right_on=["ip_src", "sport", "ip_dst", "dport", "seq"], validate="one_to_one")
    assert len(j) >= 0.99 * len(m) and len(j) >= 100, f"{len(j)} of {len(m)} clock samples found on the wire"
    # the wire's receive can follow a send by under 1 us here: the wire's time in must be exact
    lead_ns, lag_ns = (j.t_in_mono_ns - j.t_out).min(), (j.t_in - j.t_out_mono_ns).min()
    print(f"\n{name}: smallest lead of a send on the wire's receive {lead_ns / 1e3:.2f} us, "
          f"of a receive on the wire's send {lag_ns / 1e3:.2f} us")
    assert lead_ns >= 0 and lag_ns >= 0, f"a clock sample not causal: lead {lead_ns} ns, lag {lag_ns} ns"
    j["owd"], j["wire"] = j.t_in - j.t_out, j.t_out_mono_ns - j.t_in_mono_ns
    g = j.groupby(["tx_host", "rx_host"]).agg(owd=("owd", "min"), wire=("wire", "min"))
    excess = g.owd - g.wire
    print(f"\n{name}: {len(m)} clock samples paired; smallest one-way delay over the wire's smallest, per "
          f"direction: p50 {excess.median() / 1e3:.1f} us, max {excess.max() / 1e3:.1f} us")
    assert (excess <= 50_000).all(), excess.sort_values().tail()


def _unskewed(out: Path) -> Path:
    """A copy of the agent's run dirs with the injected clock error taken back
    out: every host on the one shared kernel clock again, as the truth is."""
    copy = out.parent / "unskewed"
    shutil.copytree(out, copy)
    d = copy / INJECT[0]
    meta = json.loads((d / "meta.json").read_text())
    inj = meta["clock"].pop("injected")
    k = inj["drift_ppm"] * 1e-6
    for table in ("messages", "connections", "clock_samples"):
        for shard in sorted(d.glob(f"{table}-*.parquet")):
            tbl = pq.read_table(shard)
            for i, name in enumerate(tbl.schema.names):
                if name.startswith("ts_") and name.endswith("_ns"):
                    v = tbl.column(name).to_pandas().astype("Float64")
                    true = ((v - inj["offset_ns"] + inj["t0_ns"] * k) / (1 + k)).round().astype("Int64")
                    tbl = tbl.set_column(i, name, pa.array(true, type=pa.int64()))
            pq.write_table(tbl, shard)
    (d / "meta.json").write_text(json.dumps(meta))
    return copy


@pytest.mark.parametrize("delay_ms, workload", [
    pytest.param(0.0, dict(SMALL), id="wire0-small"),
    pytest.param(1.0, dict(LARGE, reconnect_every=10), id="wire1-large-reconnect10"),
    # 8 s: with +-1 ms of jitter, 3 s of traffic (~110 samples each way per pair) tell the
    # injected 50 ppm only to +-33..55 ppm; taken as 0, it moved the offset up to 67 us
    pytest.param(5.0, dict(SMALL, server_delay_ms=2.0, server_jitter_ms=0.4, duration_s=8.0),
                 id="wire5-small-server2ms"),
])
def test_components_per_request_match_the_truth(tmp_path, delay_ms, workload):
    COVERAGE_GAPS.clear()
    skewed, truth, wire = _run(tmp_path, delay_ms=delay_ms, jitter_ms=0.2 * delay_ms, **workload)
    out = _unskewed(skewed)
    d = dissect([out])
    assert {m.source for m in d.clocks.values()} == {"shared"}
    _check(f"wire {delay_ms} ms {workload}", d, truth, wire, {"req": delay_ms * 1e6, "resp": delay_ms * 1e6})
    large = workload["keys_per_request"] > SMALL["keys_per_request"]
    _check_clock_samples(f"wire {delay_ms} ms", out, wire, large)
    _check_estimated_clocks(f"wire {delay_ms} ms", out, d, symmetric=True)
    _check_injected(f"wire {delay_ms} ms", skewed, symmetric=True)
    _xfail_on_coverage_gaps()


def test_asymmetric_wire_and_injected_clock(tmp_path):
    """1 ms worker -> server, 5 ms back: the split's error is covered by the stated uncertainty,
    with the clocks estimated from the traffic and with an offset and drift injected."""
    COVERAGE_GAPS.clear()
    pairs = {}
    for w in WORKERS:
        for s in SERVERS:
            pairs[(w, s)], pairs[(s, w)] = 1.0, 5.0
    skewed, truth, wire = _run(tmp_path, jitter_ms=0.2, pair_delay_ms=pairs, **SMALL)
    out = _unskewed(skewed)
    exact = dissect([out])
    _check("asymmetric 1/5 ms", exact, truth, wire, {"req": 1e6, "resp": 5e6})
    _check_clock_samples("asymmetric 1/5 ms", out, wire, large=False)
    _check_estimated_clocks("asymmetric 1/5 ms", out, exact, symmetric=False)
    _check_injected("asymmetric 1/5 ms", skewed, symmetric=False)
    _xfail_on_coverage_gaps()


def _check_injected(name: str, out: Path, symmetric: bool) -> None:
    """5 ms + 50 ppm put on one server's times by the agent: recovered within the stated
    uncertainty (and within 50 us with symmetric delays), the drift where the run tells it."""
    host, off, ppm = INJECT
    d = dissect([out])
    t0 = json.loads((out / host / "meta.json").read_text())["clock"]["injected"]["t0_ns"]
    checked = 0
    for m in d.clocks.values():
        if host not in (m.a, m.b) or m.samples < 100:
            continue
        assert m.source == "estimated"
        # injected: t_host' = t + off + (t - t0) ppm; the pair's offset is t_A - t_B at B's time ref_ns
        if m.a == host:
            true, true_ppm = off + (m.ref_ns - t0) * ppm * 1e-6, ppm
        else:
            true, true_ppm = -(off + (m.ref_ns - off - t0) * ppm * 1e-6), -ppm
        err = m.offset_ns - true
        assert abs(err) <= m.uncertainty_ns, (m.to_json(), true)
        if symmetric:
            _offset_within_50us(name + " injected", m.key, err)
        if m.drift_se is not None:   # the drift was measured (else the note says why not)
            # 4 standard errors: the fit's samples are not independent (a pair's clock
            # samples come in bursts), so its se is low; a fresh-clone run of the asymmetric
            # case was 3.1 se off (82.0 ppm for 50, se 10.3, 220 samples)
            assert abs(m.drift * 1e6 - true_ppm) <= max(10, 4 * m.drift_se * 1e6), (m.to_json(), m.drift_se)
        checked += 1
        print(f"\n{name}, injected {off / 1e6:g} ms + {ppm:g} ppm on {host}: {m.key} offset error "
              f"{err / 1e3:.1f} us (stated +-{m.uncertainty_ns / 1e3:.0f} us), drift {m.drift * 1e6:.1f} ppm"
              + (f" (+-{m.drift_se * 1e6:.1f})" if m.drift_se is not None else " (not measured)"))
    assert checked
