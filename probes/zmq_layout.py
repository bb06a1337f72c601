"""Where a frame's bytes live inside libzmq's opaque zmq_msg_t, measured on the library itself.

zmq_msg_t is 64 opaque bytes whose layout is libzmq-internal and changes
between versions and builds: a very small frame ("vsm") sits inline with a
one-byte size; a long one ("lmsg", or "zclmsg" when libzmq receives it
zero-copy into its decoder buffer) points to a content block {data, size, ...};
a constant one ("cmsg", zmq_msg_init_data without a free function) holds
{data, size} itself. A type tag tells which. The framework uprobe must read a
frame's size and first bytes in the kernel, so it needs these offsets as
integers.

Instead of hard-coding them we calibrate against the very .so the traced
process loads. Loading it runs its constructors, and the library may be anyone's,
so that happens only in a confined child (probes/sandbox.py: no privileges, no
network, no writable file), never in the agent; the agent gets numbers back and
checks each against the bounds zmq_msg_t allows (_layout_of_answer). In the
child: load it with ctypes, build messages of known sizes and contents
through its public API (zmq_msg_init_size, zmq_msg_init_data, and a real
multipart exchange over loopback TCP for the received kinds and the "more"
flag), and find which bytes of the 64 hold what. The message memory is filled
with fresh random bytes before each init, so only bytes the library wrote can
agree across trials. The result is then validated by decoding fresh messages
of every kind with it and comparing against zmq_msg_data/zmq_msg_size/
zmq_msg_more; anything ambiguous or inconsistent is refused with a UserError.

Memory that calibration has to dereference (candidate content pointers) is
read through /proc/self/mem, so a wrong guess is an EIO, not a segfault.
"""
from __future__ import annotations

import ctypes
import functools
import os
import re
import struct
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from core.errors import UserError
from probes import sandbox

MSG_T_BYTES = 64          # sizeof(zmq_msg_t) in every libzmq since 4.1 (public ABI)
_WORD_OFFSETS = range(0, MSG_T_BYTES - 7, 8)   # where an 8-byte word (pointer, size) can sit
_ZMQ_PAIR = 0
_ZMQ_SNDMORE = 2
_ZMQ_LINGER = 17
_ZMQ_RCVTIMEO = 27
_ZMQ_SNDTIMEO = 28
_ZMQ_LAST_ENDPOINT = 32
_EXCHANGE_TIMEOUT_MS = 2000
# Sizes for long messages: odd, so no pointer or flag word equals them by chance.
_LONG_SIZES = (1001, 100003)
# Frames of the loopback exchange: small (inline), medium (zero-copy receive
# into the decoder's buffer, when the library does that) and large (bigger than
# that buffer). The last frame of each message is sent without ZMQ_SNDMORE.
_EXCHANGE_SIZES = ((3, 100, 3001, 100003), (5,), (200,))

_REQUIRED_SYMBOLS = (
    "zmq_version", "zmq_ctx_new", "zmq_ctx_term", "zmq_socket", "zmq_close", "zmq_bind",
    "zmq_connect", "zmq_setsockopt", "zmq_getsockopt", "zmq_msg_init", "zmq_msg_init_size",
    "zmq_msg_init_data", "zmq_msg_data", "zmq_msg_size", "zmq_msg_more", "zmq_msg_close",
    "zmq_msg_send", "zmq_msg_recv",
)


@dataclass(frozen=True)
class ZmqMsgLayout:
    """Offsets (bytes) inside zmq_msg_t and inside a long message's content block."""
    library: str
    version: str
    type_off: int           # the type tag byte
    flags_off: int          # the flags byte holding "more"
    more_mask: int          # its bit
    vsm_type: int
    vsm_data_off: int       # inline data
    vsm_size_off: int       # one-byte inline size
    vsm_max_bytes: int      # largest inline frame
    lmsg_type: int
    zclmsg_type: int        # == lmsg_type when the library never produced a distinct one
    content_ptr_off: int    # lmsg/zclmsg: pointer to the content block
    content_data_off: int   # within the content block: void *data
    content_size_off: int   # within the content block: size_t size
    cmsg_type: int
    cmsg_data_off: int      # cmsg: void *data inside zmq_msg_t
    cmsg_size_off: int      # cmsg: size_t size inside zmq_msg_t

    def bpf_defines(self) -> dict[str, int]:
        """The layout as the integer constants framework.bpf.c expects (-D NAME=value)."""
        out = {f"ZMQ_{k.upper()}": v for k, v in asdict(self).items() if isinstance(v, int)}
        out["ZMQ_MSG_BYTES"] = MSG_T_BYTES
        # The content block is read in one go, up to the end of its later field.
        out["ZMQ_CONTENT_BLOCK_BYTES"] = max(self.content_data_off, self.content_size_off) + 8
        return out

    @classmethod
    def placeholder(cls) -> "ZmqMsgLayout":
        """All offsets 0: compiles the zmq half of the probe when nothing will attach to it."""
        ints = {f.name: 0 for f in fields(cls) if f.type == "int"}
        return cls(library="", version="", **ints)

    def same_offsets(self, other: "ZmqMsgLayout") -> bool:
        return self.bpf_defines() == other.bpf_defines()

    def locate(self, raw: bytes, msg_addr: int, read_mem) -> tuple[int, int] | None:
        """(data address, size) of the frame whose zmq_msg_t (64 bytes raw) sits at msg_addr.

        Mirrors read_frame() in framework.bpf.c; read_mem(addr, n) reads process
        memory (None if unreadable). None for a type tag this layout does not know.
        """
        tag = raw[self.type_off]
        if tag == self.vsm_type:
            return (msg_addr + self.vsm_data_off, raw[self.vsm_size_off])
        if tag in (self.lmsg_type, self.zclmsg_type):
            content = _u64(raw, self.content_ptr_off)
            block = read_mem(content, max(self.content_data_off, self.content_size_off) + 8)
            if block is None:
                return None
            return (_u64(block, self.content_data_off), _u64(block, self.content_size_off))
        if tag == self.cmsg_type:
            return (_u64(raw, self.cmsg_data_off), _u64(raw, self.cmsg_size_off))
        return None


def _u64(b: bytes, off: int) -> int:
    return struct.unpack_from("<Q", b, off)[0]


class _CalibrationFailed(Exception):
    pass


class _SelfMemory:
    """Reads this process's memory without trusting the address (EIO instead of SIGSEGV)."""

    def __init__(self) -> None:
        self._fd = os.open("/proc/self/mem", os.O_RDONLY)

    def read(self, addr: int, n: int) -> bytes | None:
        if addr <= 0 or addr >= 1 << 47:       # not a user-space address on x86-64
            return None
        try:
            data = os.pread(self._fd, n, addr)
        except OSError:
            return None
        return data if len(data) == n else None

    def close(self) -> None:
        os.close(self._fd)


class _Msg(ctypes.Structure):
    # 8-byte aligned like the real zmq_msg_t (which is declared with an alignment attribute).
    _fields_ = [("w", ctypes.c_uint64 * (MSG_T_BYTES // 8))]


_FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


@ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)
def _noop_free(data, hint):  # our buffers are owned by Python; nothing to free
    return None


class _Lib:
    """The library's public API through ctypes, with signatures declared."""

    def __init__(self, path: str) -> None:
        try:
            self.so = ctypes.CDLL(path)
        except OSError as e:
            raise _CalibrationFailed(f"cannot load it ({e})") from e
        missing = [s for s in _REQUIRED_SYMBOLS if not hasattr(self.so, s)]
        if missing:
            more = f" and {len(missing) - 1} more zmq_* functions" if len(missing) > 1 else ""
            raise _CalibrationFailed(f"it does not export {missing[0]}{more}: not a libzmq")
        self.mem = _SelfMemory()
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        sig = {
            "zmq_ctx_new": (vp, []), "zmq_ctx_term": (i, [vp]), "zmq_socket": (vp, [vp, i]),
            "zmq_close": (i, [vp]), "zmq_bind": (i, [vp, ctypes.c_char_p]),
            "zmq_connect": (i, [vp, ctypes.c_char_p]),
            "zmq_setsockopt": (i, [vp, i, vp, sz]), "zmq_getsockopt": (i, [vp, i, vp, vp]),
            "zmq_msg_init": (i, [vp]), "zmq_msg_init_size": (i, [vp, sz]),
            "zmq_msg_init_data": (i, [vp, vp, sz, _FREE_FN, vp]),
            "zmq_msg_data": (vp, [vp]), "zmq_msg_size": (sz, [vp]), "zmq_msg_more": (i, [vp]),
            "zmq_msg_close": (i, [vp]), "zmq_msg_send": (i, [vp, vp, i]),
            "zmq_msg_recv": (i, [vp, vp, i]),
        }
        for name, (res, args) in sig.items():
            fn = getattr(self.so, name)
            fn.restype, fn.argtypes = res, args

    def version(self) -> str:
        a, b, c = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
        self.so.zmq_version(ctypes.byref(a), ctypes.byref(b), ctypes.byref(c))
        return f"{a.value}.{b.value}.{c.value}"


@dataclass
class _Sample:
    """One initialised message: its raw bytes and what the public API says about it."""
    raw: bytes
    addr: int          # address of the zmq_msg_t
    data: int          # zmq_msg_data
    size: int          # zmq_msg_size
    more: int          # zmq_msg_more
    # 64 bytes behind every word of raw that pointed to readable memory, taken
    # while the message was alive (a closed message's content block is freed).
    pointees: dict[int, bytes]

    def read(self, addr: int, n: int) -> bytes | None:
        block = self.pointees.get(addr)
        return block[:n] if block is not None and n <= len(block) else None

    @property
    def inline(self) -> bool:
        return 0 <= self.data - self.addr < MSG_T_BYTES


def _fresh_msg() -> _Msg:
    m = _Msg()
    ctypes.memmove(ctypes.byref(m), os.urandom(MSG_T_BYTES), MSG_T_BYTES)
    return m


def _sample(lib: _Lib, m: _Msg) -> _Sample:
    p = ctypes.byref(m)
    raw = bytes(m)
    pointees = {}
    for off in _WORD_OFFSETS:
        block = lib.mem.read(_u64(raw, off), 64)
        if block is not None:
            pointees[_u64(raw, off)] = block
    return _Sample(raw=raw, addr=ctypes.addressof(m), data=lib.so.zmq_msg_data(p) or 0,
                   size=lib.so.zmq_msg_size(p), more=lib.so.zmq_msg_more(p), pointees=pointees)


def _init_size(lib: _Lib, n: int) -> _Sample:
    m = _fresh_msg()
    if lib.so.zmq_msg_init_size(ctypes.byref(m), n) != 0:
        raise _CalibrationFailed(f"zmq_msg_init_size({n}) failed")
    try:
        s = _sample(lib, m)
    finally:
        lib.so.zmq_msg_close(ctypes.byref(m))
    return s


def _init_data(lib: _Lib, buf: ctypes.Array, free_fn) -> _Sample:
    m = _fresh_msg()
    if lib.so.zmq_msg_init_data(ctypes.byref(m), ctypes.addressof(buf), len(buf),
                                free_fn, None) != 0:
        raise _CalibrationFailed("zmq_msg_init_data failed")
    try:
        s = _sample(lib, m)
    finally:
        lib.so.zmq_msg_close(ctypes.byref(m))
    return s


def _only(cands, what: str) -> int:
    cands = sorted(set(cands))
    if len(cands) != 1:
        found = "none" if not cands else f"{len(cands)} candidates {cands[:8]}"
        raise _CalibrationFailed(f"cannot locate {what} ({found})")
    return cands[0]


def _constant_bytes(samples: list[_Sample]) -> dict[int, int]:
    """Offsets whose byte is the same in every sample, with that byte."""
    return {off: samples[0].raw[off] for off in range(MSG_T_BYTES)
            if all(s.raw[off] == samples[0].raw[off] for s in samples)}


def _word_offsets(raw: bytes, value: int) -> set[int]:
    return {off for off in _WORD_OFFSETS if _u64(raw, off) == value}


def _find_inline(lib: _Lib) -> tuple[int, int, int, list[_Sample]]:
    """(data offset, size offset, max inline size, samples) of very small messages."""
    samples = [_init_size(lib, n) for n in range(1, MSG_T_BYTES + 1)]
    inline = [s for s in samples if s.inline]
    if not inline:
        raise _CalibrationFailed("no very small message is stored inline")
    max_bytes = max(s.size for s in inline)
    if [s.size for s in inline] != list(range(1, max_bytes + 1)):
        raise _CalibrationFailed("inline storage is not used for every size up to the largest inline one")
    data_off = _only({s.data - s.addr for s in inline}, "the inline data")
    if data_off + max_bytes > MSG_T_BYTES:
        raise _CalibrationFailed("inline data runs past the end of zmq_msg_t")
    data_span = range(data_off, data_off + max_bytes)
    size_off = _only((off for off in range(MSG_T_BYTES) if off not in data_span
                      and all(s.raw[off] == s.size for s in inline)), "the inline size byte")
    return data_off, size_off, max_bytes, inline


def _find_content(samples: list[_Sample]) -> tuple[int, int, int]:
    """(pointer offset in zmq_msg_t, data offset, size offset in the content block)."""
    found = None
    for s in samples:
        here = set()
        for ptr_off in _WORD_OFFSETS:
            block = s.read(_u64(s.raw, ptr_off), 64)
            if block is None:
                continue
            for d_off in _word_offsets(block, s.data):
                for z_off in _word_offsets(block, s.size):
                    here.add((ptr_off, d_off, z_off))
        found = here if found is None else found & here
    if not found or len(found) != 1:
        raise _CalibrationFailed(
            f"cannot locate the content block of long messages ({len(found or ())} candidates)")
    return next(iter(found))


def _exchange(lib: _Lib) -> list[_Sample]:
    """Received frames of a real multipart exchange over loopback TCP, with their "more" flags."""
    so = lib.so
    ctx = so.zmq_ctx_new()
    if not ctx:
        raise _CalibrationFailed("zmq_ctx_new failed")
    socks = []
    try:
        for _ in range(2):
            s = so.zmq_socket(ctx, _ZMQ_PAIR)
            if not s:
                raise _CalibrationFailed("zmq_socket failed")
            socks.append(s)
            for opt, val in ((_ZMQ_LINGER, 0), (_ZMQ_RCVTIMEO, _EXCHANGE_TIMEOUT_MS),
                             (_ZMQ_SNDTIMEO, _EXCHANGE_TIMEOUT_MS)):
                v = ctypes.c_int(val)
                so.zmq_setsockopt(s, opt, ctypes.byref(v), ctypes.sizeof(v))
        rx, tx = socks
        if so.zmq_bind(rx, b"tcp://127.0.0.1:*") != 0:
            raise _CalibrationFailed("cannot bind a loopback TCP socket for the exchange")
        ep = ctypes.create_string_buffer(256)
        ep_len = ctypes.c_size_t(len(ep))
        so.zmq_getsockopt(rx, _ZMQ_LAST_ENDPOINT, ep, ctypes.byref(ep_len))
        if so.zmq_connect(tx, ep.value) != 0:
            raise _CalibrationFailed(f"cannot connect to {ep.value!r}")
        out = []
        for sizes in _EXCHANGE_SIZES:
            for i, n in enumerate(sizes):
                m = _fresh_msg()
                so.zmq_msg_init_size(ctypes.byref(m), n)
                ctypes.memset(so.zmq_msg_data(ctypes.byref(m)), 0x30 + i, n)
                flags = _ZMQ_SNDMORE if i + 1 < len(sizes) else 0
                if so.zmq_msg_send(ctypes.byref(m), tx, flags) != n:
                    so.zmq_msg_close(ctypes.byref(m))
                    raise _CalibrationFailed(f"sending a {n}-byte frame over loopback failed")
        for sizes in _EXCHANGE_SIZES:
            for n in sizes:
                m = _fresh_msg()
                so.zmq_msg_init(ctypes.byref(m))
                if so.zmq_msg_recv(ctypes.byref(m), rx, 0) != n:
                    so.zmq_msg_close(ctypes.byref(m))
                    raise _CalibrationFailed(f"receiving a {n}-byte frame over loopback failed")
                out.append(_sample(lib, m))
                so.zmq_msg_close(ctypes.byref(m))
        return out
    finally:
        for s in socks:
            so.zmq_close(s)
        so.zmq_ctx_term(ctx)


def measure_in_process(path: str) -> ZmqMsgLayout:
    """Load the library here and measure it: only ever inside the confined child (or
    on a library of our own, in tests)."""
    lib = _Lib(path)
    try:
        return _measure(lib, path)
    finally:
        lib.mem.close()


def confined_main(path: Path) -> dict:
    """The confined child's work (probes.sandbox): the layout as plain values."""
    try:
        layout = measure_in_process(str(path))
    except _CalibrationFailed as e:
        return {"error": str(e)}
    return {k: v for k, v in asdict(layout).items() if k != "library"}


_ANSWER_BOUNDS = {
    "type_off": range(MSG_T_BYTES), "flags_off": range(MSG_T_BYTES),
    "more_mask": [1 << b for b in range(8)], "vsm_type": range(256),
    "vsm_data_off": range(MSG_T_BYTES), "vsm_size_off": range(MSG_T_BYTES),
    "vsm_max_bytes": range(1, MSG_T_BYTES), "lmsg_type": range(256), "zclmsg_type": range(256),
    "content_ptr_off": _WORD_OFFSETS, "content_data_off": _WORD_OFFSETS,
    "content_size_off": _WORD_OFFSETS, "cmsg_type": range(256), "cmsg_data_off": _WORD_OFFSETS,
    "cmsg_size_off": _WORD_OFFSETS,
}
_VERSION = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}")


def _layout_of_answer(answer: dict, path: str) -> ZmqMsgLayout:
    """The child's answer as a layout, every value checked: the child ran the library's
    code, so its answer is as untrusted as the library."""
    values = {}
    for name, allowed in _ANSWER_BOUNDS.items():
        v = answer.get(name)
        if type(v) is not int or v not in allowed:
            raise _CalibrationFailed(f"the measurement gave {name} = {str(v)[:20]!r}, "
                                     "outside what zmq_msg_t allows")
        values[name] = v
    version = answer.get("version")
    if not isinstance(version, str) or not _VERSION.fullmatch(version):
        raise _CalibrationFailed("the measurement gave no version of the form N.N.N")
    if values["vsm_data_off"] + values["vsm_max_bytes"] > MSG_T_BYTES:
        raise _CalibrationFailed("the measurement puts inline data past the end of zmq_msg_t")
    if len({values["vsm_type"], values["lmsg_type"], values["cmsg_type"]}) != 3:
        raise _CalibrationFailed("the measurement gave two kinds of message the same type tag")
    return ZmqMsgLayout(library=path, version=version, **values)


def _calibrate(path: str) -> ZmqMsgLayout:
    try:
        answer = sandbox.run("probes.zmq_layout", Path(path))
    except sandbox.SandboxFailed as e:
        raise _CalibrationFailed(str(e)) from None
    return _layout_of_answer(answer, path)


def _measure(lib: _Lib, path: str) -> ZmqMsgLayout:
    vsm_data_off, vsm_size_off, vsm_max, vsm = _find_inline(lib)

    lmsg = [_init_size(lib, n) for n in _LONG_SIZES for _ in range(2)]
    if any(s.inline for s in lmsg):
        raise _CalibrationFailed("long messages are stored inline")
    content_ptr_off, content_data_off, content_size_off = _find_content(lmsg)

    # Keep buffers alive until their messages are closed (inside _init_data).
    bufs = [ctypes.create_string_buffer(n) for n in _LONG_SIZES for _ in range(2)]
    cmsg = [_init_data(lib, b, ctypes.cast(None, _FREE_FN)) for b in bufs]
    if any(s.data != ctypes.addressof(b) for s, b in zip(cmsg, bufs)):
        raise _CalibrationFailed("zmq_msg_init_data does not keep the caller's buffer")
    cmsg_data_off = _only(set.intersection(*(_word_offsets(s.raw, s.data) for s in cmsg)),
                          "the constant message's data pointer")
    cmsg_size_off = _only(set.intersection(*(_word_offsets(s.raw, s.size) for s in cmsg)),
                          "the constant message's size")

    # The type tag: a byte constant within each kind and different between kinds.
    per_kind = [_constant_bytes(group) for group in (vsm, lmsg, cmsg)]
    type_off = _only((off for off in per_kind[0]
                      if all(off in k for k in per_kind[1:])
                      and len({k[off] for k in per_kind}) == 3
                      and off != vsm_size_off), "the type tag")
    vsm_type, lmsg_type, cmsg_type = (k[type_off] for k in per_kind)

    received = _exchange(lib)
    tags = {s.raw[type_off] for s in received} - {vsm_type, lmsg_type, cmsg_type}
    if len(tags) > 1:
        raise _CalibrationFailed(f"received frames carry unknown type tags {sorted(tags)}")
    zclmsg_type = tags.pop() if tags else lmsg_type
    if any(s.more not in (0, 1) for s in received) or len({s.more for s in received}) != 2:
        raise _CalibrationFailed("zmq_msg_more does not tell first from last frames")
    flags_off, more_mask = _only(
        ((off, 1 << bit) for off in range(MSG_T_BYTES) for bit in range(8)
         if off not in (type_off, vsm_size_off)
         and all(bool(s.raw[off] & (1 << bit)) == bool(s.more) for s in received)),
        "the \"more\" flag")

    layout = ZmqMsgLayout(
        library=path, version=lib.version(), type_off=type_off, flags_off=flags_off,
        more_mask=more_mask, vsm_type=vsm_type, vsm_data_off=vsm_data_off,
        vsm_size_off=vsm_size_off, vsm_max_bytes=vsm_max, lmsg_type=lmsg_type,
        zclmsg_type=zclmsg_type, content_ptr_off=content_ptr_off,
        content_data_off=content_data_off, content_size_off=content_size_off,
        cmsg_type=cmsg_type, cmsg_data_off=cmsg_data_off, cmsg_size_off=cmsg_size_off)
    _validate(layout, vsm + lmsg + cmsg + received)
    _validate(layout, [_init_size(lib, n) for n in (1, vsm_max, vsm_max + 1, 65537)]
              + _exchange(lib))
    return layout


def _validate(layout: ZmqMsgLayout, samples: list[_Sample]) -> None:
    """Decode every sample the way the BPF program will and compare with the public API."""
    for s in samples:
        got = layout.locate(s.raw, s.addr, s.read)
        if got is None:
            raise _CalibrationFailed(f"type tag {s.raw[layout.type_off]} of a {s.size}-byte "
                                     "frame is not described by the calibrated layout")
        if got != (s.data, s.size):
            raise _CalibrationFailed(f"the calibrated layout misreads a {s.size}-byte frame")
        more = bool(s.raw[layout.flags_off] & layout.more_mask)
        if s.more and not more:
            raise _CalibrationFailed("the calibrated \"more\" flag misses a frame with more")


@functools.lru_cache(maxsize=256)
def _calibrate_cached(path: str, dev: int, ino: int, mtime_ns: int) -> ZmqMsgLayout | str:
    """A layout, or why there is none: a failure is remembered too, so that processes
    mapping the same decoy do not each cost a confined child."""
    try:
        return _calibrate(path)
    except _CalibrationFailed as e:
        return str(e)


def calibrate(library: str | os.PathLike) -> ZmqMsgLayout:
    """The zmq_msg_t layout of this libzmq, measured once per file (cached by inode and mtime)."""
    path = os.path.realpath(library)
    try:
        st = os.stat(path)
    except OSError as e:
        raise UserError(f"cannot read libzmq {library} ({e.strerror}); "
                        "give the path of the libzmq the traced process loads") from None
    got = _calibrate_cached(path, st.st_dev, st.st_ino, st.st_mtime_ns)
    if isinstance(got, str):
        raise UserError(f"cannot calibrate the zmq_msg_t layout of {path}: {got}; the zmq "
                        "framework uprobes cannot read frames from this library, so trace "
                        "this process without them (syscall probes still work) or report "
                        "the library and its version")
    return got


def pyzmq_libzmq() -> Path:
    """The libzmq bundled with the installed pyzmq (the one our own psbench loads)."""
    import zmq  # the project depends on pyzmq; imported lazily so BPF-free code need not

    site = Path(zmq.__file__).resolve().parents[1]
    found = sorted(site.glob("pyzmq.libs/libzmq*.so*"))
    if found:
        return found[0]
    # A pyzmq built against the system libzmq links it instead of bundling it.
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and Path(parts[5]).name.startswith("libzmq"):
            return Path(parts[5])
    raise UserError(f"pyzmq at {site} neither bundles nor loads a libzmq; reinstall pyzmq")
