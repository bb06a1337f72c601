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
from reports.unrecognised import unrecognised

STAT_KEYS = ("mean", "p50", "p90", "p99")
CONTRACT_GROUPS = ("host", "nic", "wire")     # always present (null when no request had one)


def stat_us(values_ns) -> dict[str, float] | None:
    """{"mean","p50","p90","p99"} in us of the non-null values; None when there are none."""
    return _stat(pd.Series(values_ns).dropna().to_numpy(dtype=np.float64))


def _stat(v: np.ndarray) -> dict[str, float] | None:
    """stat_us of float64 values without NaN, in the requests' order (the mean's sum depends on it)."""
    if len(v) == 0:
        return None
    p50, p90, p99 = np.percentile(v, [50, 90, 99])
    return {k: round(float(x) / 1e3, 3) for k, x in zip(STAT_KEYS, (v.mean(), p50, p90, p99))}


def _float64(s: pd.Series, rows: np.ndarray | None) -> np.ndarray:
    """s[rows] as float64, NaN for null (as to_numpy(float64, na_value=nan)): a nullable integer
    column is cut before it is converted, not converted whole for each subset."""
    a = s.array
    if isinstance(a, pd.arrays.IntegerArray) and rows is not None:
        return a[rows].to_numpy(np.float64, na_value=np.nan)
    v = s.to_numpy(dtype=np.float64, na_value=np.nan)
    return v if rows is None else v[rows]


class Columns:
    """Rows `rows` of a requests table as float64 arrays (NaN for null), each column converted
    on first use: the statistics work on arrays, never on a copy of the whole table per op or host."""

    def __init__(self, df: pd.DataFrame, rows: np.ndarray | None = None, parent: "Columns | None" = None,
                 local: np.ndarray | None = None):
        self.df, self.rows, self._cache = df, rows, {}
        self._parent, self._local = parent, local    # a subset takes its arrays from its parent's

    def __len__(self) -> int:
        return len(self.df) if self.rows is None else len(self.rows)

    def __call__(self, col: str) -> np.ndarray:
        v = self._cache.get(col)
        if v is None:
            if self._parent is not None:
                v = self._parent(col)[self._local]
            else:
                v = _float64(self.df[col], self.rows)
            self._cache[col] = v
        return v

    def present(self, col: str) -> np.ndarray:
        v = self(col)
        return v[~np.isnan(v)]

    def sub(self, rows: np.ndarray) -> "Columns":
        """A subset: positions into this one's rows (its arrays are cut from this one's)."""
        return Columns(self.df, rows if self.rows is None else self.rows[rows], parent=self, local=rows)


def _present(cols: Columns, names: list[str]) -> dict[str, Any]:
    out = {}
    for c in names:
        s = _stat(cols.present(c))
        if s is not None:
            out[c] = s
    return out


def _groups(cols: Columns) -> dict[str, Any]:
    out: dict[str, Any] = {g: _stat(cols.present(f"group_{g}")) for g in CONTRACT_GROUPS}
    for g in C.GROUPS:
        if g not in out and (s := _stat(cols.present(f"group_{g}"))) is not None:
            out[g] = s
    return out


def _by(cols: Columns, col: str) -> dict[str, Any]:
    keys = cols.df[col] if cols.rows is None else cols.df[col].iloc[cols.rows]
    groups = keys.reset_index(drop=True).groupby(keys.to_numpy(), sort=True, dropna=True).indices
    out = {}
    for h in sorted(groups):
        g = cols.sub(groups[h])
        out[str(h)] = {"count": len(g), "e2e_us": _stat(g.present("e2e")), "groups_us": _groups(g)}
    return out


def op_summary(df: pd.DataFrame | Columns) -> dict[str, Any]:
    cols = df if isinstance(df, Columns) else Columns(df)
    names = C.COMPONENTS + C.SUBS + [f"group_{g}" for g in C.GROUPS]
    return {
        "count": len(cols),
        "e2e_us": _stat(cols.present("e2e")),
        "components_us": _present(cols, C.COMPONENTS),
        "subcomponents_us": _present(cols, C.SUBS),
        "groups_us": _groups(cols),
        "by_server": _by(cols, "server_host"),
        "by_worker": _by(cols, "worker_host"),
        # beyond the contract: how many of `count` requests have each value
        "counts": {c: n for c in names if (n := int(np.count_nonzero(~np.isnan(cols(c))))) > 0},
    }


def negatives(df: pd.DataFrame | Columns) -> dict[str, int]:
    """Requests with a negative component (kept as measured, never clamped), per component."""
    cols = df if isinstance(df, Columns) else Columns(df)
    out = {}
    for c in C.COMPONENTS + C.SUBS:
        k = int(np.count_nonzero(cols(c) < 0))
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


def summary(d: Dissection, other: dict[str, Any] | None = None) -> dict[str, Any]:
    """other: reports.unrecognised of d's run dirs, when the caller has it already."""
    done = d.complete
    ops = sorted(done["op"].dropna().unique(), key=lambda o: (o not in ("pull", "push"), o))
    by_op = {op: np.flatnonzero((done["op"] == op).to_numpy(dtype=bool, na_value=False)) for op in ops}
    other = unrecognised(d.dirs) if other is None else other
    return scaled({
        "requests": int(d.stats.requests),
        "unmatched": {"requests_without_response": int(d.stats.requests_without_response),
                      "messages_without_request": int(d.stats.messages_without_request),
                      "messages_unparsed": int(d.stats.messages_unparsed),
                      # traced connections that no protocol parser recognised (reports.unrecognised)
                      "connections_unrecognised": other["connections"],
                      "bytes_unrecognised": other["bytes"]},
        "hosts": list(d.hosts),
        "clock": {m.key: m.to_json() for m in d.clocks.values()},
        "by_op": {op: op_summary(Columns(done, by_op[op])) for op in ops},
        # beyond the contract's keys (documented beside it)
        "negative_components": negatives(done),
        "sampling_rate": d.sampling_rate,
        "notes": list(d.notes),
        "problems": list(d.problems),
    }, d.sampling_rate)


FORMAT_VERSION = 2   # 1: no format_version, run, window or windowed (the whole run's fields only)


def windowed(d: Dissection, duration_s: float | None) -> dict[str, Any]:
    """The window's figures: the same statistics as the whole run's `by_op`, over the
    window's requests (reports.window), counts scaled as the whole run's are."""
    done = d.complete
    ops = sorted(done["op"].dropna().unique(), key=lambda o: (o not in ("pull", "push"), o))
    rows = {op: np.flatnonzero((done["op"] == op).to_numpy(dtype=bool, na_value=False)) for op in ops}
    out = scaled({"requests": int(len(d.requests)),
                  "by_op": {op: op_summary(Columns(done, rows[op])) for op in ops}}, d.sampling_rate)
    out["rate_per_s"] = {op: round(o["count"] / duration_s, 3) for op, o in out["by_op"].items()} \
        if duration_s else {}
    out["negative_components"] = negatives(done)
    return out


def document(sel, other: dict[str, Any] | None = None) -> dict[str, Any]:
    """The JSON summary as `pslat report -f json` writes it: the whole run's figures (the
    fields of format 1, same meaning, filters applied), then what the report's window holds."""
    from reports.runfacts import RUN_KEYS, run_facts

    facts = run_facts(sel)
    s = {"format_version": FORMAT_VERSION, **summary(sel.whole, other)}
    s["run"] = {k: facts[k] for k in RUN_KEYS}
    s["window"] = sel.info.to_json()
    span = sel.info.until_s - sel.info.since_s
    s["windowed"] = windowed(sel.window, span if span > 0 else None)
    # beyond the contract: the rest of the facts, the rule's verdict, the filters
    s["run_facts"] = {k: v for k, v in facts.items() if k not in RUN_KEYS}
    w = sel.info.warmup
    s["warmup"] = {"detected_s": w.end_s, "why": w.why, "rule": sel.info.rule, "requests": w.requests,
                   "share_of_requests": round(w.share_of_requests, 4), "share_of_time": round(w.share_of_time, 4)}
    s["filters"] = sel.info.filters
    return s
