"""Declaration of the sockcalls probe (source: sockcalls.bpf.c)."""
from __future__ import annotations

from probes.declare import Attach, KernelField, Probe, TracepointField
from probes.events import SOCKCALL_COUNTERS, SockcallEvent

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
        "SOCKCALLS_RING_PAGES": (1024, 1, 1 << 16),  # 4 MiB: ~10k full events
        "SOCKCALLS_INFLIGHT_MAX": (16384, 64, 1 << 20),  # threads inside a traced call at once
        "SOCKCALLS_CONNS_MAX": (16384, 64, 1 << 22),  # connections whose facts are cached (~136 B each)
        "SOCKCALLS_IOV_WALK_MAX": (8, 1, 32),  # iovecs walked for the payload prefix
    },
)
