"""psbench on the wire, checked independently of psbench's code.

A job runs in the loopback of a network namespace made here (MTU 1500, TSO/GSO
off, so a big message is many segments), tcpdump captures it, and this file
decodes the capture on its own: TCP reassembly with scapy, ZMTP 3.0 (RFC 23:
greeting, READY with Socket-Type/Identity, frames), and the first frame of
every message with parsers.pslite.meta.PBMeta. Node ids come from the
scheduler's ADD_NODE table as seen on the wire. Every request slice in the
ground truth must be on the wire with its ids, and every data message on the
wire must be in the ground truth.
"""
import bisect
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP
from scapy.utils import PcapReader, RawPcapReader

from parsers.pslite.meta import PBMeta
from workloads.psbench.launch import launch
from workloads.psbench.options import Workload

pytestmark = pytest.mark.privileged

SCHED_PORT = 9091
FIN, SYN, ACK = 0x01, 0x02, 0x10


@pytest.fixture
def netns():
    name = f"psbt-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up", "mtu", "1500"], check=True)
        subprocess.run(["ip", "netns", "exec", name, "ethtool", "-K", "lo", "tso", "off", "gso", "off", "gro", "off"],
                       check=True, capture_output=True)
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


MARKER_PORT = 9
MARKER = b"psbench-test-end-of-capture"


def _start_capture(ns: str, pcap: Path) -> subprocess.Popen:
    cap = subprocess.Popen(["ip", "netns", "exec", ns, "tcpdump", "-i", "lo", "-U", "-s", "0", "-B", "32768",
                            "-w", str(pcap), f"tcp or udp port {MARKER_PORT}"], stderr=subprocess.PIPE, text=True)
    for line in cap.stderr:  # ready signal: tcpdump says it is listening
        if "listening on" in line:
            return cap
    raise AssertionError(f"tcpdump did not start: rc={cap.wait()}")


def _stop_capture(ns: str, cap: subprocess.Popen, pcap: Path) -> None:
    """tcpdump drops what is still in its kernel ring when interrupted: send a
    marker datagram after the job and stop only once the marker is on file
    (tcpdump writes in arrival order, so everything before it is too)."""
    subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c",
                    "import socket,sys; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                    f".sendto({MARKER!r}, ('127.0.0.1', {MARKER_PORT}))"], check=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and cap.poll() is None:
        try:
            if any(MARKER in pkt for pkt, _ in RawPcapReader(str(pcap))):
                break
        except EOFError:
            pass  # a record half written: read again
        time.sleep(0.1)  # polls the file for the marker (the capture's ready signal)
    else:
        raise AssertionError("capture never saw the end marker")
    cap.send_signal(signal.SIGINT)
    cap.wait(timeout=20)


# -- independent decoding -------------------------------------------------------

def _streams(pcap: Path):
    """{(src, sport, dst, dport): (bytes in order, initiator?, sorted segment offsets)} from raw TCP segments."""
    segs, isn, initiator = defaultdict(dict), {}, {}
    with PcapReader(str(pcap)) as reader:
        for pkt in reader:
            if IP not in pkt or TCP not in pkt:
                continue
            ip, tcp = pkt[IP], pkt[TCP]
            key = (ip.src, tcp.sport, ip.dst, tcp.dport)
            if tcp.flags & SYN:
                isn[key] = tcp.seq
                initiator[key] = not tcp.flags & ACK
                continue
            payload = bytes(tcp.payload)
            if payload and key in isn:
                segs[key][(tcp.seq - isn[key] - 1) % 2**32] = payload  # offsets from the ISN: a retransmit overwrites
    out = {}
    for key, by_off in segs.items():
        buf = bytearray()
        for off in sorted(by_off):
            data = by_off[off]
            assert off <= len(buf), f"hole in {key} at {off}"
            buf += data[len(buf) - off:]
        out[key] = (bytes(buf), initiator[key], sorted(by_off), max(map(len, by_off.values())))
    return out


def _zmtp(stream: bytes):
    """ZMTP 3.0: greeting, then frames. Returns (READY properties, [(frames, start, end offset)] messages)."""
    assert stream[0] == 0xFF and stream[9] & 1 == 1 and stream[10] == 3, "not a ZMTP 3 greeting"
    assert stream[12:32].rstrip(b"\0") == b"NULL"
    i, props, msgs, frames, start = 64, {}, [], [], 64
    while i < len(stream):
        if not frames:
            start = i
        flags = stream[i]
        if flags & 0x02:
            size, i = int.from_bytes(stream[i + 1:i + 9], "big"), i + 9
        else:
            size, i = stream[i + 1], i + 2
        body, i = stream[i:i + size], i + size
        assert len(body) == size, "truncated frame"
        if flags & 0x04:  # command
            name = body[1:1 + body[0]]
            if name == b"READY":
                j = 1 + body[0]
                while j < len(body):
                    n = body[j]
                    pname = body[j + 1:j + 1 + n].decode()
                    vlen = int.from_bytes(body[j + 1 + n:j + 5 + n], "big")
                    props[pname] = body[j + 5 + n:j + 5 + n + vlen]
                    j += 5 + n + vlen
            continue
        frames.append(body)
        if not flags & 0x01:
            msgs.append((frames, start, i))
            frames = []
    return props, msgs


def _decode(pcap: Path):
    """Node table, control messages by (cmd, request, from scheduler?), data messages and the largest segment."""
    conns, max_seg = [], 0  # (dealer->router stream key, sender identity, messages, segment offsets)
    for key, (data, initiated, offsets, biggest) in _streams(pcap).items():
        max_seg = max(max_seg, biggest)
        props, msgs = _zmtp(data)
        if initiated:  # the connecting side: a ps-lite DEALER
            assert props.get("Socket-Type") == b"DEALER", props
            conns.append((key, props.get("Identity", b""), msgs, offsets))
        else:
            assert props.get("Socket-Type") == b"ROUTER" and not msgs  # ROUTERs never send in ps-lite
    port_to_id, controls, data_msgs = {}, defaultdict(int), []
    for key, ident, msgs, _ in conns:
        for frames, _, _ in msgs:
            meta = PBMeta.FromString(frames[0])
            if meta.HasField("control") and meta.control.cmd:
                controls[(meta.control.cmd, meta.request, ident == b"ps1")] += 1
                if meta.control.cmd == 2 and ident == b"ps1":  # ADD_NODE from the scheduler: the node table
                    for n in meta.control.node:
                        port_to_id[n.port] = n.id
    for key, ident, msgs, offsets in conns:
        for frames, start, end in msgs:
            meta = PBMeta.FromString(frames[0])
            if meta.HasField("control") and meta.control.cmd:
                continue
            assert ident.startswith(b"ps"), f"data message from anonymous {key}"
            src, dst = int(ident[2:]), port_to_id[key[3]]
            worker, server = (src, dst) if meta.request else (dst, src)
            data_msgs.append({
                "app_id": meta.app_id, "customer_id": meta.customer_id, "timestamp": meta.timestamp,
                "sender": worker, "recver": server, "request": meta.request,
                "op": "push" if meta.push else "pull", "num_keys": len(frames[1]) // 8 if len(frames) > 1 else 0,
                "bytes": sum(len(f) for f in frames), "data_type": list(meta.data_type), "conn": key,
                "segments": bisect.bisect_left(offsets, end) - bisect.bisect_right(offsets, start) + 1})
    return port_to_id, controls, data_msgs, max_seg


def _run(ns: str, out: Path, wl: Workload, servers: int, workers: int):
    roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
    job = launch(out, [(r, None, "127.0.0.1") for r in roles],
                 lambda _host, argv, **kw: subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kw),
                 ("127.0.0.1", SCHED_PORT), wl)
    with job:
        job.wait()
        return job.truth()


CASES = {
    # small requests, closed loop: one segment each
    "small": dict(keys_per_request=8, embedding_dim=8, duration_s=1.0, heartbeat_interval_s=0.2),
    # 2000 keys x 16 floats: ~76 KB per server slice, 50+ segments at MTU 1500; reconnects on the way
    "large": dict(keys_per_request=2000, embedding_dim=16, key_space=200_000, rate=16, duration_s=1.5,
                  reconnect_every=5),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_slice_is_on_the_wire_and_nothing_else(netns, tmp_path, case):
    pcap = tmp_path / "job.pcap"
    cap = _start_capture(netns, pcap)
    try:
        truth = _run(netns, tmp_path / "out", Workload(**CASES[case]), servers=2, workers=2)
    finally:
        _stop_capture(netns, cap, pcap)
    port_to_id, controls, wire, max_segment = _decode(pcap)

    assert sorted(port_to_id.values()) == [1, 8, 9, 10, 11]
    assert max_segment <= 1448  # MTU 1500, no TSO: what a real NIC would carry
    assert controls[(2, False, False)] == 4 and controls[(2, False, True)] == 4  # ADD_NODE in, table out
    assert controls[(3, True, False)] == 2 * 4 and controls[(3, True, True)] == 2  # two barriers, 5 nodes
    assert controls[(3, False, True)] == 2 * 5  # the scheduler's barrier replies
    assert controls[(1, False, False)] == 4 and controls[(1, False, True)] == 1  # each node's TERMINATE to itself
    if CASES[case].get("heartbeat_interval_s"):  # nodes' heartbeats, each answered by the scheduler
        assert 4 <= controls[(5, False, True)] <= controls[(5, False, False)]

    ids = ["app_id", "customer_id", "timestamp", "sender", "recver", "op"]
    key = lambda r: tuple(int(r[c]) if c != "op" else r[c] for c in ids)  # noqa: E731
    reqs = {key(m): m for m in wire if m["request"]}
    resps = {key(m): m for m in wire if not m["request"]}
    assert len(reqs) + len(resps) == len(wire), "an id was on the wire twice"
    w = {key(r): r for r in truth[truth.role == "worker"].to_dict("records")}
    s = {key(r): r for r in truth[truth.role == "server"].to_dict("records")}
    assert len(w) > 20
    assert set(w) == set(reqs) == set(resps) == set(s)
    for k, row in w.items():
        req, resp = reqs[k], resps[k]
        assert (row["num_keys"], row["req_bytes"], row["resp_bytes"]) == (req["num_keys"], req["bytes"], resp["bytes"])
        assert req["conn"] != resp["conn"]  # the reply comes back on another TCP connection
        assert port_to_id[resp["conn"][3]] == row["sender"]  # the reply enters the worker's own ROUTER
        assert req["data_type"] == ([8, 9, 3] if row["op"] == "push" else [8, 9])
    if case == "large":
        assert max(m["segments"] for m in wire) >= 50
        assert len({m["conn"] for m in reqs.values()}) > 2 * 2  # reconnects opened new connections
