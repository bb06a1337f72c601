"""The reference the agent's sockcall decoding (agent/calls.py) is tested against: the
walker's records (probes/sockcalls.bpf.c, probes/events.py) decoded an object per
item, written for clarity, and the rule by which the walker samples keys."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

from parsers.keysample import key_hash
from probes.events import (SockcallEvent, SockcallHunted, SockcallItem, SockcallItemKind, SockcallKeys,
                           SockcallMsgEnd, SockcallWalkMark, WalkStart, WalkStop)


# ---------------------------------------------------------------------------
# Key sampling: the rule the walker applies (wk_key_level, wk_hash_block)

def key_sample_level(scanned_keys: int, sample_max: int = 16) -> int:
    """The level the walker samples a keys frame at, from the keys it hashes
    (all of a frame of up to 64 * SOCKCALLS_KEY_SCAN_BLOCKS keys, else that many)."""
    if scanned_keys <= sample_max:
        return 0
    return max(0, scanned_keys.bit_length() - 1 - 2)


def key_sampled(key: int, level: int) -> bool:
    """Whether the walker samples `key` at `level`: its splitmix64 hash has
    `level` leading zero bits (parsers.keysample.key_hash)."""
    h = int(key_hash(np.array([key], dtype=np.uint64))[0])
    return level == 0 or h >> (64 - level) == 0


# ---------------------------------------------------------------------------
# One call, as the walker describes it

class Skip(int):
    """n bytes known to be inside frame bodies, not captured."""

    def __repr__(self) -> str:
        return f"Skip({int(self)})"


class Gap(int):
    """n bytes the walker did not follow: unknown."""

    def __repr__(self) -> str:
        return f"Gap({int(self)})"


class Hunted(int):
    """n bytes the walker searched for a chain of frames and rejected (HUNTED items):
    seen and not understood, so the parser counts them unparsed, not lost."""

    def __repr__(self) -> str:
        return f"Hunted({int(self)})"


@dataclass(frozen=True)
class MessageEnd:
    call_off: int  # the message's last byte is at call offset call_off - 1
    end_seq: int  # TCP sequence one past it
    frames: int
    msg_index: int  # messages this direction ended before it, since the walk began
    rx_times: bytes | None = None  # struct ns_rx_times (receives, with the netstack probe)


@dataclass(frozen=True)
class KeySample:
    call_off: int  # the first hashed key's call offset
    scanned_bytes: int
    level: int
    mask: int  # bit t: the key at call_off + 8 t was sampled
    keys: tuple[int, ...]  # the sampled keys copied out, lowest t first (the message's cap may cut them)

    def key_offsets(self) -> list[int]:
        """Call offsets of the copied keys."""
        offs = [self.call_off + 8 * t for t in range(64) if self.mask >> t & 1]
        return offs[:len(self.keys)]


@dataclass
class WalkedCall:
    """One syscall's record(s) decoded: the header of the first record and its items."""

    event: SockcallEvent
    items: list = field(default_factory=list)  # [(SockcallItem, body bytes)]

    @property
    def walkable_bytes(self) -> int:
        """Bytes of the stream this call consumed or added (0 for a MSG_PEEK or a failure)."""
        ev = self.event
        # a receive that reached the peer's FIN also moved its sequence number
        fin = 0 if ev.call_kind.is_send else 1
        return ev.ret if ev.ret > 0 and ev.seq_bytes in (ev.ret, ev.ret + fin) else 0

    def pieces(self) -> list[tuple[int, bytes, int]]:
        """Captured bytes: [(call offset, bytes, SOCKCALL_BYTES_* bits)], keys included (what 0)."""
        out = []
        for it, body in self.items:
            if it.kind == SockcallItemKind.BYTES:
                out.append((it.call_off, body, it.what))
            elif it.kind == SockcallItemKind.KEYS:
                ks = self._keys(it, body)
                for off, k in zip(ks.key_offsets(), ks.keys):
                    out.append((off, k.to_bytes(8, "little"), 0))
        out.sort(key=lambda p: p[0])
        return out

    @staticmethod
    def _keys(it: SockcallItem, body: bytes) -> KeySample:
        head = SockcallKeys.from_buffer_copy(body)
        n = head.count
        fixed = ctypes.sizeof(SockcallKeys)
        if len(body) != fixed + 8 * n:
            raise ValueError(f"sockcall KEYS item of {len(body)} bytes for {n} keys")
        keys = tuple(int.from_bytes(body[fixed + 8 * i:fixed + 8 * i + 8], "little") for i in range(n))
        return KeySample(it.call_off, head.scanned_bytes, head.level, head.mask, keys)

    def key_samples(self) -> list[KeySample]:
        return [self._keys(it, body) for it, body in self.items if it.kind == SockcallItemKind.KEYS]

    def message_ends(self) -> list[MessageEnd]:
        ends, times = [], {}
        for it, body in self.items:
            if it.kind == SockcallItemKind.MSG_END:
                m = SockcallMsgEnd.from_buffer_copy(body)
                ends.append((it.call_off, m))
            elif it.kind == SockcallItemKind.RX_TIMES:
                times[it.call_off] = body
        return [MessageEnd(off, m.end_seq, m.frames, m.msg_index, times.get(off)) for off, m in ends]

    def marks(self) -> list[tuple[int, SockcallItemKind, WalkStart | WalkStop, SockcallWalkMark]]:
        """WALK_START / WALK_END items: (call offset, kind, why, the mark)."""
        out = []
        for it, body in self.items:
            if it.kind in (SockcallItemKind.WALK_START, SockcallItemKind.WALK_END):
                m = SockcallWalkMark.from_buffer_copy(body)
                why = WalkStart(m.how) if it.kind == SockcallItemKind.WALK_START else WalkStop(m.how)
                out.append((it.call_off, SockcallItemKind(it.kind), why, m))
        return out

    def walked_ranges(self) -> list[tuple[int, int]]:
        """[start, end) call-offset ranges in which the walker followed frames."""
        total = self.walkable_bytes
        out, start = [], None
        for off, kind, _why, _m in self.marks():  # in the order the walker wrote them
            if kind == SockcallItemKind.WALK_START:
                start = off
            elif start is not None:
                out.append((start, off))
                start = None
        if start is not None and start < total:
            out.append((start, total))
        return [(a, b) for a, b in out if b > a]

    def hunted_ranges(self) -> list[tuple[int, int]]:
        """[start, end) call-offset ranges the walker searched for sync and rejected."""
        return [(it.call_off, it.call_off + SockcallHunted.from_buffer_copy(body).bytes)
                for it, body in self.items if it.kind == SockcallItemKind.HUNTED]

    def stream_view(self, stream_offset: int) -> list[tuple[int, bytes | Skip | Gap | Hunted]]:
        """The call's bytes as the parser consumes them, from `stream_offset` (the
        stream offset of the call's first byte): [(offset, bytes)] for captured
        bytes, [(offset, Skip(n))] inside walked frame bodies, [(offset, Hunted(n))]
        where the walker searched for sync and found none, [(offset, Gap(n))]
        elsewhere. Covers the call's bytes exactly, in order."""
        total = self.walkable_bytes
        out: list = []
        at = 0
        walked = self.walked_ranges()
        hunted = self.hunted_ranges()

        def uncaptured(a: int, b: int) -> None:
            # [a, b) holds no captured bytes: Skip where walked, Gap elsewhere
            while a < b:
                inside = next(((s, e) for s, e in walked if s <= a < e), None)
                if inside is not None:
                    end = min(b, inside[1])
                    out.append((stream_offset + a, Skip(end - a)))
                elif (h := next(((s, e) for s, e in hunted if s <= a < e), None)) is not None:
                    end = min(b, h[1])
                    out.append((stream_offset + a, Hunted(end - a)))
                else:
                    nxt = min([s for s, _ in walked + hunted if s > a] + [b])
                    end = min(b, nxt)
                    out.append((stream_offset + a, Gap(end - a)))
                a = end

        for off, data, _what in self.pieces():
            if off < at or off + len(data) > total:
                raise ValueError(f"sockcall pieces overlap or overrun the call at offset {off}")
            uncaptured(at, off)
            if out and isinstance(out[-1][1], bytes) and out[-1][0] + len(out[-1][1]) == stream_offset + off:
                out[-1] = (out[-1][0], out[-1][1] + data)
            else:
                out.append((stream_offset + off, data))
            at = off + len(data)
        uncaptured(at, total)
        return out


class CallAssembler:
    """Joins the records of one call (all but the last flagged CONTINUED: its
    items did not fit in one) into a WalkedCall. The records of one call come
    from one program run, in order, from one thread."""

    def __init__(self):
        self._open: dict[int, WalkedCall] = {}

    def add(self, ev: SockcallEvent) -> WalkedCall | None:
        """The call when `ev` completes it, else None."""
        call = self._open.pop(ev.tid, None)
        if call is not None and (call.event.enter_ts_ns, call.event.sk) != (ev.enter_ts_ns, ev.sk):
            call = None  # the rest of that call was lost (ring full): drop it
        if call is None:
            call = WalkedCall(ev)
        call.items.extend(ev.items())
        if ev.continued:
            self._open[ev.tid] = call
            return None
        return call


class StreamOffsets:
    """Stream offsets (bytes since the first byte after the SYN, 64-bit) of the
    calls of each connection direction, from their 32-bit sequence numbers."""

    def __init__(self):
        self._last: dict[tuple, int] = {}

    def offset_of(self, ev: SockcallEvent) -> int:
        tx = ev.call_kind.is_send
        isn = ev.isn_local if tx else ev.isn_remote
        key = (ev.connection_key(), tx)
        rel = (ev.seq_start - isn - 1) & 0xFFFFFFFF
        last = self._last.get(key)
        off = rel if last is None else last + (((rel - last) + 2**31) % 2**32) - 2**31
        self._last[key] = off
        return off


def feed_parser(parser, view) -> list:
    """Feed a stream view to a registered protocol's stream parser; returns the
    messages it completed. Skip goes to parser.skip() (bytes inside a body the
    walker went past), Hunted to parser.unparsed() (bytes seen and rejected are
    unparsed, not lost), Gap to parser.gap() (parsers/protocol.py)."""
    skip, unparsed = parser.skip, parser.unparsed
    msgs = []
    for _off, x in view:
        if isinstance(x, bytes):
            msgs += parser.feed(x)
        elif isinstance(x, Skip):
            msgs += skip(int(x))
        elif isinstance(x, Hunted):
            msgs += unparsed(int(x))
        else:
            msgs += parser.gap(int(x))
    return msgs
