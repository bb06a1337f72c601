"""Concurrency across connections (PAPER.md question 2), per request.

For each request: how many connections the same process had in flight at that
moment,
- on the server: connections of the server process with a request between its
  arrival (the last byte at the server: netif_receive, else the recv that took
  it) and the response's first send, counted when this request arrives;
- on the worker: connections of the worker process with a request between its
  start and its end, counted when this request starts.
A connection is in flight while any of its requests is (its requests' intervals
are merged first), and the request's own connection counts: 1 means alone.
All intervals are on one timeline (reports.extra.Timeline: the reference host's
clock), so requests from workers with different clocks are compared within the
clocks' stated uncertainty (exact when the clocks are shared).

Then, per op and per count: the requests' latency (p50/p99 e2e) and their
socket wait split into run-queue wait (the reading thread was runnable but not
running) and busy-elsewhere (it was running, serving something else: other
connections): the study's first contributor.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from reports import components as C
from reports.extra import Timeline, request_times_ref
from reports.summary import Columns

MAX_BUCKET = 16          # counts above this are pooled ("16+")
_BEFORE_SERVER_USER = C.BASE[:C.BASE.index("server_user")]


def server_interval(req: pd.DataFrame, start_ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival, reply, ok): the request's time at the server process on the reference
    timeline; ok where server_user is measured (both its points present, so the
    components before it add up to its start exactly)."""
    ok = req["server_user"].notna().to_numpy() & req[C.NETWORK_AND_REMOTE].isna().to_numpy() \
        & req[C.UNSPLIT].isna().to_numpy()
    before = sum(req[c].to_numpy(dtype=np.int64, na_value=0) for c in _BEFORE_SERVER_USER)
    recv = start_ref + before
    krx = req["server_kernel_rx"].to_numpy(dtype=np.int64, na_value=0)
    arrival = recv - krx          # netif_receive when kernel_rx is whole, else the recv exit
    reply = recv + req["server_user"].to_numpy(dtype=np.int64, na_value=0)
    return arrival, reply, ok


def in_flight(group: np.ndarray, conn: np.ndarray, t0: np.ndarray, t1: np.ndarray) -> np.ndarray:
    """For each row: the number of connections of its group in flight at its t0 (itself
    included). Rows: one request each (group = process, conn = its connection)."""
    n = len(t0)
    out = np.zeros(n, dtype=np.int64)
    if n == 0:
        return out
    g = _ids(pd.Series(group))
    key = _ids(pd.Series(g), pd.Series(conn))
    # by process, connection, then start: each process's rows, and each connection's, come in runs
    order = np.lexsort((t0, key, g))
    k, g, a = key[order], g[order], np.asarray(t0)[order]
    b = np.maximum(np.asarray(t1), np.asarray(t0))[order]
    first = np.ones(n, dtype=bool)
    first[1:] = k[1:] != k[:-1]
    # busy periods per connection: a new one starts when a request starts after every
    # earlier request of the connection ended
    run_end = pd.Series(b).groupby(k, sort=False).cummax().to_numpy()
    prev_end = np.concatenate([[0], run_end[:-1]])
    new = first | (a > prev_end)
    last = np.concatenate([new[1:], [True]])
    # per period: its process, start (its first request's) and end (the running max at its last)
    p_g, p_s, p_e = g[new], a[new], run_end[last]
    bounds = np.flatnonzero(np.concatenate([[True], g[1:] != g[:-1], [True]]))
    p_bounds = np.searchsorted(p_g, g[bounds[:-1]], side="left").tolist() + [len(p_g)]
    for x, (r0, r1) in enumerate(zip(bounds[:-1], bounds[1:])):
        s, e = np.sort(p_s[p_bounds[x]:p_bounds[x + 1]]), np.sort(p_e[p_bounds[x]:p_bounds[x + 1]])
        t = a[r0:r1]
        # periods started at or before t and not yet ended (an end at t is over)
        out[order[r0:r1]] = np.searchsorted(s, t, side="right") - np.searchsorted(e, t, side="right")
    return np.maximum(out, 1)


def _ids(*cols: pd.Series) -> np.ndarray:
    """One integer per distinct combination of values (a null is a value too), ordered as the
    values first appear: a process (host, pid) or a connection (host, ports), without building
    a string per request."""
    out = None
    for c in cols:
        codes, uniques = pd.factorize(c.to_numpy(), use_na_sentinel=False)
        out = codes.astype(np.int64) if out is None else \
            pd.factorize(out * len(uniques) + codes, use_na_sentinel=False)[0].astype(np.int64)
    return out


def _in_flight_of(req: pd.DataFrame, sel: np.ndarray, side: str, peer: str,
                  t0: np.ndarray, t1: np.ndarray) -> pd.arrays.IntegerArray:
    """in_flight() for the `side` process of the selected requests (<NA> elsewhere):
    its connections are told apart by the peer host and the request's ports."""
    got = pd.array(np.zeros(len(req), np.int64), dtype="Int64")
    got[:] = pd.NA
    if sel.any():
        r = req[sel]
        proc = _ids(r[f"{side}_host"].astype(str), r[f"{side}_pid"])
        conn = _ids(r[f"{peer}_host"].astype(str), r["req_sport"], r["req_dport"])
        got[np.flatnonzero(sel)] = in_flight(proc, conn, t0[sel], t1[sel])
    return got


def per_request(req: pd.DataFrame, tl: Timeline) -> pd.DataFrame:
    """Per complete request: server_conns, worker_conns (<NA> where unknown)."""
    start, end = request_times_ref(req, tl)
    arrival, reply, ok = server_interval(req, start)
    out = pd.DataFrame(index=req.index)
    out["server_conns"] = _in_flight_of(req, ok & req["server_pid"].notna().to_numpy(),
                                        "server", "worker", arrival, reply)
    out["worker_conns"] = _in_flight_of(req, req["worker_pid"].notna().to_numpy(),
                                        "worker", "server", start, end)
    return out


def _q(v: np.ndarray, q: float) -> float | None:
    return float(np.percentile(v, q)) / 1e3 if len(v) else None


def _mean_us(v: np.ndarray) -> float | None:
    v = v[~np.isnan(v)]
    return float(v.mean()) / 1e3 if len(v) else None


def by_count(req: pd.DataFrame | Columns, counts: pd.Series, side: str) -> list[dict[str, Any]]:
    """Rows per in-flight count: requests, e2e p50/p99 and the socket wait split (us)."""
    cols = req if isinstance(req, Columns) else Columns(req)
    rows = []
    c = counts.astype("float64").to_numpy()
    bucket = np.where(np.isnan(c), np.nan, np.minimum(c, MAX_BUCKET))
    for b in np.unique(bucket[~np.isnan(bucket)]):
        sel = bucket == b
        r = cols.sub(np.flatnonzero(sel))
        e2e = r.present("e2e")
        rows.append({"conns": int(b), "pooled": bool(b == MAX_BUCKET), "requests": int(sel.sum()),
                     "e2e_p50_us": _q(e2e, 50), "e2e_p99_us": _q(e2e, 99),
                     "sock_wait_us": _mean_us(r(f"{side}_sock_wait")),
                     "runq_wait_us": _mean_us(r(f"{side}_runq_wait")),
                     "busy_wait_us": _mean_us(r(f"{side}_busy_wait")),
                     "kernel_rx_us": _mean_us(r(f"{side}_kernel_rx"))})
    return rows


def split(req: pd.DataFrame | Columns, side: str) -> dict[str, Any]:
    """The socket wait of one side, and how much of it is run-queue vs busy-elsewhere."""
    cols = req if isinstance(req, Columns) else Columns(req)
    sw_all = cols(f"{side}_sock_wait")
    has_sw = ~np.isnan(sw_all)
    sw = sw_all[has_sw]
    rq = cols.present(f"{side}_runq_wait")
    bz = cols.present(f"{side}_busy_wait")
    e2e_sw = cols("e2e")[has_sw]
    e2e_sum = np.where(np.isnan(e2e_sw), 0.0, e2e_sw).sum()   # null e2e adds nothing
    return {"requests_with_sock_wait": int(len(sw)), "requests_with_split": int(len(rq)),
            "sock_wait_mean_us": float(sw.mean()) / 1e3 if len(sw) else None,
            "sock_wait_share_of_e2e": float(sw.sum() / e2e_sum) if len(sw) and e2e_sum else None,
            "runq_share": float(rq.sum() / (rq.sum() + bz.sum())) if len(rq) and (rq.sum() + bz.sum()) else None,
            "busy_share": float(bz.sum() / (rq.sum() + bz.sum())) if len(bz) and (rq.sum() + bz.sum()) else None}


def concurrency(d, tl: Timeline) -> dict[str, Any]:
    """Per op: the in-flight tables of both sides and the socket-wait splits."""
    done = d.complete
    if len(done) == 0:
        return {}
    pr = per_request(done, tl)
    out: dict[str, Any] = {}
    for op, rows in done.groupby("op", sort=True, observed=True).indices.items():
        r, p = Columns(done, rows), pr.iloc[rows]
        # the worker's own components are named client_*
        out[str(op)] = {side: {"by_conns": by_count(r, p[f"{side}_conns"], prefix),
                               "requests_counted": int(p[f"{side}_conns"].notna().sum()),
                               "sock_wait": split(r, prefix)}
                        for side, prefix in (("server", "server"), ("worker", "client"))}
    return out
