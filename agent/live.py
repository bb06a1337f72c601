"""Live aggregates of one agent: what `pslat top` and the /metrics endpoint show.

    live = LiveAggregates()
    pipeline.live = live             # Pipeline feeds every emitted row, watermark and counter tick
    live.snapshot()                  # JSON-able; merge_snapshots() joins several agents' ones

Live views show each host's own components (DESIGN.md): a host pairs the two
message ends it sees itself, by their request ids (parsers/protocol.py):
- as a client (it sent the request): its request's tx row and the response's
  rx row -> client_user_tx, client_kernel_tx, client_nic_tx,
  network_and_remote (everything between its NIC and its NIC again: wires and
  the server), client_nic_rx, client_kernel_rx, client_user_rx;
- as a server (it received the request): the request's rx row and the
  response's tx row -> server_nic_rx, server_kernel_rx, server_user,
  server_kernel_tx, server_nic_tx.
A null stage (veth has no NIC times) joins its two neighbours as in
reports.components: NIC-only joins fold into network_and_remote, any other
join is `unsplit` (never given to one side). The split of a request across
hosts is `pslat report`'s job, not this one's.

Histograms are counts over fixed log-spaced buckets (12 per decade, 1 us to
10 s: neighbouring edges 21% apart, so a quantile read from them, here or by
Prometheus's histogram_quantile, is within 21% of the true one), so the
snapshots of several agents merge by adding counts. The window
of the live view is the last WINDOW_S seconds of the rows' own times
(CLOCK_MONOTONIC of the host), advanced by the agent's watermarks so a quiet
job ages out; /metrics keeps totals since start.
"""
from __future__ import annotations

import bisect
import os
import threading
import time
from collections import Counter, OrderedDict, deque
from typing import Any, Iterable

from agent.bounded import CONN_IDLE_NS, CONNS_MAX, put_newest
from agent.records import service_port
from parsers.protocol import PAIR_CONNECTION

WINDOW_S = 10
PER_DECADE = 12
# bucket upper edges in ns: 1 us * 10^(i/12), i = 0..84 (1 us .. 10 s); one overflow bucket above
EDGES_NS = [round(1000 * 10 ** (i / PER_DECADE)) for i in range(7 * PER_DECADE + 1)]
N_BUCKETS = len(EDGES_NS) + 1
PENDING_MAX = 200_000        # unpaired request ends kept at most (a bound, not a tuning knob)
PENDING_TTL_NS = 10 * 10**9  # a request unanswered this long is dropped from pairing
# Connections counted as open (bounded: DESIGN.md "What the agent trusts"): at most
# agent.bounded.CONNS_MAX per host (the least recently active evicted), dropped when their close row
# comes or idle for CONN_IDLE_NS (agent.streams' expiry: the decoder forgot them too).
# A closed id is kept CLOSED_KEEP_NS so its message rows, which may come after the
# close row (held up to agent.netrows.HOLD_NS), do not count it open again.
CLOSED_KEEP_NS = 60 * 10**9
CLOSED_MAX = 65_536
TOP_KEYS = 10

CLIENT_POINTS = [("q", "ts_framework_ns"), ("q", "ts_send_first_enter_ns"), ("q", "ts_xmit_last_ns"),
                 ("q", "ts_txdone_last_ns"), ("p", "ts_nic_rx_last_ns"), ("p", "ts_netif_rx_last_ns"),
                 ("p", "ts_recv_last_exit_ns"), ("p", "ts_framework_ns")]
CLIENT_COMPONENTS = ["client_user_tx", "client_kernel_tx", "client_nic_tx", "network_and_remote",
                     "client_nic_rx", "client_kernel_rx", "client_user_rx"]
SERVER_POINTS = [("q", "ts_nic_rx_last_ns"), ("q", "ts_netif_rx_last_ns"), ("q", "ts_recv_last_exit_ns"),
                 ("p", "ts_send_first_enter_ns"), ("p", "ts_xmit_last_ns"), ("p", "ts_txdone_last_ns")]
SERVER_COMPONENTS = ["server_nic_rx", "server_kernel_rx", "server_user", "server_kernel_tx", "server_nic_tx"]
UNSPLIT = "unsplit"
NIC_OR_NET = {"client_nic_tx", "network_and_remote", "client_nic_rx"}
GROUP_OF = {**{c: "host" for c in CLIENT_COMPONENTS + SERVER_COMPONENTS if "_nic_" not in c},
            **{c: "nic" for c in CLIENT_COMPONENTS + SERVER_COMPONENTS if "_nic_" in c},
            "network_and_remote": "network_and_remote", UNSPLIT: UNSPLIT}
GROUPS = ["host", "nic", "network_and_remote", UNSPLIT]
# sub-components (reported beside their parent, not part of the sum)
SUBS = {"client_kernel_rx": ["client_stack_rx", "client_sock_wait", "client_runq_wait", "client_busy_wait"],
        "server_kernel_rx": ["server_stack_rx", "server_sock_wait", "server_runq_wait", "server_busy_wait"],
        "client_kernel_tx": ["client_cwnd_wait", "client_rwnd_wait", "client_qdisc_wait"],
        "server_kernel_tx": ["server_cwnd_wait", "server_rwnd_wait", "server_qdisc_wait"],
        "client_user_tx": ["client_connect_wait"],
        "server_user": ["server_framework_rx", "server_app", "server_framework_tx"]}
# the component (or sub-component) each sub-component lies inside: runq and busy waits are the two
# parts of sock_wait, the rest lie directly in the SUBS parent; those of one parent add up to at most it
PARENT_OF = {sub: f"{sub.split('_')[0]}_sock_wait" if sub.endswith(("_runq_wait", "_busy_wait")) else parent
             for parent, subs in SUBS.items() for sub in subs}
DATA_OPS = ("push", "pull", "pushpull", "simple", "rpc", "unknown")


def bucket_of(v_ns: int) -> int:
    return bisect.bisect_left(EDGES_NS, v_ns)


def quantile_ns(counts: dict[int, int], q: float) -> float | None:
    """The q-quantile of a bucketed histogram, interpolated log-linearly inside its bucket."""
    n = sum(counts.values())
    if n == 0:
        return None
    want, seen = q * n, 0
    for i in sorted(counts):
        c = counts[i]
        if seen + c >= want and c > 0:
            if i >= len(EDGES_NS):
                return float(EDGES_NS[-1])      # above the last edge: say "> 10 s" as 10 s
            hi = EDGES_NS[i]
            lo = EDGES_NS[i - 1] if i > 0 else 0
            f = (want - seen) / c
            return lo + (hi - lo) * f if lo == 0 else lo * (hi / lo) ** f
        seen += c
    return float(EDGES_NS[-1])


class Hist:
    __slots__ = ("counts", "n", "sum_ns", "negative")

    def __init__(self):
        self.counts: dict[int, int] = {}
        self.n = 0
        self.sum_ns = 0
        self.negative = 0   # clock error inside one host would show here (kept in the sum, counted)

    def add(self, v_ns: int) -> None:
        b = bucket_of(v_ns)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.n += 1
        self.sum_ns += v_ns
        self.negative += v_ns < 0

    def merge(self, d: dict) -> None:
        for i, c in d["counts"]:
            self.counts[int(i)] = self.counts.get(int(i), 0) + int(c)
        self.n += d["n"]
        self.sum_ns += d["sum_ns"]
        self.negative += d.get("negative", 0)

    def to_json(self) -> dict:
        return {"counts": sorted([i, c] for i, c in self.counts.items()), "n": self.n,
                "sum_ns": self.sum_ns, "negative": self.negative}


def components_of(role: str, q: dict, p: dict) -> tuple[dict[str, int], int | None]:
    """({component: ns}, end-to-end ns) of one request as seen on one host (module docstring)."""
    points, names = (CLIENT_POINTS, CLIENT_COMPONENTS) if role == "client" else (SERVER_POINTS, SERVER_COMPONENTS)
    rows = {"q": q, "p": p}
    present = [(k, rows[side].get(col)) for k, (side, col) in enumerate(points)]
    present = [(k, int(v)) for k, v in present if v is not None]
    out: dict[str, int] = {}
    for (i, a), (j, b) in zip(present, present[1:]):
        covered = names[i:j]
        name = covered[0] if len(covered) == 1 else (
            "network_and_remote" if set(covered) <= NIC_OR_NET else UNSPLIT)
        out[name] = out.get(name, 0) + (b - a)
    e2e = present[-1][1] - present[0][1] if len(present) >= 2 else None
    _subs(role, q, p, out)
    return out, e2e


def _diff(a, b):
    return None if a is None or b is None else int(b) - int(a)


def _subs(role: str, q: dict, p: dict, out: dict[str, int]) -> None:
    # rx row: the message received on this host; tx row: the one it sent
    rx, tx = (p, q) if role == "client" else (q, p)
    side = role
    if f"{side}_kernel_rx" in out:
        for name, v in ((f"{side}_stack_rx", _diff(rx.get("ts_netif_rx_last_ns"), rx.get("ts_data_ready_ns"))),
                        (f"{side}_sock_wait", _diff(rx.get("ts_data_ready_ns"), rx.get("ts_recv_last_exit_ns"))),
                        (f"{side}_runq_wait", rx.get("runq_wait_ns")), (f"{side}_busy_wait", rx.get("busy_wait_ns"))):
            if v is not None:
                out[name] = int(v)
    if f"{side}_kernel_tx" in out:
        for w in ("cwnd", "rwnd", "qdisc"):
            v = tx.get(f"{w}_wait_ns")
            if v is not None:
                out[f"{side}_{w}_wait"] = int(v)
    if role == "client" and "client_user_tx" in out and q.get("connect_wait_ns") is not None:
        out["client_connect_wait"] = int(q["connect_wait_ns"])
    if role == "server" and "server_user" in out:
        handover, call = q.get("ts_framework_ns"), p.get("ts_framework_ns")
        if handover is not None and call is not None:
            out["server_framework_rx"] = int(handover) - int(q["ts_recv_last_exit_ns"])
            out["server_app"] = int(call) - int(handover)
            out["server_framework_tx"] = int(p["ts_send_first_enter_ns"]) - int(call)


def _start_ns(row: dict) -> int | None:
    for c in ("ts_framework_ns", "ts_send_first_enter_ns", "ts_nic_rx_last_ns", "ts_netif_rx_last_ns",
              "ts_data_ready_ns", "ts_recv_last_exit_ns"):
        if row.get(c) is not None:
            return int(row[c])
    return None


class _Slot:
    """One second of the live window."""

    def __init__(self):
        self.groups: dict[tuple, dict[str, Hist]] = {}   # (host, role, op, peer) -> {"e2e"|component: Hist}
        self.keys: dict[str, Counter] = {}               # host -> key -> sampled occurrences
        self.opened: Counter = Counter()                 # host -> connections first seen
        self.closed: Counter = Counter()


def cpu_seconds_self() -> float:
    """utime + stime of this process from /proc/self/stat (all its threads)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


THREADS_SHOWN = 8   # thread names kept per host's unrecognised traffic


class UnrecognisedTally:
    """One host's traffic no parser recognised: connections, bytes, the service ports
    they went to and the thread names that moved them."""

    def __init__(self):
        self.connections = 0
        self.bytes = 0
        self.ports: Counter = Counter()   # service port -> bytes
        self.threads: set[str] = set()

    def add(self, local_port: int, remote_port: int, threads: Iterable[str], moved: int) -> None:
        self.connections += 1
        self.bytes += moved
        self.ports[service_port(local_port, remote_port)] += moved
        for t in threads:
            if len(self.threads) < THREADS_SHOWN:
                self.threads.add(t)

    def merged(self, other: "UnrecognisedTally") -> "UnrecognisedTally":
        out = UnrecognisedTally()
        for t in (self, other):
            out.connections += t.connections
            out.bytes += t.bytes
            out.ports.update(t.ports)
            out.threads |= set(sorted(t.threads)[:THREADS_SHOWN - len(out.threads)])
        return out

    def to_json(self) -> dict[str, Any]:
        port = self.ports.most_common(1)
        return {"connections": self.connections, "bytes": self.bytes, "port": port[0][0] if port else None,
                "threads": sorted(self.threads)}


class LiveAggregates:
    def __init__(self, window_s: int = WINDOW_S, agent: str | None = None):
        self.window_s = window_s
        self.agent = agent or os.uname().nodename
        self.lock = threading.Lock()
        self.slots: dict[int, _Slot] = {}
        self.now_s: int | None = None               # the window's end (seconds of the rows' clock)
        self.pending: dict[tuple, tuple[dict, int]] = {}
        self.pending_order: deque = deque()
        self.totals: dict[tuple, dict[str, Hist]] = {}   # since start, for /metrics: "e2e" and components
        self.group_totals: dict[tuple, dict[str, Hist]] = {}   # the same keys: {GROUPS name: Hist}, a sum per request
        self.messages: Counter = Counter()          # (host, direction, op) -> rows
        self.unpaired_expired = 0
        self.ip_hosts: dict[str, str] = {}
        self.conns: dict[str, OrderedDict[str, int]] = {}  # host -> conn_id -> last seen ns (oldest first)
        self.closed_ids: OrderedDict[str, int] = OrderedDict()   # conn_id -> its close row's ts_close_ns
        self.bounded = Counter()                    # conns_evicted, conns_idle_expired, closed_ids_evicted
        self.opened_total: Counter = Counter()
        self.closed_total: Counter = Counter()
        self.connects: Counter = Counter()
        self.accepts: Counter = Counter()
        self.handshake: dict[str, Hist] = {}
        self.probes: dict[str, dict[str, int]] = {}
        self.sampling_rate = 1.0                    # share of host pairs traced (agent.shedding sets it)
        self.started = time.monotonic()
        self._rate_mark: tuple[float, int, float] | None = None  # (wall, events, cpu) at the last tick
        self.events_total = 0
        self.events_per_s: float | None = None
        self.cpu_pct: float | None = None
        self.unrecognised: dict[str, dict[str, Any]] = {}   # host -> UnrecognisedTally.to_json()

    # -- feeding (the pipeline's thread) --------------------------------------------
    def on_unrecognised(self, by_host: dict[str, dict[str, Any]]) -> None:
        """Every host's traffic no parser recognised so far (open and closed connections)."""
        with self.lock:
            self.unrecognised = dict(by_host)

    def _slot(self, ts_ns: int) -> _Slot | None:
        s = ts_ns // 10**9
        if self.now_s is None or s > self.now_s:
            self._advance_to(s)
        if s <= self.now_s - self.window_s:
            return None
        slot = self.slots.get(s)
        if slot is None:
            slot = self.slots[s] = _Slot()
        return slot

    def _advance_to(self, s: int) -> None:
        self.now_s = s
        for old in [k for k in self.slots if k <= s - self.window_s]:
            del self.slots[old]

    def advance(self, watermark_ns: int) -> None:
        """Time passed with nothing to show: the window moves on (a quiet job ages out)."""
        with self.lock:
            if self.now_s is None or watermark_ns // 10**9 > self.now_s:
                self._advance_to(watermark_ns // 10**9)
            self._expire_conns(watermark_ns)
            while self.pending_order and self.pending_order[0][0] < watermark_ns - PENDING_TTL_NS:
                _, key = self.pending_order.popleft()
                if self.pending.get(key, (None, None))[1] is not None and \
                        self.pending[key][1] < watermark_ns - PENDING_TTL_NS:
                    del self.pending[key]
                    self.unpaired_expired += 1

    def _expire_conns(self, now_ns: int) -> None:
        closed = self.closed_ids
        while closed:
            cid = next(iter(closed))
            if closed[cid] >= now_ns - CLOSED_KEEP_NS:
                break
            del closed[cid]
        for conns in self.conns.values():
            while conns:
                cid = next(iter(conns))
                if conns[cid] >= now_ns - CONN_IDLE_NS:
                    break
                del conns[cid]
                self.bounded["conns_idle_expired"] += 1

    def on_message(self, row: dict) -> None:
        with self.lock:
            self._on_message(row)

    def _on_message(self, row: dict) -> None:
        host, op = row.get("host_id"), row.get("op")
        self.messages[(host, row.get("direction"), op)] += 1
        if row.get("local_ip"):
            self.ip_hosts[row["local_ip"]] = host
        ts = _start_ns(row)
        if ts is None:
            return
        slot = self._slot(ts)
        cid = row.get("conn_id")
        if cid and cid not in self.closed_ids:
            conns = self.conns.get(host)
            if conns is None:
                conns = self.conns[host] = OrderedDict()
            seen = conns.get(cid)
            if seen is None:
                self.opened_total[host] += 1
                if slot is not None:
                    slot.opened[host] += 1
            # the most recently active now (rows of one connection come out of order: the latest time)
            self.bounded["conns_evicted"] += put_newest(conns, cid, ts if seen is None else max(seen, ts),
                                                        CONNS_MAX)
        if row.get("control") or op not in DATA_OPS:
            return
        if slot is not None and row.get("key_sample") and row.get("request"):
            slot.keys.setdefault(host, Counter()).update(int(k) for k in row["key_sample"])
        request, tx = bool(row.get("request")), row.get("direction") == "tx"
        role = "client" if request == tx else "server"
        if row.get("pair_scope") == PAIR_CONNECTION:
            worker = server = row.get("conn_id")   # its ends are the connection's
        else:
            worker, server = (row.get("sender"), row.get("recver")) if request else (row.get("recver"), row.get("sender"))
        key = (host, role, row.get("protocol"), row.get("call_space"), row.get("call_id"), worker, server)
        # the two ends come in either order (the correlator emits a row when its stages are
        # complete, and a tx row waits longer for its NIC times than an rx row)
        got = self.pending.pop(key, None)
        if got is None or bool(got[0].get("request")) == request:
            if len(self.pending) >= PENDING_MAX:
                self.unpaired_expired += 1
                return
            self.pending[key] = (row, ts)
            self.pending_order.append((ts, key))
            return
        (q, q_ts), p = (got, row) if not request else ((row, ts), got[0])
        comps, e2e = components_of(role, q, p)
        if e2e is None:
            return
        gkey = (host, role, q.get("op"), q.get("remote_ip") or "?")
        qslot = self._slot(q_ts)
        for target in ([self.totals] + ([qslot.groups] if qslot is not None else [])):
            hs = target.setdefault(gkey, {})
            hs.setdefault("e2e", Hist()).add(e2e)
            for c, v in comps.items():
                hs.setdefault(c, Hist()).add(v)
        by_group: dict[str, int] = {}
        for c, v in comps.items():
            if c in GROUP_OF:   # a chain component (sub-components lie inside one)
                by_group[GROUP_OF[c]] = by_group.get(GROUP_OF[c], 0) + v
        hs = self.group_totals.setdefault(gkey, {})
        for grp, v in by_group.items():
            hs.setdefault(grp, Hist()).add(v)

    def on_connection(self, row: dict) -> None:
        with self.lock:
            host, cid = row.get("host_id"), row.get("conn_id")
            if row.get("role") == "connect":
                self.connects[host] += 1
            elif row.get("role") == "accept":
                self.accepts[host] += 1
            if row.get("handshake_ns") is not None:
                self.handshake.setdefault(host, Hist()).add(int(row["handshake_ns"]))
            if row.get("ts_close_ns") is None:
                return   # still open at the agent's end
            self.closed_total[host] += 1
            if cid:
                self.bounded["closed_ids_evicted"] += put_newest(self.closed_ids, cid, int(row["ts_close_ns"]),
                                                                 CLOSED_MAX)
                self.conns.get(host, {}).pop(cid, None)
            slot = self._slot(int(row["ts_close_ns"]))
            if slot is not None:
                slot.closed[host] += 1

    def tick(self, probe_counters: dict[str, dict[str, int]], events_total: int) -> None:
        """Once a second from the agent loop: probe counters and the rates of the agent itself."""
        now, cpu = time.monotonic(), cpu_seconds_self()
        with self.lock:
            self.probes = {p: dict(c) for p, c in probe_counters.items()}
            self.events_total = events_total
            if self._rate_mark is not None:
                dt = now - self._rate_mark[0]
                if dt > 0:
                    self.events_per_s = (events_total - self._rate_mark[1]) / dt
                    self.cpu_pct = 100.0 * (cpu - self._rate_mark[2]) / dt
            self._rate_mark = (now, events_total, cpu)

    # -- reading (any thread) ----------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return self._snapshot()

    def _span_s(self) -> int:
        if not self.slots:
            return self.window_s
        return max(1, min(self.window_s, self.now_s - min(self.slots) + 1))

    def _snapshot(self) -> dict[str, Any]:
        span = self._span_s()
        groups: dict[tuple, dict[str, Hist]] = {}
        keys: dict[str, Counter] = {}
        opened, closed = Counter(), Counter()
        for slot in self.slots.values():
            for g, hs in slot.groups.items():
                acc = groups.setdefault(g, {})
                for c, h in hs.items():
                    acc.setdefault(c, Hist()).merge(h.to_json())
            for h, cnt in slot.keys.items():
                keys.setdefault(h, Counter()).update(cnt)
            opened.update(slot.opened)
            closed.update(slot.closed)
        hosts = sorted({h for h, *_ in self.messages} | set(self.conns))
        return {
            "format": "pslat-live/1",
            "window_s": span,
            "edges_ns": EDGES_NS,
            "groups": [{"host": h, "role": r, "op": op, "peer": peer, "requests": hs["e2e"].n,
                        "rate_per_s": hs["e2e"].n / span,
                        "hists": {c: x.to_json() for c, x in sorted(hs.items())}}
                       for (h, r, op, peer), hs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0])))],
            "keys": {h: {"sampled": sum(c.values()), "top": [[str(k), n] for k, n in c.most_common(TOP_KEYS)]}
                     for h, c in sorted(keys.items())},
            "connections": {h: {"open": len(self.conns.get(h, {})), "opened_per_s": opened[h] / span,
                                "closed_per_s": closed[h] / span, "opened_total": self.opened_total[h],
                                "closed_total": self.closed_total[h], "connects": self.connects[h],
                                "accepts": self.accepts[h]} for h in hosts},
            "ip_hosts": dict(sorted(self.ip_hosts.items())),
            "unrecognised": dict(sorted(self.unrecognised.items())),
            "agents": [self._health()],
        }

    def _health(self) -> dict[str, Any]:
        return {"agent": self.agent, "uptime_s": round(time.monotonic() - self.started, 1),
                "events_total": self.events_total, "events_per_s": self.events_per_s,
                "lost": {p: int(c.get("lost", 0)) for p, c in sorted(self.probes.items())},
                "cpu_pct": self.cpu_pct, "sampling_rate": self.sampling_rate,
                "pending_requests": len(self.pending), "unpaired_expired": self.unpaired_expired,
                "messages": sum(self.messages.values())}


def merge_snapshots(snaps: Iterable[dict]) -> dict[str, Any]:
    """Several agents' snapshots as one cluster view: counts and rates add, health lists join."""
    groups: dict[tuple, dict] = {}
    keys: dict[str, Counter] = {}
    sampled: Counter = Counter()
    conns: dict[str, Counter] = {}
    unrec: dict[str, dict] = {}
    out: dict[str, Any] = {"format": "pslat-live/1", "window_s": 0, "edges_ns": EDGES_NS, "ip_hosts": {},
                           "agents": []}
    for s in snaps:
        if s.get("edges_ns") != EDGES_NS:
            raise ValueError("snapshot histograms use other bucket edges (a different pslat version)")
        out["window_s"] = max(out["window_s"], s["window_s"])
        out["ip_hosts"].update(s.get("ip_hosts", {}))
        out["agents"].extend(s.get("agents", []))
        for g in s["groups"]:
            k = (g["host"], g["role"], g["op"], g["peer"])
            acc = groups.setdefault(k, {"host": k[0], "role": k[1], "op": k[2], "peer": k[3], "requests": 0,
                                        "rate_per_s": 0.0, "_h": {}})
            acc["requests"] += g["requests"]
            acc["rate_per_s"] += g["rate_per_s"]
            for c, d in g["hists"].items():
                acc["_h"].setdefault(c, Hist()).merge(d)
        for h, kd in s.get("keys", {}).items():
            keys.setdefault(h, Counter()).update({k: n for k, n in kd["top"]})
            sampled[h] += kd["sampled"]
        for h, c in s.get("connections", {}).items():
            conns.setdefault(h, Counter()).update(c)
        for h, u in s.get("unrecognised", {}).items():
            acc = unrec.setdefault(h, {"connections": 0, "bytes": 0, "port": None, "threads": [], "_top": -1})
            if u["bytes"] > acc["_top"]:
                acc["port"], acc["_top"] = u["port"], u["bytes"]
            acc["connections"] += u["connections"]
            acc["bytes"] += u["bytes"]
            acc["threads"] = sorted(set(acc["threads"]) | set(u["threads"]))[:THREADS_SHOWN]
    out["groups"] = [dict({k: v for k, v in g.items() if k != "_h"},
                          hists={c: x.to_json() for c, x in sorted(g["_h"].items())})
                     for _, g in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0])))]
    out["keys"] = {h: {"sampled": sampled[h], "top": [[k, n] for k, n in c.most_common(TOP_KEYS)]}
                   for h, c in sorted(keys.items())}
    out["connections"] = {h: dict(c) for h, c in sorted(conns.items())}
    out["unrecognised"] = {h: {k: v for k, v in u.items() if k != "_top"} for h, u in sorted(unrec.items())}
    return out
