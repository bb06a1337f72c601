"""One capture point's TCP segments -> rows of the run-dir tables (agent/records.py):
`messages` with the stages a packet tap sees, `streams` (what each connection moved,
recognised or not) and `clock_samples` (segments that start a burst).

Which end is "local". A capture point is a host (tcpdump on its interface: its address
is an end of every connection it saw and answers handshakes at once: LocalVotes) or a
tap between hosts (neither tells an address).
At a host, a message sent from a local address is a `tx` row, one to a local address
an `rx` row (both on loopback). At a tap each message is seen once, between the two
ends, and the report's chain wants the client's view: a request is the client's `tx`
row and a response its `rx` row (control messages: a `tx` row of their sender), so
the tap stands where the client's NIC would be.

Stages. AF_PACKET (tcpdump) sees a send at the driver handoff (dev_queue_xmit_nit,
just before the net_dev_start_xmit tracepoint: TxStage.XMIT_LAST) and a receive when
it is delivered to the packet taps in __netif_receive_skb (RxStage.NETIF_RX_LAST):
measured on veth, a capture's network time is the agent's wire + nic_rx within a
microsecond (tests/privileged/test_capture_agent.py, docs/capture.md). A message's
stage time is the capture time of the segment carrying its last byte. Every other
stage needs syscalls or uprobes: null, with the reason in null_reasons. Times are the
capture's CLOCK_REALTIME; the report aligns a capture point with the other hosts from
the traffic, as it does agents.

Node ids (ps-lite's sender and recver) come from the traffic only, as the agent
learns them (agent.correlate.Identities): a connection's READY identity, the
scheduler's node table. A capture that starts mid-connection lacks them: its data
messages are rows without ids, which the report counts as unparsed for pairing.
"""
from __future__ import annotations

import json
from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from agent.bounded import CONNS_MAX
from agent.correlate import Identities
from agent.endpoints import conn_id_of
from agent.records import RX_STAGE_COLUMNS, TX_STAGE_COLUMNS, RxStage, TxStage
from agent.streams import SIGNATURE_BYTES, Conn, Flow, stream_row
from capture.decode import ACK, FIN, RST, SYN, Segment
from capture.reassembly import MASK32, DirectionStats, HeldBytes, Reassembly, unwrap
from parsers.protocol import PAIR_NODES
from parsers.registry import parser_class
from parsers.sniff import SniffingParser

# the stage columns a capture fills, and why the others are null
TX_SEEN = TX_STAGE_COLUMNS[TxStage.XMIT_LAST]
RX_SEEN = RX_STAGE_COLUMNS[RxStage.NETIF_RX_LAST]
R_NO_SYSCALLS = "a packet capture sees no syscalls"
R_NO_FRAMEWORK = "a packet capture sees no framework calls"
R_NO_TXDONE = "a packet capture sees the driver handoff, not the TX completion"
R_NO_NIC_RX = "a packet capture sees a receive at netif_receive, not at the NIC"
R_NO_SCHED = "a packet capture sees no scheduler"
R_NO_TIME = "the segment carrying the last byte was not captured (a hole in the capture)"
TX_REASONS = {"ts_framework_ns": R_NO_FRAMEWORK, "ts_send_first_enter_ns": R_NO_SYSCALLS,
              "ts_send_last_exit_ns": R_NO_SYSCALLS, TX_STAGE_COLUMNS[TxStage.TXDONE_LAST]: R_NO_TXDONE,
              "cwnd_wait_ns": R_NO_SYSCALLS, "rwnd_wait_ns": R_NO_SYSCALLS}
RX_REASONS = {RX_STAGE_COLUMNS[RxStage.NIC_RX_LAST]: R_NO_NIC_RX, "ts_data_ready_ns": R_NO_SYSCALLS,
              "ts_recv_last_exit_ns": R_NO_SYSCALLS, "ts_framework_ns": R_NO_FRAMEWORK,
              "runq_wait_ns": R_NO_SCHED, "busy_wait_ns": R_NO_SCHED}


def _reasons_text(reasons: dict) -> str:
    return ";".join(f"{k}={v}" for k, v in reasons.items())


# null_reasons of a row: {(tx, its one stage timed)}: the same few texts on every row
NULL_REASONS = {(tx, timed): _reasons_text({**(TX_REASONS if tx else RX_REASONS),
                                            **({} if timed else {TX_SEEN if tx else RX_SEEN: R_NO_TIME})})
                for tx in (True, False) for timed in (True, False)}

# agent/records.py CLOCK_SAMPLES_SCHEMA: as the netstack probe's defaults (probes/netstack.py)
CLOCK_GAP_NS = 100_000
CLOCK_MIN_BYTES = 1024


@dataclass(eq=False)
class _Direction:
    src: tuple[str, int]
    dst: tuple[str, int]
    isn: int | None              # from its SYN
    opened: bool = False         # its SYN had no ACK: this end opened the connection
    asm: Reassembly | None = None
    base: int = 0                # offsets count from base + 1 (the ISN, else 0)
    mid_stream: bool = False
    last_ts_ns: int = -(1 << 62)
    signature: bytes = b""
    signature_offset: int = -1
    fin: bool = False


@dataclass(eq=False)
class _Connection:
    a: tuple[str, int]           # the endpoint seen first
    b: tuple[str, int]
    dirs: dict = field(default_factory=dict)   # src endpoint -> _Direction
    first_ns: int = 0
    last_ns: int = 0
    ids: dict = field(default_factory=dict)    # (local endpoint, ISNs) -> (conn_id, pair key), as computed


@dataclass
class _View:
    """What agent.correlate.Identities reads of a message (its WireMessage's fields)."""
    conn: object
    tx: bool
    msg: object


@dataclass
class _ConnView:
    local: tuple
    remote: tuple
    pair_key: tuple


@dataclass
class PointStats:
    segments: int = 0
    connections: int = 0
    connections_evicted: int = 0
    connections_reused: int = 0   # a SYN with a new ISN on a 4-tuple still open: a new connection
    messages: int = 0
    rows: int = 0
    directions: DirectionStats = field(default_factory=DirectionStats)
    unparsed_bytes: int = 0
    lost_bytes: int = 0
    unrecognised_connections: int = 0
    unrecognised_bytes: int = 0   # payload captured on them


class LocalVotes:
    """What tells a host's own addresses in its capture: they are an end of every connection,
    and the host answers at once. A handshake seen at the client's host has its SYN-ACK a
    round trip after the SYN and the ACK right after the SYN-ACK; at the server's host the
    SYN-ACK follows the SYN at once: each handshake votes for the end that answered first.
    A capture without handshakes (started mid-connection) is told by acknowledgements: the
    end whose quickest ACK of the other's data came ACK_CLEAR times sooner (the local
    kernel's ACK is seen microseconds after the data, the remote's a round trip later).
    At a tap the delays are parts of the round trip either way: no clear vote."""

    PAIRS_MAX = 1 << 20   # address pairs, open handshakes and connections kept
    ACK_CLEAR = 4         # one end's quickest ACK this many times sooner than the other's: a vote

    def __init__(self):
        self.pairs: set[tuple[str, str]] = set()
        self.votes: Counter = Counter()
        self._syn: dict[tuple, int] = {}      # (client, server) endpoints -> SYN time
        self._synack: dict[tuple, tuple[int, int]] = {}   # -> (SYN-ACK time, its delay after the SYN)
        self._unacked: dict[tuple, tuple[int, int]] = {}  # (src, dst) endpoints -> (seq end, time) of its last data
        self._ack_min: dict[tuple, int] = {}  # (acking, acked) endpoints -> quickest ACK seen, ns
        self.timing = True    # False: only the addresses are collected from here on (votes kept)

    def segment(self, s: Segment) -> None:
        pair = (s.src, s.dst) if s.src <= s.dst else (s.dst, s.src)
        if pair not in self.pairs and len(self.pairs) < self.PAIRS_MAX:
            self.pairs.add(pair)
        if not self.timing:
            return
        a, b = (s.src, s.sport), (s.dst, s.dport)
        if s.flags & SYN and not s.flags & ACK:
            if len(self._syn) < self.PAIRS_MAX:
                self._syn[(a, b)] = s.ts_ns
        elif s.flags & SYN:
            t0 = self._syn.pop((b, a), None)
            if t0 is not None and len(self._synack) < self.PAIRS_MAX:
                self._synack[(b, a)] = (s.ts_ns, s.ts_ns - t0)
        elif s.flags & ACK:
            got = self._synack.pop((a, b), None)
            if got is not None:
                t1, d1 = got
                d2 = s.ts_ns - t1
                if d1 != d2:
                    self.votes[s.dst if d1 < d2 else s.src] += 1
            sent = self._unacked.get((b, a))
            if sent is not None and (s.ack - sent[0]) & MASK32 < 1 << 31:   # acks that data
                del self._unacked[(b, a)]
                delay = s.ts_ns - sent[1]
                if delay < self._ack_min.get((a, b), 1 << 62) and (len(self._ack_min) < self.PAIRS_MAX
                                                                   or (a, b) in self._ack_min):
                    self._ack_min[(a, b)] = delay
        n = len(s.payload) + s.missing
        if n and (len(self._unacked) < self.PAIRS_MAX or (a, b) in self._unacked):
            self._unacked[(a, b)] = ((s.seq + n) & MASK32, s.ts_ns)

    def local(self) -> set[str]:
        """The capture point's own addresses; empty when it looks like a tap (or a host with
        several addresses): no address is an end of every connection, or two are and neither
        the handshakes nor the acknowledgements say which one answered at once."""
        common: set[str] | None = None
        for x, y in self.pairs:
            common = {x, y} if common is None else common & {x, y}
            if not common:
                return set()
        if not common:
            return set()
        if len(common) == 1 or all(a.startswith("127.") or a == "::1" for a in common):
            return common
        total = sum(self.votes[a] for a in common)
        if total:
            best = max(sorted(common), key=lambda a: self.votes[a])
            return {best} if self.votes[best] * 3 >= total * 2 else set()   # two thirds of the handshakes
        quickest = {a: min((d for (acker, _), d in self._ack_min.items() if acker[0] == a), default=None)
                    for a in common}
        if len(common) == 2 and None not in quickest.values():
            x, y = sorted(common, key=quickest.get)
            if quickest[x] * self.ACK_CLEAR <= quickest[y]:
                return {x}
        return set()


class CapturePoint:
    """Segments in (in capture order), rows out through emit(table, row)."""

    def __init__(self, host_id: str, emit, local_ips: set[str] | None, forced: dict[int, str] | None = None,
                 key_sample_max: int = 16, conns_max: int = CONNS_MAX, make_parser=None):
        """local_ips None: not known yet; rows are held until decide() says (a capture point
        is read once: its local addresses are judged from its first packets, and checked at
        the end, capture/rundir.py). make_parser(src, dst, mid_stream=, start_offset=): a
        direction's stream parser (default: the protocol forced for a port, else the
        sniffer, parsers/sniff.py)."""
        self.host_id = host_id
        self.emit = emit
        self.local = None if local_ips is None else set(local_ips)
        self._held: list = []   # what waits for the local addresses: message events, rows
        self.forced = dict(forced or {})
        self.key_sample_max = key_sample_max
        self.conns_max = conns_max
        self.conns: OrderedDict[tuple, _Connection] = OrderedDict()   # least recently active first
        self.ids = Identities()
        self.stats = PointStats()
        self.protocols: Counter = Counter()
        self.make_parser = make_parser or self._parser
        self.held = HeldBytes()   # what all directions hold out of order, bounded together
        self._fed_last: tuple | None = None   # (connection, direction) of the latest payload

    def decide(self, local_ips: set[str]) -> None:
        """The local addresses are known: what waited for them goes out."""
        self.local = set(local_ips)
        held, self._held = self._held, []
        for what, args in held:
            {"message": self._message_rows, "clock": self._clock_sample, "streams": self._stream_rows}[what](*args)

    # -- segments -------------------------------------------------------------
    def segment(self, s: Segment) -> None:
        st = self.stats
        st.segments += 1
        src, dst = (s.src, s.sport), (s.dst, s.dport)
        key = (src, dst) if src <= dst else (dst, src)
        conn = self.conns.get(key)
        syn = s.flags & SYN
        if conn is not None and syn:
            d = conn.dirs.get(src)
            if d is not None and (d.asm is not None or (d.isn is not None and d.isn != s.seq)):
                self._drop(key, conn, "reused")   # a new connection on the same 4-tuple
                st.connections_reused += 1
                conn = None
        length = len(s.payload) + s.missing
        if conn is None:
            if not syn and not length:
                return   # an ACK or FIN of a connection already closed here (or never seen): nothing to follow
            if len(self.conns) >= self.conns_max:
                old = next(iter(self.conns))
                self._drop(old, self.conns[old], "evicted")
                st.connections_evicted += 1
            conn = self.conns[key] = _Connection(src, dst, first_ns=s.ts_ns)
            st.connections += 1
        else:
            self.conns.move_to_end(key)
        conn.last_ns = max(conn.last_ns, s.ts_ns)
        d = conn.dirs.get(src)
        if d is None:
            d = conn.dirs[src] = _Direction(src, dst, s.seq if syn else None, bool(syn and not s.flags & ACK))
        elif syn and d.isn is None and d.asm is None:
            d.isn, d.opened = s.seq, not s.flags & ACK
        if s.flags & RST:
            self._drop(key, conn, "closed")
            return
        if not length:
            if s.flags & FIN:
                self._fin(key, conn, d)
            return
        if d.asm is None:
            self._start(conn, d, s)
        asm = d.asm
        off = unwrap(s.seq, d.base, asm.next)
        if (s.ts_ns - d.last_ts_ns >= CLOCK_GAP_NS and length >= CLOCK_MIN_BYTES and off >= asm.next):
            self._clock_sample(s.src, s.sport, s.dst, s.dport, s.seq, s.ts_ns)
        d.last_ts_ns = s.ts_ns
        if d.signature_offset < 0 and len(s.payload):
            d.signature, d.signature_offset = bytes(s.payload[:SIGNATURE_BYTES]), off
        last = self._fed_last
        if last is not None and last[1] is not d:
            got = last[1].asm.flush()   # its bytes before this segment's: messages in capture order
            if got:
                self._messages(*last, got)
        self._fed_last = (conn, d)
        got = asm.segment(off, bytes(s.payload), s.missing, s.ts_ns)
        if got:
            self._messages(conn, d, got)
        if s.flags & FIN:
            self._fin(key, conn, d)

    def _fin(self, key: tuple, conn: _Connection, d: _Direction) -> None:
        """A FIN: once both ends sent theirs the connection is done here (a segment of it still
        in flight afterwards is a retransmission: it starts nothing new, see segment())."""
        d.fin = True
        if len(conn.dirs) == 2 and all(x.fin for x in conn.dirs.values()):
            self._drop(key, conn, "closed")

    def _start(self, conn: _Connection, d: _Direction, s: Segment) -> None:
        """A direction's first payload: its parser (forced by port, else sniffed), from the
        stream's start when its SYN was captured, else joined mid-stream here."""
        d.base = d.isn if d.isn is not None else 0
        # from the start: offset 0 (a first segment later than that is out of order); else here
        start = 0 if d.isn is not None else (s.seq - 1) & MASK32
        d.mid_stream = d.isn is None
        d.asm = Reassembly(self.make_parser(d.src, d.dst, mid_stream=d.mid_stream, start_offset=start), start,
                           self.held)

    def _parser(self, src, dst, mid_stream: bool, start_offset: int):
        forced = self.forced.get(src[1]) or self.forced.get(dst[1]) if self.forced else None
        make = parser_class(forced) if forced else SniffingParser
        return make(mid_stream=mid_stream, start_offset=start_offset, key_sample_max=self.key_sample_max)

    def _clock_sample(self, src: str, sport: int, dst: str, dport: int, seq: int, ts_ns: int) -> None:
        if self.local is None:
            self._held.append(("clock", (src, sport, dst, dport, seq, ts_ns)))
            return
        for direction, here in (("tx", src), ("rx", dst)):
            if here in self.local:
                self.emit("clock_samples", {"host_id": self.host_id, "direction": direction, "src_ip": src,
                                            "src_port": sport, "dst_ip": dst, "dst_port": dport, "seq": seq,
                                            "ts_ns": ts_ns})

    # -- messages -------------------------------------------------------------
    def _perspectives(self, d: _Direction, msg) -> list[bool]:
        """The rows of one message: True for a tx row (local = its sender), False for rx."""
        out = []
        if d.src[0] in self.local:
            out.append(True)
        if d.dst[0] in self.local:
            out.append(False)
        if not out and not self.local:   # a tap: the client's view (module docstring)
            out.append(msg.request is not False or msg.control)
        return out

    def _messages(self, conn: _Connection, d: _Direction, msgs: list) -> None:
        asm = d.asm
        other = conn.dirs.get(d.dst)
        isns = (d.isn, other.isn if other is not None else None)
        for m in msgs:
            self.stats.messages += 1
            seq_first = (d.base + 1 + m.first_byte_offset) & MASK32
            seq_end = (d.base + 1 + m.last_byte_offset + 1) & MASK32
            event = (conn, d, isns, m, asm.time_of(m.last_byte_offset), seq_first, seq_end)
            if self.local is None:
                self._held.append(("message", event))
            else:
                self._message_rows(*event)
        asm.release(msgs[-1].end_offset)

    def _message_rows(self, conn: _Connection, d: _Direction, isns: tuple, m, ts, seq_first: int,
                      seq_end: int) -> None:
        for tx in self._perspectives(d, m):
            local, remote = (d.src, d.dst) if tx else (d.dst, d.src)
            key = (local, isns)
            got = conn.ids.get(key)
            if got is None:
                isn_l, isn_r = isns if tx else isns[::-1]
                got = conn.ids[key] = conn_id_of(local, remote, isn_l or 0, isn_r or 0, None not in isns)
            cid, pair = got
            view = _View(_ConnView(local, remote, pair), tx, m)
            self.ids.learn_message(view, local)   # the local endpoint stands for the process
            sender = recver = None
            if m.pair_scope == PAIR_NODES:
                sender, recver = self.ids.sender(view, local), self.ids.recver(view, local)
            self._row(m, tx, local, remote, cid, seq_first, seq_end, ts, sender, recver)

    def _row(self, m, tx: bool, local, remote, cid: str, seq_first: int, seq_end: int, ts,
             sender, recver) -> None:
        detail = m.detail()
        self.stats.rows += 1
        self.emit("messages", {
            "host_id": self.host_id, "direction": "tx" if tx else "rx",
            "local_ip": local[0], "local_port": local[1], "remote_ip": remote[0], "remote_port": remote[1],
            "conn_id": cid, "seq_first": seq_first, "seq_end": seq_end,
            "protocol": m.protocol, "pair_scope": m.pair_scope, "control": m.control, "request": m.request,
            "op": m.op or "unknown", "op_name": m.op_name, "call_space": m.call_space, "call_id": m.call_id,
            "sender": sender, "recver": recver, "num_keys": m.num_keys, "key_sample": list(m.key_sample),
            "key_sample_complete": m.key_sample_complete, "value_bytes": m.value_bytes,
            "msg_bytes": m.total_bytes,
            "detail": json.dumps(detail, separators=(",", ":"), sort_keys=True) if detail else None,
            TX_SEEN if tx else RX_SEEN: ts,
            "null_reasons": NULL_REASONS[(tx, ts is not None)],
        })

    # -- connections ----------------------------------------------------------
    def _drop(self, key: tuple, conn: _Connection, end: str) -> None:
        del self.conns[key]
        if self._fed_last is not None and self._fed_last[0] is conn:
            self._fed_last = None
        for d in conn.dirs.values():
            if d.asm is not None:
                got = d.asm.finish()
                if got:
                    self._messages(conn, d, got)
        self._stream_rows(conn, end)

    def finish(self) -> None:
        """The capture ended: every connection's holes are gaps, its parsers closed."""
        for key in list(self.conns):
            self._drop(key, self.conns[key], "open_at_stop")

    def _stream_rows(self, conn: _Connection, end: str) -> None:
        """streams rows (agent.records.STREAMS_SCHEMA) through agent.streams.stream_row: one per
        local end (a tap: one, from the end that opened the connection, else the first seen)."""
        if self.local is None:
            self._held.append(("streams", (conn, end)))
            return
        st = self.stats
        moved = 0
        for d in conn.dirs.values():
            if d.asm is not None:
                a, p = d.asm.stats, d.asm.parser.stats()
                for k in ("segments", "captured_bytes", "bytes", "retransmitted_bytes", "ahead_segments", "lost_bytes",
                          "truncated_bytes", "out_of_window_segments"):
                    setattr(st.directions, k, getattr(st.directions, k) + getattr(a, k))
                st.unparsed_bytes += p.unparsed_bytes
                st.lost_bytes += p.lost_bytes
                moved += a.captured_bytes
        ends = [e for e in (conn.a, conn.b) if e[0] in self.local] or [_opener(conn)]
        for local in ends:
            remote = conn.b if local == conn.a else conn.a
            tx_d, rx_d = conn.dirs.get(local), conn.dirs.get(remote)
            isn_l = tx_d.isn if tx_d else None
            isn_r = rx_d.isn if rx_d else None
            known = isn_l is not None and isn_r is not None
            cid, pair = conn_id_of(local, remote, isn_l or 0, isn_r or 0, known)
            c = Conn(0, 0, local, remote, isn_l or 0, isn_r or 0, known, cid, pair,
                     first_ns=conn.first_ns, last_ns=conn.last_ns)
            c.tx, c.rx = _flow(tx_d, True), _flow(rx_d, False)
            row = stream_row(c, self.host_id, end)
            if row["protocol"] not in ("unrecognised", "none"):
                self.protocols[row["protocol"]] += 1
            elif row["protocol"] == "unrecognised" and local == ends[0]:
                st.unrecognised_connections += 1
                st.unrecognised_bytes += moved
            self.emit("streams", row)


def _opener(conn: _Connection) -> tuple[str, int]:
    """The endpoint that sent a SYN without ACK (else the one seen first)."""
    return next((e for e, d in conn.dirs.items() if d.opened), conn.a)


def _flow(d: _Direction | None, tx: bool) -> Flow | None:
    """agent.streams.Flow of a captured direction, as stream_row reads it (no syscalls: 0 calls)."""
    if d is None or d.asm is None:
        return None
    p = d.asm.parser
    f = Flow(tx, d.base, getattr(p, "chosen", None) or p, d.asm.next, mid_stream=d.mid_stream)
    f.moved_bytes = d.asm.stats.bytes
    f.signature, f.signature_offset = d.signature, d.signature_offset
    return f

