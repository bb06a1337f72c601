"""Load shedding: which share of host pairs the agent traces, and why (DESIGN.md "Sampling").

    shedder = Shedder(fixed_rate=None, now_ns=t)          # adaptive; Shedder(0.5, t): fixed
    new_units = shedder.observe(IntervalStats(...))        # the rule below, once per interval
    loop = SheddingLoop(shedder, bpf, announce, record)    # the agent loop's side: measure,
    loop.drained(s, emptied); loop.tick(counters, consumed, now)  # write the map, announce each rate

Every rate goes out as an agent note {"sampling": {"ts_ns", "rate", "mode"}}, so
a recording replays it: SamplingRecord (the pipeline's) turns the notes into
meta["sampling"] = {"rate", "history": [[ts_ns, rate], ...], "mode",
"effective_rate", "shed"} and into the correlator's FrameworkShedJudge.

The probes keep a host pair when the 16-bit hash of its unordered address pair
is at or above the share shed (probes/common.bpf.h; probes.filters mirrors the
hash). A lower rate sheds a superset of what a higher one shed.

The adaptive rule works on the consumer's utilisation u = P / C, once per
interval: P is what the probes produced (events per second, lost ones
included), C what the consumer can take (events it consumed per second it was
busy draining: decoding and correlating happen inside the drain). Kernel
events (sockcalls, netstack) scale with the rate; framework events do not (the
uprobes see no addresses; user space drops those of unsampled pairs), so
P(r') = F + K * r'/r.
- Too much (u > U_HIGH while the rings were last emptied more than
  LAG_LIMIT_S ago, or events lost): the rate goes at once to the one whose predicted
  u is U_TARGET, but at most halves per step (at most halving on losses alone
  when the model sees no excess: a ring that overflowed was behind anyway).
  A busy consumer that still empties the rings every few seconds is not cut: on cores shared
  with the job, wall time spent draining overstates the agent's own cost
  (it is preempted), and cutting then lost requests for nothing (measured:
  the rate went to 0.1% at 100 requests/s per worker on a loaded machine).
  Framework events do not fall with the rate: when they alone exceed the
  target, no rate helps, so utilisation cuts nothing (only losses do).
- Room (no loss, u below U_TARGET at the raised rate) for CALM_INTERVALS in
  a row: the rate rises by RAISE_FACTOR (slowly: a rise that overshoots
  loses events before the next look).
- After a cut, COOLDOWN_INTERVALS go by before another cut on losses alone:
  the rings still hold the backlog of the old rate.

With a CPU budget (`pslat agent --cpu-budget CORES`), the agent's own CPU
(all its threads; the probes' in-kernel time is the job's) is kept under it as
well, whether or not the consumer keeps up: over the budget, the rate goes to
the one whose predicted CPU is BUDGET_TARGET of it (CPU taken as proportional
to the events, framework events not falling with the rate), at most halving
per look and after the same cooldown; a rise must keep the predicted CPU under
that too. When the framework events alone cost more than the budget, the rate
goes down to the least there is: the budget is the user's word.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

from probes.filters import SAMPLE_UNITS, pair_hash16, rate_of, shed_units_of

U_HIGH = 0.9             # consumer busy above this share of the time: cut
U_TARGET = 0.7           # what a cut aims at, and a rise must stay under
CALM_INTERVALS = 5
RAISE_FACTOR = 1.25
COOLDOWN_INTERVALS = 2
MIN_KEEP_UNITS = SAMPLE_UNITS // 1024     # never below 1/1024 of the host pairs
MIN_EVENTS_FOR_CAPACITY = 500             # fewer consumed events say little about C
KERNEL_PROBES = ("sockcalls", "netstack")
# Behind: the rings were last emptied longer ago than this. Not "no drain emptied them in
# the interval": a consumer on cores shared with the job can lag seconds without ever
# losing an event, and cutting then threw data away (the demo at 800 requests/s went to
# 39% of host pairs with nothing lost). Longer is too late: at 5 s the 4 MiB netstack
# ring overflowed first (1,020 events lost in the demo).
LAG_LIMIT_S = 2.0
BUDGET_TARGET = 0.8      # a CPU budget cut aims at this share of the budget, and a rise stays under it


@dataclass
class IntervalStats:
    """What one interval of the agent loop saw."""
    now_ns: int
    interval_s: float
    produced: dict[str, int]     # probe -> events produced (seen + lost) in the interval
    lost: int                    # events lost in the interval, every probe
    consumed: int                # events the consumer took
    busy_s: float                # wall seconds spent draining (decode + correlate included)
    behind: bool = True          # the rings were last emptied more than LAG_LIMIT_S ago
    cpu_s: float | None = None   # the agent process's CPU seconds (every thread) in the interval


def produced_by_probe(counters: dict[str, dict[str, int]]) -> dict[str, int]:
    """Cumulative events produced per probe, from the probes' counters."""
    out = {}
    for p, c in counters.items():
        # the kernel probes' `seen` counts delivered + lost; the framework's only submitted ones
        out[p] = int(c.get("seen", 0)) + (int(c.get("lost", 0)) if p == "framework" else 0)
    return out


class Shedder:
    """The share of host pairs kept: fixed, or adapted to the consumer (module docstring)."""

    def __init__(self, fixed_rate: float | None, now_ns: int, cpu_budget: float | None = None):
        self.mode = "adaptive" if fixed_rate is None else "fixed"
        self.cpu_budget = cpu_budget     # CPU seconds per second the agent may use (None: no budget)
        self.shed_units = 0 if fixed_rate is None else shed_units_of(fixed_rate)
        self.history: list[list] = [[int(now_ns), self.rate]]
        self._calm = 0
        self._cooldown = 0
        self.saturated_by_framework = 0   # looks at which only framework events' cost was over
        self.last_u: float | None = None

    @property
    def rate(self) -> float:
        return rate_of(self.shed_units)

    def _set(self, rate: float, now_ns: int) -> int | None:
        keep = min(SAMPLE_UNITS, max(MIN_KEEP_UNITS, round(rate * SAMPLE_UNITS)))
        units = SAMPLE_UNITS - keep
        if units == self.shed_units:
            return None
        self.shed_units = units
        self.history.append([int(now_ns), self.rate])
        return units

    def observe(self, st: IntervalStats) -> int | None:
        """One interval's figures in; the new share shed (1/SAMPLE_UNITS) when it changed."""
        if self.mode == "fixed" or st.interval_s <= 0:
            return None
        total = sum(st.produced.values())
        kernel = sum(v for p, v in st.produced.items() if p in KERNEL_PROBES)
        busy = st.busy_s / st.interval_s
        if st.consumed >= MIN_EVENTS_FOR_CAPACITY and st.busy_s > 0:
            capacity = st.consumed / st.busy_s           # events per busy second
            u = total / st.interval_s / capacity
        else:
            capacity, u = None, busy
        self.last_u = u
        if self._cooldown:
            self._cooldown -= 1
        rate = self.rate
        budget_target = self._budget_target(st, total, kernel)
        if budget_target is not None and not self._cooldown:
            self._calm = 0
            self._cooldown = COOLDOWN_INTERVALS
            return self._set(budget_target if not st.lost else min(budget_target, rate / 2), st.now_ns)
        over = u > U_HIGH and st.behind
        if over and not st.lost and capacity is not None and \
                U_TARGET * capacity * st.interval_s <= total - kernel:
            # the framework events alone fill the consumer: shedding host pairs cannot help
            # (the uprobes see no addresses; their events are dropped in user space, after
            # their cost). Cutting there only threw data away (measured: the demo's rate
            # went to 9% and the consumer stayed as busy); keep tracing, cut on losses only.
            self._calm = 0
            self.saturated_by_framework += 1
            return None
        if over or (st.lost and not self._cooldown):
            self._calm = 0
            target = rate / 2
            if over and capacity is not None and kernel > 0:
                # F + K * r'/r = U_TARGET * C  (per second)
                room = U_TARGET * capacity * st.interval_s - (total - kernel)
                target = max(rate / 2, min(rate * room / kernel, rate * 0.9))
            if st.lost:
                target = min(target, rate / 2)
            self._cooldown = COOLDOWN_INTERVALS
            return self._set(target, st.now_ns)
        if st.lost:
            self._calm = 0
            return None
        self._calm += 1
        if self._calm < CALM_INTERVALS or rate >= 1.0:
            return None
        raised = min(1.0, rate * RAISE_FACTOR)
        scale = ((total - kernel) + kernel * raised / rate) / total if total else 0.0
        if u * scale >= U_TARGET:
            return None
        if self.cpu_budget is not None and st.cpu_s is not None and \
                st.cpu_s / st.interval_s * scale > BUDGET_TARGET * self.cpu_budget:
            return None
        self._calm = 0
        return self._set(raised, st.now_ns)

    def _budget_target(self, st: IntervalStats, total: int, kernel: int) -> float | None:
        """The rate that brings the agent's CPU to BUDGET_TARGET of its budget, when over it."""
        if self.cpu_budget is None or st.cpu_s is None:
            return None
        used = st.cpu_s / st.interval_s
        if used <= self.cpu_budget:
            return None
        rate = self.rate
        if not total or not kernel:
            return rate / 2
        # cpu(r') = used * (F + K * r'/r) / total = BUDGET_TARGET * budget
        room = total * BUDGET_TARGET * self.cpu_budget / used - (total - kernel)
        return max(rate / 2, min(rate * room / kernel, rate * 0.9))


def effective_rate(history: list, end_ns: int) -> float:
    """The time-weighted mean rate from the first entry to end_ns: with steady traffic,
    recorded counts / this = the traffic's counts."""
    if not history:
        return 1.0
    start = history[0][0]
    if end_ns <= start:
        return float(history[-1][1])
    total = 0.0
    for (t, r), nxt in zip(history, history[1:] + [[end_ns, None]]):
        a, b = max(t, start), min(nxt[0], end_ns)
        if b > a:
            total += r * (b - a)
    return total / (end_ns - start)


def _time_of(change: list) -> int:
    return change[0]


class ShedUnits:
    """The share shed over time, from a Shedder's history (CLOCK_MONOTONIC ns)."""

    def __init__(self, history: list):
        self.history = history

    def between(self, t0_ns: int, t1_ns: int) -> tuple[int, int]:
        """(least, most) units shed at any time in [t0, t1]. Asked per framework record
        while shedding: the history (a change per second or so) is searched in place."""
        h = self.history
        i = max(0, bisect.bisect_right(h, t0_ns, key=_time_of) - 1)
        j = max(i, bisect.bisect_right(h, t1_ns, key=_time_of) - 1)
        units = [SAMPLE_UNITS - round(r * SAMPLE_UNITS) for _, r in h[i:j + 1]]
        return min(units), max(units)


SLACK_NS = 100_000_000   # a framework call and its syscalls may straddle a rate change this far apart
PAIRS_CACHED_MAX = 65_536   # address pairs whose hash is kept (cleared when full)
_UNKNOWN = object()


class FrameworkShedJudge:
    """Tells the correlator which framework records belong to host pairs the probes shed.

    A framework record carries no addresses: its pair is (this process's address,
    the peer node's address), both learnt from the sampled traffic (the
    correlator's Identities: endpoints of each process, node ids of endpoints and
    of ADD_NODE's table). Unresolved while the probes shed, an unmatched record
    is taken as shed too (its pair was never seen, which shedding explains)."""

    def __init__(self, ids, history: list, rescan_ns: int = 50_000_000):
        self.ids = ids
        self.units = ShedUnits(history)
        self._ip_of_tgid: dict[int, str] = {}
        self._ip_of_node: dict[int, str] = {}
        self._h16: dict[tuple[str, str], int | None] = {}   # (local, peer) -> pair_hash16 (parses addresses)
        self._rescan_ns = rescan_ns
        self._next_scan = 0
        self._scanned_version = -1
        self.unresolved = 0

    def _scan(self, now_ns: int) -> None:
        """Learn addresses again, when something was learnt (and not more often than rescan_ns)."""
        ids = self.ids
        if now_ns < self._next_scan or ids.version == self._scanned_version:
            return
        self._next_scan = now_ns + self._rescan_ns
        self._scanned_version = ids.version
        for (ip, _port), tgid in list(ids.tgid_of_endpoint.items()):
            self._ip_of_tgid.setdefault(tgid, ip)
            node = ids.node_of_tgid.get(tgid)
            if node is not None:
                self._ip_of_node.setdefault(node, ip)
        for (_pair, (ip, _port)), node in list(ids.sender_of.items()):
            self._ip_of_node.setdefault(node, ip)
        for (host, _port), node in list(ids.node_of_addr.items()):
            self._ip_of_node.setdefault(node, host)

    def _pair_h16(self, tgid: int, peer_node: int | None, now_ns: int) -> int | None:
        for attempt in (0, 1):
            local = self._ip_of_tgid.get(tgid)
            peer = self._ip_of_node.get(peer_node) if peer_node is not None else None
            if local is not None and peer is not None:
                h = self._h16.get((local, peer), _UNKNOWN)
                if h is _UNKNOWN:
                    try:
                        h = pair_hash16(local, peer)
                    except ValueError:   # a hostname, not an address
                        h = None
                    if len(self._h16) >= PAIRS_CACHED_MAX:
                        self._h16.clear()
                    self._h16[(local, peer)] = h
                return h
            if attempt == 0:
                self._scan(now_ns)
        return None

    def drop_now(self, fm, tx: bool, peer_id: int | None, now_ns: int) -> bool:
        """On arrival: its pair is known and was shed all the time from ts - SLACK to now."""
        ts = fm.ret_ts_ns
        least, most = self.units.between(ts - SLACK_NS, max(ts, now_ns))
        if least == 0:
            return False
        h = self._pair_h16(fm.tgid, peer_id, now_ns)
        return h is not None and h < least

    def shed(self, fm, tx: bool, peer_id: int | None, now_ns: int) -> bool:
        """At expiry, unmatched: was its pair shed around ts (or not resolvable while shedding)?"""
        ts = fm.ret_ts_ns
        _least, most = self.units.between(ts - SLACK_NS, ts + SLACK_NS)
        if most == 0:
            return False
        h = self._pair_h16(fm.tgid, peer_id, now_ns)
        if h is None:
            self.unresolved += 1
            return True
        return h < most


class SamplingRecord:
    """The sampling a pipeline saw, from the agent's notes (live and replay alike):
    meta["sampling"] kept current in place, the correlator's judge, the live gauge."""

    def __init__(self, meta: dict, correlator):
        self.history: list[list] = []
        self.meta = meta.setdefault("sampling", {})
        self.correlator = correlator
        self.alive_ns = 0   # the agent loop's latest tick: a consumer far behind has older watermarks

    def on_note(self, note: dict, live=None) -> None:
        ts, rate = int(note["ts_ns"]), float(note["rate"])
        if self.history and ts < self.history[-1][0]:
            ts = self.history[-1][0]
        self.history.append([ts, rate])
        self.meta.update({"rate": rate, "history": self.history, "mode": note.get("mode", "adaptive"),
                          "units": SAMPLE_UNITS})
        if note.get("cpu_budget") is not None:
            self.meta["cpu_budget"] = note["cpu_budget"]
        if self.correlator.shed_judge is None and rate < 1.0:
            self.correlator.shed_judge = FrameworkShedJudge(self.correlator.ids, self.history)
        if live is not None:
            live.sampling_rate = rate

    def set_shed(self, counts: dict[str, int]) -> None:
        """What the probes shed so far (probes.filters.shed_counts)."""
        self.meta["shed"] = dict(counts)

    def finish(self, end_ns: int) -> None:
        if self.history:
            end_ns = max(end_ns, self.alive_ns, self.history[-1][0])
            self.meta["effective_rate"] = effective_rate(self.history, end_ns)
        judge = self.correlator.shed_judge
        if judge is not None:
            self.meta["framework_shed_unresolved"] = judge.unresolved


class SheddingLoop:
    """The agent loop's side of shedding: measures each interval, asks the Shedder,
    writes the probes' map and announces every rate as a note (recorded, replayed)."""

    def __init__(self, shedder: Shedder, bpf, announce, record: SamplingRecord):
        self.shedder = shedder
        self.bpf = bpf
        self.announce = announce          # note dict -> the pipeline (and the recording)
        self.record = record
        self._busy_s = 0.0
        self._emptied_ns = shedder.history[-1][0]   # when a drain last emptied the rings
        self._mark: tuple | None = None   # (ns, produced, lost, consumed, process CPU s)
        self._say(shedder.history[-1][0])

    def _say(self, ts_ns: int) -> None:
        self.announce({"sampling": {"ts_ns": ts_ns, "rate": self.shedder.rate, "mode": self.shedder.mode,
                                    "cpu_budget": self.shedder.cpu_budget}})

    def drained(self, seconds: float, emptied: bool, now_ns: int | None = None) -> None:
        self._busy_s += seconds
        if emptied:
            self._emptied_ns = now_ns if now_ns is not None else time.monotonic_ns()

    def tick(self, counters: dict[str, dict[str, int]], consumed_total: int, now_ns: int,
             cpu_s_total: float | None = None) -> float | None:
        """Once per counters interval; the new rate when it changed. cpu_s_total: the
        process's CPU seconds so far (time.process_time()), for a CPU budget."""
        from probes.filters import shed_counts, write_shed_units

        self.record.set_shed(shed_counts(self.bpf))
        self.record.alive_ns = now_ns
        produced = produced_by_probe(counters)
        lost = sum(int(c.get("lost", 0)) for c in counters.values())
        mark, self._mark = self._mark, (now_ns, produced, lost, consumed_total, cpu_s_total)
        busy, self._busy_s = self._busy_s, 0.0
        behind = now_ns - self._emptied_ns > LAG_LIMIT_S * 1e9
        if mark is None:
            return None
        st = IntervalStats(now_ns=now_ns, interval_s=(now_ns - mark[0]) / 1e9,
                           produced={p: v - mark[1].get(p, 0) for p, v in produced.items()},
                           lost=lost - mark[2], consumed=consumed_total - mark[3], busy_s=busy,
                           behind=behind,
                           cpu_s=None if cpu_s_total is None or mark[4] is None else cpu_s_total - mark[4])
        units = self.shedder.observe(st)
        if units is None:
            return None
        write_shed_units(self.bpf, units)
        self._say(now_ns)
        return self.shedder.rate
