"""Wire messages + framework records -> rows of the `messages` table (agent/records.py).

Per message (never per packet) this gives the stage timestamps of its host
(DESIGN.md "The components of one request") and who sent it to whom.

Framework boundary. A framework record (probes.framework) is matched to a wire
message exactly, by ids, never by order: same process, same direction, same
(call_space, call_id, request). A record of a layer registered in
parsers.registry.FRAMEWORK_LAYERS brings its protocol's facts, which must agree
with the wire message (`fits`: for ps-lite the command, push flag, ZMTP bytes and
first keys, parsers/pslite/framework.py) and may name the peer's node id, which
must agree with the wire's sender or receiver when both are known; a record that
names its ids itself (probes.framework.KeyedMessage, brpc's) must come in causal
order with the message's calls. A request sliced over several servers gives one
group of records and one group of wire messages with the same ids; within a group
a pair is taken only when it is the only possibility for both sides (after the
group stopped growing), then the record's socket (with its routing peer) is bound
to that TCP connection, which settles the ambiguous groups of the same socket
later; a keyed record shared by two clients' messages is narrowed to the one whose
syscall ran on its thread.

Slices of one request differ in their keys, yet a wire message carries only a
sample of its keys (the walker's, by hash: often none of the record's first
keys, sometimes no key at all) and slices of large requests may have the same
bytes. Where a group is still ambiguous, two facts of slicing by key range narrow
it (requests only, where the sender fixes the keys' order; ps-lite's, as
Postoffice::GetServerKeyRanges does):
- a request's keys are sorted and unique, so the record's first keys are its
  smallest: a wire key below them, or between them and not one of them,
  belongs to another slice;
- each server owns one key range: a sending process's wire keys per server
  endpoint give that range's hull, and a record whose first keys fall on the far
  side of another server's disjoint hull is not bound for this one. Overlapping
  hulls (a custom slicer) say nothing.
This matters after a reconnect: fresh sockets are bound to nothing, and both
slices of the next request used to stay unmatched (psbench, 1024 keys, a
reconnect every 10: 2-4 of 3,840 slices in each of 7 recorded runs). Then, if
the settled group has as many records as wire messages and exactly one way to
pair them all, that is taken.
Unsettled after HOLD_NS: the row goes out without a framework time, and says why.

Who (protocols whose messages pair between nodes, pair_scope "nodes"). A message's
sender is the node its connection's peer announced (sender_node_id: for ps-lite the
DEALER's identity "ps<id>" in its READY); the receiver is the node owning the other
side: the id the same process announces on its own connections, or the node table
a control message lists (`nodes`: host:port -> id). An agent that joined mid-stream
saw no announcement; it learns the sender from the framework record's peer, and
(one agent, several hosts, as in the virtual cluster) shares what one end learnt
with the other end of the same connection.

Sub-components. A row's runq/busy (receives) and cwnd/rwnd (sends) waits come from
the netstack state the walker recorded at the exit of the message's last call, with
the netstack's stage times; agent/netrows.py says exactly what is measured and what
is inferred.

Time. Decisions wait on a watermark: "every event before T has been delivered".
The live agent takes T = CLOCK_MONOTONIC just before it drains all its rings and
passes it on (advance(T)); it is recorded, so a replay sees the same watermarks at
the same places and gives the same table. Event timestamps alone would not do:
the rings are drained one after the other, so after a stall of the consumer one
ring's events can lag another's by seconds. Without watermarks (unit tests,
recordings made before them) the latest event timestamp stands in for T.
"""
from __future__ import annotations

import heapq
import json
import math
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from typing import Callable

from agent.bounded import CONNS_MAX, put_newest, touch
from agent.streams import WireMessage
from agent.netrows import (HOLD_NS, NS_TXC_FORWARDED, R_DATA_READY_LATE, R_NOT_LOADED,  # noqa: F401 (re-exported)
                           R_NOT_TIMED, Connections, TxTimes, sock_wait_split, window_split)
from agent.records import RX_STAGE_COLUMNS, TX_STAGE_COLUMNS, RxStage, TxStage
from parsers.protocol import PAIR_NODES
from parsers.registry import FRAMEWORK_LAYERS

MAX_ELIMINATION = 6          # groups up to this size are searched for their only complete pairing
SETTLE_NS = 50_000_000       # a group of same-id messages is complete this long after its last member
# HOLD_NS (agent.netrows): a row waits at most this long for its framework record and its ids
STEP_NS = 10_000_000         # matching runs every STEP_NS of event time
DEADLINE_EVERY = 32          # groups settled or rows emitted between looks at a stop's deadline
# What the correlator learns per connection, zmq socket, process or server endpoint
# is kept at most this many entries per table, the least recently used evicted and
# counted (ids_evicted, bound_evicted, key_hulls_evicted, fw_tgids_evicted): traffic
# of every connection ever seen (a reconnecting job, a scan) must not grow the agent.
LEARNT_MAX = 4 * CONNS_MAX

# null reasons (what a reader of null_reasons sees)
R_NO_FW_PROBE = "no framework probe on this process"
R_NO_FW_MATCH = "no framework record matched"
R_FW_AMBIGUOUS = "framework records with the same ids could not be told apart"
R_NO_FIRST_CALL = "the call that moved the first byte was not seen (joined mid-stream or lost)"
R_NO_LAST_CALL = "the call that moved the last byte was not seen"
R_NO_NETSTACK = R_NOT_LOADED


@dataclass(eq=False)
class Pending:
    """A wire message waiting for its framework record and ids."""
    wm: WireMessage
    tgid: int
    added_ns: int
    key: tuple | None
    fw: dict = field(default_factory=dict)   # layer -> FrameworkMessage
    fw_reason: str | None = None


_NO_KEYS: frozenset = frozenset()


@dataclass(eq=False)
class PendingFw:
    fm: object            # probes.framework.FrameworkMessage (or KeyedMessage)
    added_ns: int
    key: tuple
    # its protocol's facts (parsers.registry.FRAMEWORK_LAYERS: fits() and the fields
    # below); None for a record that names its wire message's ids itself
    facts: object | None
    # the facts' generic fields, copied: read per candidate wire message
    peer_id: int | None = field(init=False)
    head_keys: tuple = field(init=False)
    head_key_set: frozenset = field(init=False)

    def __post_init__(self):
        facts = self.facts
        if facts is None:
            self.peer_id, self.head_keys, self.head_key_set = None, (), _NO_KEYS
        else:
            self.peer_id, self.head_keys, self.head_key_set = facts.peer_id, facts.head_keys, facts.head_key_set


class Identities:
    """Node ids learnt from the traffic (see the module docstring). `version` changes
    whenever something new is learnt."""

    def __init__(self):
        self.sender_of: OrderedDict[tuple, int] = OrderedDict()     # (pair_key, sending endpoint) -> node id
        self.node_of_tgid: OrderedDict[int, int] = OrderedDict()
        self.node_of_addr: OrderedDict[tuple, int] = OrderedDict()  # ROUTER (ip, port) -> node id (ADD_NODE)
        self.tgid_of_endpoint: OrderedDict[tuple, int] = OrderedDict()
        self.version = 0
        self.evicted = 0   # entries dropped beyond LEARNT_MAX (least recently learnt or used first)

    def _set(self, table: dict, key, value, overwrite: bool = False) -> None:
        old = table.get(key)
        if old is None or (overwrite and old != value):
            self.evicted += put_newest(table, key, value, LEARNT_MAX)
            self.version += 1
        else:
            touch(table, key)   # learnt again: in use

    def learn_message(self, wm: WireMessage, tgid: int) -> None:
        conn = wm.conn
        self._set(self.tgid_of_endpoint, conn.local, tgid)
        if wm.msg.sender_node_id is not None:
            # READY seen: authoritative for this connection
            sending = conn.local if wm.tx else conn.remote
            self._set(self.sender_of, (conn.pair_key, sending), wm.msg.sender_node_id, overwrite=True)
            if wm.tx:
                self._set(self.node_of_tgid, tgid, wm.msg.sender_node_id)
        for n in wm.msg.nodes:
            if n.node_id is not None and n.port:
                self._set(self.node_of_addr, (n.hostname, n.port), n.node_id, overwrite=True)

    def learn_sender(self, wm: WireMessage, node: int) -> None:
        conn = wm.conn
        self._set(self.sender_of, (conn.pair_key, conn.local if wm.tx else conn.remote), node)

    def sender(self, wm: WireMessage, tgid: int) -> int | None:
        if wm.msg.sender_node_id is not None:
            return wm.msg.sender_node_id
        conn = wm.conn
        key = (conn.pair_key, conn.local if wm.tx else conn.remote)
        got = self.sender_of.get(key)
        if got is not None:
            touch(self.sender_of, key)   # a live connection's id is kept while it speaks
        if wm.tx:
            if got is None:
                # our own DEALER whose READY we missed: the process's id from its other DEALERs
                got = self.node_of_tgid.get(tgid)
            elif tgid not in self.node_of_tgid:
                self._set(self.node_of_tgid, tgid, got)
        return got

    def recver(self, wm: WireMessage, tgid: int) -> int | None:
        conn = wm.conn
        owner_end = conn.remote if wm.tx else conn.local
        got = self.node_of_addr.get(owner_end)
        if got is None:
            owner = tgid if not wm.tx else self.tgid_of_endpoint.get(conn.remote)
            if owner is not None:
                got = self.node_of_tgid.get(owner)
        return got


class Correlator:
    """See the module docstring. emit(host netns inode, row dict) receives finished rows."""

    def __init__(self, emit: Callable[[int, dict], None], host_of: Callable[[int], str],
                 framework_on: bool = True, netstack_on: bool = False, key_sample_max: int = 16):
        self.emit = emit
        self.host_of = host_of
        self.framework_on = framework_on
        self.netstack_on = netstack_on
        self.key_sample_max = key_sample_max
        self.ids = Identities()
        self.now_ns = 0
        self._next_step = 0
        self._wires: dict[tuple, list[Pending]] = defaultdict(list)    # group key -> pending wires
        self._fws: dict[tuple, list[PendingFw]] = defaultdict(list)    # group key -> pending fw
        self._group_touched: dict[tuple, int] = {}   # in order of last touch (re-inserted)
        self._expiry: list[tuple[int, int, tuple]] = []  # heap of (when, tie-break, group key)
        self._expiry_seq = 0
        self._unkeyed: list[Pending] = []
        self._ready: list[Pending] = []
        self._waiting: list[Pending] = []              # rows waiting for their ids
        self._ids_seen = -1
        # (layer, tgid, framework socket, routing peer) -> conn_id
        self._bound: OrderedDict[tuple, str] = OrderedDict()
        # (tgid, netns, server endpoint) -> [lowest, highest] key the process sent it
        self._key_hull: OrderedDict[tuple, list[int]] = OrderedDict()
        self._hull_endpoints: dict[int, set] = defaultdict(set)   # tgid -> (netns, endpoint) with a hull
        self.fw_tgids: OrderedDict[int, None] = OrderedDict()   # processes whose framework records we saw
        self.counters = defaultdict(int)
        self.tx_times = TxTimes()
        self.watermarked = False   # advance() was called: event timestamps no longer move time
        self.connections: Connections | None = None
        self.shed_judge = None   # agent.shedding.FrameworkShedJudge while the probes shed host pairs
        self._next_prune = 0

    # -- input ------------------------------------------------------------------
    def on_message(self, wm: WireMessage) -> None:
        call = wm.last_call or wm.first_call
        tgid = call.tgid if call is not None else min(wm.conn.tgids)
        self.ids.learn_message(wm, tgid)
        event_ns = call.exit_ts_ns if call is not None else self.now_ns
        self._tick(event_ns)
        m = wm.msg
        # held from its own time, not from a watermark that may lag it by seconds: a drain
        # that takes long hands over records seconds newer than the last watermark, and the
        # next watermark expired them at once, before their partners from the other ring
        # (measured: 76-152 of 9,600 messages near a run's end without framework times)
        p = Pending(wm, tgid, max(self.now_ns, event_ns), None)
        if m.call_id is None and m.call_space is None:
            self._unkeyed.append(p)   # nothing to match a framework record by
            return
        p.key = (tgid, wm.tx, m.call_space, m.call_id, m.request)
        if wm.tx and m.request and m.key_sample and not m.control:
            self._learn_keys(tgid, wm, min(m.key_sample), max(m.key_sample))
        self._wires[p.key].append(p)
        self._touch(p.key, p.added_ns)

    def on_framework(self, fm) -> None:
        if fm.tgid not in self.fw_tgids:
            self.counters["fw_tgids_evicted"] += put_newest(self.fw_tgids, fm.tgid, None, LEARNT_MAX)
        self._tick(fm.ret_ts_ns)
        tx = fm.direction == "send"
        facts_of = FRAMEWORK_LAYERS.get(fm.layer)
        if facts_of is None:
            # a record that names its wire message's ids itself (probes.framework.KeyedMessage)
            ids = getattr(fm, "call_key", None)
            if ids is None:
                self.counters["framework_without_ids"] += 1
                return
            key = (fm.tgid, tx, *ids)
            f = PendingFw(fm, max(self.now_ns, fm.ret_ts_ns), key, None)
        else:
            facts = facts_of(fm)
            if facts is None:
                self.counters["framework_without_ids"] += 1
                return
            if self.shed_judge is not None and self.shed_judge.drop_now(fm, tx, facts.peer_id, self.now_ns):
                self.counters["framework_shed"] += 1   # its host pair is not sampled: no wire message comes
                return
            key = (fm.tgid, tx, *facts.ids)
            f = PendingFw(fm, max(self.now_ns, fm.ret_ts_ns), key, facts)
        self._fws[key].append(f)
        self._touch(key, f.added_ns)

    def _touch(self, key: tuple, at_ns: int) -> None:
        touched = self._group_touched
        touched.pop(key, None)
        touched[key] = at_ns

    def advance(self, watermark_ns: int) -> None:
        """Every event up to watermark_ns has been delivered (see the module docstring)."""
        self.watermarked = True
        if watermark_ns > self.now_ns:
            self.now_ns = watermark_ns
        self.step()

    def _tick(self, ts_ns: int) -> None:
        if self.watermarked:
            return
        if ts_ns > self.now_ns:
            self.now_ns = ts_ns
        if self.now_ns >= self._next_step:
            self._next_step = self.now_ns + STEP_NS
            self.step()

    def on_netstack(self, ev) -> None:
        """A netstack event (probes.events NetstackEvent subclasses, by kind)."""
        kind = ev.kind
        if kind == 1:     # TX: a message end handed to the driver
            self.tx_times.on_tx(ev.sk, ev.end_seq, ev.flags, ev.ts_queue_ns, ev.ts_xmit_ns, self.now_ns)
            self.ids.version += 1   # tx rows waiting for their times look again
        elif kind == 2:   # TX_DONE
            self.tx_times.on_tx_done(ev.sk, ev.end_seq, ev.reason, ev.ts_done_ns, self.now_ns)
            self.ids.version += 1
        elif self.connections is not None:
            if kind == 3:
                self.connections.on_retransmit(ev)
            elif kind == 4:
                self.connections.on_state(ev)
            elif kind == 5:
                self.connections.on_call(ev)

    def _tx_ready(self, p: Pending, final: bool) -> bool:
        """A send-side row waits for its driver handoff and completion (netstack)."""
        if not self.netstack_on or not p.wm.tx or final or self.now_ns - p.added_ns >= HOLD_NS:
            return True
        st = self.tx_times.get(p.wm.conn.sk, p.wm.seq_end)
        return st is not None and st.get("_done", False)

    # -- matching ---------------------------------------------------------------
    def _compatible(self, f: PendingFw, p: Pending) -> bool:
        facts = f.facts
        if facts is None:   # a keyed record: the ids agree by its key
            return _in_causal_order(f.fm.ts_ns, p.wm)
        if not facts.fits(p.wm.msg, self.key_sample_max):
            return False
        peer = facts.peer_id
        if peer is not None:
            other = self.ids.sender(p.wm, p.tgid) if not p.wm.tx else self.ids.recver(p.wm, p.tgid)
            if other is not None and other != peer:
                return False
        return True

    def _learn_keys(self, tgid: int, wm: WireMessage, lo: int, hi: int) -> None:
        end = (wm.conn.netns_ino, wm.conn.remote)
        hull = self._key_hull.get((tgid, end))
        if hull is None:
            if len(self._key_hull) >= LEARNT_MAX:
                (old_tgid, old_end), _ = self._key_hull.popitem(last=False)
                ends = self._hull_endpoints[old_tgid]
                ends.discard(old_end)
                if not ends:
                    del self._hull_endpoints[old_tgid]
                self.counters["key_hulls_evicted"] += 1
            self._key_hull[(tgid, end)] = [lo, hi]
            self._hull_endpoints[tgid].add(end)
        else:
            if lo < hull[0]:
                hull[0] = lo
            if hi > hull[1]:
                hull[1] = hi

    def _slice_fits(self, f: PendingFw, p: Pending) -> bool:
        """The slicing facts (module docstring): False when the record's first keys
        cannot be those of p's slice. Asked only of groups with several members."""
        heads = f.head_keys
        m = p.wm.msg
        if not heads or not m.request or m.control or not p.wm.tx:
            return True
        first, last = heads[0], heads[-1]
        if any(a >= b for a, b in zip(heads, heads[1:])):
            return True   # not sorted and unique: not a request sliced by key range
        for k in m.key_sample:
            if k < first or (k <= last and k not in f.head_key_set):
                return False
        end = (p.wm.conn.netns_ino, p.wm.conn.remote)
        own = self._key_hull.get((p.tgid, end))
        if own is None:
            return True
        for other in self._hull_endpoints.get(p.tgid, ()):
            if other == end:
                continue
            lo, hi = self._key_hull[(p.tgid, other)]
            if lo > own[1] and last >= lo:      # the other range lies above this one
                return False
            if hi < own[0] and first <= hi:     # ... below it
                return False
        return True

    def _match_group(self, key: tuple, settled: bool) -> None:
        ws, fs = self._wires.get(key), self._fws.get(key)
        if not ws or not fs:
            return
        if len(ws) == 1 and len(fs) == 1:
            # the common case: one message with these ids and one record
            if self._compatible(fs[0], ws[0]):
                self._pair(fs.pop(), ws.pop())
                del self._wires[key], self._fws[key]
            return
        bound_pass = eliminated = False
        known: dict[tuple, bool] = {}   # (f, p) -> compatible, while no id is learnt
        ids_version = self.ids.version
        while ws and fs:
            if self.ids.version != ids_version:   # a pair taught an id: peers may now differ
                known.clear()
                ids_version = self.ids.version
            compat = {}
            for f in fs:
                fits = []
                for p in ws:
                    ok = known.get((id(f), id(p)))
                    if ok is None:
                        ok = known[(id(f), id(p))] = self._compatible(f, p) and self._slice_fits(f, p)
                    if ok:
                        fits.append(p)
                compat[id(f)] = fits
            if bound_pass:
                for f in fs:
                    if f.facts is None:
                        # a keyed record: one id that two clients both used, both in flight
                        # at once; the thread that took the message from the framework or
                        # gave it is, as a rule, the one that made its syscall (docs/paddle.md)
                        narrowed = [p for p in compat[id(f)] if _call_tid(p.wm) == f.fm.tid]
                        if narrowed:
                            compat[id(f)] = narrowed
                        continue
                    cid = self._bound.get((f.fm.layer, f.fm.tgid, f.fm.sock, f.fm.peer))
                    if cid is not None:
                        narrowed = [p for p in compat[id(f)] if p.wm.conn.conn_id == cid]
                        if narrowed:
                            compat[id(f)] = narrowed
            rev: dict[int, list[PendingFw]] = defaultdict(list)
            for f in fs:
                for p in compat[id(f)]:
                    rev[id(p)].append(f)
            pairs = [(f, compat[id(f)][0]) for f in fs
                     if len(compat[id(f)]) == 1 and len(rev[id(compat[id(f)][0])]) == 1]
            if not pairs:
                if settled and not bound_pass:
                    bound_pass = True
                    continue
                if settled and not eliminated and len(fs) == len(ws) <= MAX_ELIMINATION:
                    eliminated = True
                    pairs = _only_pairing(fs, compat)
                if not pairs:
                    break
            for f, p in pairs:
                self._pair(f, p)
                fs.remove(f)
                ws.remove(p)
        if not ws:
            self._wires.pop(key, None)
        if not fs:
            self._fws.pop(key, None)

    def _pair(self, f: PendingFw, p: Pending) -> None:
        fm = f.fm
        p.fw[fm.layer] = fm
        facts = f.facts
        if facts is None:   # a keyed record: nothing to learn from it (its sock is no socket)
            self.counters["framework_matched"] += 1
            self._ready.append(p)
            return
        self.counters["bound_evicted"] += put_newest(self._bound, (fm.layer, fm.tgid, fm.sock, fm.peer),
                                                     p.wm.conn.conn_id, LEARNT_MAX)
        if p.wm.tx and p.wm.msg.request and facts.head_keys and not p.wm.msg.control:
            self._learn_keys(p.tgid, p.wm, min(facts.head_keys), max(facts.head_keys))
        if facts.peer_id is not None and not p.wm.tx:
            self.ids.learn_sender(p.wm, facts.peer_id)
        self.counters["framework_matched"] += 1
        self._ready.append(p)

    def step(self, final: bool = False, deadline: float = math.inf) -> None:
        """deadline (time.monotonic()): with final, what is not settled and emitted by
        then is counted (unsettled_at_stop) and dropped."""
        now = self.now_ns
        touched = self._group_touched
        # groups that stopped growing: match them (in order of their last touch)
        n = 0
        while touched:
            key = next(iter(touched))
            if not final and now - touched[key] < SETTLE_NS:
                break
            n += 1
            if n % DEADLINE_EVERY == 0 and time.monotonic() >= deadline:
                return self._drop_unsettled()
            del touched[key]
            self._settle(key, final)
        # groups that could not be settled: give up on members older than HOLD_NS
        exp = self._expiry
        while exp and (final or exp[0][0] <= now):
            n += 1
            if n % DEADLINE_EVERY == 0 and time.monotonic() >= deadline:
                return self._drop_unsettled()
            _, _, key = heapq.heappop(exp)
            if key not in touched:   # a group touched again is settled again first
                self._settle(key, final)
        if self._unkeyed:
            self._ready.extend(self._unkeyed)
            self._unkeyed = []
        if not self._emit_ready(final, deadline):
            self._drop_unsettled()
        if now >= self._next_prune:
            self._next_prune = now + HOLD_NS
            self.tx_times.prune(now)

    def _hold(self, groups: dict, key: tuple, final: bool) -> tuple[list, int | None]:
        """Takes a group's members that waited HOLD_NS (all of them when final) out of
        groups[key]; returns them and the oldest time among those kept."""
        items = groups.get(key)
        if not items:
            return [], None
        now = self.now_ns
        keep, out, oldest = [], [], None
        for x in items:
            if final or now - x.added_ns >= HOLD_NS:
                out.append(x)
            else:
                keep.append(x)
                oldest = x.added_ns if oldest is None else min(oldest, x.added_ns)
        if keep:
            groups[key] = keep
        else:
            del groups[key]
        return out, oldest

    def _settle(self, key: tuple, final: bool) -> None:
        now = self.now_ns
        if key in self._wires and key in self._fws:
            self._match_group(key, True)
        ws, oldest_w = self._hold(self._wires, key, final)
        for p in ws:
            p.fw_reason = R_FW_AMBIGUOUS if self._fws.get(key) else R_NO_FW_MATCH
            self._ready.append(p)
        fs, oldest_f = self._hold(self._fws, key, final)
        for f in fs:
            shed = self.shed_judge is not None and self.shed_judge.shed(f.fm, f.key[1], f.peer_id, now)
            self.counters["framework_shed" if shed else "framework_unmatched"] += 1
        oldest = min((t for t in (oldest_w, oldest_f) if t is not None), default=None)
        if oldest is not None:
            # the counter breaks ties: group keys may hold None (absent ids), which do not compare
            self._expiry_seq += 1
            heapq.heappush(self._expiry, (oldest + HOLD_NS, self._expiry_seq, key))

    def _node_ids(self, p: Pending) -> tuple[int | None, int | None]:
        """The sending and receiving node ids, where the protocol names nodes."""
        if p.wm.msg.pair_scope != PAIR_NODES:
            return None, None
        return self.ids.sender(p.wm, p.tgid), self.ids.recver(p.wm, p.tgid)

    def _emit_ready(self, final: bool, deadline: float = math.inf) -> bool:
        """Rows out, once their sender and recver are known (or they waited HOLD_NS).
        Rows still waiting are checked again only when an id was learnt. False when
        the deadline came first (the rest is left in self._ready)."""
        waiting = self._waiting
        if self.ids.version != self._ids_seen or final:
            self._ids_seen = self.ids.version
            self._ready = waiting + self._ready
            waiting = self._waiting = []
        now = self.now_ns
        ids = self.ids
        for i, p in enumerate(self._ready):
            if i % DEADLINE_EVERY == DEADLINE_EVERY - 1 and time.monotonic() >= deadline:
                del self._ready[:i]
                return False
            wm = p.wm
            m = wm.msg
            if m.pair_scope == PAIR_NODES:   # _node_ids, inlined: this loop runs per message
                sender, recver = ids.sender(wm, p.tgid), ids.recver(wm, p.tgid)
                # ids may still be learnt (a mid-stream join)
                wait = (sender is None or recver is None) and not final and now - p.added_ns < HOLD_NS \
                    and not m.control
            else:
                sender = recver = None
                wait = False
            if wait or not self._tx_ready(p, final):
                waiting.append(p)   # ids or times may still come
            else:
                self.emit(wm.conn.netns_ino, self._row(p, sender, recver))
        self._ready = []
        # the oldest may have waited long enough
        i = 0
        while i < len(waiting) and now - waiting[i].added_ns >= HOLD_NS:
            p = waiting[i]
            self.emit(p.wm.conn.netns_ino, self._row(p, *self._node_ids(p)))
            i += 1
        if i:
            del waiting[:i]
        return True

    def _drop_unsettled(self) -> None:
        """A stop's deadline came first: what is still held is counted, not emitted."""
        self.counters["unsettled_at_stop"] += (sum(map(len, self._wires.values())) + len(self._unkeyed)
                                               + len(self._ready) + len(self._waiting))
        self.counters["framework_unsettled_at_stop"] += sum(map(len, self._fws.values()))
        self._wires.clear()
        self._fws.clear()
        self._group_touched.clear()
        self._expiry.clear()
        self._unkeyed, self._ready, self._waiting = [], [], []

    def close(self, deadline: float = math.inf) -> None:
        """Everything held goes out; by deadline (time.monotonic()) at the latest, the
        rest counted as unsettled_at_stop."""
        self.step(final=True, deadline=deadline)
        if self.connections is not None:
            self.connections.close()

    # -- rows -----------------------------------------------------------------------
    def _row(self, p: Pending, sender, recver) -> dict:
        wm, m = p.wm, p.wm.msg
        conn = wm.conn
        first, last = wm.first_call, wm.last_call
        reasons: dict[str, str] = {}
        fws = p.fw
        fw = None
        if len(fws) == 1:
            (fw,) = fws.values()
        elif fws:
            for layer in FRAMEWORK_LAYERS:   # the layer nearest the application first
                fw = fws.get(layer)
                if fw is not None:
                    break
            else:
                fw = next(iter(fws.values()))
        if fw is not None:
            ts_fw = fw.ts_ns
        else:
            ts_fw = None
            if not self.framework_on or p.tgid not in self.fw_tgids:
                reasons["ts_framework_ns"] = R_NO_FW_PROBE
            else:
                reasons["ts_framework_ns"] = p.fw_reason or R_NO_FW_MATCH
        stages = wm.stages
        netstack_on = self.netstack_on
        tx = wm.tx
        if tx and netstack_on:
            stages = self.tx_times.pop(conn.sk, wm.seq_end) or stages
        get = stages.get
        kernel_reason = R_NOT_TIMED if netstack_on else R_NO_NETSTACK
        call = last or first
        local, remote = conn.local, conn.remote
        # one literal in schema order: the stage columns of the other side stay None
        row = {
            "host_id": self.host_of(conn.netns_ino),
            "direction": "tx" if tx else "rx",
            "pid": p.tgid, "tid": call.tid if call else None, "comm": call.comm if call else None,
            "netns_ino": conn.netns_ino,
            "local_ip": local[0], "local_port": local[1], "remote_ip": remote[0], "remote_port": remote[1],
            "conn_id": conn.conn_id,
            "seq_first": wm.seq_first, "seq_end": wm.seq_end,
            "protocol": m.protocol, "pair_scope": m.pair_scope,
            "control": m.control, "request": m.request,
            "op": m.op or "unknown", "op_name": m.op_name,
            "call_space": m.call_space, "call_id": m.call_id,
            "sender": sender, "recver": recver,
            "num_keys": m.num_keys, "key_sample": list(m.key_sample),
            "key_sample_complete": m.key_sample_complete,
            "value_bytes": m.value_bytes, "msg_bytes": m.total_bytes,
            "detail": _detail_json(m.detail()),
            "framework_layer": fw.layer if fw is not None else None,
            "ts_framework_ns": ts_fw,
            "ts_send_first_enter_ns": None, "ts_send_last_exit_ns": None,
            "ts_xmit_last_ns": None, "ts_txdone_last_ns": None,
            "ts_nic_rx_last_ns": None, "ts_netif_rx_last_ns": None,
            "ts_data_ready_ns": None, "ts_recv_last_exit_ns": None,
            "runq_wait_ns": get("runq_wait_ns"), "busy_wait_ns": get("busy_wait_ns"),
            "cwnd_wait_ns": get("cwnd_wait_ns"), "rwnd_wait_ns": get("rwnd_wait_ns"),
            "qdisc_wait_ns": get("qdisc_wait_ns"), "connect_wait_ns": get("connect_wait_ns"),
        }
        if tx:
            row["ts_send_first_enter_ns"] = first.enter_ts_ns if first else None
            row["ts_send_last_exit_ns"] = last.exit_ts_ns if last else None
            if first is None:
                reasons["ts_send_first_enter_ns"] = R_NO_FIRST_CALL
            if last is None:
                reasons["ts_send_last_exit_ns"] = R_NO_LAST_CALL
            for col, null_key in _TX_KERNEL_COLS:
                v = row[col] = get(col)
                if v is None:
                    reasons[col] = get(null_key, kernel_reason)
        else:
            done = row["ts_recv_last_exit_ns"] = last.exit_ts_ns if last else None
            if last is None:
                reasons["ts_recv_last_exit_ns"] = R_NO_LAST_CALL
            for col, null_key in _RX_KERNEL_COLS:
                v = row[col] = get(col)
                if v is None:
                    reasons[col] = get(null_key, kernel_reason)
            dr = row["ts_data_ready_ns"]
            if dr is not None and done is not None and dr > done:
                # a later segment's data-ready: the byte's own segment arrived 5 ms before
                # the recv, the record on file came 10 us after it (once, in a 2 ms-wire run
                # with reconnects; the segment also held the next message's start)
                row["ts_data_ready_ns"] = None
                reasons["ts_data_ready_ns"] = R_DATA_READY_LATE
        if not netstack_on:
            cols = ("cwnd_wait_ns", "rwnd_wait_ns") if wm.tx else ("runq_wait_ns", "busy_wait_ns")
            sub = {k + ":null": R_NO_NETSTACK for k in cols}
        elif tx:
            sub = window_split(wm.seq_end, row["ts_send_last_exit_ns"], last.window if last else None, stages)
        else:
            sub = sock_wait_split(row["ts_data_ready_ns"], row["ts_recv_last_exit_ns"],
                                  last.sched if last else None)
        for k, v in sub.items():
            if k.endswith(":null"):
                reasons[k[:-len(":null")]] = v
            else:
                row[k] = v
        row["null_reasons"] = ";".join(f"{k}={v}" for k, v in reasons.items())
        if tx and ts_fw is not None and self.connections is not None:
            # the request waited for its connection (zmq connects in the background)
            est = self.connections.established_ns(conn.local, conn.remote)
            if est is not None and est > ts_fw:
                row["connect_wait_ns"] = est - ts_fw
        return row


def _call_tid(wm: WireMessage) -> int | None:
    """The thread of the syscall nearest the framework: a send's first, a receive's last."""
    call = wm.first_call if wm.tx else wm.last_call
    return call.tid if call is not None else None


def _in_causal_order(fw_ts_ns: int, wm: WireMessage) -> bool:
    """A framework send comes before its message's first send call; a framework
    receive after the receive call that brought its last byte. What tells apart the
    records of one id that two peers both used (brpc: each client counts its own)."""
    if wm.tx:
        call = wm.first_call
        return call is None or fw_ts_ns <= call.enter_ts_ns
    call = wm.last_call
    return call is None or fw_ts_ns >= call.exit_ts_ns


def _detail_json(d: dict) -> str | None:
    """A message's own fields as the detail column: compact JSON, null when none (most
    messages: no encoding on the hot path)."""
    return json.dumps(d, separators=(",", ":"), sort_keys=True) if d else None


def _only_pairing(fs: list, compat: dict) -> list[tuple]:
    """The pairs of the one way to give every record its own compatible wire message,
    or [] when there is none or more than one (compat: id(record) -> candidates)."""
    found: list[list[tuple]] = []
    chosen: list[tuple] = []
    used: set[int] = set()

    def walk(i: int) -> None:
        if i == len(fs):
            found.append(list(chosen))
            return
        for p in compat[id(fs[i])]:
            if id(p) not in used and len(found) < 2:
                used.add(id(p))
                chosen.append((fs[i], p))
                walk(i + 1)
                chosen.pop()
                used.discard(id(p))

    walk(0)
    return found[0] if len(found) == 1 else []


_TX_KERNEL_COLS = tuple((TX_STAGE_COLUMNS[s], TX_STAGE_COLUMNS[s] + ":null")
                        for s in (TxStage.XMIT_LAST, TxStage.TXDONE_LAST))
_RX_KERNEL_COLS = tuple((RX_STAGE_COLUMNS[s], RX_STAGE_COLUMNS[s] + ":null")
                        for s in (RxStage.NIC_RX_LAST, RxStage.NETIF_RX_LAST, RxStage.DATA_READY))
