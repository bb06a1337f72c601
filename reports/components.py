"""DESIGN.md's components of one request, from its four message ends.

The chain of one request (client = the worker, server = the parameter server;
the server's times converted to the client's clock first):

    P0  client  request  framework call            (TxStage.FRAMEWORK_CALL)
    P1  client  request  first send syscall entry
    P2  client  request  driver handoff of the last segment
    P3  client  request  TX completion / NIC TX timestamp
    P4  server  request  NIC RX of the last segment
    P5  server  request  netif_receive of the last segment
    P6  server  request  recv exit that consumed the last byte
    P7  server  response first send syscall entry
    P8..P9      response driver handoff, TX completion (server)
    P10..P12    response NIC RX, netif_receive, recv exit (client)
    P13 client  response framework hand-over

Component k is the interval P(k) -> P(k+1). A point that is null (the device
lacks the stage, or its event was lost) joins the two intervals around it and
the joined interval is named:
- by its one component, when it covers one;
- wire_req / wire_resp when it covers a wire and NIC components only (DESIGN:
  the NIC's time falls into the wire);
- network_and_remote when it covers every server point (the server host is
  not traced, or this request's server ends were not found);
- unsplit otherwise (host and network times that cannot be told apart: never
  given to one of them).
So the components of a request add up exactly (integer ns) to its end-to-end
time, from its first to its last present point: P0 -> P13 when the framework
probe saw both, else from the send syscall / to the recv exit, else (a packet
capture at the client) from the driver handoff / to netif (e2e_from, e2e_to
say which). A negative interval (a clock error) is kept as it is.

Sub-components, reported beside their parent, only where the parent is whole:
*_kernel_rx = *_stack_rx (netif -> data-ready) + *_sock_wait (data-ready ->
recv exit); *_sock_wait = *_runq_wait (the agent's run-queue time of the
reading thread) + *_busy_wait (the rest: the thread was busy elsewhere);
*_kernel_tx = *_stack_tx + *_cwnd_wait + *_rwnd_wait + *_qdisc_wait (the
agent's measured waits; stack_tx is the rest, so an unmeasured wait stays in
it); client_connect_wait is part of client_user_tx. Where the server's
framework boundary is probed too: server_user = server_framework_rx (recv
exit -> the framework hands the request to the app: e.g. libzmq's I/O thread
to the app thread) + server_app (the app's own time, what the server would log
itself) + server_framework_tx (the app hands the response over -> first send
syscall).

Work is per distinct pattern of present points (a handful), vectorised over
the requests of each pattern: no loop over requests.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from agent.records import RX_STAGE_COLUMNS, TX_STAGE_COLUMNS, RxStage, TxStage

CLIENT_TX, SERVER_RX, SERVER_TX, CLIENT_RX = "q_tx_", "q_rx_", "p_tx_", "p_rx_"
POINTS = [
    CLIENT_TX + TX_STAGE_COLUMNS[TxStage.FRAMEWORK_CALL],
    CLIENT_TX + TX_STAGE_COLUMNS[TxStage.SEND_FIRST_ENTER],
    CLIENT_TX + TX_STAGE_COLUMNS[TxStage.XMIT_LAST],
    CLIENT_TX + TX_STAGE_COLUMNS[TxStage.TXDONE_LAST],
    SERVER_RX + RX_STAGE_COLUMNS[RxStage.NIC_RX_LAST],
    SERVER_RX + RX_STAGE_COLUMNS[RxStage.NETIF_RX_LAST],
    SERVER_RX + RX_STAGE_COLUMNS[RxStage.RECV_LAST_EXIT],
    SERVER_TX + TX_STAGE_COLUMNS[TxStage.SEND_FIRST_ENTER],
    SERVER_TX + TX_STAGE_COLUMNS[TxStage.XMIT_LAST],
    SERVER_TX + TX_STAGE_COLUMNS[TxStage.TXDONE_LAST],
    CLIENT_RX + RX_STAGE_COLUMNS[RxStage.NIC_RX_LAST],
    CLIENT_RX + RX_STAGE_COLUMNS[RxStage.NETIF_RX_LAST],
    CLIENT_RX + RX_STAGE_COLUMNS[RxStage.RECV_LAST_EXIT],
    CLIENT_RX + RX_STAGE_COLUMNS[RxStage.FRAMEWORK_HANDOVER],
]
SERVER_POINTS = range(4, 10)
# server-side times that need the clock conversion besides the chain's points
SERVER_EXTRA = [SERVER_RX + RX_STAGE_COLUMNS[RxStage.DATA_READY],
                SERVER_RX + RX_STAGE_COLUMNS[RxStage.FRAMEWORK_HANDOVER],
                SERVER_TX + TX_STAGE_COLUMNS[TxStage.FRAMEWORK_CALL]]
CLIENT_DATA_READY = CLIENT_RX + RX_STAGE_COLUMNS[RxStage.DATA_READY]

BASE = ["client_user_tx", "client_kernel_tx", "client_nic_tx", "wire_req", "server_nic_rx",
        "server_kernel_rx", "server_user", "server_kernel_tx", "server_nic_tx", "wire_resp",
        "client_nic_rx", "client_kernel_rx", "client_user_rx"]
NETWORK_AND_REMOTE = "network_and_remote"
UNSPLIT = "unsplit"
COMPONENTS = BASE + [NETWORK_AND_REMOTE, UNSPLIT]
GROUPS = {
    "host": ["client_user_tx", "client_kernel_tx", "server_kernel_rx", "server_user",
             "server_kernel_tx", "client_kernel_rx", "client_user_rx"],
    "nic": ["client_nic_tx", "server_nic_rx", "server_nic_tx", "client_nic_rx"],
    "wire": ["wire_req", "wire_resp"],
    NETWORK_AND_REMOTE: [NETWORK_AND_REMOTE],
    UNSPLIT: [UNSPLIT],
}
SUBCOMPONENTS = {  # parent -> its parts (the last one of each list is the remainder)
    "client_user_tx": ["client_connect_wait"],
    "client_kernel_tx": ["client_cwnd_wait", "client_rwnd_wait", "client_qdisc_wait", "client_stack_tx"],
    "server_kernel_rx": ["server_stack_rx", "server_sock_wait", "server_runq_wait", "server_busy_wait"],
    "server_user": ["server_framework_rx", "server_app", "server_framework_tx"],
    "server_kernel_tx": ["server_cwnd_wait", "server_rwnd_wait", "server_qdisc_wait", "server_stack_tx"],
    "client_kernel_rx": ["client_stack_rx", "client_sock_wait", "client_runq_wait", "client_busy_wait"],
}
SUBS = [s for parts in SUBCOMPONENTS.values() for s in parts]
_WIRE_REQ = {2, 3, 4}       # client_nic_tx, wire_req, server_nic_rx
_WIRE_RESP = {8, 9, 10}


def span_name(i: int, j: int) -> str:
    """The name of the interval from present point i to the next present point j."""
    covered = set(range(i, j))
    if len(covered) == 1:
        return BASE[i]
    if 3 in covered and covered <= _WIRE_REQ:
        return "wire_req"
    if 9 in covered and covered <= _WIRE_RESP:
        return "wire_resp"
    if i >= 2 and j <= 11 and set(SERVER_POINTS) <= set(range(i + 1, j)):
        return NETWORK_AND_REMOTE
    return UNSPLIT


def describe_pattern(present: list[bool]) -> tuple[list[tuple[int, int, str]], str]:
    """(spans, folds): the intervals of a pattern of present points and what folded where."""
    pts = [k for k, p in enumerate(present) if p]
    spans = [(i, j, span_name(i, j)) for i, j in zip(pts, pts[1:])]
    folds = []
    for i, j, name in spans:
        gone = [BASE[k] for k in range(i, j) if BASE[k] != name]
        if gone:
            folds.append(f"{'+'.join(gone)}>{name}")
    return spans, ";".join(folds)


def _ns(df: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    s = df[col]
    ok = s.notna().to_numpy()
    return s.fillna(0).to_numpy(dtype=np.int64), ok


def compute(req: pd.DataFrame) -> pd.DataFrame:
    """Components, sub-components, groups and end-to-end (all int64 ns, <NA> for null) per
    request; `req` has the chain's columns with server times already in the client's clock."""
    n = len(req)
    t = np.zeros((n, len(POINTS)), dtype=np.int64)
    present = np.zeros((n, len(POINTS)), dtype=bool)
    for k, col in enumerate(POINTS):
        t[:, k], present[:, k] = _ns(req, col)
    comp = np.zeros((n, len(COMPONENTS)), dtype=np.int64)
    has = np.zeros((n, len(COMPONENTS)), dtype=bool)
    e2e = np.zeros(n, dtype=np.int64)
    e2e_ok = np.zeros(n, dtype=bool)
    first = np.full(n, -1)
    last = np.full(n, -1)
    folds = np.empty(n, dtype=object)
    code = present.astype(np.int64) @ (1 << np.arange(len(POINTS), dtype=np.int64))
    uniq, inv = np.unique(code, return_inverse=True)
    index = {name: k for k, name in enumerate(COMPONENTS)}
    for u, pattern in enumerate(uniq):
        rows = np.flatnonzero(inv == u)
        bits = [bool(pattern >> k & 1) for k in range(len(POINTS))]
        spans, fold = describe_pattern(bits)
        folds[rows] = fold
        pts = [k for k, b in enumerate(bits) if b]
        if len(pts) < 2:
            continue
        first[rows], last[rows] = pts[0], pts[-1]
        e2e[rows] = t[rows, pts[-1]] - t[rows, pts[0]]
        e2e_ok[rows] = True
        for i, j, name in spans:
            c = index[name]
            comp[rows, c] += t[rows, j] - t[rows, i]
            has[rows, c] = True
    out = pd.DataFrame({name: _masked(comp[:, k], has[:, k]) for k, name in enumerate(COMPONENTS)})
    for g, members in GROUPS.items():
        ks = [index[m] for m in members]
        # a member that is null adds nothing (its time is in another member or group)
        out[f"group_{g}"] = _masked((comp[:, ks] * has[:, ks]).sum(axis=1), has[:, ks].any(axis=1))
    out["e2e"] = _masked(e2e, e2e_ok)
    # a packet capture's view starts at the driver handoff and ends at netif (capture/point.py)
    names = np.array(["framework", "syscall", "driver"] + [None] * 11, dtype=object)
    end_names = np.array([None] * 11 + ["netif", "syscall", "framework"], dtype=object)
    out["e2e_from"] = np.where(first >= 0, names[np.maximum(first, 0)], None)
    out["e2e_to"] = np.where(last >= 0, end_names[np.maximum(last, 0)], None)
    out["folded"] = folds
    _subcomponents(req, out, t, present, has, index)
    return out


def _masked(v: np.ndarray, ok: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.where(ok, v, 0).astype(np.int64), ~ok)


def _sub_input(req: pd.DataFrame, col: str) -> tuple[np.ndarray, np.ndarray]:
    return _ns(req, col) if col in req.columns else (np.zeros(len(req), np.int64), np.zeros(len(req), bool))


def _subcomponents(req, out, t, present, has, index) -> None:
    whole = {name: has[:, index[name]] & _base_span(present, index[name]) for name in SUBCOMPONENTS}
    # client_user_tx: connect wait
    cw, cw_ok = _sub_input(req, CLIENT_TX + "connect_wait_ns")
    out["client_connect_wait"] = _masked(cw, cw_ok & whole["client_user_tx"])
    # kernel tx: measured waits, stack_tx the rest
    for side, parent, pre in (("client", "client_kernel_tx", CLIENT_TX), ("server", "server_kernel_tx", SERVER_TX)):
        ok = whole[parent]
        rest = out[parent].fillna(0).to_numpy(dtype=np.int64).copy()
        for w in ("cwnd", "rwnd", "qdisc"):
            v, v_ok = _sub_input(req, f"{pre}{w}_wait_ns")
            out[f"{side}_{w}_wait"] = _masked(v, v_ok & ok)
            rest -= np.where(v_ok, v, 0)
        out[f"{side}_stack_tx"] = _masked(rest, ok)
    # server_user: framework hand-over, the app, framework call
    fw_rx, rx_ok = _ns(req, SERVER_EXTRA[1])
    fw_tx, tx_ok = _ns(req, SERVER_EXTRA[2])
    ok = whole["server_user"] & rx_ok & tx_ok
    out["server_framework_rx"] = _masked(fw_rx - t[:, 6], ok)
    out["server_app"] = _masked(fw_tx - fw_rx, ok)
    out["server_framework_tx"] = _masked(t[:, 7] - fw_tx, ok)
    # kernel rx: stack_rx + sock_wait; sock_wait = runq_wait + busy_wait
    for side, parent, pre, netif_k, recv_k, ready_col in (
            ("server", "server_kernel_rx", SERVER_RX, 5, 6, SERVER_EXTRA[0]),
            ("client", "client_kernel_rx", CLIENT_RX, 11, 12, CLIENT_DATA_READY)):
        ready, r_ok = _ns(req, ready_col)
        ok = whole[parent] & r_ok
        out[f"{side}_stack_rx"] = _masked(ready - t[:, netif_k], ok)
        sock = t[:, recv_k] - ready
        out[f"{side}_sock_wait"] = _masked(sock, ok)
        runq, q_ok = _sub_input(req, f"{pre}runq_wait_ns")
        busy, b_ok = _sub_input(req, f"{pre}busy_wait_ns")
        # the remainder keeps sock_wait = runq_wait + busy_wait exact
        runq_v = np.where(q_ok, runq, sock - busy)
        have = ok & (q_ok | b_ok)
        out[f"{side}_runq_wait"] = _masked(runq_v, have)
        out[f"{side}_busy_wait"] = _masked(sock - runq_v, have)


def _base_span(present: np.ndarray, k: int) -> np.ndarray:
    """Component k is whole: both its points are present."""
    return present[:, k] & present[:, k + 1] if k < len(BASE) else np.zeros(len(present), bool)
