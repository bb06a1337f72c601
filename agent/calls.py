"""The sockcalls probe's ring records -> `Call`s.

Each sockcall event becomes a `Call`: who, which connection, when, which TCP
sequence range, and a *stream view* of what it moved, relative to the call's
first byte:

    [(rel_offset, bytes)     captured bytes
     (rel_offset, Skip(n))   n bytes inside message bodies the kernel's walker went past
     (rel_offset, Hunted(n)) n bytes the walker searched for sync and rejected
     (rel_offset, n: int)    n bytes not captured]

plus `ends`: {rel offset just past a message end: {stage column: ts_ns}} that the
kernel could time for that end (walker / netstack: data-ready, netif, NIC...).
A record of the "prefix" format carries the call's first bytes only: one piece,
the rest not captured. agent/streams.py turns Calls into messages.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from agent.bounded import CONNS_MAX
from agent.endpoints import addr_text
from agent.netrows import SchedHistory
from core.safetext import safe_text
from probes.events import (PID_MAX, SOCKCALL_BYTES_BODY, SOCKCALL_BYTES_HEADER, SOCKCALL_F_ISN_DERIVED,
                           SOCKCALL_F_ISN_EXACT, TIME_NS_MAX, SockCall, SockcallEvent, WalkStart, WalkStop)

MASK32 = 0xFFFFFFFF   # TCP sequence numbers
_SEND_CALLS = frozenset(c.value for c in SockCall if c.is_send)
_ISN_FLAGS = SOCKCALL_F_ISN_EXACT | SOCKCALL_F_ISN_DERIVED
# struct sockcall_event up to payload[] (checked against the ctypes mirror below)
_HEAD = struct.Struct("<QQQQqIIIIIIII16s16sHHHHBB6x16s")
assert _HEAD.size == SockcallEvent.payload.offset, "calls._HEAD does not match SockcallEvent"
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
    fin: int = 0                   # 1: a receive that also consumed the peer's FIN (in seq_bytes, not a byte)
    # walker format, a call walked from a message's start to a message's end (whole_messages):
    # its messages' items, and the record to build the view from (view is None until then)
    walked: list | None = None
    record: tuple | None = None    # (buffer, items start, items end, total)


def sockcall_format() -> str:
    """How this tree's sockcalls probe fills payload[]: "prefix" (the first bytes
    the call moved) or "items" (the in-kernel walker's items, events.h
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
    (enter, exit_, sk, _cookie, ret, tgid, tid, _fd, netns, seq_start, seq_end, isn_l, isn_r,
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
        ends_of = _ends_cache[key] = ((addr_text(family, saddr), sport), (addr_text(family, daddr), dport))
    name = _comm_cache.get(comm)
    if name is None:
        if len(_comm_cache) >= 65536:
            _comm_cache.clear()
        # a name the traced process chose: control characters (terminal escapes) replaced
        name = _comm_cache[comm] = safe_text(comm.split(b"\0", 1)[0].decode(errors="replace"))
    seq_bytes = (seq_end - seq_start) & MASK32
    # positional: keyword arguments cost ~1 us per call here
    c = Call(call in _SEND_CALLS, tgid, tid, name, netns, sk, enter, exit_, family, ends_of[0], ends_of[1],
             isn_l, isn_r, bool(flags & _ISN_FLAGS), seq_start, seq_bytes, view, ends)
    if seq_bytes == ret + 1 and ret > 0 and not c.tx:
        c.fin = 1
    return c


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
# struct: the ctypes mirrors (probes.events, tests/oracles/walker.py's WalkedCall, which this
# must agree with: tests/unit/test_agent_decode.py) cost ~50 us per call.
_ITEM = struct.Struct("<BBHI")            # kind, what, len, call_off
_KEYS = struct.Struct("<IBBHQ")           # scanned_bytes, level, count, pad, mask
_IT_BYTES, _IT_WALK_START, _IT_WALK_END, _IT_MSG_END, _IT_KEYS, _IT_RX_TIMES = 1, 2, 3, 4, 5, 6
_IT_HUNTED = 9
_NETSTACK_ITEMS = frozenset((_IT_RX_TIMES, _ITEM_SCHED, _ITEM_WINDOW))
# per kind (the index): its fixed body length, None when it varies, -1: not a kind
_FIXED_LEN = (-1, None, 8, 8, 16, None, None, None, None, 8)
_WALK_HOWS = {_IT_WALK_START: frozenset(WalkStart), _IT_WALK_END: frozenset(WalkStop)}
_START_HOWS, _END_HOWS = _WALK_HOWS[_IT_WALK_START], _WALK_HOWS[_IT_WALK_END]
_CALLS = frozenset(c.value for c in SockCall)
_PAYLOAD_MAX = SockcallEvent.payload.size
_F_CONTINUED = 0x08


class _NetstackItems:
    """A call's items from the netstack lookups: RX_TIMES per message end, SCHED, WINDOW."""
    __slots__ = ("times", "sched", "window")

    def __init__(self):
        self.times: dict | None = None    # call offset of a message end -> struct ns_rx_times
        self.sched: list | None = None    # struct ns_sched bodies
        self.window: bytes | None = None  # struct ns_window

    def take(self, kind: int, off: int, body: bytes) -> None:
        if kind == _IT_RX_TIMES:
            if self.times is None:
                self.times = {}
            self.times[off] = body
        elif kind == _ITEM_SCHED:
            if self.sched is None:
                self.sched = []
            self.sched.append(body)
        else:
            self.window = body


def _item_bodies(buf: bytes, at: int, end: int):
    """The items in buf[at:end] as (kind, call_off, body start, body end, what), each
    header validated as probes.events.decode_items does."""
    unpack = _ITEM.unpack_from
    n = end - at
    while at < end:
        if end - at < 8:
            raise ValueError(f"sockcall item header cut at payload byte {n - (end - at)} of {n}")
        kind, what, ln, off = unpack(buf, at)
        at += 8
        fixed = _FIXED_LEN[kind] if kind < 10 else -1
        if fixed == -1:
            raise ValueError(f"sockcall item of unknown kind {kind}")
        nxt = at + ln
        if nxt > end:
            raise ValueError(f"sockcall item claims {ln} bytes, {end - at} left")
        if fixed is not None and ln != fixed:
            raise ValueError(f"sockcall item of kind {kind} and {ln} bytes, expected {fixed}")
        yield kind, off, at, nxt, what
        at = nxt


def _check_items(buf: bytes, at: int, end: int) -> None:
    """Raises ValueError for a record whose items do not parse (see _item_bodies)."""
    for _ in _item_bodies(buf, at, end):
        pass


def _walked_view(buf: bytes, at: int, end: int, total: int) -> tuple:
    """(stream view from call offset 0, walked ranges, ends, rx times, sched bodies, window)
    of the items in buf[at:end] (validated by _item_bodies, and read in the same pass).
    The view and ranges are the same as tests/oracles/walker.py's WalkedCall.stream_view(0) /
    walked_ranges(), Gap as int, Skip as Skip; ends: {offset: {}} per message end; rx
    times: {offset: struct ns_rx_times}."""
    pieces = []
    ranges = []
    hunted = []
    start = None
    ends: dict = {}
    ns = _NetstackItems()
    for kind, off, at, nxt, _what in _item_bodies(buf, at, end):
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
        elif kind in _NETSTACK_ITEMS:
            ns.take(kind, off, buf[at:nxt])
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
        return out, walked, ends, ns.times, ns.sched, ns.window

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
    return out, walked, ends, ns.times, ns.sched, ns.window


def _first(p):
    return p[0]


_WALK_MARK = struct.Struct("<IBB")     # struct sockcall_walk_mark: frame_idx, how, phase
_PHASE_HEADER = 2                      # walk_engine.bpf.h WK_HEADER
_WHOLE_BYTES = SOCKCALL_BYTES_HEADER | SOCKCALL_BYTES_BODY


def whole_messages(buf: bytes, at: int, end: int, total: int) -> tuple | None:
    """The items of a call the walker followed, in sync, from a message's first byte
    (a WALK_START at 0, frame 0, at a header) to a message's last (its last MSG_END at
    the call's end): ([(start, end, pieces, keys)] per message in call order, rx times,
    sched bodies, window), as _walked_view reads them. pieces: BYTES items as (call
    offset, bytes); keys: KEYS items as (call offset, count, mask, keys bytes). None for
    any other call, and for one _walked_view would refuse: that call goes the general
    way, where a bad record raises."""
    msgs: list = []
    pieces: list = []
    keys: list = []
    start = covered = 0   # the message's first byte; the end of the last copied piece
    ns = _NetstackItems()
    items = _item_bodies(buf, at, end)
    for kind, off, at, nxt, _what in items:
        if kind != _IT_WALK_START or off:
            return None
        frame_idx, how, phase = _WALK_MARK.unpack_from(buf, at)
        if frame_idx or phase != _PHASE_HEADER or how not in _START_HOWS:
            return None
        break
    else:
        return None
    for kind, off, at, nxt, what in items:
        if kind == _IT_BYTES:
            if what & ~_WHOLE_BYTES or off < covered:
                return None
            covered = off + nxt - at
            pieces.append((off, buf[at:nxt]))
        elif kind == _IT_KEYS:
            if nxt - at < _KEYS.size:
                return None
            _scanned, _level, count, _pad, mask = _KEYS.unpack_from(buf, at)
            if nxt - at != _KEYS.size + 8 * count or off < covered:
                return None
            covered = off + 8 * mask.bit_length()
            keys.append((off, count, mask, buf[at + _KEYS.size:nxt]))
        elif kind == _IT_MSG_END:
            if off <= start:
                return None
            msgs.append((start, off, pieces, keys))
            pieces, keys, start = [], [], off
        elif kind in _NETSTACK_ITEMS:
            ns.take(kind, off, buf[at:nxt])
        else:   # a walk that stopped, a hunt, another start
            return None
    if start != total or pieces or keys or covered > total:
        return None
    return msgs, ns.times, ns.sched, ns.window


def walked_view(c: Call) -> list:
    """The stream view of a call whose items whole_messages took (agent/streams.py
    builds it only when the direction's parser cannot take the messages as they are)."""
    return _walked_view(*c.record)[0]


class SockcallAssembler:
    """sockcalls ring records -> Calls, for either payload format. "items": the
    walker's items joined over the records of a call flagged CONTINUED (as
    tests/oracles/walker.py's CallAssembler: same thread, same entry time and socket),
    unpacked here with struct (see _ITEM)."""

    def __init__(self, fmt: str):
        if fmt not in ("prefix", "items"):
            raise ValueError(f"unknown sockcall format {fmt!r}")
        self.format = fmt
        self._open: dict[int, tuple] = {}   # tid -> (enter ts, sk, first header, payloads so far)
        if fmt == "items":
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
        whole = whole_messages(buf, at, end, total)
        if whole is not None:
            msgs, times, sched, window = whole
            view, walked, ends = None, None, {m[1]: {} for m in msgs}
        else:
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
        if whole is not None:
            c.walked, c.record = msgs, (buf, at, end, total)
        else:
            # the walker was not following frames at the call's end: a sync hint may help
            # (why it stopped is in the probe's counters: desyncs, stream_gaps, walk_aborted)
            c.kernel_unsynced = not walked or walked[-1][1] < total
        return c
