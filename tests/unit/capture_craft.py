"""Captures crafted from a real one for the capture tests: packets reordered, sent twice,
lost, cut by a snap length, a file cut off. Packets are read and rebuilt with scapy (not
with the code under test); the file is written here (pcap, nanosecond times), since a
capture whose captured length is below the wire length needs a writer that says so."""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from scapy.layers.inet import IP, TCP
from scapy.layers.l2 import Ether
from scapy.utils import RawPcapReader

LINK_ETHERNET = 1
PCAP_NS_MAGIC = 0xA1B23C4D


def read(path: Path) -> list[list]:
    """[[ts_ns, frame bytes, wire length], ...] of an Ethernet pcap (nanosecond or microsecond)."""
    out = []
    reader = RawPcapReader(str(path))
    scale = 1 if reader.nano else 1000
    for data, meta in reader:
        out.append([meta.sec * 10**9 + meta.usec * scale, bytes(data), meta.wirelen])   # usec: ns when nano
    reader.close()
    return out


def write(path: Path, recs: list[list], link_type: int = LINK_ETHERNET, snaplen: int = 262144) -> Path:
    """A pcap of [ts_ns, captured bytes, wire length] records."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", PCAP_NS_MAGIC, 2, 4, 0, 0, snaplen, link_type))
        for ts, data, wire_len in recs:
            f.write(struct.pack("<IIII", ts // 10**9, ts % 10**9, len(data), wire_len))
            f.write(data)
    return path


def tcp_of(rec) -> TCP | None:
    p = Ether(rec[1])
    return p[TCP] if TCP in p else None


def payload_len(rec) -> int:
    t = tcp_of(rec)
    return len(bytes(t.payload)) if t is not None else 0


def flow_of(rec) -> tuple | None:
    p = Ether(rec[1])
    return (p[IP].src, p[TCP].sport, p[IP].dst, p[TCP].dport) if TCP in p else None


def data_indices(recs: list[list], flow: tuple | None = None) -> list[int]:
    """Indices of the records carrying TCP payload (of one flow)."""
    return [i for i, r in enumerate(recs) if payload_len(r) and (flow is None or flow_of(r) == flow)]


def busiest_flow(recs: list[list]) -> tuple:
    """The flow with the most payload segments."""
    counts: dict = {}
    for i in data_indices(recs):
        f = flow_of(recs[i])
        counts[f] = counts.get(f, 0) + 1
    return max(counts, key=counts.get)


def tail_of(rec, skip: int) -> list:
    """The record's segment without its first `skip` payload bytes (a partial retransmission)."""
    p = Ether(rec[1])
    t = p[TCP]
    data = bytes(t.payload)
    t.remove_payload()
    t.seq = (t.seq + skip) % 2**32
    p = p / data[skip:]
    del p[IP].len, p[IP].chksum, p[TCP].chksum
    b = bytes(p)
    return [rec[0], b, len(b)]


def random_tcp(path: Path, total_bytes: int, flows: int = 1000, payload: int = 1448, seed: int = 1) -> Path:
    """A pcap of about total_bytes of TCP segments with random payload and random sequence
    numbers on `flows` connections (no handshakes): nothing in it is any protocol. Built with
    numpy (scapy takes minutes for 100 MB)."""
    rng = np.random.default_rng(seed)
    n = total_bytes // (16 + 54 + payload)
    hdr = np.zeros((n, 16 + 54), dtype=np.uint8)
    ts = 1_700_000_000 * 10**9 + np.arange(n, dtype=np.int64) * 10_000
    rec = np.zeros(n, dtype=[("sec", "<u4"), ("ns", "<u4"), ("cap", "<u4"), ("wire", "<u4")])
    rec["sec"], rec["ns"], rec["cap"], rec["wire"] = ts // 10**9, ts % 10**9, 54 + payload, 54 + payload
    hdr[:, :16] = rec.view(np.uint8).reshape(n, 16)
    hdr[:, 28:30] = (0x08, 0x00)   # Ethernet: IPv4
    hdr[:, 30:50] = np.frombuffer(struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40 + payload, 0, 0, 64, 6, 0,
                                              bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2])), np.uint8)
    hdr[:, 50:52] = (20000 + rng.integers(0, flows, n)).astype(">u2").view(np.uint8).reshape(n, 2)
    hdr[:, 52:54] = (0x23, 0x28)   # port 9000
    hdr[:, 54:58] = rng.integers(0, 2**32, n, dtype=np.uint64).astype(">u4").view(np.uint8).reshape(n, 4)
    hdr[:, 62], hdr[:, 63] = 0x50, 0x18   # 20-byte header; PSH, ACK
    body = np.frombuffer(rng.bytes(n * payload), dtype=np.uint8).reshape(n, payload)
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", PCAP_NS_MAGIC, 2, 4, 0, 0, 262144, LINK_ETHERNET))
        f.write(np.concatenate([hdr, body], axis=1).tobytes())
    return path
