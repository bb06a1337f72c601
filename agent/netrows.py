"""The netstack probe's events -> parts of rows: send-side stage times per message
end (TxTimes), the `connections` table (Connections), and the sub-component inputs
of DESIGN.md ("The components of one request") per message:

    *_sock_wait  = *_runq_wait + *_busy_wait           (receive side: sock_wait_split)
    *_kernel_tx  = *_stack_tx + *_cwnd_wait + *_rwnd_wait + *_qdisc_wait
                                                       (send side: window_split, tx_stages_of)

Each input is either a measured or precisely inferred ns value, or null with its
reason (under the column's name in null_reasons). stack_tx is not a column: the
report takes it as the rest of kernel_tx, so an unmeasured wait stays there.
"""
from __future__ import annotations

import struct
from collections import OrderedDict, deque
from typing import Callable

from agent.bounded import CONNS_MAX, put_newest
from agent.endpoints import addr_text, conn_id_of

MASK32 = 0xFFFFFFFF
HOLD_NS = 2_000_000_000      # as agent.correlate: a row waits at most this long for its times
# Bounds (DESIGN.md "What the agent trusts"; each eviction counted in meta.json):
# send-side times of message ends waiting for their rows (pruned after 4 * HOLD_NS,
# so this only bites a flood: ~0.4 KB each). Connection rows in progress (one per
# open socket) are at most agent.bounded.CONNS_MAX: the oldest is written out as still
# open, without its close.
TX_ENDS_MAX = 65_536
# A connection's ESTABLISHED time is kept this long after its close: its last rows,
# held up to HOLD_NS, may still ask for it (connect_wait_ns)
ESTABLISHED_KEEP_NS = 2 * HOLD_NS

R_NOT_TIMED = "the kernel probes gave no time for this message end"
R_NOT_LOADED = "netstack probe not loaded"
R_DATA_READY_LATE = "the data-ready on record came after the recv that took the byte (a later segment's)"
R_TX_RING_OVERFLOW = "the end left the socket's ring before reaching the driver"

# ---------------------------------------------------------------- send-side stage times

NS_TX_F_RETRANS, NS_TX_F_OVERWRITTEN, NS_TX_F_CLOSED, NS_TX_F_SENT_UNSEEN, NS_TX_F_NO_QUEUE = 1, 2, 4, 8, 16
NS_TXC_COMPLETED, NS_TXC_FORWARDED, NS_TXC_DROPPED = 1, 2, 3
_NO_XMIT = ((NS_TX_F_OVERWRITTEN, R_TX_RING_OVERFLOW),
            (NS_TX_F_CLOSED, "the socket closed before the segment reached the driver"),
            (NS_TX_F_SENT_UNSEEN, "sent before the socket was tracked, or its handoff record was overwritten"))
_TXDONE_NULL = {NS_TXC_FORWARDED: "device has no TX completion (veth/loopback hand the skb to the peer)",
                NS_TXC_DROPPED: "the segment was dropped after the driver handoff"}


def tx_stages_of(flags: int, ts_queue_ns: int, ts_xmit_ns: int) -> dict:
    """Send-side stages of a message end from a netstack TX event. "_ts_queue_ns"
    (net_dev_queue of the skb carrying the end: when it left TCP) is kept for
    window_split; it is not a column."""
    for bit, why in _NO_XMIT:
        if flags & bit:
            return {"ts_xmit_last_ns": None, "ts_xmit_last_ns:null": why,
                    "ts_txdone_last_ns": None, "ts_txdone_last_ns:null": "no driver handoff on record"}
    out = {"ts_xmit_last_ns": ts_xmit_ns or None}
    if not ts_xmit_ns:
        out["ts_xmit_last_ns:null"] = R_NOT_TIMED
    if ts_queue_ns and not flags & NS_TX_F_NO_QUEUE:
        out["_ts_queue_ns"] = ts_queue_ns
        if ts_xmit_ns:
            out["qdisc_wait_ns"] = ts_xmit_ns - ts_queue_ns
    return out


class TxTimes:
    """Send-side times per message end (socket, end_seq), as the netstack probe
    reports them: a TX event (driver handoff), then a TX_DONE (completion, or
    why there is none). Complete when both came, or the first says no times."""

    def __init__(self):
        self._by_end: OrderedDict[tuple, dict] = OrderedDict()   # oldest first
        self.retransmitted_ends = 0
        self.evicted = 0   # ends dropped beyond TX_ENDS_MAX before their row took them

    def _entry(self, sk: int, end_seq: int, now_ns: int) -> dict:
        st = self._by_end.get((sk, end_seq))
        if st is None:
            st = {"_added": now_ns}
            self.evicted += put_newest(self._by_end, (sk, end_seq), st, TX_ENDS_MAX)
        return st

    def on_tx(self, sk: int, end_seq: int, flags: int, ts_queue_ns: int, ts_xmit_ns: int, now_ns: int) -> None:
        if flags & NS_TX_F_RETRANS:
            self.retransmitted_ends += 1   # the first transmission's times stand
            return
        st = self._entry(sk, end_seq, now_ns)
        got = tx_stages_of(flags, ts_queue_ns, ts_xmit_ns)
        # a further device's event (stacked devices) gives the latest handoff; the
        # first queueing (leaving TCP) stands
        st.update({k: v for k, v in got.items() if k not in st or k.startswith("ts_xmit") or k == "qdisc_wait_ns"})
        if "ts_txdone_last_ns" in got:
            st["_done"] = True

    def on_tx_done(self, sk: int, end_seq: int, reason: int, ts_done_ns: int, now_ns: int) -> None:
        st = self._entry(sk, end_seq, now_ns)
        if reason == NS_TXC_COMPLETED and ts_done_ns:
            st["ts_txdone_last_ns"] = ts_done_ns
        else:
            st["ts_txdone_last_ns"] = None
            st["ts_txdone_last_ns:null"] = _TXDONE_NULL.get(reason, R_NOT_TIMED)
        st["_done"] = True

    def get(self, sk: int, end_seq: int) -> dict | None:
        return self._by_end.get((sk, end_seq))

    def pop(self, sk: int, end_seq: int) -> dict | None:
        return self._by_end.pop((sk, end_seq), None)

    def prune(self, now_ns: int) -> None:
        old = [k for k, v in self._by_end.items() if now_ns - v["_added"] > 4 * HOLD_NS]
        for k in old:
            del self._by_end[k]


# ---------------------------------------------------------------- sub-component inputs

# struct ns_sched / struct ns_window (probes/events.h), checked against the ctypes
# mirrors in tests/unit/test_agent_netrows.py
NS_SCHED = struct.Struct("<QQQQQII")
NS_WINDOW = struct.Struct("<IIIIIIIIIiiI")
NS_SCHED_F_TRACKED, NS_SCHED_F_NOT_LOADED = 0x01, 0x80
NS_WIN_F_VALID, NS_WIN_F_NOT_LOADED = 0x01, 0x80

R_NO_SCHED = "no scheduler record for the receive that took the last byte"
R_SCHED_UNTRACKED = "the reading thread's scheduling was not followed before that receive (its first one seen)"
R_NO_READY = "no data-ready or recv exit time for this message end"
R_RUNQ_MIXED = ("the reading thread was switched out and in again after data-ready, its latest wake-up "
                "before it: the run-queue share after data-ready cannot be isolated")
R_SCHED_AFTER_EXIT = "the reading thread was switched out and in again between the recv's exit and the scheduler read"
R_NO_WINDOW = "no window record for the send that wrote the last byte"
R_WINDOW_NOT_READ = "the window state could not be read"
R_NO_LEFT_TCP = "no time at which the end left TCP (no queueing or driver handoff on record)"


def _after(a: int, b: int) -> bool:
    """TCP sequence a is at or after b (mod 2**32)."""
    return ((a - b) & MASK32) < (1 << 31)


class SchedHistory:
    """Per thread, the scheduler counters at its previous traced receive: with them a
    receive's counters tell the run-queue time since then (see sock_wait_split)."""

    MAX_THREADS = 65536

    def __init__(self):
        self._prev: dict[int, tuple[int, int, int]] = {}   # tid -> (exit ts, runq_ns, nr_switch_in)

    def snapshot(self, tid: int, exit_ts_ns: int, body: bytes) -> tuple | None:
        """A receive's SCHED item -> (ts_wakeup, ts_switch_in, runq_ns, nr_switch_in, ts_tracked,
        flags, previous (exit ts, runq_ns, nr_switch_in) of the thread or None)."""
        if len(body) < NS_SCHED.size:
            return None
        wake, sw_in, _oncpu, runq, tracked, nr, flags = NS_SCHED.unpack_from(body)
        prev = self._prev.get(tid)
        if flags & NS_SCHED_F_TRACKED:
            if len(self._prev) >= self.MAX_THREADS and tid not in self._prev:
                self._prev.clear()   # threads come and go; a lost history only costs exactness once
            self._prev[tid] = (exit_ts_ns, runq, nr)
        return (wake, sw_in, runq, nr, tracked, flags, prev)


def sock_wait_split(ts_data_ready_ns: int | None, ts_recv_exit_ns: int | None, sched: tuple | None) -> dict:
    """runq_wait_ns + busy_wait_ns = sock_wait (data-ready D -> exit R of the recv that
    consumed the message's last byte), from the reading thread's scheduler record read
    at R (SchedHistory.snapshot): its latest wake-up W and switch-in S, its cumulative
    run-queue time and switch-in count, and the same counters at its previous traced
    receive exit R0.

    - S < D (or no switch-in since tracking began before D): the thread was on a CPU
      from S through R without a break (a switch-out would need a later switch-in):
      runq_wait = 0, busy_wait = R - D. Exact.
    - S >= D, R0 <= D and exactly one switch-in since R0: the one run-queue period
      completed since R0 ended at S and lasted the run-queue counter's increase Q;
      its part after D is runq_wait = min(Q, S - D). Exact.
    - S >= D otherwise, and D <= W <= S: runq_wait = S - W, from the wake-up after
      data-ready to the switch-in (measured); run-queue time of earlier preemptions
      between D and W is not separable and stays in busy_wait (a lower bound).
    - else (or S after R: the record was read after a later switch-in) null, with the reason.
    busy_wait = sock_wait - runq_wait: the thread ran, or slept waiting on something
    else (other connections, the app), while the data waited."""
    if ts_data_ready_ns is None or ts_recv_exit_ns is None:
        return _nulls(("runq_wait_ns", "busy_wait_ns"), R_NO_READY)
    if sched is None:
        return _nulls(("runq_wait_ns", "busy_wait_ns"), R_NO_SCHED)
    wake, sw_in, runq, nr, tracked, flags, prev = sched
    if flags & NS_SCHED_F_NOT_LOADED:
        return _nulls(("runq_wait_ns", "busy_wait_ns"), R_NOT_LOADED)
    if not flags & NS_SCHED_F_TRACKED:
        return _nulls(("runq_wait_ns", "busy_wait_ns"), R_SCHED_UNTRACKED)
    d, r = ts_data_ready_ns, ts_recv_exit_ns
    sock = r - d
    if sw_in > r:
        # preempted between the exit's timestamp and the record's read: the counters
        # describe a later run-queue period, not the one before the exit
        return _nulls(("runq_wait_ns", "busy_wait_ns"), R_SCHED_AFTER_EXIT)
    if (sw_in and sw_in < d) or (not sw_in and tracked <= d):
        runq_wait = 0
    elif prev is not None and prev[0] <= d and nr - prev[2] == 1:
        runq_wait = min(runq - prev[1], sw_in - d)
    elif d <= wake <= sw_in:
        runq_wait = sw_in - wake
    else:
        return _nulls(("runq_wait_ns", "busy_wait_ns"), R_RUNQ_MIXED)
    return {"runq_wait_ns": runq_wait, "busy_wait_ns": sock - runq_wait}


def window_split(end_seq: int, ts_send_exit_ns: int | None, window: bytes | None, tx_stages: dict) -> dict:
    """cwnd_wait_ns / rwnd_wait_ns of a message end: how long TCP held its last byte
    back for the congestion window / the peer's receive window.

    Measured: the window state of the socket at the exit E of the send that wrote the
    last byte (one read, probes/rings.bpf.h ns_window_state) and the time T at which
    the skb carrying that byte left TCP (its net_dev_queue; the driver handoff when no
    queueing was seen, then any qdisc time is in it too).
    - snd_nxt at E is past end_seq: the end had left TCP inside the syscall (TCP does
      not wait on windows there: it sends what they allow and returns): both 0. Exact.
    - else the end was held from E to T. Inferred: the limit in force at E is taken as
      the cause of the whole hold (ACKs in between may have changed which one binds;
      the state is read once): the end lies beyond the peer's advertised window
      (end_seq - snd_una > snd_wnd) -> rwnd_wait = T - E; else packets_out >= snd_cwnd
      -> cwnd_wait = T - E; else neither window held it (Nagle/autocork, small-queue
      limits, pacing): both 0 and the hold stays in stack_tx.
    Null, with the reason, when the window record or T is missing."""
    cols = ("cwnd_wait_ns", "rwnd_wait_ns")
    if window is None or ts_send_exit_ns is None or len(window) < NS_WINDOW.size:
        return _nulls(cols, R_NO_WINDOW)
    (cwnd, _ssthresh, packets_out, _retrans_out, snd_wnd, snd_una, snd_nxt, _write_seq, _mss,
     _wmem, _sndbuf, flags) = NS_WINDOW.unpack_from(window)
    if flags & NS_WIN_F_NOT_LOADED:
        return _nulls(cols, R_NOT_LOADED)
    if not flags & NS_WIN_F_VALID:
        return _nulls(cols, R_WINDOW_NOT_READ)
    if _after(snd_nxt, end_seq):
        return {"cwnd_wait_ns": 0, "rwnd_wait_ns": 0}
    left = tx_stages.get("_ts_queue_ns") or tx_stages.get("ts_xmit_last_ns")
    if not left:
        return _nulls(cols, R_NO_LEFT_TCP)
    held = left - ts_send_exit_ns
    if ((end_seq - snd_una) & MASK32) > snd_wnd:
        return {"cwnd_wait_ns": 0, "rwnd_wait_ns": held}
    if packets_out >= cwnd:
        return {"cwnd_wait_ns": held, "rwnd_wait_ns": 0}
    return {"cwnd_wait_ns": 0, "rwnd_wait_ns": 0}


def _nulls(cols, why: str) -> dict:
    out: dict = {}
    for c in cols:
        out[c] = None
        out[c + ":null"] = why
    return out


# ---------------------------------------------------------------- connections

_TCP_STATE = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING",
              12: "NEW_SYN_RECV"}
TCP_ESTABLISHED, TCP_SYN_SENT, TCP_SYN_RECV, TCP_CLOSE = 1, 2, 3, 7
NS_CALL_CONNECT, NS_CALL_ACCEPT = 1, 2
NS_CONN_F_ISN, NS_CONN_F_TGID = 1, 2


class Connections:
    """Connection life-cycles -> rows of the `connections` table (records.CONNECTIONS_SCHEMA).
    emit(netns inode, row) gets a row when the connection closes, or at the end."""

    def __init__(self, emit: Callable[[int, dict], None], host_of: Callable[[int], str]):
        self.emit = emit
        self.host_of = host_of
        self._open: OrderedDict[tuple, dict] = OrderedDict()   # (netns, sk) -> row in progress, oldest first
        self._est_of: OrderedDict[tuple, int] = OrderedDict()  # (local, remote) -> ESTABLISHED ts
        self._est_closed: deque = deque()     # (close ts, (local, remote), its ESTABLISHED ts)
        # rows written out open, ESTABLISHED times dropped, beyond CONNS_MAX
        self.counters = {"rows_evicted": 0, "established_evicted": 0}

    def _row(self, netns: int, sk: int) -> dict:
        r = self._open.get((netns, sk))
        if r is None:
            if len(self._open) >= CONNS_MAX:
                self.counters["rows_evicted"] += 1
                self._flush(*next(iter(self._open)))   # the oldest, as at the end: without its close
            r = self._open[(netns, sk)] = {"netns_ino": netns, "role": "unknown", "retransmits": 0,
                                           "retransmit_failures": 0, "_states": []}
        return r

    @staticmethod
    def _tuple(r: dict, family: int, saddr: bytes, daddr: bytes, sport: int, dport: int) -> None:
        # a local port of 0 never replaces a known one: at TCP_CLOSE the kernel has
        # released it (the event says 0; closed rows had local port 0 and a conn_id no
        # message row has)
        if (sport or dport) and (sport or "local_ip" not in r):
            r.update(local_ip=addr_text(family, bytes(saddr)), local_port=sport,
                     remote_ip=addr_text(family, bytes(daddr)), remote_port=dport)

    def on_call(self, ev) -> None:
        if not ev.sk:
            return
        r = self._row(ev.netns_ino, ev.sk)
        r["pid"] = ev.tgid
        self._tuple(r, ev.family, ev.saddr, ev.daddr, ev.sport, ev.dport)
        if ev.call == NS_CALL_CONNECT:
            r.update(role="connect", ts_connect_enter_ns=ev.ts_enter_ns, ts_connect_exit_ns=ev.ts_exit_ns,
                     connect_ret=ev.ret)
        elif ev.call == NS_CALL_ACCEPT:
            r.update(role="accept", ts_accept_enter_ns=ev.ts_enter_ns, ts_accept_exit_ns=ev.ts_exit_ns)

    def on_state(self, ev) -> None:
        r = self._row(ev.netns_ino, ev.sk)
        self._tuple(r, ev.family, ev.saddr, ev.daddr, ev.sport, ev.dport)
        if ev.flags & NS_CONN_F_TGID and ev.tgid:
            r.setdefault("pid", ev.tgid)
        if ev.flags & NS_CONN_F_ISN:
            r.update(isn_local=ev.isn_local, isn_remote=ev.isn_remote)
        r["_states"].append(f"{_TCP_STATE.get(ev.newstate, ev.newstate)}@{ev.ts_ns}")
        if ev.newstate == TCP_SYN_SENT:
            r["ts_syn_sent_ns"] = ev.ts_ns
        elif ev.newstate == TCP_SYN_RECV:
            r["ts_syn_recv_ns"] = ev.ts_ns
        elif ev.newstate == TCP_ESTABLISHED:
            r["ts_established_ns"] = ev.ts_ns
            if "local_ip" in r:
                self.counters["established_evicted"] += put_newest(self._est_of, _ends_of(r), ev.ts_ns,
                                                                   CONNS_MAX)
        elif ev.newstate == TCP_CLOSE:
            r["ts_close_ns"] = ev.ts_ns
            if "ts_established_ns" in r and "local_ip" in r:
                self._est_closed.append((ev.ts_ns, _ends_of(r), r["ts_established_ns"]))
            self._flush(ev.netns_ino, ev.sk)
        closed = self._est_closed
        while closed and closed[0][0] < ev.ts_ns - ESTABLISHED_KEEP_NS:
            _, ends, est = closed.popleft()
            if self._est_of.get(ends) == est:   # not a later connection on the same ports
                del self._est_of[ends]

    def on_retransmit(self, ev) -> None:
        r = self._row(ev.netns_ino, ev.sk)
        self._tuple(r, ev.family, ev.saddr, ev.daddr, ev.sport, ev.dport)
        r["retransmits"] += 1
        if ev.err:
            r["retransmit_failures"] += 1

    def established_ns(self, local, remote) -> int | None:
        """When the connection local -> remote was established (kept ESTABLISHED_KEEP_NS
        after its close), or None."""
        return self._est_of.get((local, remote))

    def _flush(self, netns: int, sk: int) -> None:
        r = self._open.pop((netns, sk))
        states = r.pop("_states")
        r["states"] = ",".join(states)
        if "local_ip" in r:
            known = "isn_local" in r
            r["conn_id"] = conn_id_of((r["local_ip"], r["local_port"]), (r["remote_ip"], r["remote_port"]),
                                      r.get("isn_local", 0), r.get("isn_remote", 0), known)[0]
        est = r.get("ts_established_ns")
        start = r.get("ts_connect_enter_ns") or r.get("ts_syn_sent_ns")
        if est and start:
            r["handshake_ns"] = est - start
        if est and r.get("ts_accept_exit_ns"):
            r["accept_wait_ns"] = r["ts_accept_exit_ns"] - est
        r["host_id"] = self.host_of(netns)
        self.emit(netns, r)

    def close(self) -> None:
        for netns, sk in list(self._open):
            self._flush(netns, sk)


def _ends_of(r: dict) -> tuple:
    """(local, remote) endpoints of a connection row."""
    return (r["local_ip"], r["local_port"]), (r["remote_ip"], r["remote_port"])
