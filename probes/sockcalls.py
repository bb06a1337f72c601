"""The sockcalls probe (source: sockcalls.bpf.c, walk_engine.bpf.h and its
framings, framings.bpf.h): its declaration, and the user-space side of its
stream walker.

    prog = ProbeProgram.start([SOCKCALLS], filters)
    install_walker(prog)                  # the walker's tail-called programs
    calls = CallAssembler()
    prog.on_events(lambda _p, ev: (c := calls.add(ev)) and handle(c))
    view = call.stream_view(offsets.offset_of(call.event))   # [(stream offset, bytes | Skip | Hunted | Gap)]
    msgs = feed_parser(parser, view)
    set_sync_hint(prog, sk, Direction.RX, seq, frame_index)   # from the parser, for a joined stream

A call's record(s) carry items (events.h): the bytes the walker copied (frame
headers, meta and command frames, greeting, or a raw prefix where it does not
follow frames), sampled keys, where messages ended, and where it started and
stopped following frames. `WalkedCall.stream_view` turns them into the byte
stream the ps-lite parser consumes: captured bytes, `Skip(n)` (n bytes known to
be inside frame bodies, not captured), `Hunted(n)` (n bytes searched for sync
and rejected: unparsed) and `Gap(n)` (n bytes not followed).
"""
from __future__ import annotations

import ctypes
import enum
from dataclasses import dataclass, field

from agent.errors import UserError
from probes.declare import Attach, KernelField, LruMap, Probe, TracepointField
from probes.events import (SOCKCALL_COUNTERS, SockcallEvent, SockcallItem, SockcallItemKind, SockcallKeys,
                           SockcallHunted, SockcallMsgEnd, SockcallWalkMark, WalkProtocol, WalkStart, WalkStop)

# syscall -> (its argument fields in tracefs: fd, pointer, length/count)
SYSCALL_ARGS = {
    "read": ("fd", "buf", "count"),
    "write": ("fd", "buf", "count"),
    "readv": ("fd", "vec", "vlen"),
    "writev": ("fd", "vec", "vlen"),
    "recvfrom": ("fd", "ubuf", "size"),
    "sendto": ("fd", "buff", "len"),
    "recvmsg": ("fd", "msg"),
    "sendmsg": ("fd", "msg"),
}

_ENTERS = tuple(f"syscalls:sys_enter_{s}" for s in SYSCALL_ARGS)
_EXITS = tuple(f"syscalls:sys_exit_{s}" for s in SYSCALL_ARGS)
_STATE = "sock:inet_sock_set_state"


def _arg_fields() -> tuple[TracepointField, ...]:
    out = []
    for syscall, args in SYSCALL_ARGS.items():
        for arg in args:
            out.append(TracepointField(f"TP_{syscall.upper()}_{arg.upper()}",
                                       (f"syscalls:sys_enter_{syscall}",), arg, 8))
    return tuple(out)


SOCKCALLS = Probe(
    name="sockcalls",
    source="sockcalls.bpf.c",
    attach=(
        *(Attach("tracepoint", tp, f"sc_enter_{s}") for s, tp in zip(SYSCALL_ARGS, _ENTERS)),
        *(Attach("tracepoint", tp, "sc_exit") for tp in _EXITS),
        Attach("tracepoint", _STATE, "sc_conn_state"),
    ),
    event=SockcallEvent,
    ring="sockcalls_events",
    counters_map="sockcalls_counters",
    counters=SOCKCALL_COUNTERS,
    kernel_fields=(
        KernelField("OFF_TCP_WRITE_SEQ", "tcp_sock.write_seq", 4),
        KernelField("OFF_TCP_COPIED_SEQ", "tcp_sock.copied_seq", 4),
        KernelField("OFF_TCP_SND_UNA", "tcp_sock.snd_una", 4),
        KernelField("OFF_TCP_RCV_NXT", "tcp_sock.rcv_nxt", 4),
        KernelField("OFF_TCP_BYTES_ACKED", "tcp_sock.bytes_acked", 8),
        KernelField("OFF_TCP_BYTES_RECEIVED", "tcp_sock.bytes_received", 8),
        KernelField("OFF_SK_MAX_ACK_BACKLOG", "sock.sk_max_ack_backlog", 4),
    ),
    tracepoint_fields=(
        *_arg_fields(),
        TracepointField("TP_SYSCALL_NR", _ENTERS + _EXITS, "__syscall_nr", 4),
        TracepointField("TP_EXIT_RET", _EXITS, "ret", 8),
        TracepointField("TP_ISS_SKADDR", (_STATE,), "skaddr", 8),
        TracepointField("TP_ISS_NEWSTATE", (_STATE,), "newstate", 4),
        TracepointField("TP_ISS_PROTOCOL", (_STATE,), "protocol", 2),
    ),
    constants={
        # name: (default, low, high)
        "SOCKCALLS_RING_PAGES": (1024, 1, 1 << 16),  # 4 MiB: ~1000 full records, ~10k small ones
        "SOCKCALLS_INFLIGHT_MAX": (16384, 64, 1 << 20),  # threads inside a traced call at once
        "SOCKCALLS_CONNS_MAX": (16384, 64, 1 << 22),  # connections whose facts are cached (~136 B each)
        # iovecs of a call the walker reads (UIO_MAXIOV: all), SOCKCALLS_IOV_WINDOW at a time
        # (a walk step reads the next window; a larger window makes the verifier refuse the walk)
        "SOCKCALLS_IOV_WALK_MAX": (1024, 1, 1024),
        "SOCKCALLS_IOV_WINDOW": (8, 1, 8),
        # the walker (walk_engine.bpf.h) and its framings
        # steps per walker pass (33 passes per call at most: ~1300 frames of small messages at
        # 64, ~650 at 32; beyond, counted walk_budget); the verifier refuses ~96
        "SOCKCALLS_WALK_STEPS": (64, 1, 64),
        "SOCKCALLS_META_COPY_MAX": (512, 0, 2048),  # bytes of a meta frame (frame 0) copied out
        "SOCKCALLS_COMMAND_COPY_MAX": (256, 0, 2048),  # bytes of a command frame copied out
        "SOCKCALLS_KEY_SAMPLE_MAX": (16, 0, 64),  # keys copied out per message
        "SOCKCALLS_KEY_SCAN_BLOCKS": (4, 1, 64),  # blocks of 64 keys hashed per keys frame
        "SOCKCALLS_FRAME_MAX_BITS": (34, 8, 62),  # a frame of 2**bits bytes or more is garbage
        "SOCKCALLS_PREFIX_BYTES": (256, 0, 512),  # raw bytes of an unsynced call (and after a desync)
        "SOCKCALLS_WALK_CONNS_MAX": (32768, 64, 1 << 22),  # connection directions walked (~64 B each)
        "SOCKCALLS_HINTS_MAX": (4096, 16, 1 << 20),  # sync hints waiting to apply
        "SOCKCALLS_ENDS_PER_PASS": (8, 1, 8),  # message ends per netstack lookup pass (verifier: ~55k insns each)
    },
    lru_maps=(LruMap("conns", "conns_made", "conns_removed", "SOCKCALLS_CONNS_MAX"),
              LruMap("walks", "walks_made", "walks_removed", "SOCKCALLS_WALK_CONNS_MAX")),
)


# ---------------------------------------------------------------------------
# The walker's programs and maps (walk_engine.bpf.h, framings.bpf.h)

def _slot(protocol: WalkProtocol, kind: int) -> int:
    """WK_SLOT: where protocol's program of kind WK_PROG_* (walk 0, hunt 1, hunt end 2) sits."""
    return int(protocol) * 4 + kind


# The walker's tail-called programs and their slots in sockcalls_progs, in order
# of importance: following frames, finding sync, the netstack lookups (walk_ends,
# slot 0, shared by every protocol).
WALKER_PROGRAMS = {
    "zmtp_walk": _slot(WalkProtocol.ZMTP, 0),
    "brpc_walk": _slot(WalkProtocol.BRPC, 0),
    "zmtp_hunt": _slot(WalkProtocol.ZMTP, 1),
    "brpc_hunt": _slot(WalkProtocol.BRPC, 1),
    "zmtp_hunt_end": _slot(WalkProtocol.ZMTP, 2),
    "brpc_hunt_end": _slot(WalkProtocol.BRPC, 2),
    "walk_ends": 0,
}
# The protocols (parsers/registry.py names) the walker has a framing for: only
# their streams get sync hints from user space.
FRAMINGS = {"pslite": WalkProtocol.ZMTP, "brpc": WalkProtocol.BRPC}
_PROG_ARRAY = b"sockcalls_progs"
_HINT_MAP = b"sockcalls_sync_hint"


class Direction(enum.IntEnum):
    """WK_DIR_*: a connection's direction, as this host sees it."""

    TX = 0  # bytes this end sends
    RX = 1  # bytes it receives


def install_walker(prog, framings=None) -> None:
    """Load the walker's tail-called programs into the probe's program array:
    those of `framings` (WalkProtocol values; None: every framing) and the shared
    netstack lookups. (A framing's programs take the verifier 0.5-2 s each start:
    a test of one protocol loads only its own.)

    Until this runs, walked calls end with WALK_END NO_WALKER and their
    connections go unsynced. TODO(lead): the loader should call this after
    compiling and before attaching (a generic "after load" hook on Probe), so
    no call slips through.

    Every program is tried, the most important first; those the kernel refuses
    (the netstack lookups with its ring sizes at their maximum can exceed the
    verifier's budget) are named in one RuntimeError at the end: a missing
    walk_ends leaves message ends without kernel times, a missing P_hunt
    leaves protocol P's joined connections to hints, a missing P_walk leaves
    raw prefixes."""
    import bcc  # only here: the rest of this module runs without bcc

    table = prog.bpf[_PROG_ARRAY]
    failed = []
    wanted = None if framings is None else {int(WalkProtocol(f)) for f in framings} | {0}
    for name, slot in WALKER_PROGRAMS.items():
        if wanted is not None and slot // 4 not in wanted:   # WK_SLOT(proto, kind) = proto * 4 + kind
            continue
        try:
            fn = prog.bpf.load_func(name.encode(), bcc.BPF.TRACEPOINT)
        except Exception as e:  # bcc raises Exception with the verifier's verdict
            failed.append(f"{name}: {e}")
            continue
        table[ctypes.c_int(slot)] = ctypes.c_int(fn.fd)
    if failed:
        raise RuntimeError("walker programs not loaded: " + "; ".join(failed))


class _HintKey(ctypes.Structure):
    _fields_ = [("sk", ctypes.c_uint64), ("dir", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class _Hint(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_uint32), ("frame_idx", ctypes.c_uint16), ("proto", ctypes.c_uint8),
                ("_pad", ctypes.c_uint8)]


def set_sync_hint(prog, sk: int, direction: Direction, seq: int, frame_index: int = 0,
                  framing: WalkProtocol = WalkProtocol.NONE) -> None:
    """Tell the walker that a frame header starts at TCP sequence `seq` of this
    socket's `direction`, frame `frame_index` of its message (0: a message
    starts there), in `framing` (NONE: the one the walker has). The first later
    call whose range holds `seq` starts walking there; a hint the stream has
    already passed is dropped (counted hints_stale), its framing kept for the
    walker's own hunt. `sk` is SockcallEvent.sk."""
    for name, v, hi in (("sk", sk, 2**64 - 1), ("seq", seq, 2**32 - 1), ("frame_index", frame_index, 2**16 - 1)):
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
            raise UserError(f"sync hint {name}={v!r} is not an integer in 0..{hi}")
    direction = Direction(direction)
    framing = WalkProtocol(framing)
    prog.bpf[_HINT_MAP][_HintKey(sk, direction)] = _Hint(seq, frame_index, framing, 0)


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
    from parsers.keysample import key_hash
    import numpy as np

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
