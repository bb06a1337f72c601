"""Declaration of the netstack probe (sources: netstack.bpf.c, rings.bpf.h).

The kernel network stack around the messages of traced sockets: driver
handoff, qdisc, TX completion, NAPI / netif_receive, data-ready, window state,
retransmissions, connection life cycle, connect/accept times and the
scheduler state of the threads that read. Per message, not per packet: the
kernel walker in sockcalls.bpf.c (walk_engine.bpf.h) calls the ns_* API of rings.bpf.h (documented
there) when it finds where a message ends.
"""
from __future__ import annotations

from probes.declare import Attach, KernelField, LruMap, Probe, TracepointField
from probes.events import NETSTACK_COUNTERS, NetstackEvent

_CALL_ENTERS = {
    "ns_enter_connect": ("syscalls:sys_enter_connect", "NS_TP_CONNECT_FD"),
    "ns_enter_accept": ("syscalls:sys_enter_accept", "NS_TP_ACCEPT_FD"),
    "ns_enter_accept4": ("syscalls:sys_enter_accept4", "NS_TP_ACCEPT4_FD"),
}
_CALL_EXITS = ("syscalls:sys_exit_connect", "syscalls:sys_exit_accept", "syscalls:sys_exit_accept4")

# raw tracepoint -> BPF function. Raw: no trace record is formatted, the
# program gets the tracepoint's C arguments (skb, sk, task pointers).
RAW_HOOKS = {
    "net_dev_queue": "ns_dev_queue",
    "net_dev_start_xmit": "ns_start_xmit",
    "consume_skb": "ns_consume_skb",
    "kfree_skb": "ns_kfree_skb",
    "napi_gro_receive_entry": "ns_rx_arrival",
    "netif_rx": "ns_rx_arrival",            # devices without NAPI (veth, loopback)
    "netif_receive_skb": "ns_netif_receive",
    "sk_data_ready": "ns_data_ready",
    "tcp_retransmit_skb": "ns_retransmit",
    "inet_sock_set_state": "ns_set_state",
    "sched_switch": "ns_sched_switch",
    "sched_wakeup": "ns_sched_wakeup",
    "sched_wakeup_new": "ns_sched_wakeup_new",
}
# Hooks that exist only with NS_TX_COMPLETION=1 (the loader attaches what the
# declaration lists, so this probe is declared per setting: netstack_probe()).
_COMPLETION_HOOKS = ("consume_skb", "kfree_skb")


def _probe(tx_completion: bool) -> Probe:
    raw = {tp: fn for tp, fn in RAW_HOOKS.items() if tx_completion or tp not in _COMPLETION_HOOKS}
    return Probe(
        name="netstack",
        source="netstack.bpf.c",
        attach=(
            *(Attach("raw_tracepoint", tp, fn) for tp, fn in raw.items()),
            *(Attach("tracepoint", tp, fn) for fn, (tp, _) in _CALL_ENTERS.items()),
            Attach("tracepoint", "syscalls:sys_exit_connect", "ns_exit_connect"),
            *(Attach("tracepoint", tp, "ns_exit_accept") for tp in _CALL_EXITS[1:]),
        ),
        event=NetstackEvent,
        ring="ns_events",
        counters_map="ns_counters",
        counters=NETSTACK_COUNTERS,
        kernel_fields=(
            KernelField("NS_OFF_SKB_SK", "sk_buff.sk", 8),
            KernelField("NS_OFF_SKB_DEV", "sk_buff.dev", 8),
            KernelField("NS_OFF_SKB_HEAD", "sk_buff.head", 8),
            KernelField("NS_OFF_SKB_DATA", "sk_buff.data", 8),
            KernelField("NS_OFF_SKB_LEN", "sk_buff.len", 4),
            KernelField("NS_OFF_SKB_TRANSPORT_HEADER", "sk_buff.transport_header", 2),
            KernelField("NS_OFF_SKB_PROTOCOL", "sk_buff.protocol", 2),
            KernelField("NS_OFF_SKB_CB", "sk_buff.cb", 48),  # TCP's struct tcp_skb_cb lives here
            KernelField("NS_OFF_TCB_SEQ", "tcp_skb_cb.seq", 4),
            KernelField("NS_OFF_TCB_END_SEQ", "tcp_skb_cb.end_seq", 4),
            KernelField("NS_OFF_DEV_IFINDEX", "net_device.ifindex", 4),
            KernelField("NS_OFF_DEV_ND_NET", "net_device.nd_net.net", 8),
            KernelField("NS_OFF_SKC_STATE", "sock.__sk_common.skc_state", 1),
            KernelField("NS_OFF_TCP_SND_CWND", "tcp_sock.snd_cwnd", 4),
            KernelField("NS_OFF_TCP_SND_SSTHRESH", "tcp_sock.snd_ssthresh", 4),
            KernelField("NS_OFF_TCP_PACKETS_OUT", "tcp_sock.packets_out", 4),
            KernelField("NS_OFF_TCP_RETRANS_OUT", "tcp_sock.retrans_out", 4),
            KernelField("NS_OFF_TCP_SND_WND", "tcp_sock.snd_wnd", 4),
            KernelField("NS_OFF_TCP_SND_UNA", "tcp_sock.snd_una", 4),
            KernelField("NS_OFF_TCP_SND_NXT", "tcp_sock.snd_nxt", 4),
            KernelField("NS_OFF_TCP_WRITE_SEQ", "tcp_sock.write_seq", 4),
            KernelField("NS_OFF_TCP_MSS_CACHE", "tcp_sock.mss_cache", 4),
            KernelField("NS_OFF_TCP_RCV_NXT", "tcp_sock.rcv_nxt", 4),
            KernelField("NS_OFF_SK_WMEM_QUEUED", "sock.sk_wmem_queued", 4),
            KernelField("NS_OFF_SK_SNDBUF", "sock.sk_sndbuf", 4),
            KernelField("NS_OFF_TASK_PID", "task_struct.pid", 4),
        ),
        tracepoint_fields=(
            *(TracepointField(const, (tp,), "fd", 8) for tp, const in _CALL_ENTERS.values()),
            TracepointField("NS_TP_SYSCALL_NR", tuple(tp for tp, _ in _CALL_ENTERS.values()) + _CALL_EXITS,
                            "__syscall_nr", 4),
            TracepointField("NS_TP_EXIT_RET", _CALL_EXITS, "ret", 8),
        ),
        constants={
            # name: (default, low, high)
            "NETSTACK_LOADED": (1, 1, 1),  # tells rings.bpf.h to compile the real API
            "NS_RING_PAGES": (256, 1, 1 << 16),  # 1 MiB: ~10k events
            # tracked sockets: ~6 KiB of rings each (TX, data-ready, flow),
            # preallocated: 4096 -> ~25 MiB of kernel memory (28 MiB for all maps)
            "NS_SOCKS_MAX": (4096, 64, 1 << 20),
            "NS_SKBS_MAX": (16384, 256, 1 << 22),  # skbs between qdisc and TX completion
            # thread slots of the sched hooks (tid % this; 64 B each: 2 MiB): pid_max
            # (32768 here) or more, and no two threads share one
            "NS_THREADS_MAX": (32768, 64, 1 << 22),
            # last 64 skbs handed to the driver, per socket: segments, when the
            # device has no TSO (TCP's GSO skbs are then segmented in software)
            "NS_TX_XMIT_SLOTS_LOG2": (6, 2, 8),
            "NS_TX_EXPECT_SLOTS_LOG2": (4, 2, 8),  # 16 message ends waiting, per socket
            "NS_RX_SLOTS_LOG2": (7, 2, 9),  # last 128 segments received per flow: two 64 KiB messages (a reader one message behind still finds the first; 64 lost 1-5% of 78 KB requests)
            "NS_DR_SLOTS_LOG2": (5, 2, 8),  # last 32 data-ready wake-ups, per socket
            # a segment after this long without one on its flow starts a burst: both ends
            # report it (ns_clock_event) for the clock estimate. 0: none reported. 100 us:
            # about one event per message end that follows a pause (messages closer than
            # that queue behind each other anyway, and would not be minimum-delay samples)
            "NS_CLOCK_GAP_NS": (100_000, 0, 10**9),
            # ...when it carries this much: a smaller one is a whole message, whose own
            # times are the same sample (and reporting it cost ~2 events per message)
            "NS_CLOCK_MIN_BYTES": (1024, 1, 1 << 16),
            "NS_TX_COMPLETION": (int(tx_completion), int(tx_completion), int(tx_completion)),
        },
        lru_maps=(LruMap("socks", "socks_made", "socks_removed", "NS_SOCKS_MAX"),),
    )


NETSTACK = _probe(tx_completion=True)
# Without the consume_skb/kfree_skb hooks (which fire for every skb freed on
# the machine): no ns_tx_done_event.
NETSTACK_NO_COMPLETION = _probe(tx_completion=False)


def netstack_probe(tx_completion: bool = True) -> Probe:
    return NETSTACK if tx_completion else NETSTACK_NO_COMPLETION
