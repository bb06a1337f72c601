"""Raw send/recv events -> protocol messages, per connection and direction.

Each sockcall event becomes a `Call`: who, which connection, when, which TCP
sequence range, and a *stream view* of what it moved, relative to the call's
first byte:

    [(rel_offset, bytes)   captured bytes
     (rel_offset, n: int)  n bytes not captured]

plus `ends`: {rel offset just past a message end: {stage column: ts_ns}} that the
kernel could time for that end (walker / netstack: data-ready, netif, NIC...).
Today's sockcalls events carry a 256-byte prefix: one piece, the rest not
captured. The in-kernel frame walker gives several pieces and skips (bytes
inside frame bodies) per call: only `view_of_*` changes, not what follows.

Per direction of a connection a stream parser is fed the pieces and told of the
rest through gap() (a gap inside a body it walks anyway costs nothing; one that
hides a header makes it resynchronise). Which protocol's parser: the one forced
for the connection's port (`--protocol PORT=NAME`), else the one its first
bytes name, or, for a direction first seen mid-stream, the first whose hunt
finds sync (parsers/sniff.py). Stream offsets count from the
byte after the SYN: offset = seq - (isn + 1) mod 2**32, unwrapped.

The output is one `WireMessage` per parsed message, with the calls that moved
its first and last byte (their times are stages of the message).
"""
from __future__ import annotations

import bisect
import math
import socket
import struct
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from agent.bounded import CONN_IDLE_NS, CONNS_MAX
from agent.safetext import safe_text
from parsers.pslite.meta import is_node_identity, node_id_of_identity
from parsers.registry import KERNEL_FRAMINGS, parser_class
from parsers.sniff import SniffingParser
from probes import framework as _fw
from probes.events import (AF_INET, AF_INET6, PID_MAX, SOCKCALL_F_ISN_DERIVED, SOCKCALL_F_ISN_EXACT,
                           TIME_NS_MAX, SockCall, SockcallEvent)

MASK32 = 0xFFFFFFFF
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

_SEND_CALLS = frozenset(c.value for c in SockCall if c.is_send)
_ISN_FLAGS = SOCKCALL_F_ISN_EXACT | SOCKCALL_F_ISN_DERIVED
# struct sockcall_event up to payload[] (checked against the ctypes mirror below)
_HEAD = struct.Struct("<QQQQqIIIIIIII16s16sHHHHBB6x16s")
assert _HEAD.size == SockcallEvent.payload.offset, "decode._HEAD does not match SockcallEvent"
_HEAD_SIZE = _HEAD.size


@dataclass(slots=True)
class Call:
    """One completed send/recv syscall, as the decoder uses it."""
    tx: bool
    tgid: int
    tid: int
    comm: str
    netns_ino: int
    sk: int
    enter_ts_ns: int
    exit_ts_ns: int
    family: int
    local: tuple[str, int]
    remote: tuple[str, int]
    isn_local: int
    isn_remote: int
    isn_known: bool
    seq_start: int
    seq_bytes: int          # bytes the call moved per TCP sequence numbers
    view: list              # [(rel, bytes) | (rel, int)]
    ends: dict              # {rel end: {stage column: ts_ns}}
    start_offset: int = 0   # stream offset of seq_start (set by the decoder)
    kernel_unsynced: bool = False  # walker format: the kernel was not following frames at the call's end
    # netstack state at the call's exit (walker format, calls that ended a message):
    sched: tuple | None = None     # receives: agent.netrows.SchedHistory.snapshot of the thread
    window: bytes | None = None    # sends: struct ns_window of the socket (agent.netrows.window_split)


_addr_cache: dict[bytes, str] = {}


def _addr(family: int, raw: bytes) -> str:
    key = raw if family == AF_INET6 else raw[:4]
    s = _addr_cache.get(key)
    if s is None:
        if family == AF_INET6:
            s = socket.inet_ntop(socket.AF_INET6, raw)
        elif family == AF_INET:
            s = socket.inet_ntop(socket.AF_INET, raw[:4])
        else:
            s = raw.hex()
        if len(_addr_cache) < 65536:
            _addr_cache[key] = s
    return s


def sockcall_format() -> str:
    """How this tree's sockcalls probe fills payload[]: "prefix" (the first bytes
    the call moved) or "items" (the in-kernel ZMTP walker's items, events.h
    struct sockcall_item). Read from events.h, which is what the BPF side
    compiles (the walker's Python mirror may land after its C side)."""
    from probes.events import EVENTS_H
    return "items" if "struct sockcall_item" in EVENTS_H.read_text() else "prefix"


def _head(raw: bytes):
    if len(raw) < _HEAD.size:
        raise ValueError(f"sockcall record of {len(raw)} bytes is shorter than its header")
    return _HEAD.unpack_from(raw)


_ends_cache: dict[tuple, tuple] = {}   # (family, saddr, sport, daddr, dport) -> (local, remote)
_comm_cache: dict[bytes, str] = {}


def _call(h, view: list, ends: dict) -> Call:
    (enter, exit_, sk, _cookie, _ret, tgid, tid, _fd, netns, seq_start, seq_end, isn_l, isn_r,
     saddr, daddr, family, sport, dport, _pb, call, flags, comm) = h
    if enter > TIME_NS_MAX or exit_ > TIME_NS_MAX or tgid > PID_MAX or tid > PID_MAX:
        # the pid, tid and time columns could not hold it (probes.events.TIME_NS_MAX)
        raise ValueError(f"sockcall record with times {enter}, {exit_} or ids {tgid}, {tid} "
                         "no kernel gives")
    # the same few connections and threads call after call: their strings once
    key = (family, saddr, sport, daddr, dport)
    ends_of = _ends_cache.get(key)
    if ends_of is None:
        if len(_ends_cache) >= CONNS_MAX:   # per 4-tuple: under churn a cache this size is RSS
            _ends_cache.clear()
        ends_of = _ends_cache[key] = ((_addr(family, saddr), sport), (_addr(family, daddr), dport))
    name = _comm_cache.get(comm)
    if name is None:
        if len(_comm_cache) >= 65536:
            _comm_cache.clear()
        # a name the traced process chose: control characters (terminal escapes) replaced
        name = _comm_cache[comm] = safe_text(comm.split(b"\0", 1)[0].decode(errors="replace"))
    # positional: keyword arguments cost ~1 us per call here
    return Call(call in _SEND_CALLS, tgid, tid, name, netns, sk, enter, exit_, family, ends_of[0], ends_of[1],
                isn_l, isn_r, bool(flags & _ISN_FLAGS), seq_start, (seq_end - seq_start) & MASK32, view, ends)


def _moved(h) -> int:
    """Bytes the call consumed or wrote; 0 for errors, end of stream (a FIN) and
    MSG_PEEK (returned bytes, consumed none)."""
    ret, seq_start, seq_end = h[4], h[9], h[10]
    return (seq_end - seq_start) & MASK32 if ret > 0 else 0


def call_of_sockcall(raw: bytes) -> Call | None:
    """A sockcalls ring record of the "prefix" format -> Call (None: it moved nothing)."""
    h = _head(raw)
    moved = _moved(h)
    if not moved:
        return None
    payload = raw[_HEAD.size:_HEAD.size + h[18]]  # a valid prefix, even after a fault
    if moved != h[4]:
        # the range and the return disagree (another thread on the same socket):
        # the prefix cannot be placed, so none of it is used
        view = [(0, moved)]
    else:
        view = [(0, payload)] if payload else []
        if len(payload) < moved:
            view.append((len(payload), moved - len(payload)))
    return _call(h, view, {})


NS_RX_F_NETIF, NS_RX_F_NIC, NS_RX_F_DATA_READY, NS_RX_F_NO_NAPI = 0x1, 0x2, 0x4, 0x8
NS_RX_F_NETIF_OVERWRITTEN, NS_RX_F_NETIF_MISSING = 0x10, 0x20
NS_RX_F_DR_MISSING, NS_RX_F_UNTRACKED, NS_RX_F_NOT_LOADED = 0x80, 0x200, 0x8000
_RX_TIMES = struct.Struct("<QQQII")    # struct ns_rx_times: nic, netif, data_ready, rcv_nxt, flags
_RX_TIMES_SIZE = _RX_TIMES.size
_ITEM_SCHED, _ITEM_WINDOW = 7, 8       # enum sockcall_item_kind (probes/events.h); checked by the unit tests
_SCHED_TIMES = struct.Struct("<QQQQQ")  # struct ns_sched's times (agent.netrows.NS_SCHED): wake-up .. tracked


def rx_stages(nic: int, netif: int, dr: int, flags: int) -> dict:
    """Receive-side stage times of one message end, with the reason for each missing one."""
    if flags & NS_RX_F_NOT_LOADED:
        why = "netstack probe not loaded"
        return {"ts_nic_rx_last_ns": None, "ts_nic_rx_last_ns:null": why,
                "ts_netif_rx_last_ns": None, "ts_netif_rx_last_ns:null": why,
                "ts_data_ready_ns": None, "ts_data_ready_ns:null": why}
    out: dict = {}
    seg = None
    if flags & NS_RX_F_NIC and nic:
        out["ts_nic_rx_last_ns"] = nic
    else:
        out["ts_nic_rx_last_ns"] = None
        seg = _rx_segment_reason(flags)
        out["ts_nic_rx_last_ns:null"] = (
            "no arrival record (NAPI or netif_rx) for the segment: no NIC time" if flags & NS_RX_F_NO_NAPI else seg)
    if flags & NS_RX_F_NETIF and netif:
        out["ts_netif_rx_last_ns"] = netif
    else:
        out["ts_netif_rx_last_ns"] = None
        out["ts_netif_rx_last_ns:null"] = seg or _rx_segment_reason(flags)
    if flags & NS_RX_F_DATA_READY and dr:
        out["ts_data_ready_ns"] = dr
    else:
        out["ts_data_ready_ns"] = None
        out["ts_data_ready_ns:null"] = "no data-ready on record for this end"
    return out


def _rx_segment_reason(flags: int) -> str:
    return ("segment record overwritten in the flow ring" if flags & NS_RX_F_NETIF_OVERWRITTEN else
            "socket not tracked before this call" if flags & NS_RX_F_UNTRACKED else
            "no record of the segment")


class Skip(int):
    """n bytes inside frame bodies the kernel's walker skipped (not lost: known)."""


class Hunted(int):
    """n bytes the kernel's walker searched for sync and rejected (unparsed, not lost)."""


# The walker's items (events.h struct sockcall_item and its bodies), unpacked with
# struct: the ctypes mirrors (probes.events, probes.sockcalls.WalkedCall, which this
# must agree with: tests/unit/test_agent_decode.py) cost ~50 us per call.
_ITEM = struct.Struct("<BBHI")            # kind, what, len, call_off
_KEYS = struct.Struct("<IBBHQ")           # scanned_bytes, level, count, pad, mask
_IT_BYTES, _IT_WALK_START, _IT_WALK_END, _IT_MSG_END, _IT_KEYS, _IT_RX_TIMES = 1, 2, 3, 4, 5, 6
_IT_HUNTED = 9
# per kind (the index): its fixed body length, None when it varies, -1: not a kind
_FIXED_LEN = (-1, None, 8, 8, 16, None, None, None, None, 8)
_WALK_HOWS = {_IT_WALK_START: frozenset(range(1, 5)), _IT_WALK_END: frozenset(range(1, 11))}
_START_HOWS, _END_HOWS = _WALK_HOWS[_IT_WALK_START], _WALK_HOWS[_IT_WALK_END]
_CALLS = frozenset(c.value for c in SockCall)
_PAYLOAD_MAX = SockcallEvent.payload.size
_F_CONTINUED = 0x08


def _item_bodies(buf: bytes, at: int, end: int):
    """The items in buf[at:end] as (kind, call_off, body start, body end), each header
    validated as probes.events.decode_items does."""
    unpack = _ITEM.unpack_from
    n = end - at
    while at < end:
        if end - at < 8:
            raise ValueError(f"sockcall item header cut at payload byte {n - (end - at)} of {n}")
        kind, _what, ln, off = unpack(buf, at)
        at += 8
        fixed = _FIXED_LEN[kind] if kind < 10 else -1
        if fixed == -1:
            raise ValueError(f"sockcall item of unknown kind {kind}")
        nxt = at + ln
        if nxt > end:
            raise ValueError(f"sockcall item claims {ln} bytes, {end - at} left")
        if fixed is not None and ln != fixed:
            raise ValueError(f"sockcall item of kind {kind} and {ln} bytes, expected {fixed}")
        yield kind, off, at, nxt
        at = nxt


def _check_items(buf: bytes, at: int, end: int) -> None:
    """Raises ValueError for a record whose items do not parse (see _item_bodies)."""
    for _ in _item_bodies(buf, at, end):
        pass


def _walked_view(buf: bytes, at: int, end: int, total: int) -> tuple:
    """(stream view from call offset 0, walked ranges, ends, rx times, sched bodies, window)
    of the items in buf[at:end] (validated by _item_bodies, and read in the same pass).
    The view and ranges are the same as probes.sockcalls.WalkedCall.stream_view(0) /
    walked_ranges(), Gap as int, Skip as Skip; ends: {offset: {}} per message end; rx
    times: {offset: struct ns_rx_times}."""
    pieces = []
    ranges = []
    hunted = []
    start = None
    ends: dict = {}
    times = None
    sched = None
    window = None
    for kind, off, at, nxt in _item_bodies(buf, at, end):
        ln = nxt - at
        if kind == _IT_BYTES:
            pieces.append((off, buf[at:nxt]))
        elif kind == _IT_MSG_END:
            if off not in ends:
                ends[off] = {}
        elif kind == _IT_WALK_START:
            if buf[at + 4] not in _START_HOWS:
                raise ValueError(f"sockcall walk mark of unknown reason {buf[at + 4]}")
            start = off
        elif kind == _IT_KEYS:
            if ln < _KEYS.size:
                raise ValueError(f"sockcall KEYS item of {ln} bytes")
            _scanned, _level, count, _pad, mask = _KEYS.unpack_from(buf, at)
            if ln != _KEYS.size + 8 * count:
                raise ValueError(f"sockcall KEYS item of {ln} bytes for {count} keys")
            k = at + _KEYS.size
            if count and mask & ((1 << count) - 1) == (1 << count) - 1:
                # the first `count` keys, all sampled (a frame of few keys): one piece
                pieces.append((off, buf[k:nxt]))
            else:
                while mask and k < nxt:   # the k-th key at the k-th set bit's offset
                    low = mask & -mask
                    pieces.append((off + 8 * (low.bit_length() - 1), buf[k:k + 8]))
                    mask ^= low
                    k += 8
        elif kind == _IT_RX_TIMES:
            if times is None:
                times = {}
            times[off] = buf[at:nxt]
        elif kind == _ITEM_SCHED:
            if sched is None:
                sched = []
            sched.append(buf[at:nxt])
        elif kind == _ITEM_WINDOW:
            window = buf[at:nxt]
        elif kind == _IT_WALK_END:
            if buf[at + 4] not in _END_HOWS:
                raise ValueError(f"sockcall walk mark of unknown reason {buf[at + 4]}")
            if start is not None:
                ranges.append((start, off))
                start = None
        elif kind == _IT_HUNTED:
            hunted.append((off, off + int.from_bytes(buf[at:at + 4], "little")))
    if start is not None and start < total:
        ranges.append((start, total))
    walked = [(a, b) for a, b in ranges if b > a]
    if len(pieces) > 1:
        pieces.sort(key=_first)
    out: list = []
    if len(walked) == 1 and walked[0] == (0, total):
        # the common case, the walker followed the whole call: all it did not copy is
        # Skip; a piece right after the last one is joined to it
        at = 0
        for off, data in pieces:
            end = off + len(data)
            if off < at or end > total:
                raise ValueError(f"sockcall pieces overlap or overrun the call at offset {off}")
            if off == at and out:
                o, d = out[-1]
                out[-1] = (o, d + data)
            else:
                if off > at:
                    out.append((at, Skip(off - at)))
                out.append((off, data))
            at = end
        if at < total:
            out.append((at, Skip(total - at)))
        return out, walked, ends, times, sched, window

    def uncaptured(a: int, b: int) -> None:
        # [a, b) holds no captured bytes: Skip where walked, Gap elsewhere
        while a < b:
            for s, e in walked:
                if s <= a < e:
                    end = min(b, e)
                    out.append((a, Skip(end - a)))
                    break
            else:
                for s, e in hunted:
                    if s <= a < e:
                        end = min(b, e)
                        out.append((a, Hunted(end - a)))
                        break
                else:
                    end = b
                    for s, _e in walked + hunted:
                        if a < s < end:
                            end = s
                    out.append((a, end - a))
            a = end

    at = 0
    for off, data in pieces:
        if off < at or off + len(data) > total:
            raise ValueError(f"sockcall pieces overlap or overrun the call at offset {off}")
        if off > at:
            uncaptured(at, off)
        if out and type(out[-1][1]) is bytes and out[-1][0] + len(out[-1][1]) == off:
            out[-1] = (out[-1][0], out[-1][1] + data)
        else:
            out.append((off, data))
        at = off + len(data)
    uncaptured(at, total)
    return out, walked, ends, times, sched, window


def _first(p):
    return p[0]


class SockcallAssembler:
    """sockcalls ring records -> Calls, for either payload format. "items": the
    walker's items joined over the records of a call flagged CONTINUED (as
    probes.sockcalls.CallAssembler: same thread, same entry time and socket),
    unpacked here with struct (see _ITEM)."""

    def __init__(self, fmt: str):
        if fmt not in ("prefix", "items"):
            raise ValueError(f"unknown sockcall format {fmt!r}")
        self.format = fmt
        self._open: dict[int, tuple] = {}   # tid -> (enter ts, sk, first header, payloads so far)
        if fmt == "items":
            from agent.netrows import SchedHistory
            self._sched = SchedHistory()

    def feed(self, raw: bytes) -> Call | None:
        if self.format == "prefix":
            return call_of_sockcall(raw)
        h = _head(raw)
        pb = h[18]
        if h[19] not in _CALLS:
            raise ValueError(f"sockcall record has unknown call {h[19]}")
        if pb > _PAYLOAD_MAX or _HEAD_SIZE + pb > len(raw):
            raise ValueError(f"sockcall record claims {pb} payload bytes but carries {len(raw) - _HEAD_SIZE}")
        tid = h[6]
        opened = self._open.pop(tid, None) if self._open else None
        if opened is not None and (opened[0], opened[1]) != (h[0], h[2]):
            opened = None  # the rest of that call was lost (ring full): drop it
        continued = h[20] & _F_CONTINUED
        if opened is not None or continued:
            # a call over several records: each one's items checked as it comes, all of
            # them read together at the last (call offsets: payloads join end to end)
            _check_items(raw, _HEAD_SIZE, _HEAD_SIZE + pb)
            payload = raw[_HEAD_SIZE:_HEAD_SIZE + pb]
            if opened is not None:
                first, payload = opened[2], opened[3] + payload
            else:
                first = h
            if continued:
                self._open[tid] = (h[0], h[2], first, payload)
                return None
            buf, at, end = payload, 0, len(payload)
        else:
            first, buf, at, end = h, raw, _HEAD_SIZE, _HEAD_SIZE + pb
        ret = first[4]
        moved = (first[10] - first[9]) & MASK32   # a receive that reached the FIN: its seq too
        total = ret if ret > 0 and (moved == ret or (moved == ret + 1 and first[19] not in _SEND_CALLS)) else 0
        if not total:
            if buf is raw:
                _check_items(raw, at, at + pb)   # a bad record is refused even when it moved nothing
            return None
        view, walked, ends, times, sched, window = _walked_view(buf, at, end, total)
        if times is not None:
            for off, st in ends.items():
                rx = times.get(off)
                if rx is not None and len(rx) >= _RX_TIMES_SIZE:
                    nic, netif, dr, _rcv_nxt, flags = _RX_TIMES.unpack_from(rx)
                    if nic > TIME_NS_MAX or netif > TIME_NS_MAX or dr > TIME_NS_MAX:
                        raise ValueError(f"sockcall RX_TIMES item with times {nic}, {netif}, {dr} "
                                         "no kernel gives")
                    st.update(rx_stages(nic, netif, dr, flags))
        c = _call(h, view, ends)
        if sched is not None:
            for body in sched:
                if len(body) >= _SCHED_TIMES.size and max(_SCHED_TIMES.unpack_from(body)) > TIME_NS_MAX:
                    raise ValueError("sockcall SCHED item with times no kernel gives")
                c.sched = self._sched.snapshot(c.tid, c.exit_ts_ns, body)
        c.window = window
        # the walker was not following frames at the call's end: a sync hint may help
        # (why it stopped is in the probe's counters: desyncs, stream_gaps, walk_aborted)
        c.kernel_unsynced = not walked or walked[-1][1] < total
        return c


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


def conn_id_of(local, remote, isn_local: int, isn_remote: int, known: bool) -> tuple[str, tuple]:
    """A connection's id, the same string on both of its ends: endpoints sorted, each
    with its ISN ('?' when unknown)."""
    a = (local[0], local[1], isn_local if known else None)
    b = (remote[0], remote[1], isn_remote if known else None)
    lo, hi = sorted((a, b), key=lambda e: (e[0], e[1]))

    def fmt(e):
        host = f"[{e[0]}]" if ":" in e[0] else e[0]
        return f"{host}:{e[1]}#{'?' if e[2] is None else e[2]}"

    return f"{fmt(lo)}-{fmt(hi)}", ((lo[0], lo[1]), (hi[0], hi[1]))


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
                 idle_ns: int = CONN_IDLE_NS, on_stream=None, forced: dict[int, str] | None = None):
        """on_sync_hint(sk, tx, seq, frame_index): the parser knows where a frame header
        of a direction the kernel's walker is not following will be (live: tell the
        walker, probes.sockcalls.set_sync_hint; only for protocols the walker frames).
        forced: {port: protocol name}: a connection with either end on the port speaks it. on_stream(conn, end): a connection is
        dropped (end: closed, idle_expired, evicted, reused) or still open at the stop
        (open_at_stop): what it moved (stream_row)."""
        self.key_sample_max = key_sample_max
        self.on_sync_hint = on_sync_hint
        self.on_stream = on_stream
        self.conns_max = conns_max
        self.idle_ns = idle_ns
        self.forced = dict(forced or {})
        self.hints = 0
        # (netns, sk, local, remote) -> Conn, least recently active first (agent.bounded)
        self.conns: OrderedDict[tuple, Conn] = OrderedDict()
        self.calls = 0
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
        flow.moved_bytes += c.seq_bytes
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
                        # a Skip is inside a frame body: parsers/pslite has no skip() yet,
                        # and a gap there loses nothing (the parser walks the body anyway)
                        got = (getattr(parser, "skip", parser.gap) if isinstance(x, Skip) else
                               getattr(parser, "unparsed", parser.gap) if isinstance(x, Hunted) else parser.gap)(n)
                        if got:
                            out += got
            flow.next_offset = end
            c.view = None   # fed: a kept call needs its times, not its bytes (memory)
            if type(parser) is SniffingParser and parser.chosen is not None:
                flow.parser = parser.chosen   # it has seen every byte: fed directly from now on
            if c.kernel_unsynced and self.on_sync_hint is not None:
                self._hint(conn, flow, c)
        if self._dropped:
            return self._take_dropped() + (self._messages(conn, flow, out) if out else [])
        return self._messages(conn, flow, out) if out else []

    def _hint(self, conn: Conn, flow: Flow, c: Call) -> None:
        """The call ended unsynced in the kernel; if the parser is in sync and its next
        byte is a frame header, that is where the walker can start."""
        if flow.parser.PROTOCOL not in KERNEL_FRAMINGS:
            return
        at = flow.parser.next_sync()
        if at is None or at[0] == flow.hinted_offset or c.exit_ts_ns - flow.hinted_ns < HINT_INTERVAL_NS:
            return
        flow.hinted_offset, flow.hinted_ns = at[0], c.exit_ts_ns
        self.hints += 1
        self.on_sync_hint(c.sk, c.tx, (flow.isn + 1 + at[0]) & MASK32, at[1])

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


# ---------------------------------------------------------------- framework events

_MISSING = object()
META_CACHE_MAX = 4096  # meta frames decoded, kept until both ends' records came (cleared when full)
# struct fw_event unpacked here as probes.framework.unpack_event does
_FW_LEGACY_BYTES = _fw._LEGACY_BYTES
_FW_FIXED_SIZE = _fw._FIXED.size
_FW_FIXED_UNPACK = _fw._FIXED.unpack_from
_FW_LENS = 11 + _fw.MAX_FRAMES   # head_len[] in _FIXED's values
_FW_HEAD_AT = tuple(range(_FW_FIXED_SIZE, _FW_FIXED_SIZE + _fw.CAPTURE_BYTES * _fw.MAX_FRAMES, _fw.CAPTURE_BYTES))


class FrameworkDecoder:
    """Raw framework-probe events -> probes.framework.FrameworkMessage.

    The same as probes.framework.MessageAssembler (the pieces of one (thread,
    socket, direction) joined up to the one without "more"; a ROUTER's first
    frame is the peer's routing id), on tuples unpacked straight from the ring
    record instead of an object per event: this ran ~4 times per ps-lite
    message (once per frame) and was the agent's largest per-event cost; the
    kernel now sends one event per message. zmq_socket events and the ps-lite
    layer go through the probe's own assembler.
    """

    def __init__(self):
        from probes.framework import Kind, MessageAssembler

        self._asm = MessageAssembler()
        self._open: dict[tuple, list] = {}
        self._send, self._recv = int(Kind.ZMQ_SEND), int(Kind.ZMQ_RECV)
        self._unpack = _fw.unpack_event
        self._metas: dict[tuple, object] = {}
        self._nodes: dict[bytes, int | None] = {}   # routing id -> ps-lite node id
        # routing ids named as ps-lite's ("ps<digits>") whose node id does not fit the
        # sender column (int32): refused, counted (meta.json's framework_values_rejected)
        self.values_rejected = 0

    @property
    def open_messages(self) -> int:
        return len(self._open)

    def feed(self, raw: bytes):
        if len(raw) == _FW_LEGACY_BYTES:
            (kind, tgid, tid, sock, ts, first_ret, ret_ts, _ret, more, _arg, sizes, heads) = \
                self._unpack(raw)
        elif len(raw) < _FW_FIXED_SIZE:
            raise ValueError(f"framework record of {len(raw)} bytes is shorter than its header")
        else:   # probes.framework.unpack_event, inlined: once per zmq message
            v = _FW_FIXED_UNPACK(raw)
            ts, first_ret, ret_ts, sock, tgid, tid, kind, more, n = v[0], v[1], v[2], v[3], v[5], v[6], v[8], v[9], v[10]
            if n > _fw.MAX_FRAMES:
                raise ValueError(f"framework record claims {n} frames")
            sizes = v[11:11 + n]
            heads = tuple([raw[at:at + ln] for at, ln in zip(_FW_HEAD_AT, v[_FW_LENS:_FW_LENS + n])])
        if ts > TIME_NS_MAX or first_ret > TIME_NS_MAX or ret_ts > TIME_NS_MAX or tgid > PID_MAX or tid > PID_MAX:
            raise ValueError(f"framework record with times {ts}, {first_ret}, {ret_ts} or ids {tgid}, {tid} "
                             "no kernel gives")
        if kind != self._send and kind != self._recv:
            from probes.framework import decode_event
            return self._asm.feed(decode_event(raw))
        key = (tgid, tid, sock, kind)
        pieces = self._open.get(key) if self._open else None
        if more:
            piece = (ts, first_ret, ret_ts, sizes, heads)
            if pieces is None:
                self._open[key] = [piece]
            else:
                pieces.append(piece)
            return None
        if pieces is not None:
            del self._open[key]
            pieces.append((ts, first_ret, ret_ts, sizes, heads))
            first = pieces[0]
            ts, first_ret = first[0], first[1]
            sizes = tuple([s for p in pieces for s in p[3]])
            heads = tuple([h for p in pieces for h in p[4]])
        return self._message(kind == self._send, tgid, tid, sock, ts, first_ret, ret_ts, sizes, heads)

    def _message(self, send: bool, tgid: int, tid: int, sock: int, ts: int, first_ret: int,
                 ret_ts: int, sizes: tuple, heads: tuple):
        peer, at = None, 0
        sock_type = self._asm._sock_types.get((tgid, sock))
        if len(sizes) >= 2 and (sock_type == _fw.ZMQ_ROUTER or (
                sock_type is None and _fw._looks_like_routing_id(heads[0], sizes[0]))):
            peer, at = heads[0], 1
        meta = self._meta(heads[at], sizes[at], peer if not send else None) if at < len(sizes) else None
        return _frozen(_fw.FrameworkMessage, {
            "layer": "zmq", "direction": "send" if send else "recv", "tgid": tgid, "tid": tid, "sock": sock,
            "ts_ns": ts if send else ret_ts, "call_ts_ns": ts, "ret_ts_ns": ret_ts,
            "first_ret_ts_ns": first_ret, "total_bytes": sum(sizes), "frames": len(sizes), "peer": peer,
            "meta": meta, "frame_sizes": sizes, "frame_heads": heads})

    def _meta(self, head: bytes, size: int, peer: bytes | None):
        """decode_pbmeta of a meta frame, the sender taken from a received message's
        routing id. Cached: the sender's and the receiver's records of one message carry
        the same meta (one agent per kernel sees both), and MetaIds is immutable."""
        key = (head, size)
        meta = self._metas.get(key, _MISSING)
        if meta is _MISSING:
            if len(self._metas) >= META_CACHE_MAX:
                self._metas.clear()
            meta = self._metas[key] = _fw.decode_pbmeta(head, size)
        if meta is not None and peer is not None:
            node = self._nodes.get(peer, _MISSING)
            if node is _MISSING:
                if len(self._nodes) >= META_CACHE_MAX:
                    self._nodes.clear()
                node = self._nodes[peer] = node_id_of_identity(peer)
                if node is None and is_node_identity(peer):
                    self.values_rejected += 1
            if node is not None:
                meta = _replace_sender(meta, node)
        return meta


def _frozen(cls, fields: dict):
    """An instance of the frozen dataclass cls with these fields (all of them, in order).
    Its __init__ sets each through object.__setattr__: ~1.5 us per FrameworkMessage, on
    every framework record; the instance is the same (eq, repr, hash)."""
    obj = _new(cls)
    obj.__dict__.update(fields)
    return obj


_new = object.__new__


def _replace_sender(meta, node: int):
    # dataclasses.replace, without its per-call field introspection
    d = dict(meta.__dict__)
    d["sender"] = node
    return _frozen(_fw.MetaIds, d)
