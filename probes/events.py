"""ctypes mirrors of the event structs in events.h, and their decoding.

tests/unit/test_probes_events.py compiles events.h and checks every field's
offset and size against these classes, so the two cannot drift apart.
"""
from __future__ import annotations

import ctypes
import enum
import socket
from pathlib import Path

EVENTS_H = Path(__file__).with_name("events.h")

COUNTER_SEEN = 0
COUNTER_LOST = 1

AF_INET = 2
AF_INET6 = 10


class SockCall(enum.IntEnum):
    """enum sockcall_call."""

    READ = 1
    WRITE = 2
    READV = 3
    WRITEV = 4
    RECVFROM = 5
    SENDTO = 6
    RECVMSG = 7
    SENDMSG = 8

    @property
    def is_send(self) -> bool:
        return self in (SockCall.WRITE, SockCall.WRITEV, SockCall.SENDTO, SockCall.SENDMSG)


_CALL_VALUES = frozenset(c.value for c in SockCall)

SOCKCALL_F_ISN_EXACT = 0x01
SOCKCALL_F_ISN_DERIVED = 0x02
SOCKCALL_F_PAYLOAD_FAULT = 0x04

SOCKCALL_PAYLOAD_MAX = 256

# Counter slots of the sockcalls probe, in order (enum pslat_counter, enum sockcall_counter).
SOCKCALL_COUNTERS = ("seen", "lost", "eagain", "inflight_full")


class SockcallEvent(ctypes.Structure):
    """struct sockcall_event."""

    _fields_ = [
        ("enter_ts_ns", ctypes.c_uint64),
        ("exit_ts_ns", ctypes.c_uint64),
        ("sk", ctypes.c_uint64),
        ("sk_cookie", ctypes.c_uint64),
        ("ret", ctypes.c_int64),
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("fd", ctypes.c_uint32),
        ("netns_ino", ctypes.c_uint32),
        ("seq_start", ctypes.c_uint32),
        ("seq_end", ctypes.c_uint32),
        ("isn_local", ctypes.c_uint32),
        ("isn_remote", ctypes.c_uint32),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
        ("family", ctypes.c_uint16),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("payload_bytes", ctypes.c_uint16),
        ("call", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("_pad", ctypes.c_uint8 * 6),
        ("comm", ctypes.c_char * 16),
        ("payload", ctypes.c_uint8 * SOCKCALL_PAYLOAD_MAX),
    ]

    # The C struct's name in events.h, for the layout test.
    c_name = "struct sockcall_event"

    @classmethod
    def decode(cls, data: bytes | memoryview) -> "SockcallEvent":
        """One ring-buffer record, which is cut after payload[payload_bytes]."""
        head = SockcallEvent.payload.offset
        if len(data) < head:
            raise ValueError(f"sockcall record of {len(data)} bytes is shorter than its header ({head})")
        ev = cls()
        n = min(len(data), ctypes.sizeof(cls))
        ctypes.memmove(ctypes.addressof(ev), bytes(data[:n]), n)
        if ev.call not in _CALL_VALUES:
            raise ValueError(f"sockcall record has unknown call {ev.call}")
        if ev.payload_bytes > SOCKCALL_PAYLOAD_MAX or head + ev.payload_bytes > len(data):
            raise ValueError(f"sockcall record claims {ev.payload_bytes} payload bytes but carries "
                             f"{len(data) - head}")
        return ev

    @classmethod
    def from_ring(cls, data_ptr: int, size_bytes: int) -> "SockcallEvent":
        """Decode from the (pointer, size) bcc hands a ring-buffer callback."""
        return cls.decode(ctypes.string_at(data_ptr, size_bytes))

    # -- derived views ----------------------------------------------------

    @property
    def call_kind(self) -> SockCall:
        return SockCall(self.call)

    @property
    def payload_data(self) -> bytes:
        return bytes(self.payload[: self.payload_bytes])

    @property
    def seq_bytes(self) -> int:
        """Bytes the call moved according to TCP sequence numbers (mod 2**32)."""
        return (self.seq_end - self.seq_start) & 0xFFFFFFFF

    def _addr(self, raw) -> str:
        b = bytes(raw)
        # inet_ntop: ~10x cheaper than ipaddress, and this runs per event.
        if self.family == AF_INET:
            return socket.inet_ntop(socket.AF_INET, b[:4])
        if self.family == AF_INET6:
            return socket.inet_ntop(socket.AF_INET6, b)
        return b.hex()

    @property
    def local_addr(self) -> str:
        return self._addr(self.saddr)

    @property
    def remote_addr(self) -> str:
        return self._addr(self.daddr)

    def connection_key(self) -> tuple:
        """(local addr, local port, remote addr, remote port, isn_local, isn_remote):
        a reconnect on a reused port gives a new key."""
        return (self.local_addr, self.sport, self.remote_addr, self.dport, self.isn_local, self.isn_remote)

    def as_record(self) -> dict:
        """A plain record, field names with units, for everything downstream of probes/."""
        return {
            "call": self.call_kind.name.lower(),
            "enter_ts_ns": self.enter_ts_ns,
            "exit_ts_ns": self.exit_ts_ns,
            "tgid": self.tgid,
            "tid": self.tid,
            "comm": self.comm.decode(errors="replace"),
            "fd": self.fd,
            "ret": self.ret,
            "sk": self.sk,
            "sk_cookie": self.sk_cookie,
            "netns_ino": self.netns_ino,
            "family": self.family,
            "local_addr": self.local_addr,
            "local_port": self.sport,
            "remote_addr": self.remote_addr,
            "remote_port": self.dport,
            "isn_local": self.isn_local,
            "isn_remote": self.isn_remote,
            "isn_exact": bool(self.flags & SOCKCALL_F_ISN_EXACT),
            "seq_start": self.seq_start,
            "seq_end": self.seq_end,
            "payload": self.payload_data,
            "payload_fault": bool(self.flags & SOCKCALL_F_PAYLOAD_FAULT),
        }
