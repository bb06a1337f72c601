"""Connection management (PAPER.md question 3): set-up, teardown, open connections,
and what they cost the requests.

From the agents' `connections` table (agent/records.py CONNECTIONS_SCHEMA: one
row per connection a traced process connected or accepted, with its handshake,
accept wait and close) and the requests' client_connect_wait (the time a
request waited for its connection to be set up: ZMQ connects asynchronously).
A run whose agents did not write the table (netstack probe off, older agent)
says "not traced" rather than zero.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from reports.extra import RunContext

COLUMNS = ["host_id", "pid", "role", "conn_id", "connect_ret", "ts_connect_enter_ns", "ts_syn_sent_ns",
           "ts_syn_recv_ns", "ts_established_ns", "handshake_ns", "accept_wait_ns", "ts_close_ns",
           "retransmits"]
TIME_BINS = 60
EINPROGRESS = -115       # a non-blocking connect() returns it: not a failure


def _stat_us(s: pd.Series) -> dict[str, float] | None:
    v = s.dropna().to_numpy(dtype=np.float64)
    if len(v) == 0:
        return None
    p50, p99 = np.percentile(v, [50, 99])
    return {"count": int(len(v)), "mean": float(v.mean()) / 1e3, "p50": float(p50) / 1e3,
            "p99": float(p99) / 1e3, "max": float(v.max()) / 1e3}


def _per_host(c: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for host, g in c.groupby("host_id", sort=True, observed=True):
        ret = g["connect_ret"].astype("Float64")
        rows.append({
            "host": str(host), "connects": int((g["role"] == "connect").sum()),
            "accepts": int((g["role"] == "accept").sum()), "other": int((~g["role"].isin(["connect", "accept"])).sum()),
            "closes": int(g["ts_close_ns"].notna().sum()),
            "connect_failures": int(((ret < 0) & (ret != EINPROGRESS)).fillna(False).sum()),
            "retransmits": int(g["retransmits"].fillna(0).sum()),
            "handshake_us": _stat_us(g["handshake_ns"]), "accept_wait_us": _stat_us(g["accept_wait_ns"]),
        })
    return rows


def _open_over_time(c: pd.DataFrame, ctx: RunContext) -> dict[str, Any]:
    """Opens, closes and open connections per time bin, on the reference timeline."""
    opened = c["ts_established_ns"].fillna(c["ts_syn_recv_ns"]).fillna(c["ts_syn_sent_ns"])
    t_open, t_close = [], []
    for host, rows in c.groupby("host_id", sort=False, observed=True).indices.items():
        o = opened.iloc[rows].dropna()
        t_open.append(ctx.timeline.to_ref(o.to_numpy(dtype=np.int64), str(host)))
        cl = c["ts_close_ns"].iloc[rows].dropna()
        t_close.append(ctx.timeline.to_ref(cl.to_numpy(dtype=np.int64), str(host)))
    t_open = np.concatenate(t_open) if t_open else np.zeros(0, np.int64)
    t_close = np.concatenate(t_close) if t_close else np.zeros(0, np.int64)
    both = np.concatenate([t_open, t_close])
    if len(both) == 0:
        return {}
    t0, t1 = int(both.min()), int(both.max())
    edges = np.linspace(t0, max(t1, t0 + 1), TIME_BINS + 1)
    n_open = np.histogram(t_open, edges)[0]
    n_close = np.histogram(t_close, edges)[0]
    # connections open at the end of each bin (those open before the first record are unknown)
    open_now = np.cumsum(n_open) - np.cumsum(n_close)
    return {"t_s": [round(float((e - t0) / 1e9), 4) for e in edges[1:]], "opens": n_open.tolist(),
            "closes": n_close.tolist(), "open": open_now.tolist(), "t0_ref_ns": t0}


def connection_management(d, ctx: RunContext) -> dict[str, Any]:
    done = d.complete
    cw = done["client_connect_wait"] if "client_connect_wait" in done else pd.Series(dtype="Int64")
    e2e_sum = float(done["e2e"].astype("float64").sum()) if len(done) else 0.0
    waited = cw.dropna()
    out: dict[str, Any] = {
        "connect_wait": {"requests": int(len(done)), "measured": int(len(waited)),
                         "waited": int((waited > 0).sum()),
                         "share_of_request_time": float(waited.astype("float64").sum() / e2e_sum) if e2e_sum and len(waited) else None,
                         "stat_us": _stat_us(waited[waited > 0])},
    }
    if not ctx.has_table("connections"):
        out["traced"] = False
        out["why"] = ("not traced: no run dir has a connections table (the agent's netstack probe was "
                      "off, or the agent predates it)")
        return out
    c = ctx.table("connections", COLUMNS)
    out["traced"] = True
    out["hosts"] = _per_host(c)
    out["total"] = {k: int(sum(h[k] for h in out["hosts"])) for k in ("connects", "accepts", "closes",
                                                                         "connect_failures", "retransmits")}
    out["handshake_us"] = _stat_us(c["handshake_ns"])
    out["accept_wait_us"] = _stat_us(c["accept_wait_ns"])
    life = (c["ts_close_ns"] - c["ts_established_ns"]).dropna()
    out["lifetime_us"] = _stat_us(life)
    out["over_time"] = _open_over_time(c, ctx)
    return out
