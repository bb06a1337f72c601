"""The JSON summary of a dissection: a contract (issue 4; README "Report JSON summary").

Every stat object is {"mean", "p50", "p90", "p99"} in microseconds over the
requests that have the value; the statistics describe the requests whose
worker-side end-to-end was measured (Dissection.complete).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from reports import components as C
from reports.dissect import Dissection

STAT_KEYS = ("mean", "p50", "p90", "p99")
CONTRACT_GROUPS = ("host", "nic", "wire")     # always present (null when no request had one)


def stat_us(values_ns) -> dict[str, float] | None:
    """{"mean","p50","p90","p99"} in us of the non-null values; None when there are none."""
    v = pd.Series(values_ns).dropna().to_numpy(dtype=np.float64)
    if len(v) == 0:
        return None
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {k: round(float(x) / 1e3, 3) for k, x in zip(STAT_KEYS, (v.mean(), p50, p90, p99))}


def _present(df: pd.DataFrame, cols: list[str]) -> dict[str, Any]:
    out = {}
    for c in cols:
        s = stat_us(df[c])
        if s is not None:
            out[c] = s
    return out


def _groups(df: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {g: stat_us(df[f"group_{g}"]) for g in CONTRACT_GROUPS}
    for g in C.GROUPS:
        if g not in out and (s := stat_us(df[f"group_{g}"])) is not None:
            out[g] = s
    return out


def _by(df: pd.DataFrame, col: str) -> dict[str, Any]:
    return {str(h): {"count": len(g), "e2e_us": stat_us(g["e2e"]), "groups_us": _groups(g)}
            for h, g in df.groupby(col, sort=True, dropna=True)}


def op_summary(df: pd.DataFrame) -> dict[str, Any]:
    return {
        "count": len(df),
        "e2e_us": stat_us(df["e2e"]),
        "components_us": _present(df, C.COMPONENTS),
        "subcomponents_us": _present(df, C.SUBS),
        "groups_us": _groups(df),
        "by_server": _by(df, "server_host"),
        "by_worker": _by(df, "worker_host"),
        # beyond the contract: how many of `count` requests have each value
        "counts": {c: int(df[c].notna().sum()) for c in C.COMPONENTS + C.SUBS + [f"group_{g}" for g in C.GROUPS]
                   if df[c].notna().any()},
    }


def negatives(df: pd.DataFrame) -> dict[str, int]:
    """Requests with a negative component (kept as measured, never clamped), per component."""
    out = {}
    for c in C.COMPONENTS + C.SUBS:
        k = int((df[c].dropna() < 0).sum())
        if k:
            out[c] = k
    return out


def scaled(s: dict[str, Any], rate: float | None) -> dict[str, Any]:
    """Counts of the sampled host pairs -> the traffic's (x 1/rate), and a "sampling" entry
    saying so; "sampled_requests" keeps the count as recorded."""
    s["sampling"] = {"rate": rate or 1.0, "scaled": rate is not None}
    s["sampled_requests"] = s["requests"]
    if rate is None:
        return s
    k = 1.0 / rate
    s["requests"] = round(s["requests"] * k)
    for o in s["by_op"].values():
        o["count"] = round(o["count"] * k)
        o["counts"] = {c: round(n * k) for c, n in o["counts"].items()}
        for by in (o["by_server"], o["by_worker"]):
            for b in by.values():
                b["count"] = round(b["count"] * k)
    return s


def summary(d: Dissection) -> dict[str, Any]:
    done = d.complete
    ops = sorted(done["op"].dropna().unique(), key=lambda o: (o not in ("pull", "push"), o))
    return scaled({
        "requests": int(d.stats.requests),
        "unmatched": {"requests_without_response": int(d.stats.requests_without_response),
                      "messages_without_request": int(d.stats.messages_without_request),
                      "messages_unparsed": int(d.stats.messages_unparsed)},
        "hosts": list(d.hosts),
        "clock": {m.key: m.to_json() for m in d.clocks.values()},
        "by_op": {op: op_summary(done[done["op"] == op]) for op in ops},
        # beyond the contract's keys (documented beside it)
        "negative_components": negatives(done),
        "sampling_rate": d.sampling_rate,
        "notes": list(d.notes),
        "problems": list(d.problems),
    }, d.sampling_rate)
