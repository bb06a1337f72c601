"""The framework-boundary probe: when a message crosses between the app and its messaging layer.

Uprobes (probes/framework.bpf.c) on
- libzmq (the copy a process loads, e.g. pyzmq's bundled one): zmq_msg_send,
  zmq_msg_recv and zmq_socket. The kernel groups a thread's frames on one
  socket into a message (it ends at a frame sent without ZMQ_SNDMORE /
  received without "more") and sends one event per message: each frame's size
  and first bytes, read through the zmq_msg_t layout calibrated on that very
  library (probes/zmq_layout.py), so the PBMeta frame of ps-lite traffic can be
  decoded to its ids (parsers/pslite/framework.py) and the record matched to a wire
  message exactly.
  A message of more than MAX_FRAMES frames, or one whose frames are interleaved
  with another socket's on the same thread, comes in pieces (events with
  "more" set) that user space joins per (thread, socket, direction).
  zmq_msg_send is probed at its entry only: a send's "return" times are its
  entry's and its ret the frame's size (framework.bpf.c says why).
- ps-lite inside libmxnet.so: ps::ZMQVan::SendMsg entry/return and
  ps::ZMQVan::RecvMsg entry/return. One event per message; the ids come from
  the leading fields of ps::Meta (decoded in parsers/pslite/framework.py).
- brpc's baidu_std protocol inside Paddle's libpaddle.so: PackRpcRequest and
  Controller::OnVersionedRPCReturned (client: request out, response back),
  ProcessRpcRequest and SendRpcResponse (server: request in, response out), entry
  only. One event per RPC end with the wire's correlation id (docs/paddle.md, "The
  framework boundary"): a KeyedMessage names its wire message's ids itself.

Its own bcc object for now (independent of the syscall probe); records are
plain dataclasses so everything downstream runs without root. What the probe knows of
each kind of event is KINDS; agent/framework_records.py decodes the ring's records.
"""
from __future__ import annotations

import ctypes
import enum
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from core.errors import UserError
from probes import libtrust
from probes.elf_symbols import defined_functions
from probes.zmq_layout import ZmqMsgLayout, calibrate

NAME = "framework"
SOURCE = Path(__file__).with_name("framework.bpf.c")
CAPTURE_BYTES = 64            # bytes of each frame (or of ps::Meta) copied to user space
MAX_FRAMES = 8                # frames one event carries (ps-lite sends at most 5 per message)
DEFAULT_RINGBUF_PAGES = 256   # 1 MiB: ~2300 ps-lite messages of 4-5 frames (~450 bytes each)
# Slots of (thread, kind), ~670 bytes each, preallocated (LRU): 5.5 MB.
DEFAULT_INFLIGHT_MAX = 8192


class Kind(enum.IntEnum):
    """enum fw_kind in framework.bpf.c"""
    ZMQ_SEND = 1
    ZMQ_RECV = 2
    ZMQ_SOCKET = 3
    PS_SEND = 4
    PS_RECV = 5
    BRPC_CLIENT_SEND = 6
    BRPC_CLIENT_RECV = 7
    BRPC_SERVER_RECV = 8
    BRPC_SERVER_SEND = 9


# enum fw_counter order. seen: events (zmq: messages or pieces of one); frames: zmq
# frames added to messages; pieces: events sent before their message ended; unpaired
# (brpc): a server request with no response on its thread, or a response with no request.
COUNTERS = ("seen", "lost", "failed", "orphan", "inflight_full", "frames", "pieces", "unpaired")


class FwEvent(ctypes.Structure):
    """Mirror of struct fw_event (checked against bcc's view of it at every start).
    A record holds the fixed part and the first `frames` heads only."""
    _fields_ = [
        ("ts_ns", ctypes.c_uint64), ("first_ret_ts_ns", ctypes.c_uint64),
        ("ret_ts_ns", ctypes.c_uint64), ("sock", ctypes.c_uint64), ("ret", ctypes.c_int64),
        ("tgid", ctypes.c_uint32), ("tid", ctypes.c_uint32), ("arg", ctypes.c_int32),
        ("kind", ctypes.c_uint8), ("more", ctypes.c_uint8), ("frames", ctypes.c_uint8),
        ("_pad", ctypes.c_uint8), ("sizes", ctypes.c_uint64 * MAX_FRAMES),
        ("head_len", ctypes.c_uint8 * MAX_FRAMES),
        ("heads", ctypes.c_uint8 * (CAPTURE_BYTES * MAX_FRAMES)),   # [frame][byte], flat
    ]


# The fixed part of a record in one unpack: ts_ns, first_ret_ts_ns, ret_ts_ns, sock,
# ret, tgid, tid, arg, kind, more, frames, sizes[MAX_FRAMES], head_len[MAX_FRAMES].
_FIXED = struct.Struct(f"<QQQQqIIiBBBx{MAX_FRAMES}Q{MAX_FRAMES}B")
# The record of one frame per event that agents before per-message events wrote
# (recording format 1 holds them): ts_ns, ret_ts_ns, sock, obj, ret, size, tgid,
# tid, arg, data_len, kind, more, msg_type, busy, then 64 bytes of the frame.
# 136 bytes: a length no current record has (128-byte fixed part + a multiple of 64).
_LEGACY = struct.Struct("<QQQQqQIIiHBBBB6x")
_LEGACY_BYTES = _LEGACY.size + 64


@dataclass(frozen=True)
class AttachPoint:
    symbol: str             # what the uprobe attaches to (mangled for C++)
    entry_fn: str           # BPF function on entry
    return_fn: str | None   # BPF function on return (None: entry only)


# The declaration: which symbols of which library feed which BPF functions.
POINTS = {
    "zmq": (
        AttachPoint("zmq_msg_send", "zmq_send_entry", None),   # entry only (framework.bpf.c says why)
        AttachPoint("zmq_msg_recv", "zmq_recv_entry", "zmq_recv_return"),
        AttachPoint("zmq_socket", "zmq_socket_entry", "zmq_socket_return"),
    ),
    "ps": (
        AttachPoint("_ZN2ps6ZMQVan7SendMsgERKNS_7MessageE", "ps_send_entry", "ps_send_return"),
        AttachPoint("_ZN2ps6ZMQVan7RecvMsgEPNS_7MessageE", "ps_recv_entry", "ps_recv_return"),
    ),
    # brpc as paddlepaddle 3.0.0's libpaddle.so exports it (docs/paddle.md: nm -D)
    "brpc": (
        AttachPoint("_ZN4brpc6policy14PackRpcRequestEPN5butil5IOBufEPPNS_13SocketMessageEmPKN6google"
                    "8protobuf16MethodDescriptorEPNS_10ControllerERKS2_PKNS_13AuthenticatorE",
                    "brpc_client_send", None),
        AttachPoint("_ZN4brpc10Controller22OnVersionedRPCReturnedERKNS0_14CompletionInfoEbi",
                    "brpc_client_recv", None),
        AttachPoint("_ZN4brpc6policy17ProcessRpcRequestEPNS_16InputMessageBaseE", "brpc_server_recv", None),
        AttachPoint("_ZN4brpc6policy15SendRpcResponseElPNS_10ControllerEPKN6google8protobuf7MessageES7_"
                    "PKNS_6ServerEPNS_12MethodStatusEl", "brpc_server_send", None),
    ),
}


@dataclass(frozen=True)
class KindFacts:
    """What an event of one kind is, for its decoder (agent/framework_records.py)."""
    layer: str                  # the POINTS entry whose hooks send it
    shape: str                  # "frames": a message's frames, in pieces (more set) up to the
                                # last; "call": one event per message, ret its bytes and heads[0]
                                # the start of its meta; "entry": one end of an RPC, at a
                                # function's entry; "socket": a new socket, arg its type
    direction: str | None = None        # "send" or "recv"
    request: bool | None = None         # "entry": a request's end, or a response's


KINDS = {Kind.ZMQ_SEND: KindFacts("zmq", "frames", "send"),
         Kind.ZMQ_RECV: KindFacts("zmq", "frames", "recv"),
         Kind.ZMQ_SOCKET: KindFacts("zmq", "socket"),
         Kind.PS_SEND: KindFacts("ps", "call", "send"), Kind.PS_RECV: KindFacts("ps", "call", "recv"),
         Kind.BRPC_CLIENT_SEND: KindFacts("brpc", "entry", "send", True),
         Kind.BRPC_CLIENT_RECV: KindFacts("brpc", "entry", "recv", False),
         Kind.BRPC_SERVER_RECV: KindFacts("brpc", "entry", "recv", True),
         Kind.BRPC_SERVER_SEND: KindFacts("brpc", "entry", "send", False)}

# libzmq as distributions name it (libzmq.so.5) and as wheels do (pyzmq's libzmq-<hash>.so.5.2.5)
_LIB_PATTERNS = {"zmq": re.compile(r"^libzmq([-.][^/]*)?\.so(\.[0-9]+)*$"), "ps": re.compile(r"^libmxnet\.so$"),
                 "brpc": re.compile(r"^libpaddle\.so$")}
LIBRARY_NAMES = "libzmq, libmxnet.so or libpaddle.so"   # what _LIB_PATTERNS match, for messages
# what a /proc/PID/maps line of every library _LIB_PATTERNS matches holds: a cheap
# look before targets_of_pid parses the maps
LIBRARY_PATH_PARTS = (b"/libzmq", b"/libmxnet.so", b"/libpaddle.so")


def layer_of(library_name: str) -> str | None:
    """The layer a framework library of this file name is probed as; None: not one."""
    return next((ly for ly, pat in _LIB_PATTERNS.items() if pat.match(library_name)), None)


@dataclass(frozen=True)
class Target:
    """A library to probe, in one process (pid) or in every process that maps it (pid None)."""
    library: Path
    layer: str             # "zmq", "ps" or "brpc"
    pid: int | None = None
    # the process it was found in, when it is probed in every process (pid None):
    # whose user may own it (probes/libtrust.py)
    found_in: int | None = field(default=None, compare=False)

    @property
    def owner_pid(self) -> int | None:
        """The process whose user may own the library (probes/libtrust.py)."""
        return self.pid if self.pid is not None else self.found_in

    def __post_init__(self):
        if self.layer not in POINTS:
            raise UserError(f"unknown framework layer {self.layer!r}; use one of {sorted(POINTS)}")
        if self.pid is not None and (not isinstance(self.pid, int) or self.pid <= 0):
            raise UserError(f"pid {self.pid!r} is not a process id; give a positive integer")


def targets_of_pid(pid: int) -> list[Target]:
    """The framework libraries a running process has mapped (libzmq*, libmxnet.so, libpaddle.so)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError as e:
        raise UserError(f"cannot read the libraries of process {pid} ({e.strerror}); "
                        "check the pid (is it running?) and run as root") from None
    found: dict[str, Target] = {}
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].removesuffix(" (deleted)")
        layer = layer_of(Path(path).name)
        if layer is not None:
            found.setdefault(path, Target(_visible_path(Path(path), pid), layer, pid))
    return list(found.values())


def _visible_path(path: Path, pid: int | None) -> Path:
    """path as this process can open it (the traced one may live in another mount namespace)."""
    if pid is None or path.exists():
        return path
    return Path(f"/proc/{pid}/root") / path.relative_to("/")


# --- decoded events and records ----------------------------------------------------------

@dataclass(frozen=True)
class FrameCall:
    """One ring event: a zmq message (or a piece of one: more set), a ps-lite message
    (one call), or a new socket."""
    kind: Kind
    tgid: int
    tid: int
    sock: int
    ts_ns: int                  # entry of the first call
    first_ret_ts_ns: int        # return of the first call (zmq_msg_send: its entry)
    ret_ts_ns: int              # return of the last call (zmq_msg_send: its entry)
    ret: int                    # the last call's return value (ps: message bytes; zmq_msg_send: frame bytes)
    more: bool                  # zmq: the message goes on in a later event
    arg: int                    # zmq_socket: socket type; zmq_msg_send: last flags
    sizes: tuple[int, ...]      # zmq: each frame's size
    heads: tuple[bytes, ...]    # first bytes of each frame / of ps::Meta


def unpack_event(raw: bytes) -> tuple:
    """(kind, tgid, tid, sock, ts_ns, first_ret_ts_ns, ret_ts_ns, ret, more, arg, sizes,
    heads) of one ring record, as plain values (FrameCall's order). A one-frame record of
    an older agent (replayed from a recording) reads as a piece of one frame."""
    if len(raw) == _LEGACY_BYTES:
        (ts, ret_ts, sock, _obj, ret, size, tgid, tid, arg, data_len, kind, more, _t, _b) = \
            _LEGACY.unpack_from(raw)
        head = raw[_LEGACY.size:_LEGACY.size + data_len]
        return kind, tgid, tid, sock, ts, ret_ts, ret_ts, ret, more, arg, (size,), (head,)
    v = _FIXED.unpack_from(raw)
    n = v[10]
    at = _FIXED.size
    lens = v[11 + MAX_FRAMES:11 + MAX_FRAMES + n]
    heads = tuple([raw[at + i * CAPTURE_BYTES:at + i * CAPTURE_BYTES + h] for i, h in enumerate(lens)])
    return v[8], v[5], v[6], v[3], v[0], v[1], v[2], v[4], v[9], v[7], v[11:11 + n], heads


def decode_event(raw: bytes) -> FrameCall:
    kind, *rest = unpack_event(raw)
    return FrameCall(Kind(kind), *rest[:7], bool(rest[7]), *rest[8:])


@dataclass(frozen=True)
class FrameworkMessage:
    """One message at the framework boundary."""
    layer: str                 # "zmq" (libzmq calls), "ps" (ps::ZMQVan) or "brpc"
    direction: str             # "send" or "recv"
    tgid: int
    tid: int
    sock: int                  # zmq socket handle, the ps::ZMQVan, or brpc's correlation id
    ts_ns: int                 # the boundary: send = first call's entry, recv = last return
    call_ts_ns: int            # entry of the first call
    ret_ts_ns: int             # return of the last call
    first_ret_ts_ns: int       # return of the first call (recv: first frame handed over)
    total_bytes: int
    frames: int | None         # zmq frames (None at the ps layer)
    peer: bytes | None = None  # ROUTER routing id (recv: who sent it; send: to whom)
    meta: object = None        # the ids its layer's protocol decoded (parsers.registry.FRAMEWORK_RECORD_IDS)
    frame_sizes: tuple[int, ...] = ()
    frame_heads: tuple[bytes, ...] = ()  # first bytes of each frame (ps: of ps::Meta)


@dataclass(frozen=True)
class KeyedMessage(FrameworkMessage):
    """A framework message that names its wire message's ids itself (brpc: the
    correlation id): call_key is (call_space, call_id, request) as parsers/protocol.py
    gives them for that message. meta is None."""
    call_key: tuple = (None, None, None)


# --- the live probe ------------------------------------------------------------------------

# A probe object without zmq targets still compiles the zmq functions (never
# attached): they need some integer for each layout constant.
_UNUSED_LAYOUT = ZmqMsgLayout.placeholder().bpf_defines()


def _check_int(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise UserError(f"{name} must be an integer in [{lo}, {hi}], not {value!r}")
    return value


class FrameworkProbe:
    """Uprobes on the given targets; poll() returns the records seen since, each through
    decoder.feed (agent.framework_records.FrameworkDecoder: the messages it completed)
    where one is given, else as the ring's bytes."""

    def __init__(self, targets: Sequence[Target], *, ringbuf_pages: int = DEFAULT_RINGBUF_PAGES,
                 inflight_max: int = DEFAULT_INFLIGHT_MAX, decoder=None) -> None:
        if not targets:
            raise UserError(f"no framework library to trace; give a pid that loads {LIBRARY_NAMES}, "
                            "or a library path")
        pages = _check_int("ring buffer pages", ringbuf_pages, 1, 1 << 16)
        if pages & (pages - 1):
            raise UserError(f"ring buffer pages must be a power of two, not {pages}")
        self.targets = _without_overlaps(targets)
        for t in self.targets:
            libtrust.check(t.library, t.owner_pid)
        self.layout = self._one_layout(self.targets)
        self._defines = {
            "FW_CAPTURE_BYTES": CAPTURE_BYTES, "FW_MAX_FRAMES": MAX_FRAMES, "FW_RINGBUF_PAGES": pages,
            "FW_INFLIGHT_MAX": _check_int("inflight_max", inflight_max, 1, 1 << 20),
            **(self.layout.bpf_defines() if self.layout else _UNUSED_LAYOUT),
        }
        for name, value in self._defines.items():
            _check_int(name, value, 0, 1 << 20)
        self._bpf = None
        self._exports_checked: set[tuple[Path, str]] = set()
        self._out: list = []
        self.decoder = decoder
        self.decoded = 0

    def layout_refusal(self, t: Target) -> str | None:
        """Why a target added after the build cannot be probed by this program (its
        layer reads memory through a layout the program was built with), or None."""
        if t.layer != "zmq":
            return None
        if self.layout is None:
            return "the framework probe was built without a libzmq layout"
        if not calibrate(t.library).same_offsets(self.layout):
            return f"{t.library} lays out zmq_msg_t differently from {self.layout.library}"
        return None

    @staticmethod
    def _one_layout(targets: Iterable[Target]) -> ZmqMsgLayout | None:
        layouts = [calibrate(t.library) for t in targets if t.layer == "zmq"]
        for other in layouts[1:]:
            if not other.same_offsets(layouts[0]):
                raise UserError(f"{layouts[0].library} and {other.library} lay out zmq_msg_t "
                                "differently; trace their processes with separate probes")
        return layouts[0] if layouts else None

    def cflags(self) -> list[str]:
        return [f"-D{k}={v}" for k, v in sorted(self._defines.items())]

    def program_text(self) -> str:
        """The program as compiled: its constants, then the source (for --print-bpf)."""
        head = "".join(f"#define {k} {v}\n" for k, v in sorted(self._defines.items()))
        return f"/* {NAME} probe, constants passed as -D */\n{head}\n{SOURCE.read_text()}"

    def start(self) -> "FrameworkProbe":
        from bcc import BPF  # only the live probe needs bcc (and root)

        if os.geteuid() != 0:
            raise UserError("the framework probe needs root (BPF uprobes); run it with sudo")
        self._bpf = BPF(src_file=str(SOURCE).encode(), cflags=self.cflags())
        try:
            _check_mirror(self._bpf[b"fw_event_layout"].Leaf)
            for t in self.targets:
                for p in POINTS[t.layer]:
                    self._attach(t, p)
            self._bpf[b"events"].open_ring_buffer(self._on_event)
        except BaseException:
            self.close()
            raise
        return self

    def _attach(self, t: Target, p: AttachPoint) -> None:
        self._check_exports(t)
        pid = t.pid if t.pid is not None else -1
        try:
            lib, sym = os.fsencode(t.library), p.symbol.encode()
            self._bpf.attach_uprobe(name=lib, sym=sym, fn_name=p.entry_fn.encode(), pid=pid)
            if p.return_fn is not None:
                self._bpf.attach_uretprobe(name=lib, sym=sym, fn_name=p.return_fn.encode(), pid=pid)
        except Exception as e:
            where = f"process {t.pid}" if t.pid else "every process"
            raise UserError(f"cannot attach a uprobe to {p.symbol} in {t.library} ({where}): "
                            f"{e}; check that the library exports it and the process "
                            "still runs") from None

    def _check_exports(self, t: Target) -> None:
        """UserError naming what the library lacks, before any of its points is attached
        (another build of the framework: nothing half-attached)."""
        key = (t.library, t.layer)
        if key in self._exports_checked:
            return
        wanted = [p.symbol for p in POINTS[t.layer]]
        found = defined_functions(t.library, wanted)
        missing = [s for s in wanted if s not in found]
        if missing:
            raise UserError(f"{t.library} does not export {', '.join(missing)}, where the "
                            f"{t.layer} framework probe attaches; the probe knows the builds in "
                            "docs/ (mxnet==1.9.1, paddlepaddle==3.0.0, pyzmq's libzmq)")
        self._exports_checked.add(key)

    def _on_event(self, ctx, data, size) -> None:
        raw = ctypes.string_at(data, size)
        self.decoded += 1
        msg = self.decoder.feed(raw) if self.decoder is not None else raw
        if msg is not None:
            self._out.append(msg)

    def poll(self, timeout_ms: int = 100) -> list:
        """Messages completed since the last poll, waiting up to timeout_ms for the first."""
        self._bpf.ring_buffer_poll(timeout_ms)
        out, self._out = self._out, []
        return out

    def drain(self) -> list:
        """Whatever is in the ring buffer now, without waiting."""
        self._bpf.ring_buffer_consume()
        out, self._out = self._out, []
        return out

    def counters(self) -> dict[str, int]:
        """Events per outcome, summed over CPUs (DESIGN.md: seen and lost per probe)."""
        table = self._bpf[b"counters"]
        out = {name: int(sum(table[table.Key(i)])) for i, name in enumerate(COUNTERS)}
        out["decoded"] = self.decoded
        if self.decoder is not None:
            out["open_messages"] = self.decoder.open_messages
        return out

    def close(self) -> None:
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    def __enter__(self) -> "FrameworkProbe":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def _without_overlaps(targets: Iterable[Target]) -> list[Target]:
    """Each target once; a library probed in every process is not probed again per pid
    (the uprobe would fire twice per call)."""
    everywhere = {(t.library, t.layer) for t in targets if t.pid is None}
    out: list[Target] = []
    for t in targets:
        if t not in out and (t.pid is None or (t.library, t.layer) not in everywhere):
            out.append(t)
    return out


def _check_mirror(leaf) -> None:
    """FwEvent must lay out like bcc's view of struct fw_event, or every record is garbage."""
    def shape(cls):
        return [(n, getattr(cls, n).offset, getattr(cls, n).size) for n, _ in cls._fields_]

    if shape(leaf) != shape(FwEvent) or ctypes.sizeof(leaf) != ctypes.sizeof(FwEvent):
        raise RuntimeError(f"FwEvent does not mirror struct fw_event: {shape(leaf)} vs "
                           f"{shape(FwEvent)}; fix probes/framework.py")
