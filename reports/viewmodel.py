"""Everything the HTML and terminal reports show, pre-aggregated into one JSON-able dict.

    model = build_model(d, run_dirs)      # d: reports.dissect.Dissection

No row per request survives: components become mean contributions (which add
up to the mean end-to-end exactly, as the components of each request do),
quantile sketches for the CDFs, time bins, in-flight buckets and rank curves,
so the report's size does not grow with the number of requests.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from reports import components as C
from reports.concurrency import concurrency
from reports.connmgmt import connection_management
from reports.extra import RunContext, request_times_ref
from reports.skew import key_skew
from reports.summary import Columns, summary
from reports.unrecognised import unrecognised

# quantiles of the CDFs: every percent, then the tail
CDF_Q = np.concatenate([np.linspace(0, 0.99, 100), [0.995, 0.999, 0.9999, 1.0]])
TIME_BINS = 60
MAX_HOSTS = 48          # per-host bars beyond this: the hosts with the most requests
GROUP_ORDER = ["host", "nic", "wire", C.NETWORK_AND_REMOTE, C.UNSPLIT]


def _contrib_us(cols: Columns, names: list[str]) -> dict[str, float]:
    """Mean contribution of each column to the mean e2e (null counts as 0), us."""
    n = len(cols)
    out = {}
    for c in names:
        v = cols(c)
        nan = np.isnan(v)
        if not nan.all():
            out[c] = float(np.where(nan, 0.0, v).sum()) / n / 1e3
    return out


def _q_us(v: np.ndarray, qs) -> list[float | None]:
    return [float(x) / 1e3 for x in np.percentile(v, qs)] if len(v) else [None] * len(qs)


def _groups_of(keys: pd.Series | np.ndarray, sort: bool = True) -> dict[Any, np.ndarray]:
    """Positions of each key's rows (ascending), null keys left out: a groupby's groups
    without copying the table once per group."""
    v = keys.to_numpy() if isinstance(keys, pd.Series) else np.asarray(keys)
    # a placeholder Series: one of the text keys would be converted to pandas' str dtype first
    return pd.Series(np.zeros(len(v), np.int8)).groupby(v, sort=sort, dropna=True).indices


def _hosts_part(cols: Columns, col: str) -> dict[str, Any]:
    keys = cols.df[col] if cols.rows is None else cols.df[col].iloc[cols.rows]
    counts = keys.value_counts()
    keep = list(counts.index[:MAX_HOSTS])
    out: dict[str, Any] = {"hosts": {}, "left_out": int(max(0, len(counts) - MAX_HOSTS))}
    by_text = _groups_of(keys.astype(str))
    for h in sorted(map(str, keep)):
        g = cols.sub(by_text[h])
        p50, p99 = _q_us(g.present("e2e"), [50, 99])
        out["hosts"][h] = {"count": len(g), "e2e_p50_us": p50, "e2e_p99_us": p99,
                           "groups_us": _contrib_us(g, [f"group_{x}" for x in GROUP_ORDER]),
                           "components_us": _contrib_us(g, C.COMPONENTS)}
    return out


def _by_op(done: pd.DataFrame) -> list[tuple[str, Columns]]:
    """(op, its rows) in op order."""
    groups = _groups_of(done["op"])
    return [(str(op), Columns(done, groups[op])) for op in sorted(groups)]


def unnamed_ops(done: pd.DataFrame) -> dict[str, Any]:
    """Per protocol, the requests whose operation's name was not seen, and their ops (every
    registered protocol names its requests where their bytes were seen: ps-lite by command,
    brpc by command or method, gRPC by method)."""
    counts, ops = {}, {}
    if len(done) and "op_name" in done:
        unnamed = done["op_name"].isna().to_numpy()
        for proto, rows in _groups_of(done["protocol"].astype(str)).items():
            n = int(unnamed[rows].sum())
            if n:
                counts[proto] = (n, len(rows))
                ops[proto] = sorted(set(done["op"].iloc[rows][unnamed[rows]].astype(str)))
    return {"unnamed_ops": counts, "unnamed_ops_ops": ops}


def breakdown(done: pd.DataFrame) -> dict[str, Any]:
    out = {}
    for op, g in _by_op(done):
        e2e = g.present("e2e")
        p50, p99 = _q_us(e2e, [50, 99])
        out[op] = {"count": len(g), "e2e_mean_us": float(e2e.mean()) / 1e3 if len(e2e) else None,
                   "e2e_p50_us": p50, "e2e_p99_us": p99,
                   "groups_us": _contrib_us(g, [f"group_{x}" for x in GROUP_ORDER]),
                   "components_us": _contrib_us(g, C.COMPONENTS),
                   "subcomponents_us": _contrib_us(g, C.SUBS),
                   "by_server": _hosts_part(g, "server_host"), "by_worker": _hosts_part(g, "worker_host")}
    return out


def cdfs(done: pd.DataFrame) -> dict[str, Any]:
    out = {}
    for op, g in _by_op(done):
        per = {}
        for c in ["e2e"] + C.COMPONENTS + C.SUBS:
            v = g.present(c)
            if len(v):
                # sorted first: the same quantiles, 2x faster than selecting 104 of them
                per[c] = {"n": int(len(v)), "negative": int((v < 0).sum()),
                          "us": [round(x, 3) for x in _q_us(np.sort(v), CDF_Q * 100)]}
        out[op] = {"q": [round(float(q), 6) for q in CDF_Q], "series": per}
    return out


def over_time(done: pd.DataFrame, start_ref: np.ndarray, t0_ref_ns: int | None = None) -> dict[str, Any]:
    """Per time bin of the whole run (from t0_ref_ns, the run's start, when given)."""
    if len(done) == 0:
        return {}
    t0 = int(start_ref.min()) if t0_ref_ns is None else min(int(t0_ref_ns), int(start_ref.min()))
    t1 = int(start_ref.max())
    edges = np.linspace(t0, max(t1, t0 + 1), TIME_BINS + 1)
    b = np.clip(np.searchsorted(edges, start_ref, side="right") - 1, 0, TIME_BINS - 1)
    out: dict[str, Any] = {"t_s": [round(float((e - t0) / 1e9), 4) for e in (edges[:-1] + edges[1:]) / 2],
                           "t0_ref_ns": t0, "ops": {}}
    ops = done["op"].astype(str).to_numpy()
    e2e_all = done["e2e"].to_numpy(dtype=np.float64, na_value=np.nan)
    groups = {g: done[f"group_{g}"].to_numpy(dtype=np.float64, na_value=np.nan) for g in GROUP_ORDER}
    for op, m in _groups_of(ops).items():
        count = np.bincount(b[m], minlength=TIME_BINS)
        rec: dict[str, Any] = {"count": count.tolist(), "groups_us": {}, "e2e_p50_us": [], "e2e_p99_us": []}
        for g, v in groups.items():
            if np.isnan(v[m]).all():
                continue
            s = np.bincount(b[m], weights=np.nan_to_num(v[m]), minlength=TIME_BINS)
            rec["groups_us"][g] = [round(float(x) / 1e3, 3) if k else None for x, k in zip(s / np.maximum(count, 1), count)]
        # the op's e2e by bin: one stable sort, then a slice per bin (percentiles ignore the order)
        order = np.argsort(b[m], kind="stable")
        e2e_sorted, bounds = e2e_all[m][order], np.concatenate([[0], np.cumsum(count)])
        for k in range(TIME_BINS):
            v = e2e_sorted[bounds[k]:bounds[k + 1]]
            v = v[~np.isnan(v)]
            p50, p99 = _q_us(v, [50, 99])
            rec["e2e_p50_us"].append(p50)
            rec["e2e_p99_us"].append(p99)
        out["ops"][op] = rec
    return out


def warmup_excess(done: pd.DataFrame, start_ref: np.ndarray, t0_ref_ns: int | None,
                  end_s: float | None) -> dict[str, float]:
    """Per component, how much more it took per request in the warm-up than after it (mean
    contribution, us; the largest first): what the start-up's extra time was spent on."""
    if end_s is None or t0_ref_ns is None or len(done) == 0:
        return {}
    inside = (start_ref - t0_ref_ns) / 1e9 < end_s
    if inside.all() or not inside.any():
        return {}
    cols = Columns(done)
    a = _contrib_us(cols.sub(np.flatnonzero(inside)), C.COMPONENTS + C.SUBS)
    b = _contrib_us(cols.sub(np.flatnonzero(~inside)), C.COMPONENTS + C.SUBS)
    out = {c: a[c] - b.get(c, 0.0) for c in a}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def clocks(d, ctx: RunContext, done: pd.DataFrame) -> list[dict[str, Any]]:
    """Per host pair: the model and what its uncertainty means for the wire split."""
    rows = []
    wire = {}
    wire_req = done["wire_req"].to_numpy(dtype=np.float64, na_value=np.nan)
    for (w, s), idx in done.groupby(["worker_host", "server_host"], sort=False, observed=True).indices.items():
        v = wire_req[idx]
        v = v[~np.isnan(v)]
        wire[tuple(sorted((str(w), str(s))))] = v.mean() / 1e3 if len(v) else None
    for (a, b), m in sorted(d.clocks.items()):
        j = m.to_json()
        unc = j["uncertainty_us"]
        wr = wire.get((a, b))
        if m.source == "shared":
            meaning = "one clock: the wire split between directions is exact"
        elif m.source == "none":
            meaning = "no clock relation: these hosts' requests keep their server side as network_and_remote"
        else:
            meaning = (f"wire_req and wire_resp are each known within +-{unc:,.1f} us (their sum, the round "
                       "trip on the wire, is exact)")
            if wr:
                meaning += f"; mean wire_req here is {wr:,.1f} us"
        rows.append({"pair": m.key, "a": a, "b": b, **j, "meaning": meaning, "note": m.note,
                     "wire_req_mean_us": wr})
    return rows


def processes(ctx: RunContext) -> list[dict[str, Any]]:
    """The traced processes: host, pid, thread names and counts (from the messages rows)."""
    t = ctx.arrow("messages", ["host_id", "pid", "tid", "comm"])
    if len(t) == 0:
        return []
    df = t.group_by(["host_id", "pid", "tid", "comm"]).aggregate([]).to_pandas()
    out = []
    for (h, pid), g in df.groupby(["host_id", "pid"], sort=True, dropna=False):
        comms = sorted(set(str(c) for c in g["comm"].dropna()))
        out.append({"host": str(h), "pid": None if pd.isna(pid) else int(pid), "threads": int(g["tid"].nunique()),
                    "comms": comms})
    return out


def health(ctx: RunContext, d) -> list[dict[str, Any]]:
    rows = []
    for host in d.hosts:
        meta = ctx.metas.get(host, {})
        c = meta.get("counters") or {}
        probes = {}
        for p, v in (c.get("probes") or {}).items():
            if isinstance(v, dict):
                probes[p] = {"seen": int(v.get("seen", 0) or 0), "lost": int(v.get("lost", 0) or 0)}
        sampling = meta.get("sampling") if isinstance(meta.get("sampling"), dict) else {}
        rows.append({"host": host, "probes": probes, "messages": c.get("messages"),
                     "rows_dropped": int(c.get("rows_dropped") or 0), "consumer_cpu_s": c.get("consumer_cpu_s"),
                     # agent-wide, like the probe counters: decoded, not matched by a SIGTERM's deadline
                     "unsettled_at_stop": int(c.get("correlate_unsettled_at_stop") or 0),
                     "unparsed_bytes": int(c.get("unparsed_bytes") or 0), "lost_bytes": int(c.get("lost_bytes") or 0),
                     "sampling_rate": sampling.get("rate", 1.0) if sampling else 1.0,
                     "closed": bool(meta.get("closed")), "meta": bool(meta),
                     "run_id": meta.get("run_id")})   # one agent's run dirs share it (agent-wide counters)
    return rows


def kernel_bypass(ctx: RunContext) -> list[dict[str, Any]]:
    """Traced processes whose messages went around the kernel's sockets (meta.json's
    kernel_bypass, checked by agent.runmeta; agent/bypass.py), by host."""
    return [dict(e, host=host) for host, meta in sorted(ctx.metas.items())
            for e in meta.get("kernel_bypass") or ()]


def build_model(d, run_dirs: list[Path] | None, sel=None) -> dict[str, Any]:
    """sel: a reports.window.Selection of d (default: its steady state, no filters). The
    views describe its window; the over-time charts show the whole run, the window marked."""
    from reports.findings import findings, run_traffic_gaps
    from reports.runfacts import run_facts
    from reports.window import select

    sel = sel if sel is not None else select(d)
    whole, d = sel.whole, sel.window
    ctx = RunContext.open(run_dirs, d)
    done = d.complete
    whole_done = whole.complete
    start_ref, _ = request_times_ref(whole_done, ctx.timeline) if len(whole_done) else (np.zeros(0, np.int64), None)
    other = unrecognised(d.dirs)
    w = sel.info.warmup
    m: dict[str, Any] = {
        "run": run_facts(sel),
        "window": {**sel.info.to_json(), "run_s": sel.info.run_s, "text": sel.info.describe(),
                   "filters": sel.info.filters, "rule": sel.info.rule,
                   "warmup": {"end_s": w.end_s, "why": w.why, "requests": w.requests,
                              "share_of_requests": w.share_of_requests, "share_of_time": w.share_of_time,
                              "mean_us": w.mean_us, "steady_mean_us": w.steady_mean_us,
                              "cut": sel.info.warmup_cut,
                              "excess_us": warmup_excess(whole_done, start_ref, sel.t0_ref_ns, w.end_s)}},
        # the pairing counts are the run's (from dissection); the window's own count beside them
        "summary": {**summary(d, other), "windowed": {"requests": int(len(d.requests))}},
        "unrecognised": other,
        "hosts": list(d.hosts),
        "timeline": {"ref": ctx.timeline.ref, "unaligned": ctx.timeline.unaligned},
        **unnamed_ops(done),
        "breakdown": breakdown(done),
        "cdf": cdfs(done),
        "over_time": over_time(whole_done, start_ref, sel.t0_ref_ns),
        "concurrency": concurrency(d, ctx.timeline),
        "connections": connection_management(d, ctx),
        "skew": key_skew(ctx),
        "clocks": clocks(d, ctx, done),
        "health": health(ctx, d),
        "processes": processes(ctx),
        "traffic_gaps": run_traffic_gaps(ctx),
        "kernel_bypass": kernel_bypass(ctx),
        "sampling_rate": d.sampling_rate,
        "started_realtime_ns": min((int(v["started_realtime_ns"]) for v in ctx.metas.values()
                                    if isinstance(v.get("started_realtime_ns"), int)), default=None),
    }
    m["findings"] = findings(m)
    return m
