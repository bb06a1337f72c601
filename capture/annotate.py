"""One host's captured packets + the agent's message rows of that host -> pcapng packets
commented with the process and thread, the connection, the messages and requests whose
bytes each carries, and the stage it was seen at (issue 17 item 2, `pslat agent --pcap`).

    n = annotate(records, host_id, messages, writer, interface)   # records: CaptureReader's

The join is by connection and TCP sequence: a packet from a local address is one of the
host's `tx` rows' flow (local = its source), else of an `rx` row's (local = its
destination); it carries a message's bytes when [seq, seq + payload) overlaps the row's
[seq_first, seq_end). Sequence numbers wrap: offsets are taken modulo 2**32 from each
flow's first row (a flow moves less than 2 GiB between its rows). Packets of flows
the agent has no row of say so. Every string in a comment comes from the rows (traced
data): capture/pcapng_write.py bounds it.
"""
from __future__ import annotations

import bisect
from collections import defaultdict

from capture.decode import COUNTERS, decode

MASK32 = (1 << 32) - 1
MESSAGES_NAMED_MAX = 8   # a packet's comment names at most this many messages (and counts the rest)
STAGE = {True: "seen at the driver handoff (tx, ts_xmit_last)", False: "seen at netif_receive (rx, ts_netif_rx_last)"}


def _flows(messages) -> dict:
    """(direction, local, remote) -> (base seq, sorted starts, rows sorted by start)."""
    by: dict = defaultdict(list)
    for r in messages.itertuples(index=False):
        by[(r.direction, (r.local_ip, int(r.local_port)), (r.remote_ip, int(r.remote_port)))].append(r)
    out = {}
    for k, rows in by.items():
        base = int(rows[0].seq_first)
        rows = sorted(rows, key=lambda r: (int(r.seq_first) - base) & MASK32)
        out[k] = (base, [(int(r.seq_first) - base) & MASK32 for r in rows], rows)
    return out


def _describe(r) -> str:
    kind = "control" if r.control else "request" if r.request else "response"
    ids = ", ".join(f"{n} {int(v)}" for n, v in (("call_space", r.call_space), ("call_id", r.call_id),
                                                   ("sender", r.sender), ("recver", r.recver)) if v == v and v is not None)
    return f"{r.protocol} {r.op} {kind} ({ids}) seq {int(r.seq_first)}-{int(r.seq_end)}"


def annotate(records, host_id: str, messages, writer, interface: int) -> dict:
    """Writes every record to `writer` on `interface` with its comment; returns counts."""
    flows = _flows(messages)
    local = set(messages.local_ip)
    counts = dict.fromkeys(COUNTERS, 0)
    seen = {"packets": 0, "payload_packets": 0, "payload_packets_named": 0}
    for ts_ns, link_type, data, wire_len in records:
        seen["packets"] += 1
        s = decode(link_type, data, wire_len, ts_ns, counts)
        if s is None:
            writer.packet(interface, ts_ns, data, wire_len, comment=f"pslat {host_id}: not TCP")
            continue
        tx = s.src in local
        me, peer = ((s.src, s.sport), (s.dst, s.dport)) if tx else ((s.dst, s.dport), (s.src, s.sport))
        flow = flows.get(("tx" if tx else "rx", me, peer))
        # its process and connection: from either direction's rows (an ACK-only direction has none)
        known = flow or flows.get(("rx" if tx else "tx", me, peer))
        conn = f"{me[0]}:{me[1]} -> {peer[0]}:{peer[1]}" if tx else f"{peer[0]}:{peer[1]} -> {me[0]}:{me[1]}"
        n = len(s.payload) + s.missing
        head = f"pslat {host_id}: {conn}, {STAGE[tx]}"
        if known is None:
            writer.packet(interface, ts_ns, data, wire_len, outbound=tx,
                          comment=f"{head}; a connection the agent has no message of")
            continue
        r0 = known[2][0]
        head += f"; pid {r0.pid} tid {r0.tid} ({r0.comm}), conn {r0.conn_id}"
        base, starts, rows = flow or (0, [], [])
        named = []
        if n:
            seen["payload_packets"] += 1
            a = (s.seq - base) & MASK32
            b = a + n
            i = max(bisect.bisect_right(starts, a) - 1, 0)
            while i < len(rows) and starts[i] < b:
                r = rows[i]
                end = starts[i] + ((int(r.seq_end) - int(r.seq_first)) & MASK32)
                if end > a:
                    named.append(r)
                i += 1
            if named:
                seen["payload_packets_named"] += 1
                head = f"pslat {host_id}: {conn}, {STAGE[tx]}; pid {named[0].pid} tid {named[0].tid} " \
                       f"({named[0].comm}), conn {named[0].conn_id}"
        text = head + ("; " + "; ".join(_describe(r) for r in named[:MESSAGES_NAMED_MAX]) if named else
                       "; no message bytes" if not n else "; bytes of no message the agent parsed")
        if len(named) > MESSAGES_NAMED_MAX:
            text += f"; and {len(named) - MESSAGES_NAMED_MAX} more messages"
        writer.packet(interface, ts_ns, data, wire_len, comment=text, outbound=tx)
    return seen
