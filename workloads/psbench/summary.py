"""What a psbench run achieved, from its own ground truth: throughput and
latency per op, as a dict (for JSON and benches) and as a rich table.

Counted from the workers' rows that completed: a slice is one message to one
server and its response; a whole request is all slices of one (sender,
app_id, customer_id, timestamp), its latency from its first slice's issue to
its last slice's completion. Rates are over the span from the first issue to
the last completion.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
from rich.table import Table

OPS = ("pull", "push")
REQUEST_KEY = ["sender", "app_id", "customer_id", "timestamp"]


def _pcts_us(lat_ns: pd.Series) -> dict:
    a = lat_ns.to_numpy(dtype=np.float64) / 1e3
    if a.size == 0:
        return {"p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"p50": round(float(p50), 1), "p90": round(float(p90), 1), "p99": round(float(p99), 1)}


def summarize(truth) -> dict:
    """`truth`: a ground-truth DataFrame, or a psbench output directory."""
    if not isinstance(truth, pd.DataFrame):
        from workloads.psbench.truth import read_truth
        truth = read_truth(truth)
    w = truth[(truth["role"] == "worker") & truth["t_completed_ns"].notna()]
    unanswered = int(((truth["role"] == "worker") & truth["t_completed_ns"].isna()).sum())
    out = {"workers": int(w["sender"].nunique()), "servers": int(w["recver"].nunique()),
           "unanswered_slices": unanswered, "duration_s": 0.0, "by_op": {}, "total": {}}
    if w.empty:
        return out
    span_s = (int(w["t_completed_ns"].max()) - int(w["t_issued_ns"].min())) / 1e9
    out["duration_s"] = round(span_s, 3)

    def stats(rows: pd.DataFrame) -> dict:
        req = rows.groupby(REQUEST_KEY).agg(t0=("t_issued_ns", "min"), t1=("t_completed_ns", "max"))
        return {"slices": len(rows), "requests": len(req),
                "slices_per_s": round(len(rows) / span_s, 1) if span_s > 0 else None,
                "requests_per_s": round(len(req) / span_s, 1) if span_s > 0 else None,
                "slice_latency_us": _pcts_us(rows["t_completed_ns"] - rows["t_issued_ns"]),
                "request_latency_us": _pcts_us(req["t1"] - req["t0"]),
                "req_bytes_mean": round(float(rows["req_bytes"].mean()), 1),
                "resp_bytes_mean": round(float(rows["resp_bytes"].mean()), 1)}

    for op in OPS:
        rows = w[w["op"] == op]
        if len(rows):
            out["by_op"][op] = stats(rows)
    out["total"] = stats(w)
    return out


def summary_table(summary: dict, title: str = "psbench ground truth") -> Table:
    t = Table(title=f"{title}: {summary['workers']} workers x {summary['servers']} servers, "
                    f"{summary['duration_s']:g} s")
    for col in ("op", "slices/s", "req/s", "p50 us", "p90 us", "p99 us", "req p99 us"):
        t.add_column(col, justify="left" if col == "op" else "right")
    for op, s in [*summary["by_op"].items(), ("all", summary["total"])]:
        if not s:
            continue
        lat = s["slice_latency_us"]
        t.add_row(op, f"{s['slices_per_s']:,.0f}", f"{s['requests_per_s']:,.0f}",
                  *(f"{lat[p]:,.0f}" for p in ("p50", "p90", "p99")),
                  f"{s['request_latency_us']['p99']:,.0f}")
    if summary["unanswered_slices"]:
        t.caption = f"{summary['unanswered_slices']} slices never answered"
    return t
