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

# What a record's values may be before they go on to a run dir's columns
# (agent.records): a record with one the kernel cannot have written (a damaged or
# doctored recording) is refused with a ValueError, counted as undecodable, instead of
# making a writer raise later. Times are CLOCK_MONOTONIC ns, below 2**62 (146 years of
# uptime) so that a difference or sum of two still fits int64; process and thread ids
# fit the int32 pid/tid columns (the kernel's pid_max is at most 2**22).
TIME_NS_MAX = 2**62
PID_MAX = 2**31 - 1

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
SOCKCALL_F_CONTINUED = 0x08

SOCKCALL_PAYLOAD_MAX = 16384

# Counter slots of the sockcalls probe, in order (enum pslat_counter, enum sockcall_counter).
SOCKCALL_COUNTERS = ("seen", "lost", "eagain", "inflight_full", "walk_bytes", "frames", "messages",
                     "desyncs", "key_samples", "truncated", "not_zmtp", "stream_gaps", "walk_aborted",
                     "hints_applied", "hints_stale", "self_syncs", "walk_budget", "hunted_bytes",
                     "conns_made", "conns_removed", "walks_made", "walks_removed", "msgs_out", "msgs_lost")


class SockcallItemKind(enum.IntEnum):
    """enum sockcall_item_kind: what follows a struct sockcall_item in payload[]."""

    BYTES = 1
    WALK_START = 2
    WALK_END = 3
    MSG_END = 4
    KEYS = 5
    RX_TIMES = 6
    SCHED = 7
    WINDOW = 8
    HUNTED = 9


# BYTES items: SOCKCALL_BYTES_*
SOCKCALL_BYTES_PREFIX = 0x01
SOCKCALL_BYTES_GREETING = 0x02
SOCKCALL_BYTES_HEADER = 0x04
SOCKCALL_BYTES_BODY = 0x08
SOCKCALL_BYTES_RAW = 0x10


class WalkProtocol(enum.IntEnum):
    """SOCKCALL_PROTO_*: the framing the walker follows a direction with (WALK_START's detail)."""

    NONE = 0  # a WALK_START written before the walker said protocols (it was ZMTP)
    ZMTP = 1
    BRPC = 2


class WalkStart(enum.IntEnum):
    """SOCKCALL_WALK_*: why the walker follows frames from a WALK_START on."""

    GREETING = 1
    CONTINUE = 2
    HINT = 3
    SELF = 4


class WalkStop(enum.IntEnum):
    """SOCKCALL_STOP_*: why it stopped at a WALK_END."""

    NOT_ZMTP = 1
    OPAQUE = 2
    BAD_FLAGS = 3
    BAD_SIZE = 4
    BAD_COMMAND = 5
    STREAM_GAP = 6
    BUDGET = 7
    IOV = 8
    FAULT = 9
    NO_WALKER = 10
    BAD_MAGIC = 11


class SockcallItem(ctypes.Structure):
    """struct sockcall_item."""

    _fields_ = [("kind", ctypes.c_uint8), ("what", ctypes.c_uint8), ("len", ctypes.c_uint16),
                ("call_off", ctypes.c_uint32)]
    c_name = "struct sockcall_item"


class SockcallWalkMark(ctypes.Structure):
    """struct sockcall_walk_mark (WALK_START, WALK_END)."""

    _fields_ = [("frame_idx", ctypes.c_uint32), ("how", ctypes.c_uint8), ("phase", ctypes.c_uint8),
                ("detail", ctypes.c_uint16)]
    c_name = "struct sockcall_walk_mark"


class SockcallMsgEnd(ctypes.Structure):
    """struct sockcall_msg_end."""

    _fields_ = [("end_seq", ctypes.c_uint32), ("frames", ctypes.c_uint32), ("msg_index", ctypes.c_uint64)]
    c_name = "struct sockcall_msg_end"


class SockcallKeys(ctypes.Structure):
    """struct sockcall_keys (followed by `count` little-endian uint64 keys)."""

    _fields_ = [("scanned_bytes", ctypes.c_uint32), ("level", ctypes.c_uint8), ("count", ctypes.c_uint8),
                ("_pad", ctypes.c_uint16), ("mask", ctypes.c_uint64)]
    c_name = "struct sockcall_keys"


class SockcallHunted(ctypes.Structure):
    """struct sockcall_hunted (HUNTED)."""

    _fields_ = [("bytes", ctypes.c_uint32), ("_pad", ctypes.c_uint32)]
    c_name = "struct sockcall_hunted"


_ITEM_HDR = ctypes.sizeof(SockcallItem)
_FIXED_ITEMS = {SockcallItemKind.WALK_START: SockcallWalkMark, SockcallItemKind.WALK_END: SockcallWalkMark,
                SockcallItemKind.MSG_END: SockcallMsgEnd, SockcallItemKind.HUNTED: SockcallHunted}
_ITEM_KINDS = frozenset(k.value for k in SockcallItemKind)


def decode_items(payload: bytes) -> list[tuple[SockcallItem, bytes]]:
    """payload[] of a sockcall record -> [(item header, its body bytes)], in order.

    Raises ValueError on an item that runs past the payload or has an unknown kind."""
    out = []
    pos, n = 0, len(payload)
    while pos < n:
        if n - pos < _ITEM_HDR:
            raise ValueError(f"sockcall item header cut at payload byte {pos} of {n}")
        it = SockcallItem.from_buffer_copy(payload, pos)
        body_at = pos + _ITEM_HDR
        if it.kind not in _ITEM_KINDS:
            raise ValueError(f"sockcall item of unknown kind {it.kind} at payload byte {pos}")
        if body_at + it.len > n:
            raise ValueError(f"sockcall item at payload byte {pos} claims {it.len} bytes, {n - body_at} left")
        fixed = _FIXED_ITEMS.get(it.kind)
        if fixed is not None and it.len != ctypes.sizeof(fixed):
            raise ValueError(f"sockcall {SockcallItemKind(it.kind).name} item of {it.len} bytes, "
                             f"expected {ctypes.sizeof(fixed)}")
        out.append((it, bytes(payload[body_at:body_at + it.len])))
        pos = body_at + it.len
    return out


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

    def items(self) -> list[tuple[SockcallItem, bytes]]:
        """payload[] decoded into its items (events.h: what the walker says)."""
        return decode_items(self.payload_data)

    @property
    def continued(self) -> bool:
        """More records of this call follow (its items did not fit in one)."""
        return bool(self.flags & SOCKCALL_F_CONTINUED)

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


# ==== netstack: BEGIN (owner: probes/netstack.py; mirrors the netstack block of events.h) ====

class NsEventKind(enum.IntEnum):
    """enum ns_event_kind: the first byte of every netstack record."""

    TX = 1
    TX_DONE = 2
    RETRANS = 3
    CONN = 4
    CALL = 5
    CLOCK = 6


# Counter slots of the netstack probe, in order (enum pslat_counter, enum ns_counter).
NETSTACK_COUNTERS = ("seen", "lost", "tx_expect_overwritten", "tx_sent_unseen", "rx_netif_overwritten",
                     "rx_netif_missing", "rx_dr_missing", "skb_unparsed", "track_failed",
                     "socks_made", "socks_removed")

NS_TX_F_RETRANS = 0x0001
NS_TX_F_OVERWRITTEN = 0x0002
NS_TX_F_CLOSED = 0x0004
NS_TX_F_SENT_UNSEEN = 0x0008
NS_TX_F_NO_QUEUE = 0x0010
NS_TX_F_BEFORE_EXPECT = 0x0020
NS_TX_F_STACKED = 0x0040
NS_TX_F_NEXT_DEVICE = 0x0080

NS_TXC_COMPLETED = 1
NS_TXC_FORWARDED = 2
NS_TXC_DROPPED = 3
NS_TXC_NAMES = {NS_TXC_COMPLETED: "completed", NS_TXC_FORWARDED: "no_tx_completion_forwarded",
                NS_TXC_DROPPED: "dropped"}

NS_CONN_F_ISN = 0x01
NS_CONN_F_TGID = 0x02

NS_CALL_CONNECT = 1
NS_CALL_ACCEPT = 2

NS_RX_F_NETIF = 0x0001
NS_RX_F_NIC = 0x0002
NS_RX_F_DATA_READY = 0x0004
NS_RX_F_NO_NAPI = 0x0008
NS_RX_F_NETIF_OVERWRITTEN = 0x0010
NS_RX_F_NETIF_MISSING = 0x0020
NS_RX_F_DR_OVERWRITTEN = 0x0040
NS_RX_F_DR_MISSING = 0x0080
NS_RX_F_DUPLICATE = 0x0100
NS_RX_F_UNTRACKED = 0x0200
NS_RX_F_NOT_LOADED = 0x8000

NS_SCHED_F_TRACKED = 0x01
NS_SCHED_F_NOT_LOADED = 0x80

NS_WIN_F_VALID = 0x01
NS_WIN_F_NOT_LOADED = 0x80

# TCP states (include/net/tcp_states.h), for life-cycle records.
TCP_STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2",
              6: "TIME_WAIT", 7: "CLOSE", 8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING",
              12: "NEW_SYN_RECV", 13: "BOUND_INACTIVE"}


def _ns_addr(family: int, raw) -> str:
    b = bytes(raw)
    if family == AF_INET:
        return socket.inet_ntop(socket.AF_INET, b[:4])
    if family == AF_INET6:
        return socket.inet_ntop(socket.AF_INET6, b)
    return b.hex()


class NetstackEvent(ctypes.Structure):
    """Base of the netstack records; `from_ring` decodes any of them by its kind byte."""

    c_name = ""
    kind_value = 0

    @classmethod
    def decode(cls, data: bytes | memoryview) -> "NetstackEvent":
        if not len(data):
            raise ValueError("empty netstack record")
        kind = data[0]
        sub = _NS_KINDS.get(kind)
        if sub is None:
            raise ValueError(f"netstack record has unknown kind {kind}")
        if cls is not NetstackEvent and sub is not cls:
            raise ValueError(f"netstack record of kind {kind} is not a {cls.__name__}")
        size = ctypes.sizeof(sub)
        if len(data) != size:
            raise ValueError(f"netstack {sub.__name__} record is {len(data)} bytes, expected {size}")
        ev = sub.from_buffer_copy(bytes(data))
        for name, limit in _NS_LIMITS[kind]:
            if getattr(ev, name) > limit:
                raise ValueError(f"netstack {sub.__name__} record has {name} {getattr(ev, name)}, "
                                 f"past {limit}")
        return ev

    @classmethod
    def from_ring(cls, data_ptr: int, size_bytes: int) -> "NetstackEvent":
        """Decode from the (pointer, size) bcc hands a ring-buffer callback."""
        return cls.decode(ctypes.string_at(data_ptr, size_bytes))

    def as_record(self) -> dict:
        """A plain record: every field, addresses as text, arrays as bytes."""
        out = {}
        for name, _ in self._fields_:
            if name.startswith("_"):
                continue
            v = getattr(self, name)
            if name in ("saddr", "daddr"):
                v = _ns_addr(self.family, v)
            elif name == "comm":
                v = v.decode(errors="replace")
            out[name] = v
        out["kind"] = NsEventKind(self.kind).name.lower()
        return out


class NsTxEvent(NetstackEvent):
    """struct ns_tx_event."""

    c_name = "struct ns_tx_event"
    kind_value = NsEventKind.TX
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("nr_xmit", ctypes.c_uint8),
        ("flags", ctypes.c_uint16),
        ("end_seq", ctypes.c_uint32),
        ("sk", ctypes.c_uint64),
        ("msg_id", ctypes.c_uint64),
        ("ts_expect_ns", ctypes.c_uint64),
        ("ts_queue_ns", ctypes.c_uint64),
        ("ts_xmit_ns", ctypes.c_uint64),
        ("skb_seq", ctypes.c_uint32),
        ("skb_end_seq", ctypes.c_uint32),
        ("ifindex", ctypes.c_uint32),
        ("netns_ino", ctypes.c_uint32),
    ]


class NsTxDoneEvent(NetstackEvent):
    """struct ns_tx_done_event."""

    c_name = "struct ns_tx_done_event"
    kind_value = NsEventKind.TX_DONE
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("reason", ctypes.c_uint8),
        ("_pad", ctypes.c_uint16),
        ("end_seq", ctypes.c_uint32),
        ("sk", ctypes.c_uint64),
        ("msg_id", ctypes.c_uint64),
        ("ts_xmit_ns", ctypes.c_uint64),
        ("ts_done_ns", ctypes.c_uint64),
        ("ifindex", ctypes.c_uint32),
        ("netns_ino", ctypes.c_uint32),
    ]


class NsRetransEvent(NetstackEvent):
    """struct ns_retrans_event."""

    c_name = "struct ns_retrans_event"
    kind_value = NsEventKind.RETRANS
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("state", ctypes.c_uint8),
        ("family", ctypes.c_uint16),
        ("netns_ino", ctypes.c_uint32),
        ("ts_ns", ctypes.c_uint64),
        ("sk", ctypes.c_uint64),
        ("seq", ctypes.c_uint32),
        ("end_seq", ctypes.c_uint32),
        ("err", ctypes.c_int32),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
    ]


class NsConnEvent(NetstackEvent):
    """struct ns_conn_event."""

    c_name = "struct ns_conn_event"
    kind_value = NsEventKind.CONN
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("oldstate", ctypes.c_uint8),
        ("newstate", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("netns_ino", ctypes.c_uint32),
        ("ts_ns", ctypes.c_uint64),
        ("sk", ctypes.c_uint64),
        ("sk_cookie", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("isn_local", ctypes.c_uint32),
        ("isn_remote", ctypes.c_uint32),
        ("family", ctypes.c_uint16),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("_pad", ctypes.c_uint16),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
        ("_pad2", ctypes.c_uint32),
    ]


class NsCallEvent(NetstackEvent):
    """struct ns_call_event."""

    c_name = "struct ns_call_event"
    kind_value = NsEventKind.CALL
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("call", ctypes.c_uint8),
        ("family", ctypes.c_uint16),
        ("netns_ino", ctypes.c_uint32),
        ("ts_enter_ns", ctypes.c_uint64),
        ("ts_exit_ns", ctypes.c_uint64),
        ("sk", ctypes.c_uint64),
        ("ret", ctypes.c_int64),
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("fd", ctypes.c_uint32),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
        ("comm", ctypes.c_char * 16),
    ]


class NsClockEvent(NetstackEvent):
    """struct ns_clock_event."""

    c_name = "struct ns_clock_event"
    kind_value = NsEventKind.CLOCK
    _fields_ = [
        ("kind", ctypes.c_uint8),
        ("rx", ctypes.c_uint8),
        ("family", ctypes.c_uint16),
        ("netns_ino", ctypes.c_uint32),
        ("ts_ns", ctypes.c_uint64),
        ("seq", ctypes.c_uint32),
        ("sport", ctypes.c_uint16),
        ("dport", ctypes.c_uint16),
        ("saddr", ctypes.c_uint8 * 16),
        ("daddr", ctypes.c_uint8 * 16),
    ]


_NS_KINDS = {c.kind_value: c for c in (NsTxEvent, NsTxDoneEvent, NsRetransEvent, NsConnEvent, NsCallEvent,
                                       NsClockEvent)}
# per kind, the fields NetstackEvent.decode bounds (TIME_NS_MAX, PID_MAX)
_NS_LIMITS = {k: tuple((name, TIME_NS_MAX if name.endswith("_ns") else PID_MAX)
                       for name, _ in c._fields_ if name.endswith("_ns") or name in ("tgid", "tid"))
              for k, c in _NS_KINDS.items()}


# Out-parameters of the rings.bpf.h API, embedded by other probes' events.

class NsRxTimes(ctypes.Structure):
    """struct ns_rx_times."""

    c_name = "struct ns_rx_times"
    _fields_ = [
        ("ts_nic_ns", ctypes.c_uint64),
        ("ts_netif_ns", ctypes.c_uint64),
        ("ts_data_ready_ns", ctypes.c_uint64),
        ("data_ready_rcv_nxt", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    ]


class NsSched(ctypes.Structure):
    """struct ns_sched."""

    c_name = "struct ns_sched"
    _fields_ = [
        ("ts_wakeup_ns", ctypes.c_uint64),
        ("ts_switch_in_ns", ctypes.c_uint64),
        ("oncpu_ns", ctypes.c_uint64),
        ("runq_ns", ctypes.c_uint64),
        ("ts_tracked_ns", ctypes.c_uint64),
        ("nr_switch_in", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
    ]


class NsWindow(ctypes.Structure):
    """struct ns_window."""

    c_name = "struct ns_window"
    _fields_ = [
        ("snd_cwnd", ctypes.c_uint32),
        ("snd_ssthresh", ctypes.c_uint32),
        ("packets_out", ctypes.c_uint32),
        ("retrans_out", ctypes.c_uint32),
        ("snd_wnd", ctypes.c_uint32),
        ("snd_una", ctypes.c_uint32),
        ("snd_nxt", ctypes.c_uint32),
        ("write_seq", ctypes.c_uint32),
        ("mss_cache", ctypes.c_uint32),
        ("wmem_queued_bytes", ctypes.c_int32),
        ("sndbuf_bytes", ctypes.c_int32),
        ("flags", ctypes.c_uint32),
    ]


NETSTACK_MIRRORS = (NsTxEvent, NsTxDoneEvent, NsRetransEvent, NsConnEvent, NsCallEvent, NsClockEvent, NsRxTimes,
                    NsSched, NsWindow)
# ==== netstack: END ====


# ---- the sockcalls probe's fixed message record (after NsRxTimes, which it holds)

SOCKCALL_MSG_ITEMS_MAX = 512
SOCKCALL_MSG_F_ITEMS_CUT = 0x01
SOCKCALL_MSG_F_ITEMS_LOST = 0x02
SOCKCALL_MSG_F_RX_TIMES = 0x04


class SockcallMsg(ctypes.Structure):
    """struct sockcall_msg: one per message end, on the sockcalls_msgs ring."""

    c_name = "struct sockcall_msg"
    _fields_ = [
        ("enter_ts_ns", ctypes.c_uint64),
        ("exit_ts_ns", ctypes.c_uint64),
        ("sk", ctypes.c_uint64),
        ("msg_index", ctypes.c_uint64),
        ("tgid", ctypes.c_uint32),
        ("tid", ctypes.c_uint32),
        ("netns_ino", ctypes.c_uint32),
        ("seq_start", ctypes.c_uint32),
        ("seq_end", ctypes.c_uint32),
        ("end_seq", ctypes.c_uint32),
        ("frames", ctypes.c_uint32),
        ("items_bytes", ctypes.c_uint16),
        ("call", ctypes.c_uint8),
        ("flags", ctypes.c_uint8),
        ("rx", NsRxTimes),
        ("items", ctypes.c_uint8 * SOCKCALL_MSG_ITEMS_MAX),
    ]
