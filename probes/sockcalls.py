"""The sockcalls probe (source: sockcalls.bpf.c, walk_engine.bpf.h and its
framings, framings.bpf.h): its declaration, and the user-space side of its
stream walker.

    prog = ProbeProgram.start([SOCKCALLS], filters)
    install_walker(prog)                  # the walker's tail-called programs
    set_sync_hint(prog, sk, Direction.RX, seq, frame_index)   # from the parser, for a joined stream

A call's record(s) carry items (events.h): the bytes the walker copied (frame
headers, meta and command frames, greeting, or a raw prefix where it does not
follow frames), sampled keys, where messages ended, and where it started and
stopped following frames. agent/calls.py turns them into the byte stream a
protocol's parser consumes: captured bytes, bytes known to be inside frame
bodies (not captured), bytes searched for sync and rejected (unparsed) and bytes
not followed (tests/oracles/walker.py is the reference, `WalkedCall.stream_view`).
"""
from __future__ import annotations

import ctypes
import enum
import os
from concurrent.futures import ThreadPoolExecutor

from core.errors import UserError
from probes.declare import Attach, KernelField, LruMap, Probe, TracepointField
from probes.events import SOCKCALL_COUNTERS, SockcallEvent, WalkProtocol

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
        # slots of threads inside a traced call (tid % this; 56 B each: 1.8 MiB):
        # pid_max (32768 here) or more, and no two threads share one
        "SOCKCALLS_INFLIGHT_MAX": (32768, 64, 1 << 22),
        "SOCKCALLS_CONNS_MAX": (16384, 64, 1 << 22),  # connections whose facts are cached (~136 B each)
        # iovecs of a call the walker reads (UIO_MAXIOV: all), SOCKCALLS_IOV_WINDOW at a time
        # (a walk step reads the next window; a larger window makes the verifier refuse the walk)
        "SOCKCALLS_IOV_WALK_MAX": (1024, 1, 1024),
        "SOCKCALLS_IOV_WINDOW": (8, 1, 8),
        # the walker (walk_engine.bpf.h) and its framings
        # steps per walker pass (33 passes per call at most: ~1300 frames of small messages at
        # 64, ~650 at 32; beyond, counted walk_budget); the verifier refuses ~96
        "SOCKCALLS_WALK_STEPS": (64, 1, 64),
        # bytes of a meta frame copied out: a BytePS control message lists its nodes in the
        # RawMeta, 88 + 168 bytes each (11 fit in 2048, the engine's bound: WK_PIECE_MAX x 4)
        "SOCKCALLS_META_COPY_MAX": (2048, 0, 2048),
        "SOCKCALLS_COMMAND_COPY_MAX": (256, 0, 2048),  # bytes of a command frame copied out
        "SOCKCALLS_KEY_SAMPLE_MAX": (16, 0, 64),  # keys copied out per message
        "SOCKCALLS_KEY_SCAN_BLOCKS": (4, 1, 64),  # blocks of 64 keys hashed per keys frame
        "SOCKCALLS_FRAME_MAX_BITS": (34, 8, 62),  # a frame of 2**bits bytes or more is garbage
        "SOCKCALLS_PREFIX_BYTES": (256, 0, 512),  # raw bytes of an unsynced call (and after a desync)
        "SOCKCALLS_WALK_CONNS_MAX": (32768, 64, 1 << 22),  # connection directions walked (~64 B each)
        "SOCKCALLS_HINTS_MAX": (4096, 16, 1 << 20),  # sync hints waiting to apply
        # one fixed record per message end (events.h struct sockcall_msg) on a ring of
        # its own, beside the call's record: the fast path's input (docs/cost.md)
        "SOCKCALLS_MSG_RECORDS": (0, 0, 1),
        "SOCKCALLS_MSG_RING_PAGES": (512, 1, 1 << 16),  # 2 MiB: ~3,400 records
        "SOCKCALLS_MSGS_PER_PASS": (8, 1, 16),  # records per walk_msgs pass
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
    "walk_msgs": 1,
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
    todo = [(name, slot) for name, slot in WALKER_PROGRAMS.items()
            if wanted is None or slot // 4 in wanted]   # WK_SLOT(proto, kind) = proto * 4 + kind

    def load(name: str):
        try:
            return prog.bpf.load_func(name.encode(), bcc.BPF.TRACEPOINT)
        except Exception as e:  # bcc raises Exception with the verifier's verdict
            return e

    # the verifier's seconds run in the kernel, outside the GIL: one thread per core
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        loaded = list(pool.map(load, [name for name, _ in todo]))
    for (name, slot), fn in zip(todo, loaded):
        if isinstance(fn, Exception):
            failed.append(f"{name}: {fn}")
            continue
        table[ctypes.c_int(slot)] = ctypes.c_int(fn.fd)
    if failed:
        raise RuntimeError("walker programs not loaded: " + "; ".join(failed))


class _HintKey(ctypes.Structure):
    _fields_ = [("sk", ctypes.c_uint64), ("dir", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]


class _Hint(ctypes.Structure):
    _fields_ = [("seq", ctypes.c_uint32), ("frame_idx", ctypes.c_uint16), ("proto", ctypes.c_uint8),
                ("flags", ctypes.c_uint8)]


_HINT_COUNT_ONLY = 1   # walk_engine.bpf.h WK_HINT_COUNT_ONLY


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


def set_count_only(prog, sk: int, direction: Direction) -> None:
    """Tell the walker that this socket's `direction` is in no framing it has
    (user space hunted in its raw prefixes and recognised no protocol): from its
    next call on, its calls are counted and nothing of them is copied."""
    if isinstance(sk, bool) or not isinstance(sk, int) or not 0 <= sk <= 2**64 - 1:
        raise UserError(f"count-only hint sk={sk!r} is not an integer in 0..{2**64 - 1}")
    prog.bpf[_HINT_MAP][_HintKey(sk, Direction(direction))] = _Hint(0, 0, WalkProtocol.NONE, _HINT_COUNT_ONLY)
