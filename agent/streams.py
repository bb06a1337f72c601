"""Calls (agent/calls.py) -> protocol messages, per connection and direction.

Per direction of a connection a stream parser is fed the captured pieces and told
of the rest: skip() for bytes inside a body the kernel's walker went past,
unparsed() for bytes it searched and rejected, gap() for bytes not followed (a gap
inside a body the parser walks anyway costs nothing; one that hides a header makes
it resynchronise). Which protocol's parser: the one forced for the connection's port
(`--protocol PORT=NAME`), else the one its first bytes name, or, for a direction
first seen mid-stream, the first whose hunt finds sync (parsers/sniff.py). Stream
offsets count from the byte after the SYN: offset = seq - (isn + 1) mod 2**32,
unwrapped.

The output is one `WireMessage` per parsed message, with the calls that moved
its first and last byte (their times are stages of the message).
"""
from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from agent.bounded import CONN_IDLE_NS, CONNS_MAX
from agent.calls import MASK32, Call, Hunted, Skip, walked_view
from agent.endpoints import conn_id_of
from parsers.registry import parser_class
from parsers.sniff import OpaqueStream, SniffingParser
from probes.sockcalls import FRAMINGS

# Calls kept per direction to find the call that moved a message's first byte
# (the parser may release a message late: a tentative chain holds up to 256 KiB).
CALLS_KEPT_MAX = 4096
CALLS_KEPT_BYTES = 4 << 20
# A sync hint per direction at most this often: the walker may need a few calls to
# take one (the stream moved on meanwhile); more would only fill its map.
HINT_INTERVAL_NS = 20_000_000
# Connection state is bounded (StreamDecoder; caps and idle expiry in agent.bounded).
# After a socket's close its last calls may still come on the other ring for this
# long (as agent/delivered.py's 100 ms: a ring's read is cut at most that far behind
# its latest event).
CLOSE_SETTLE_NS = 100_000_000
SIGNATURE_BYTES = 16         # of a direction's first captured bytes, kept to tell its protocol by
THREADS_KEPT = 8             # thread names kept per connection
UPKEEP_NS = 100_000_000      # closes and idle connections looked at this often (call time)


@dataclass(slots=True)
class Flow:
    """One direction of one connection on one host."""
    tx: bool
    isn: int                 # the ISN this direction's offsets count from
    parser: object           # a registered protocol's stream parser, or a SniffingParser until it chose
    next_offset: int         # stream offset of the next byte expected
    calls: deque = field(default_factory=deque)   # Call, in stream order
    starts: list = field(default_factory=list)    # their start offsets (for bisect), kept in step
    mid_stream: bool = False
    hinted_offset: int = -1  # stream offset of the last sync hint given
    hinted_ns: int = -(1 << 62)  # and when (hints are rate-limited per direction)
    # what it moved, whatever the protocol (the streams table: traffic no parser recognised)
    n_calls: int = 0
    moved_bytes: int = 0
    signature: bytes = b""   # its first captured bytes (SIGNATURE_BYTES at most)
    signature_offset: int = -1   # their stream offset (0: the stream's start)


@dataclass(slots=True)
class Conn:
    """One TCP connection as seen on one host."""
    netns_ino: int
    sk: int
    local: tuple[str, int]
    remote: tuple[str, int]
    isn_local: int
    isn_remote: int
    isn_known: bool
    conn_id: str
    pair_key: tuple          # the same on both ends: sorted endpoints
    tx: Flow | None = None
    rx: Flow | None = None
    tgids: set = field(default_factory=set)
    first_ns: int = 0        # entry time of its first call seen (a close before it is another's)
    last_ns: int = 0         # exit time of its latest call (the idle expiry's clock)
    threads: dict = field(default_factory=dict)   # tid -> thread name, THREADS_KEPT at most


@dataclass(slots=True)
class WireMessage:
    """A message parsed from one direction of one connection (parsers/protocol.py)."""
    conn: Conn
    tx: bool
    msg: object
    first_call: Call | None   # None: the call was no longer kept (or the byte was in a gap)
    last_call: Call | None
    seq_first: int
    seq_end: int
    stages: dict              # stage column -> ts_ns from the kernel's end records


def stream_row(conn: Conn, host_id: str, end: str) -> dict:
    """A row of the streams table (agent.records.STREAMS_SCHEMA): what the connection
    moved each way and whether a parser recognised its protocol."""
    flows = (("tx", conn.tx), ("rx", conn.rx))
    recognised = next((f.parser.PROTOCOL for _, f in flows if f is not None and f.parser.recognised()), None)
    moved = sum(f.moved_bytes for _, f in flows if f is not None)
    row = {"host_id": host_id, "netns_ino": conn.netns_ino, "conn_id": conn.conn_id,
           "local_ip": conn.local[0], "local_port": conn.local[1],
           "remote_ip": conn.remote[0], "remote_port": conn.remote[1],
           "pids": sorted(conn.tgids), "threads": sorted(set(conn.threads.values())),
           "protocol": recognised or ("unrecognised" if moved else "none"),
           "ts_first_ns": conn.first_ns, "ts_last_ns": conn.last_ns, "end": end}
    for d, f in flows:
        st = f.parser.stats() if f is not None else None
        row[f"calls_{d}"] = f.n_calls if f is not None else 0
        row[f"bytes_{d}"] = f.moved_bytes if f is not None else 0
        row[f"messages_{d}"] = st.messages if st is not None else 0
        row[f"unparsed_bytes_{d}"] = st.unparsed_bytes if st is not None else 0
        row[f"signature_{d}"] = f.signature.hex() if f is not None else ""
        row[f"signature_offset_{d}"] = f.signature_offset if f is not None and f.signature else None
    return row


class StreamDecoder:
    """Calls in, WireMessages out. One per agent: connections of every host.

    Its state is per connection (a Conn, two parsers, the calls kept for timing), so
    it is bounded (DESIGN.md "What the agent trusts"): a connection is dropped when
    its close is seen (closed(): the netstack probe's TCP_CLOSE, CLOSE_SETTLE_NS
    later), when idle for CONN_IDLE_NS, and beyond CONNS_MAX the least recently
    active one is evicted. Each is counted per network namespace
    (decoder_conns_closed, _idle_expired, _evicted, and _reused for a socket and
    port reused with new ISNs before its close was seen; in stats_by_netns, hence
    meta.json). Dropping ends its parsers (a tentative chain is accepted) and their
    messages go out with the next feed() or advance(). A connection dropped while
    alive that speaks again is a new Conn joining mid-stream: its ISNs come with
    every call, so its id is the same."""

    def __init__(self, key_sample_max: int = 16, on_sync_hint=None, conns_max: int = CONNS_MAX,
                 idle_ns: int = CONN_IDLE_NS, on_stream=None, forced: dict[int, str] | None = None,
                 walked: bool = True):
        """on_sync_hint(sk, tx, seq, frame_index, framing): the parser knows where a frame
        header of a direction the kernel's walker is not following will be, and in which
        of the walker's framings (live: tell the walker, probes.sockcalls.set_sync_hint;
        only for protocols the walker frames, probes.sockcalls.FRAMINGS); framing None
        (seq and frame_index 0): a direction joined mid-stream that no parser recognised,
        whose calls the kernel still copies raw prefixes of: it may count them only
        (probes.sockcalls.set_count_only).
        forced: {port: protocol name}: a connection with either end on the port speaks it. on_stream(conn, end): a connection is
        dropped (end: closed, idle_expired, evicted, reused) or still open at the stop
        (open_at_stop): what it moved (stream_row).
        walked: a parser that can (take_walked) takes the messages of a call the kernel walked
        whole without a stream view (False: every call through its stream view, the
        reference the fast way is tested against)."""
        self.key_sample_max = key_sample_max
        self.walked = walked
        self.on_sync_hint = on_sync_hint
        self.on_stream = on_stream
        self.conns_max = conns_max
        self.idle_ns = idle_ns
        self.forced = dict(forced or {})
        self.hints = 0
        self.hints_count_only = 0
        # (netns, sk, local, remote) -> Conn, least recently active first (agent.bounded)
        self.conns: OrderedDict[tuple, Conn] = OrderedDict()
        self.calls = 0
        self.calls_walked_whole = 0   # of them, taken by the parser as the walker gave them (take_walked)
        self.gap_bytes = 0
        self.overlap_bytes = 0
        self._closed_stats: dict[int, dict[str, int]] = {}
        self._closing: deque = deque()   # (close ts, key, Conn) waiting for their last calls
        # (netns, sk) -> keys of its Conns, oldest first: the kernel reuses a closed socket's
        # memory at once, so a later connection's calls may come before the close
        self._keys_of_sk: dict[tuple, list] = {}
        self._dropped: list[WireMessage] = []   # messages of dropped connections, out with the next return
        self._next_upkeep_ns = 0

    # -- connections ----------------------------------------------------------
    def _conn(self, c: Call) -> Conn:
        key = (c.netns_ino, c.sk, c.local, c.remote)
        conn = self.conns.get(key)
        if conn is not None and (not c.isn_known or not conn.isn_known or
                                 (conn.isn_local == c.isn_local and conn.isn_remote == c.isn_remote)):
            if c.isn_known and not conn.isn_known:
                # learnt the ISNs after events without them: keep the flows, fix the id
                conn.isn_local, conn.isn_remote, conn.isn_known = c.isn_local, c.isn_remote, True
                conn.conn_id, conn.pair_key = conn_id_of(c.local, c.remote, c.isn_local, c.isn_remote, True)
            return conn
        if conn is not None:
            # a reused socket and port with new ISNs: the old connection closed unseen
            self._drop(key, conn, "decoder_conns_reused")
        elif len(self.conns) >= self.conns_max:
            old_key = next(iter(self.conns))
            self._drop(old_key, self.conns[old_key], "decoder_conns_evicted")
        # new connection (or a reused socket/port with new ISNs: a new connection)
        cid, pair = conn_id_of(c.local, c.remote, c.isn_local, c.isn_remote, c.isn_known)
        conn = Conn(c.netns_ino, c.sk, c.local, c.remote, c.isn_local, c.isn_remote, c.isn_known, cid, pair,
                    first_ns=c.enter_ts_ns)
        self.conns[key] = conn
        self._keys_of_sk.setdefault((c.netns_ino, c.sk), []).append(key)
        return conn

    def closed(self, netns_ino: int, sk: int, remote: tuple, ts_ns: int) -> None:
        """The socket reached TCP_CLOSE at ts_ns (the netstack probe). Its connection is
        dropped once every call before ts_ns was delivered: the rings are read one after
        the other, so its last calls may come after this (advance(), or a call
        CLOSE_SETTLE_NS later). Found by socket, not 4-tuple: the kernel has released
        the local port by then (the event says port 0). A connection whose first call
        came after the close is a later one on a reused socket."""
        for key in reversed(self._keys_of_sk.get((netns_ino, sk), ())):
            conn = self.conns[key]
            if conn.first_ns <= ts_ns and (remote[1] == 0 or remote == conn.remote):
                self._closing.append((ts_ns, key, conn))
                return

    def advance(self, watermark_ns: int) -> list[WireMessage]:
        """Every event up to watermark_ns has been delivered (agent.correlate): closes
        and idle connections are dropped; returns the messages their parsers ended."""
        self._upkeep(watermark_ns, watermark_ns)
        return self._take_dropped()

    def _take_dropped(self) -> list[WireMessage]:
        out, self._dropped = self._dropped, []
        return out

    def _upkeep(self, delivered_ns: int, now_ns: int) -> None:
        """Drops the connections closed before delivered_ns and those idle at now_ns."""
        self._next_upkeep_ns = now_ns + UPKEEP_NS
        self._apply_closes(delivered_ns)
        conns = self.conns
        idle_before = now_ns - self.idle_ns
        while conns:
            key = next(iter(conns))
            conn = conns[key]
            if conn.last_ns >= idle_before:
                break
            self._drop(key, conn, "decoder_conns_idle_expired")

    def _apply_closes(self, delivered_ns: float) -> None:
        closing = self._closing
        while closing and closing[0][0] <= delivered_ns:
            _, key, conn = closing.popleft()
            if self.conns.get(key) is conn:
                self._drop(key, conn, "decoder_conns_closed")

    def finish(self) -> list[WireMessage]:
        """At the stop, once every call has been delivered: the closes still waiting
        for their last calls are applied (not left out of decoder_conns_closed), and the
        streams of the connections still open are said (end "open_at_stop"). Their
        parsers are left as they are: a chain still tentative after a mid-stream join
        is not believed without its confirmation. Returns the messages the closed
        connections' parsers ended."""
        self._apply_closes(math.inf)
        if self.on_stream is not None:
            for conn in self.conns.values():
                self.on_stream(conn, "open_at_stop")
        return self._take_dropped()

    def _drop(self, key: tuple, conn: Conn, counter: str) -> None:
        del self.conns[key]
        keys = self._keys_of_sk[(conn.netns_ino, conn.sk)]
        keys.remove(key)
        if not keys:
            del self._keys_of_sk[(conn.netns_ino, conn.sk)]
        for flow in (conn.tx, conn.rx):
            if flow is not None:
                got = flow.parser.close()
                if got:
                    self._dropped += self._messages(conn, flow, got)
        acc = self._closed_stats.setdefault(conn.netns_ino, {})
        _add_flow_stats(acc, conn)
        acc[counter] = acc.get(counter, 0) + 1
        if self.on_stream is not None:
            self.on_stream(conn, counter.removeprefix("decoder_conns_"))

    def _flow(self, conn: Conn, c: Call, offset_isn: int) -> tuple[Flow, int]:
        flow = conn.tx if c.tx else conn.rx
        rel = (c.seq_start - offset_isn - 1) & MASK32
        if flow is None:
            start = rel  # offsets from ISN+1 (from seq 1 when the ISN is unknown)
            mid = not (conn.isn_known and rel == 0)
            forced = self.forced.get(conn.local[1]) or self.forced.get(conn.remote[1]) if self.forced else None
            make = parser_class(forced) if forced else SniffingParser
            flow = Flow(c.tx, offset_isn, make(mid_stream=mid, start_offset=start, key_sample_max=self.key_sample_max),
                        start, mid_stream=mid)
            if c.tx:
                conn.tx = flow
            else:
                conn.rx = flow
            return flow, start
        # unwrap: the offset nearest the expected one with these low 32 bits
        base = flow.next_offset
        off = (base & ~MASK32) | rel
        if off < base - (1 << 31):
            off += 1 << 32
        elif off > base + (1 << 31):
            off -= 1 << 32
        return flow, off

    # -- calls ----------------------------------------------------------------
    def feed(self, c: Call) -> list[WireMessage]:
        self.calls += 1
        now = c.exit_ts_ns
        if now >= self._next_upkeep_ns:
            # a call this much later than a close: the closed socket's calls were delivered
            self._upkeep(now - CLOSE_SETTLE_NS, now)
        key = (c.netns_ino, c.sk, c.local, c.remote)
        conn = self.conns.get(key)
        if conn is None or not conn.isn_known or not c.isn_known or (
                conn.isn_local != c.isn_local or conn.isn_remote != c.isn_remote):
            conn = self._conn(c)   # new, or its ISNs are news: the general case
        self.conns.move_to_end(key)   # in order of last activity: the idle and the evicted first
        if now > conn.last_ns:
            conn.last_ns = now
        conn.tgids.add(c.tgid)
        if c.tid not in conn.threads and len(conn.threads) < THREADS_KEPT:
            conn.threads[c.tid] = c.comm
        tx = c.tx
        flow = conn.tx if tx else conn.rx
        isn = (conn.isn_local if tx else conn.isn_remote) if conn.isn_known else 0
        if flow is None:
            flow, off = self._flow(conn, c, isn)
        else:   # _flow's unwrap, inlined: the offset nearest the expected one with these low 32 bits
            base = flow.next_offset
            off = (base & ~MASK32) | ((c.seq_start - isn - 1) & MASK32)
            if off < base - (1 << 31):
                off += 1 << 32
            elif off > base + (1 << 31):
                off -= 1 << 32
        c.start_offset = off
        flow.n_calls += 1
        flow.moved_bytes += c.seq_bytes - c.fin
        if c.walked is not None:
            # whole messages as the walker saw them: the parser takes them without a stream
            # view when it stands at that message boundary (parsers/pslite/walked.py)
            take = getattr(flow.parser, "take_walked", None) if flow.signature_offset >= 0 and self.walked else None
            got = take(c.walked, off, c.seq_bytes - c.fin) if take is not None and off == flow.next_offset else None
            c.walked = None
            if got is not None:
                self.calls_walked_whole += 1
                c.record = None
                self._keep_call(flow, c)
                flow.next_offset = off + c.seq_bytes
                if self._dropped:
                    return self._take_dropped() + self._messages(conn, flow, got)
                return self._messages(conn, flow, got)
            c.view = walked_view(c)
            c.record = None
        if flow.signature_offset < 0 and c.view and type(c.view[0][1]) is bytes and c.view[0][1]:
            flow.signature = c.view[0][1][:SIGNATURE_BYTES]
            flow.signature_offset = off + c.view[0][0]
        parser = flow.parser
        out: list = []
        skip = flow.next_offset - off  # bytes of this call already seen (overlap)
        if skip < 0:
            self.gap_bytes += -skip
            out += parser.gap(-skip)
            skip = 0
        elif skip > 0:
            self.overlap_bytes += min(skip, c.seq_bytes)
        end = off + c.seq_bytes
        if end > flow.next_offset:
            self._keep_call(flow, c)
            for rel, x in c.view:
                if type(x) is bytes or not isinstance(x, int):   # captured bytes (bytes first: most)
                    if rel < skip:
                        x = x[skip - rel:]
                    if x:
                        got = parser.feed(x)
                        if got:
                            out += got
                else:
                    n = x - max(0, skip - rel) if rel < skip else x
                    if n > 0:
                        got = (parser.skip if isinstance(x, Skip) else
                               parser.unparsed if isinstance(x, Hunted) else parser.gap)(n)
                        if got:
                            out += got
            flow.next_offset = end
            if type(parser) is SniffingParser and parser.chosen is not None:
                flow.parser = parser.chosen   # it has seen every byte: fed directly from now on
            if c.kernel_unsynced and self.on_sync_hint is not None:
                self._hint(conn, flow, c)
            c.view = None   # fed: a kept call needs its times, not its bytes (memory)
        if self._dropped:
            return self._take_dropped() + (self._messages(conn, flow, out) if out else [])
        return self._messages(conn, flow, out) if out else []

    def _hint(self, conn: Conn, flow: Flow, c: Call) -> None:
        """The call ended unsynced in the kernel; if the parser is in sync and its next
        byte is a frame header, that is where the walker can start."""
        framing = FRAMINGS.get(flow.parser.PROTOCOL)
        if framing is None:
            # Unrecognised after a mid-stream hunt (a stream seen from its start was
            # classified by the kernel itself): stop the kernel's raw prefixes.
            if (type(flow.parser) is OpaqueStream and flow.mid_stream
                    and c.exit_ts_ns - flow.hinted_ns >= HINT_INTERVAL_NS
                    and any(type(x) is bytes for _rel, x in c.view)):
                flow.hinted_ns = c.exit_ts_ns
                self.hints_count_only += 1
                self.on_sync_hint(c.sk, c.tx, 0, 0, None)
            return
        at = flow.parser.next_sync()
        if at is None or at[0] == flow.hinted_offset or c.exit_ts_ns - flow.hinted_ns < HINT_INTERVAL_NS:
            return
        flow.hinted_offset, flow.hinted_ns = at[0], c.exit_ts_ns
        self.hints += 1
        self.on_sync_hint(c.sk, c.tx, (flow.isn + 1 + at[0]) & MASK32, at[1], framing)

    @staticmethod
    def _keep_call(flow: Flow, c: Call) -> None:
        calls, starts = flow.calls, flow.starts
        calls.append(c)
        starts.append(c.start_offset)
        if len(calls) > CALLS_KEPT_MAX or (c.start_offset - starts[0] > CALLS_KEPT_BYTES and len(calls) > 64):
            drop = len(calls) // 4
            for _ in range(drop):
                calls.popleft()
            del starts[:drop]

    def _messages(self, conn: Conn, flow: Flow, msgs: list) -> list[WireMessage]:
        out = []
        base = flow.isn + 1
        tx = flow.tx
        calls, starts = flow.calls, flow.starts
        for m in msgs:
            first_at, end = m.first_byte_offset, m.last_byte_offset + 1
            # the kept calls that moved its first and its last byte (None: not kept)
            i = bisect.bisect_right(starts, first_at) - 1
            first = calls[i] if i >= 0 else None
            if first is not None and first_at >= first.start_offset + first.seq_bytes:
                first = None
            i = bisect.bisect_right(starts, end - 1) - 1
            last = calls[i] if i >= 0 else None
            stages = {}
            if last is not None:
                if end - 1 >= last.start_offset + last.seq_bytes:
                    last = None
                elif last.ends:
                    stages = last.ends.get(end - last.start_offset, {})
            out.append(WireMessage(conn, tx, m, first, last, (base + first_at) & MASK32, (base + end) & MASK32,
                                   stages))
        if msgs:
            self._release_calls(flow, msgs[-1].end_offset)
        return out

    @staticmethod
    def _release_calls(flow: Flow, offset: int) -> None:
        """The parser gives messages in stream order: a later one starts at or after the
        end of the last one given, so calls that ended before it are not needed again
        (kept, they held ~4096 calls per busy flow: most of the agent's memory)."""
        calls, starts = flow.calls, flow.starts
        n = 0
        while n < len(calls) - 1 and starts[n] + calls[n].seq_bytes <= offset:
            n += 1
        if n:
            for _ in range(n):
                calls.popleft()
            del starts[:n]

    def unrecognised_open(self) -> list[tuple[Conn, int]]:
        """The open connections that moved bytes no parser recognised (yet), with those
        bytes: what `pslat top` says of traffic it does not understand."""
        out = []
        for conn in self.conns.values():
            moved = 0
            for f in (conn.tx, conn.rx):
                if f is not None:
                    if f.parser.recognised():
                        break
                    moved += f.moved_bytes
            else:
                if moved:
                    out.append((conn, moved))
        return out

    def stats_by_netns(self) -> dict[int, dict[str, int]]:
        """Parser byte counters per network namespace (connections open or closed)."""
        out: dict[int, dict[str, int]] = {}
        for ino, c in self._closed_stats.items():
            out[ino] = dict(c)
        for conn in self.conns.values():
            _add_flow_stats(out.setdefault(conn.netns_ino, {}), conn)
        return out


def _add_flow_stats(acc: dict[str, int], conn: Conn) -> None:
    for flow in (conn.tx, conn.rx):
        if flow is None:
            continue
        s = flow.parser.stats()
        for k in ("messages", "unparsed_bytes", "lost_bytes", "fed_bytes", "gap_bytes",
                  "handshake_bytes", "resyncs", "desyncs", "values_rejected"):
            key = "messages_parsed" if k == "messages" else k
            acc[key] = acc.get(key, 0) + getattr(s, k)
    acc["connections"] = acc.get("connections", 0) + 1
