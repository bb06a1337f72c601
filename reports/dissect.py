"""The run dirs of several hosts -> one row per request with DESIGN.md's components.

    d = dissect([Path("out/w0"), Path("out/ps0"), ...])   # or the parent dir
    d.requests          # DataFrame: ids, op, hosts, keys, bytes, components (int64 ns)
    d.clocks            # {(a, b): reports.clocks.ClockModel}
    d.problems, d.notes # what was wrong with the input / what the reader should know

Steps, each a whole-column DataFrame operation (pandas here; the joins and the
per-pattern arithmetic map onto Dask partitions by host):
  reports.load        read run dirs, name every problem
  reports.pairing     pair each message's two ends, then each request with its response
  reports.clocks      per host pair: shared / disciplined / estimated from the same traffic
  reports.components  the chain of stage times -> components that add up exactly
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from reports import components as C
from reports.clocks import ClockModel, clock_models, traffic_samples
from reports.load import Loaded, load, release_memory
from reports.pairing import EndStats, RequestStats, pair_ends, pair_requests

SERVER_COLUMNS = [C.POINTS[k] for k in C.SERVER_POINTS] + C.SERVER_EXTRA


@dataclass
class Dissection:
    requests: pd.DataFrame
    clocks: dict[tuple[str, str], ClockModel]
    hosts: list[str]
    stats: RequestStats
    ends: EndStats
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    sampling_rate: float | None = None
    # each used host's run dir and meta.json as reports.load read and checked them (the
    # views read these, not the files again: one reader of outside data)
    dirs: dict[str, Path] = field(default_factory=dict)
    metas: dict[str, dict] = field(default_factory=dict)

    @property
    def complete(self) -> pd.DataFrame:
        """Requests whose client end-to-end is measured (the ones the statistics describe);
        made once per requests table (each view asks for it: a copy of 1M rows each time)."""
        cached = self.__dict__.get("_complete")
        if cached is None or cached[0] is not self.requests:
            r = self.requests
            # all complete (the usual case): a shallow copy, not a second copy of the table
            done = r.copy(deep=False) if r["complete"].all() else r[r["complete"]]
            cached = self.__dict__["_complete"] = (r, done)
        return cached[1]


def dissect(paths: list[Path], force_estimate: bool = False) -> Dissection:
    return dissect_loaded(load(paths), force_estimate=force_estimate)


def _host_col(req: pd.DataFrame, first: str, second: str) -> pd.Series:
    return req[first].astype(object).where(req[first].notna(), req[second].astype(object))


def dissect_loaded(loaded: Loaded, force_estimate: bool = False) -> Dissection:
    """Takes loaded.messages (left None): the message rows are not kept beside the requests."""
    messages, loaded.messages = loaded.messages, None
    msgs, end_stats = pair_ends(messages)
    del messages
    release_memory()   # each step's garbage off the next one's peak (see there)
    samples = traffic_samples(msgs, [(h.host_id, h.path) for h in loaded.hosts])
    req, rstats = pair_requests(msgs)
    del msgs
    release_memory()
    req["worker_host"] = _host_col(req, "q_tx_host_id", "p_rx_host_id")
    req["server_host"] = _host_col(req, "q_rx_host_id", "p_tx_host_id")
    pairs = set()
    for h1, h2 in req[["worker_host", "server_host"]].dropna().drop_duplicates().itertuples(index=False):
        if h1 != h2:
            pairs.add(tuple(sorted((h1, h2))))
    for h1, h2 in samples[["tx_host", "rx_host"]].drop_duplicates().itertuples(index=False):
        pairs.add(tuple(sorted((h1, h2))))
    metas = {h.host_id: h.meta for h in loaded.hosts}
    clocks = clock_models(sorted(pairs), metas, samples, force_estimate=force_estimate)
    notes = [m.note for m in clocks.values() if m.note]
    _to_client_clock(req, clocks)
    comps = C.compute(req)
    table = _table(req, comps)
    notes += _notes(table, req)
    del req, comps
    release_memory()
    rate = _sampling_rate(loaded)
    if rate is not None:
        notes.append(f"the agents sampled host pairs at rate {rate:g}: counts are of the sampled traffic")
    return Dissection(requests=table, clocks=clocks, hosts=[h.host_id for h in loaded.hosts],
                      stats=rstats, ends=end_stats, problems=list(loaded.problems), notes=notes,
                      sampling_rate=rate, dirs={h.host_id: h.path for h in loaded.hosts}, metas=metas)


def _to_client_clock(req: pd.DataFrame, clocks: dict) -> None:
    """Server-side times -> the worker's clock, per (worker, server) host pair; a pair
    without a usable clock loses its server times (its requests get network_and_remote)."""
    cols = {}
    for c in SERVER_COLUMNS:
        s = req[c]
        cols[c] = (s.fillna(0).to_numpy(dtype=np.int64), s.notna().to_numpy())
    keep = np.ones(len(req), dtype=bool)
    groups = req.groupby(["worker_host", "server_host"], sort=False, dropna=False).indices
    for (w, s), rows in groups.items():
        if pd.isna(w) or pd.isna(s) or w == s:
            continue
        model = clocks.get(tuple(sorted((w, s))))
        if model is None or not model.usable:
            keep[rows] = False
            continue
        for c, (v, ok) in cols.items():
            v[rows] = model.convert(v[rows], s, w)
    for c, (v, ok) in cols.items():
        ok = ok & keep
        req[c] = pd.arrays.IntegerArray(np.where(ok, v, 0), ~ok)


def _first(req: pd.DataFrame, a: str, b: str) -> pd.Series:
    return req[a].fillna(req[b]) if a in req and b in req else req[a]


def _table(req: pd.DataFrame, comps: pd.DataFrame) -> pd.DataFrame:
    """One row per request: who, what, and its components (int64 ns)."""
    server_addr = req["q_tx_remote_ip"].astype(object).where(req["q_tx_remote_ip"].notna(),
                                                             req["p_rx_remote_ip"].astype(object))
    worker_addr = req["q_rx_remote_ip"].astype(object).where(req["q_rx_remote_ip"].notna(),
                                                             req["p_tx_remote_ip"].astype(object))
    t = pd.DataFrame({
        "protocol": _first(req, "q_protocol", "p_protocol").astype(object),
        "op": _first(req, "q_op", "p_op").astype(object),
        "op_name": _first(req, "q_op_name", "p_op_name").astype(object),
        "call_space": req["call_space"], "call_id": req["call_id"],
        "worker": req["worker"], "server": req["server"],
        # an untraced host is named by its address as the traced end saw it
        "worker_host": req["worker_host"].where(req["worker_host"].notna(), worker_addr),
        "server_host": req["server_host"].where(req["server_host"].notna(), server_addr),
        "worker_pid": _first(req, "q_tx_pid", "p_rx_pid"),
        "server_pid": _first(req, "q_rx_pid", "p_tx_pid"),
        "num_keys": req["q_num_keys"],
        "req_bytes": req["q_msg_bytes"], "resp_bytes": req["p_msg_bytes"],
        "req_value_bytes": req["q_value_bytes"], "resp_value_bytes": req["p_value_bytes"],
        # the worker's clock: when the request started (framework call, else first send)
        "start_ns": _first(req, C.POINTS[0], C.POINTS[1]),
        # where to find each message in a capture: its sender's port, its receiver's, its last seq
        "req_sport": _first(req, "q_tx_local_port", "q_rx_remote_port"),
        "req_dport": _first(req, "q_tx_remote_port", "q_rx_local_port"),
        "req_seq_end": req["q_seq_end"],
        "resp_sport": _first(req, "p_tx_local_port", "p_rx_remote_port"),
        "resp_dport": _first(req, "p_tx_remote_port", "p_rx_local_port"),
        "resp_seq_end": req["p_seq_end"],
    })
    t = pd.concat([t, comps], axis=1)
    t["complete"] = (t["e2e_from"].notna() & t["e2e_to"].notna()).to_numpy()
    return t


def _notes(table: pd.DataFrame, req: pd.DataFrame) -> list[str]:
    out = []
    n = len(table)
    partial = n - int(table["complete"].sum())
    if partial:
        out.append(f"{partial} of {n} requests lack the worker's view of the request or the response "
                   "(worker not traced, or its end lost): counted, not in the statistics")
    comp = table.loc[table["complete"], ["e2e_from", "e2e_to", "folded"]]
    if len(comp) == 0:
        return out
    sys_ = int(((comp["e2e_from"] == "syscall") | (comp["e2e_to"] == "syscall")).sum())
    if sys_:
        out.append(f"{sys_} requests have no framework time at one end: their end-to-end starts or "
                   "ends at the send/recv syscall")
    wire = int(((comp["e2e_from"] == "driver") | (comp["e2e_to"] == "netif")).sum())
    if wire:
        out.append(f"{wire} requests have no syscall time at one end (a packet capture sees none): their "
                   "end-to-end starts at the driver handoff or ends at netif")
    for fold, k in comp["folded"].value_counts().items():
        if fold:
            why = _null_reasons(req.loc[comp.index[comp["folded"] == fold], _REASON_COLUMNS], fold)
            out.append(f"{k} requests: {fold.replace(';', ', ')} (null stage{why}; '>' = folded into)")
    return out


_END_NAMES = {C.CLIENT_TX: "the request's end on the worker", C.SERVER_RX: "the request's end on the server",
              C.SERVER_TX: "the response's end on the server", C.CLIENT_RX: "the response's end on the worker"}


# what _null_reasons reads (a fold's rows of these only: not every column of the requests)
_REASON_COLUMNS = list(dict.fromkeys(C.POINTS + [f"{col[:5]}{x}" for col in C.POINTS
                                                  for x in ("host_id", "null_reasons")]))


def _null_reasons(req: pd.DataFrame, fold: str) -> str:
    """The agent's most common reason for the stages that made this fold."""
    reasons = []
    for col in C.POINTS:
        side, stage = col[:5], col[5:]
        null = req[col].isna()
        if not null.any():
            continue
        if req.loc[null, f"{side}host_id"].isna().all():
            reasons.append(f"{_END_NAMES[side]} not found (lost, or its host not traced or without a clock)")
            continue
        # the reason strings repeat: parse each distinct one once, weigh it by its count
        counts = req.loc[null, f"{side}null_reasons"].value_counts()
        why: dict[str, int] = {}
        for text, k in counts.items():
            for part in str(text).split(";"):
                name, _, reason = part.partition("=")
                if name == stage and reason:
                    why[reason] = why.get(reason, 0) + int(k)
        if why:
            reasons.append(f"{stage}: {max(why, key=why.get)}")
    return (": " + "; ".join(dict.fromkeys(reasons))) if reasons else ""


def _sampling_rate(loaded: Loaded) -> float | None:
    rates = []
    for h in loaded.hosts:
        s = h.meta.get("sampling") if isinstance(h.meta.get("sampling"), dict) else {}
        r = s.get("effective_rate", s.get("rate"))   # the run's time-weighted rate (agent.shedding)
        if isinstance(r, (int, float)) and 0 < r < 1:
            rates.append(float(r))
    return min(rates) if rates else None
