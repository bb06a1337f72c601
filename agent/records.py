"""The records a host's agent writes, and the ordered stages of one message.

One row of the `messages` table is one application message (a request, a response
or a protocol's control message, in any registered protocol: parsers/protocol.py)
as seen on one host, send side or receive side, with the time at
which it crossed each layer of that host (DESIGN.md, "The components of one
request"). Times are CLOCK_MONOTONIC ns of that host; a stage the host's device
does not have is null and `null_reasons` says why (never a made-up time).
"""
from __future__ import annotations

import enum

import pyarrow as pa


class TxStage(enum.IntEnum):
    """Send-side stages of one message, in causal order."""
    FRAMEWORK_CALL = 0      # uprobe: the framework's call that sends the message
    SEND_FIRST_ENTER = 1    # first send syscall entry that wrote a byte of it
    SEND_LAST_EXIT = 2      # exit of the send syscall that wrote its last byte
    XMIT_LAST = 3           # driver handoff of the segment carrying its last byte
    TXDONE_LAST = 4         # TX completion / NIC hardware TX timestamp of that segment


class RxStage(enum.IntEnum):
    """Receive-side stages of one message, in causal order."""
    NIC_RX_LAST = 0         # NIC hardware RX timestamp, else IRQ/NAPI entry, of the last segment
    NETIF_RX_LAST = 1       # netif_receive of the last segment
    DATA_READY = 2          # socket data-ready for the last byte
    RECV_LAST_EXIT = 3      # exit of the recv syscall that consumed the last byte
    FRAMEWORK_HANDOVER = 4  # uprobe: the framework hands the whole message to the app


TX_STAGE_COLUMNS = {
    TxStage.FRAMEWORK_CALL: "ts_framework_ns",
    TxStage.SEND_FIRST_ENTER: "ts_send_first_enter_ns",
    TxStage.SEND_LAST_EXIT: "ts_send_last_exit_ns",
    TxStage.XMIT_LAST: "ts_xmit_last_ns",
    TxStage.TXDONE_LAST: "ts_txdone_last_ns",
}
RX_STAGE_COLUMNS = {
    RxStage.NIC_RX_LAST: "ts_nic_rx_last_ns",
    RxStage.NETIF_RX_LAST: "ts_netif_rx_last_ns",
    RxStage.DATA_READY: "ts_data_ready_ns",
    RxStage.RECV_LAST_EXIT: "ts_recv_last_exit_ns",
    RxStage.FRAMEWORK_HANDOVER: "ts_framework_ns",
}

_ts = pa.int64()
MESSAGES_SCHEMA = pa.schema([
    ("host_id", pa.string()),
    ("direction", pa.string()),           # "tx" | "rx"
    ("pid", pa.int32()), ("tid", pa.int32()), ("comm", pa.string()),
    ("netns_ino", pa.uint32()),           # the network namespace the socket lives in
    # connection: local/remote 4-tuple as seen on this host, and the key that
    # makes a reconnect on a reused port a new connection
    ("local_ip", pa.string()), ("local_port", pa.int32()),
    ("remote_ip", pa.string()), ("remote_port", pa.int32()),
    ("conn_id", pa.string()),
    ("seq_first", pa.uint32()), ("seq_end", pa.uint32()),  # TCP seq of first byte, one past the last
    # what the message was, as its protocol's parser says (parsers/protocol.py): op in
    # the shared vocabulary (parsers.protocol.OPS) and op_name in the protocol's own;
    # call_space and call_id pair a response with its request, on the same connection
    # or across connections between two node ids (pair_scope); detail: the protocol's
    # own fields as a JSON object (null when it has none)
    ("protocol", pa.string()), ("pair_scope", pa.string()),
    ("control", pa.bool_()), ("request", pa.bool_()),
    ("op", pa.string()), ("op_name", pa.string()),
    ("call_space", pa.int64()), ("call_id", pa.int64()),
    ("sender", pa.int32()), ("recver", pa.int32()),   # node ids, where the protocol names nodes
    ("num_keys", pa.int64()), ("key_sample", pa.list_(pa.uint64())),
    ("key_sample_complete", pa.bool_()),  # False when lost bytes hid part of the keys
    ("value_bytes", pa.int64()), ("msg_bytes", pa.int64()),  # msg_bytes: the protocol's bytes on the wire
    ("detail", pa.string()),
    ("framework_layer", pa.string()),     # whose time ts_framework_ns is: a layer of probes.framework (KINDS), or null
    # stages (see TxStage / RxStage); rx rows reuse ts_framework_ns for the hand-over
    ("ts_framework_ns", _ts),
    ("ts_send_first_enter_ns", _ts), ("ts_send_last_exit_ns", _ts),
    ("ts_xmit_last_ns", _ts), ("ts_txdone_last_ns", _ts),
    ("ts_nic_rx_last_ns", _ts), ("ts_netif_rx_last_ns", _ts),
    ("ts_data_ready_ns", _ts), ("ts_recv_last_exit_ns", _ts),
    ("null_reasons", pa.string()),        # "stage=reason;..." for every null stage
    # inputs of the sub-components (DESIGN.md); what each measures or infers, and why
    # one is null (its reason under its name in null_reasons): agent/netrows.py.
    # rx rows: runq_wait + busy_wait = ts_recv_last_exit - ts_data_ready;
    # tx rows: cwnd_wait, rwnd_wait, qdisc_wait (stack_tx is the rest of kernel_tx)
    ("runq_wait_ns", _ts), ("busy_wait_ns", _ts),
    ("cwnd_wait_ns", _ts), ("rwnd_wait_ns", _ts), ("qdisc_wait_ns", _ts),
    ("connect_wait_ns", _ts),
])


# One row per TCP connection a traced process opened or accepted, from the
# netstack probe's life-cycle events (connect()/accept() calls, TCP state
# changes, retransmissions). Times are CLOCK_MONOTONIC ns of the host; null when
# the agent did not see that step (the connection predates it, or is still open).
CONNECTIONS_SCHEMA = pa.schema([
    ("host_id", pa.string()), ("netns_ino", pa.uint32()),
    ("pid", pa.int32()),                  # the process that connected / accepted (when known)
    ("role", pa.string()),                # "connect" | "accept" | "unknown"
    ("local_ip", pa.string()), ("local_port", pa.int32()),
    ("remote_ip", pa.string()), ("remote_port", pa.int32()),
    ("conn_id", pa.string()),             # as in `messages` (the same on both ends)
    ("isn_local", pa.uint32()), ("isn_remote", pa.uint32()),
    ("ts_connect_enter_ns", _ts), ("ts_connect_exit_ns", _ts), ("connect_ret", pa.int64()),
    ("ts_syn_sent_ns", _ts), ("ts_syn_recv_ns", _ts),
    ("ts_established_ns", _ts),
    ("handshake_ns", _ts),                # connect() entry (else SYN_SENT) -> ESTABLISHED
    ("ts_accept_enter_ns", _ts), ("ts_accept_exit_ns", _ts),
    ("accept_wait_ns", _ts),              # ESTABLISHED -> accept() returned it
    ("ts_close_ns", _ts),                 # TCP_CLOSE
    ("retransmits", pa.int64()), ("retransmit_failures", pa.int64()),
    ("states", pa.string()),              # "STATE@ts_ns,..." every transition seen
])


# One row per TCP connection whose bytes the stream decoder saw, written when it
# drops the connection (its close, idle, evicted, its socket reused) or at the stop
# (end "open_at_stop"): what it moved each way, whatever its protocol, and whether
# a parser recognised it ("protocol": the parser's name, "unrecognised", or "none"
# for no bytes). Traffic no protocol recognises is said from here, never lost.
# Both ends of a connection traced: a row on each host, the same conn_id. Bytes are
# the TCP sequence space the calls moved: the payload, and one for a FIN read with it.
STREAMS_SCHEMA = pa.schema([
    ("host_id", pa.string()), ("netns_ino", pa.uint32()), ("conn_id", pa.string()),
    ("local_ip", pa.string()), ("local_port", pa.int32()),
    ("remote_ip", pa.string()), ("remote_port", pa.int32()),
    ("pids", pa.list_(pa.int32())), ("threads", pa.list_(pa.string())),   # thread names seen in its calls
    ("protocol", pa.string()),
    ("calls_tx", pa.int64()), ("bytes_tx", pa.int64()), ("messages_tx", pa.int64()),
    ("unparsed_bytes_tx", pa.int64()), ("signature_tx", pa.string()), ("signature_offset_tx", pa.int64()),
    ("calls_rx", pa.int64()), ("bytes_rx", pa.int64()), ("messages_rx", pa.int64()),
    ("unparsed_bytes_rx", pa.int64()), ("signature_rx", pa.string()), ("signature_offset_rx", pa.int64()),
    ("ts_first_ns", _ts), ("ts_last_ns", _ts),   # its first call's entry, its latest call's exit
    ("end", pa.string()),
])


EPHEMERAL_PORT_MIN = 32768   # Linux's default ip_local_port_range starts here


def service_port(a: int, b: int) -> int:
    """The port a connection serves: the end below the ephemeral range, else the lower."""
    low = [p for p in (a, b) if p < EPHEMERAL_PORT_MIN]
    return low[0] if len(low) == 1 else min(a, b)


# One row per segment of NS_CLOCK_MIN_BYTES or more that started a burst on a traced
# flow (nothing else of the flow for the netstack probe's NS_CLOCK_GAP_NS before it):
# the first segment of a large message, as its sender handed
# it to the driver ("tx") or its receiver saw it arrive ("rx"): the report pairs
# the two ends by flow and seq into one-way samples for the clock estimate
# (agent/clocksamples.py, reports/clocks.py). CLOCK_MONOTONIC ns of the host.
CLOCK_SAMPLES_SCHEMA = pa.schema([
    ("host_id", pa.string()),
    ("direction", pa.string()),           # "tx" | "rx"
    ("src_ip", pa.string()), ("src_port", pa.int32()),   # the segment's source and destination
    ("dst_ip", pa.string()), ("dst_port", pa.int32()),
    ("seq", pa.uint32()),                 # its first payload byte
    ("ts_ns", _ts),                       # tx: driver handoff; rx: arrival (NAPI/netif_rx, else netif_receive)
])
