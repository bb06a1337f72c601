"""Pairing across hosts, as DataFrame joins (DESIGN.md "Matching", across hosts).

1. The two ends of a message: its `tx` row on the sending host and its `rx` row
   on the receiving host carry the same connection seen from both sides
   (local/remote swapped), the same TCP sequence range and the same ISNs (in
   conn_id). They are joined on (sender ip, port, receiver ip, port, seq_first,
   seq_end); a join whose conn_ids (both with known ISNs) or message ids
   disagree is refused, and a key that occurs twice on one side is left
   unpaired rather than guessed. Result: one row per message, `tx_*` and `rx_*`
   columns (null for an end not seen).
2. A request and its response: the ids its protocol's parser gives them
   (call_space, call_id: parsers/protocol.py) within the scope of its pairing:
   for pair_scope "nodes" between the same worker and server node ids
   (request: sender -> recver, response: recver <- sender), on any connection
   (a protocol whose nodes answer on connections of their own); for
   "connection" on the same TCP connection. If a key occurs several times (a restarted worker
   counting from 0 again), the n-th request pairs with the n-th response in time
   order.

Every step is a merge/groupby on whole columns, so it runs per partition on
Dask as it runs on pandas.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from agent.records import RX_STAGE_COLUMNS, TX_STAGE_COLUMNS, TxStage
from parsers.protocol import PAIR_CONNECTION, PAIR_NODES

FLOW_KEY = ["src_ip", "src_port", "dst_ip", "dst_port", "seq_first", "seq_end"]
ID_COLUMNS = ["protocol", "pair_scope", "control", "request", "op", "op_name", "call_space", "call_id",
              "sender", "recver", "num_keys", "value_bytes", "msg_bytes", "seq_end"]
SUB_INPUTS = ["runq_wait_ns", "busy_wait_ns", "cwnd_wait_ns", "rwnd_wait_ns", "qdisc_wait_ns",
              "connect_wait_ns"]
SIDE_COLUMNS = ["host_id", "pid", "local_ip", "local_port", "remote_ip", "remote_port", "conn_id",
                "null_reasons", *SUB_INPUTS]
# the send syscall's exit is no boundary of any component (reports.load does not read it)
TX_COLUMNS = SIDE_COLUMNS + [c for s, c in TX_STAGE_COLUMNS.items() if s is not TxStage.SEND_LAST_EXIT]
RX_COLUMNS = SIDE_COLUMNS + list(RX_STAGE_COLUMNS.values())
# ids that both ends of one message must agree on (when both know them)
_END_CHECK = ["request", "call_space", "call_id"]
# _proto, _chan: the protocol and (connection scope) the connection, as category codes
REQUEST_KEY = ["_proto", "call_space", "call_id", "worker", "server", "_chan"]


@dataclass
class EndStats:
    paired: int = 0
    tx_only: int = 0
    rx_only: int = 0
    refused: int = 0        # same 4-tuple and seq, but conn_id or ids disagree
    ambiguous: int = 0      # rows whose key occurs more than once on their side


def _flow_keys(m: pd.DataFrame, tx: bool) -> pd.DataFrame:
    src, dst = ("local", "remote") if tx else ("remote", "local")
    k = pd.DataFrame({
        "src_ip": m[f"{src}_ip"], "src_port": m[f"{src}_port"],
        "dst_ip": m[f"{dst}_ip"], "dst_port": m[f"{dst}_port"],
        "seq_first": m["seq_first"], "seq_end": m["seq_end"],
    }, index=m.index)
    return k.dropna()


def _packed(kt: pd.DataFrame, kr: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The flow keys as two uint64 columns (addresses' codes and ports; seq_first and seq_end),
    one to one with the six, when the values fit (they do for TCP): duplicated() and merge()
    factorize two columns instead of six (1M requests: 4 s -> 1.5 s). Else the keys as given."""
    ips = ["src_ip", "dst_ip"]
    if not all(isinstance(k[c].dtype, pd.CategoricalDtype) for k in (kt, kr) for c in ips) or not all(
            k[c].cat.categories.equals(kt["src_ip"].cat.categories) for k in (kt, kr) for c in ips):
        return kt, kr
    out = []
    for k in (kt, kr):
        v = {c: (k[c].cat.codes if c in ips else k[c]).to_numpy(dtype=np.int64) for c in FLOW_KEY}
        if len(k) and (min(x.min() for x in v.values()) < 0 or max(v[c].max() for c in ips) >= 1 << 16
                       or max(v["src_port"].max(), v["dst_port"].max()) >= 1 << 16
                       or max(v["seq_first"].max(), v["seq_end"].max()) >= 1 << 32):
            return kt, kr
        u = {c: x.astype(np.uint64) for c, x in v.items()}
        flow = u["src_ip"] << 48 | u["src_port"] << 32 | u["dst_ip"] << 16 | u["dst_port"]
        out.append(pd.DataFrame({"flow": flow, "seq": u["seq_first"] << 32 | u["seq_end"]}, index=k.index))
    return out[0], out[1]


def _known_isn(conn_id: pd.Series) -> np.ndarray:
    """conn_id names both ISNs ('?' for one the agent did not know)."""
    cats = conn_id.cat.categories
    known = ~pd.Series(cats, dtype=object).str.contains("?", regex=False).to_numpy(dtype=bool)
    codes = conn_id.cat.codes.to_numpy()
    return (codes >= 0) & known[np.maximum(codes, 0)] if len(cats) else np.zeros(len(codes), bool)


def _disagree(a: pd.Series, b: pd.Series) -> np.ndarray:
    both = a.notna().to_numpy() & b.notna().to_numpy()
    ne = np.zeros(len(a), dtype=bool)
    if isinstance(a.dtype, pd.CategoricalDtype):   # one dtype for the whole column: compare codes
        a, b = a.cat.codes, b.cat.codes
    ne[both] = a.to_numpy(dtype=object)[both] != b.to_numpy(dtype=object)[both]
    return ne


def pair_ends(m: pd.DataFrame) -> tuple[pd.DataFrame, EndStats]:
    """One row per message (see the module docstring); `m` is the messages table of every host."""
    m = m.reset_index(drop=True)
    is_tx = (m["direction"] == "tx").to_numpy()
    is_rx = (m["direction"] == "rx").to_numpy()
    flow = m[["local_ip", "local_port", "remote_ip", "remote_port", "seq_first", "seq_end"]]   # not a copy of all
    kt, kr = _packed(_flow_keys(flow[is_tx], True), _flow_keys(flow[is_rx], False))
    dup_t, dup_r = kt.duplicated(keep=False), kr.duplicated(keep=False)
    stats = EndStats(ambiguous=int(dup_t.sum() + dup_r.sum()))
    j = (kt[~dup_t].rename_axis("tx_row").reset_index()
         .merge(kr[~dup_r].rename_axis("rx_row").reset_index(), on=list(kt.columns), how="inner"))
    tr, rr = j["tx_row"].to_numpy(), j["rx_row"].to_numpy()
    bad = np.zeros(len(j), dtype=bool)
    ct, cr = m["conn_id"].iloc[tr].reset_index(drop=True), m["conn_id"].iloc[rr].reset_index(drop=True)
    known = _known_isn(ct) & _known_isn(cr)
    bad |= known & _disagree(ct, cr)
    for c in _END_CHECK:
        bad |= _disagree(m[c].iloc[tr].reset_index(drop=True), m[c].iloc[rr].reset_index(drop=True))
    stats.refused = int(bad.sum())
    tr, rr = tr[~bad], rr[~bad]
    stats.paired = len(tr)
    tx_only = _unpaired(is_tx, tr)
    rx_only = _unpaired(is_rx, rr)
    stats.tx_only, stats.rx_only = len(tx_only), len(rx_only)
    none_t = np.full(len(rx_only), -1)
    none_r = np.full(len(tx_only), -1)
    tx_idx = np.concatenate([tr, tx_only, none_t])
    rx_idx = np.concatenate([rr, none_r, rx_only])
    return _gather(m, tx_idx, rx_idx), stats


def _unpaired(is_side: np.ndarray, paired: np.ndarray) -> np.ndarray:
    """Rows of one side (ascending) not among `paired`: a mask, not np.setdiff1d, which
    hashes both arrays (10 s for 4M rows)."""
    left = is_side.copy()
    left[paired] = False
    return np.flatnonzero(left)


def _take(m: pd.DataFrame, idx: np.ndarray, cols: list[str]) -> pd.DataFrame:
    """Rows idx of m (-1: an all-null row), keeping nullable dtypes. Masked and categorical
    columns are gathered by their own take(): reindex() checks the indices again for every
    column (1M requests: 1.5 s)."""
    if len(m) == 0:
        return m[cols].reindex(idx).reset_index(drop=True)
    out = {}
    for c in cols:
        a = m[c].array
        if isinstance(a, (pd.arrays.IntegerArray, pd.arrays.BooleanArray, pd.arrays.FloatingArray, pd.Categorical)):
            out[c] = a.take(idx, allow_fill=True)
        else:
            out[c] = m[c].reindex(idx).reset_index(drop=True)
    return pd.DataFrame(out, columns=cols, copy=False)


def _gather(m: pd.DataFrame, tx_idx: np.ndarray, rx_idx: np.ndarray) -> pd.DataFrame:
    t = _take(m, tx_idx, TX_COLUMNS + ID_COLUMNS)
    r = _take(m, rx_idx, RX_COLUMNS + ID_COLUMNS)
    out = pd.concat([t[TX_COLUMNS].add_prefix("tx_"), r[RX_COLUMNS].add_prefix("rx_")], axis=1)
    for c in ID_COLUMNS:
        out[c] = t[c].fillna(r[c]) if len(out) else t[c]   # the sender's view first
    return out


@dataclass
class RequestStats:
    requests: int = 0                    # request and response both found
    requests_without_response: int = 0
    messages_without_request: int = 0
    messages_unparsed: int = 0           # data messages without the ids to pair them


def _codes(col: pd.Series) -> np.ndarray:
    """A text column's category codes (-1 for null), the same for every row of one frame."""
    if not isinstance(col.dtype, pd.CategoricalDtype):
        col = col.astype("category")
    return col.cat.codes.to_numpy(dtype=np.int64)


def _order_ns(msgs: pd.DataFrame, first: str, second: str) -> pd.Series:
    """A host-local time to rank messages with the same ids by (see the module docstring)."""
    t = msgs[first].astype("Float64")
    return t.fillna(msgs[second].astype("Float64"))


def _rank(d: pd.DataFrame) -> pd.DataFrame:
    """_n: the rank of a message among those with its ids, in time order."""
    d = d.sort_values(REQUEST_KEY + ["_t"], kind="stable")
    d["_n"] = d.groupby(REQUEST_KEY, sort=False, dropna=False).cumcount()
    return d.drop(columns=["_t"])


def pair_requests(msgs: pd.DataFrame) -> tuple[pd.DataFrame, RequestStats]:
    """One row per request: `q_*` columns of its request message, `p_*` of its response."""
    st = RequestStats()
    # masks first, then one filter per half: no copy of every column of the data messages
    data = ((msgs["control"] == False) & msgs["request"].notna()).fillna(False).to_numpy(dtype=bool)  # noqa: E712
    scope = msgs["pair_scope"].astype(object).to_numpy()
    nodes = scope == PAIR_NODES
    conn = scope == PAIR_CONNECTION
    chan = _codes(msgs["tx_conn_id"]) if "tx_conn_id" in msgs else np.full(len(msgs), -1)
    if "rx_conn_id" in msgs:
        chan = np.where(chan >= 0, chan, _codes(msgs["rx_conn_id"]))
    has_id = msgs["call_id"].notna().to_numpy()
    ids_ok = has_id & ((nodes & msgs[["sender", "recver"]].notna().all(axis=1).to_numpy()) | (conn & (chan >= 0)))
    st.messages_unparsed = int((data & ~ids_ok).sum())
    is_req = (msgs["request"] == True).fillna(False).to_numpy(dtype=bool)  # noqa: E712
    msgs = msgs.assign(_proto=_codes(msgs["protocol"]), _chan=np.where(conn, chan, -1))
    req = msgs[data & ids_ok & is_req]     # new frames (copy-on-write): no .copy()
    resp = msgs[data & ids_ok & ~is_req]   # `request` is known on data rows: not a request = a response
    # node ids name the two ends where the protocol has them; on a connection its ends do
    req["worker"], req["server"] = req["sender"], req["recver"]
    resp["worker"], resp["server"] = resp["recver"], resp["sender"]
    # the worker's clock orders both: the request leaves it, the response arrives at it
    req["_t"] = _order_ns(req, "tx_ts_send_first_enter_ns", "rx_ts_recv_last_exit_ns")
    resp["_t"] = _order_ns(resp, "rx_ts_recv_last_exit_ns", "tx_ts_send_first_enter_ns")
    req, resp = (_rank(d) for d in (req, resp))
    keys = REQUEST_KEY + ["_n"]
    q = req.drop(columns=["sender", "recver"]).rename(columns=lambda c: c if c in keys else f"q_{c}")
    p = resp.drop(columns=["sender", "recver"]).rename(columns=lambda c: c if c in keys else f"p_{c}")
    j = q.merge(p, on=keys, how="outer", indicator=True)
    del req, resp, q, p
    st.requests_without_response = int((j["_merge"] == "left_only").sum())
    st.messages_without_request = int((j["_merge"] == "right_only").sum())
    both = j["_merge"] == "both"
    if not both.all():   # a filter copies the whole table (1M requests: 1.3 GB more at the peak)
        j = j[both]
    j = j.drop(columns=["_merge", "_n", "_proto", "_chan"]).reset_index(drop=True)
    st.requests = len(j)
    return j, st
