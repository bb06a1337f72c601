"""The job's packets as the wire carried them, and each TCP direction's bytes in order:
what the parsers are checked on (parsers/brpc for Paddle, parsers/pslite for BytePS),
independent of pslat's probes.

`WireCapture(path)` (inside a workloads.cluster.Cluster) runs tcpdump in the wire
namespace on the frames coming in from the hosts (`-Q in`: each frame once, as its
sender handed it to the wire). `tcp_streams(path)` reassembles every TCP direction
from its SYN's sequence number (retransmitted and overlapping bytes kept once); a
direction whose start was not captured is left out.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.errors import UserError

from workloads.cluster import netns
from workloads.cluster.spec import WIRE_NS

# --immediate-mode makes libpcap use fixed ring slots sized by the snap length: 2048
# holds a whole 1500-byte frame (the cluster turns segmentation offloads off); -B gives
# 32 MiB of them, so a burst does not overrun the ring on a busy machine.
TCPDUMP_ARGV = ["tcpdump", "--immediate-mode", "-U", "-n", "-i", "any", "-Q", "in",
                "-s", "2048", "-B", "32768"]
START_TIMEOUT_S = 10.0
SETTLE_S = 0.5   # the wire's own delay plus tcpdump's lag, after the last packet


@dataclass(frozen=True)
class Direction:
    """One direction of one TCP connection: its bytes from the first one after the SYN."""
    src: str
    sport: int
    dst: str
    dport: int
    data: bytes

    @property
    def key(self) -> str:
        return f"{self.src}:{self.sport}>{self.dst}:{self.dport}"


class WireCapture:
    """tcpdump on the wire for the duration of a with-block; `.stats` and `.dropped` after."""

    def __init__(self, path: Path, bpf_filter: str = "tcp"):
        self.path = Path(path)
        self.stats = ""
        self.dropped = False
        argv = [*TCPDUMP_ARGV, "-w", str(self.path), bpf_filter]
        self.proc = subprocess.Popen(netns.in_ns(WIRE_NS, argv), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True)

    def __enter__(self) -> "WireCapture":
        deadline = time.monotonic() + START_TIMEOUT_S
        seen = []
        # tcpdump says "listening on" once its socket is open
        for line in iter(self.proc.stderr.readline, b""):
            seen.append(line)
            if b"listening on" in line:
                return self
            if time.monotonic() > deadline:
                break
        self.proc.kill()
        self.proc.wait()
        raise UserError(f"tcpdump in {WIRE_NS} did not start: {b''.join(seen)[-300:]!r}")

    def __exit__(self, *exc: Any) -> None:
        time.sleep(SETTLE_S)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        # its last words: "N packets captured ... M packets dropped by kernel"
        self.stats = self.proc.stderr.read().decode(errors="replace").strip()
        self.proc.stderr.close()
        self.dropped = "\n0 packets dropped by kernel" not in "\n" + self.stats


def tcp_streams(pcap: Path) -> list[Direction]:
    """Every TCP direction whose SYN was captured, its payload in sequence order."""
    from scapy.all import IP, TCP, PcapReader

    isn: dict[tuple, int] = {}
    segs: dict[tuple, dict[int, bytes]] = {}
    with PcapReader(str(pcap)) as reader:
        for pkt in reader:
            if IP not in pkt or TCP not in pkt:
                continue
            ip, tcp = pkt[IP], pkt[TCP]
            flow = (ip.src, tcp.sport, ip.dst, tcp.dport)
            if tcp.flags & 0x02:   # SYN: the direction's first byte is ISN + 1
                isn[flow] = tcp.seq + 1
                segs[flow] = {}
                continue
            payload = bytes(tcp.payload)
            if flow in isn and payload:
                off = (tcp.seq - isn[flow]) % (1 << 32)
                if len(payload) > len(segs[flow].get(off, b"")):
                    segs[flow][off] = payload
    out = []
    for flow, by_off in segs.items():
        buf = bytearray()
        for off in sorted(by_off):
            data = by_off[off]
            if off > len(buf):
                break   # a hole: keep the bytes before it only
            buf += data[len(buf) - off:]
        out.append(Direction(flow[0], flow[1], flow[2], flow[3], bytes(buf)))
    return out
