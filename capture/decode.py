"""Packet records -> TCP segments: link layer (Ethernet with VLAN tags, Linux cooked v1
and v2 as `tcpdump -i any` writes, raw IP, BSD loopback), IPv4 and IPv6, TCP.

    seg = decode(link_type, data, wire_len, ts_ns, counts)   # Segment, or None (counted in counts)

A packet that is not TCP is counted by why (counts: a dict of counters named in
COUNTERS), never an error: a capture of a host carries ARP, DNS, ICMP. The payload
is the IP packet's own length, not the frame's (Ethernet pads short frames); what the
snap length cut off is `missing` bytes, which reassembly turns into a gap.
"""
from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

# link types (www.tcpdump.org/linktypes.html)
LINK_NULL, LINK_ETHERNET, LINK_RAW, LINK_LOOP = 0, 1, 101, 108
LINK_LINUX_SLL, LINK_IPV4, LINK_IPV6, LINK_LINUX_SLL2 = 113, 228, 229, 276
LINK_NAMES = {LINK_NULL: "BSD loopback", LINK_ETHERNET: "Ethernet", LINK_RAW: "raw IP", LINK_LOOP: "OpenBSD loopback",
              LINK_LINUX_SLL: "Linux cooked", LINK_IPV4: "IPv4", LINK_IPV6: "IPv6", LINK_LINUX_SLL2: "Linux cooked v2"}
ETH_IPV4, ETH_IPV6, ETH_VLAN, ETH_QINQ = 0x0800, 0x86DD, 0x8100, 0x88A8
PROTO_TCP = 6
VLAN_TAGS_MAX = 2

COUNTERS = ("not_ip", "not_tcp", "ip_fragments", "ipv6_extension_headers", "unknown_link_type",
            "malformed", "truncated_headers")

_u16 = struct.Struct("!H").unpack_from
_tcp = struct.Struct("!HHIIBB").unpack_from    # ports, seq, ack, data offset, flags
# the common case in one read: Ethernet's type, a 20-byte IPv4 header, TCP's first 14 bytes
_ETH_IPV4_TCP = struct.Struct("!12xHBxHxxHxB2x4s4sHHIIBB")
_ETH_IPV4_TCP_LEN = _ETH_IPV4_TCP.size
_ip_text_cache: dict[bytes, str] = {}


@dataclass(slots=True)
class Segment:
    ts_ns: int
    src: str
    sport: int
    dst: str
    dport: int
    seq: int
    ack: int
    flags: int
    payload: memoryview   # the captured part of the TCP payload
    missing: int          # payload bytes the snap length cut off


FIN, SYN, RST, ACK = 0x01, 0x02, 0x04, 0x10


def _ip_text(raw: bytes) -> str:
    s = _ip_text_cache.get(raw)
    if s is None:
        s = str(ipaddress.ip_address(raw))
        if len(_ip_text_cache) < 65536:
            _ip_text_cache[raw] = s
    return s


def _network_offset(link_type: int, data) -> tuple[int, int] | None:
    """(offset of the IP header, ethertype), or None when the link header is not there."""
    n = len(data)
    if link_type == LINK_ETHERNET:
        if n < 14:
            return None
        off, etype = 14, _u16(data, 12)[0]
        for _ in range(VLAN_TAGS_MAX):
            if etype not in (ETH_VLAN, ETH_QINQ):
                break
            if n < off + 4:
                return None
            etype, off = _u16(data, off + 2)[0], off + 4
        return off, etype
    if link_type == LINK_LINUX_SLL:
        return (16, _u16(data, 14)[0]) if n >= 16 else None
    if link_type == LINK_LINUX_SLL2:
        return (20, _u16(data, 0)[0]) if n >= 20 else None
    if link_type in (LINK_RAW, LINK_IPV4, LINK_IPV6):
        if n < 1:
            return None
        return 0, ETH_IPV4 if data[0] >> 4 == 4 else ETH_IPV6 if data[0] >> 4 == 6 else 0
    if link_type in (LINK_NULL, LINK_LOOP):
        if n < 4:
            return None
        fam = struct.unpack_from("<I" if link_type == LINK_NULL else "!I", data, 0)[0]
        if link_type == LINK_NULL and fam > 0xFFFF:   # written by a big-endian host
            fam = struct.unpack_from("!I", data, 0)[0]
        return 4, ETH_IPV4 if fam == 2 else ETH_IPV6 if fam in (10, 24, 28, 30) else 0
    return -1, 0


def decode(link_type: int, data, wire_len: int, ts_ns: int, counts: dict) -> Segment | None:
    if link_type == LINK_ETHERNET and len(data) >= _ETH_IPV4_TCP_LEN:
        etype, vihl, total, frag, proto, src, dst, sport, dport, seq, ack, doff, flags = \
            _ETH_IPV4_TCP.unpack_from(data)
        if etype == ETH_IPV4 and vihl == 0x45 and proto == PROTO_TCP and not frag & 0x3FFF:
            # what the general path below checks, for this shape
            pay_at, ip_end, n = 34 + (doff >> 4) * 4, 14 + total, len(data)
            if 54 <= pay_at <= ip_end and n >= pay_at and ip_end <= wire_len:
                have_end = ip_end if ip_end < n else n
                return Segment(ts_ns, _ip_text(src), sport, _ip_text(dst), dport, seq, ack, flags,
                               memoryview(data)[pay_at:have_end], ip_end - have_end)
    return _decode(link_type, data, wire_len, ts_ns, counts)


def _decode(link_type: int, data, wire_len: int, ts_ns: int, counts: dict) -> Segment | None:
    got = _network_offset(link_type, data)
    if got is None:
        counts["truncated_headers"] += 1
        return None
    off, etype = got
    if off < 0:
        counts["unknown_link_type"] += 1
        return None
    n = len(data)
    cut = wire_len - n   # bytes of the frame the snap length left out
    if etype == ETH_IPV4:
        if n < off + 20:
            counts["truncated_headers"] += 1
            return None
        vihl = data[off]
        ihl = (vihl & 0x0F) * 4
        total = _u16(data, off + 2)[0]
        if vihl >> 4 != 4 or ihl < 20 or total < ihl:
            counts["malformed"] += 1
            return None
        if data[off + 9] != PROTO_TCP:
            counts["not_tcp"] += 1
            return None
        if _u16(data, off + 6)[0] & 0x3FFF:   # more fragments, or an offset: not a whole segment
            counts["ip_fragments"] += 1
            return None
        src, dst = bytes(data[off + 12:off + 16]), bytes(data[off + 16:off + 20])
        tcp_at, ip_end = off + ihl, off + total
    elif etype == ETH_IPV6:
        if n < off + 40:
            counts["truncated_headers"] += 1
            return None
        if data[off] >> 4 != 6:
            counts["malformed"] += 1
            return None
        nxt = data[off + 6]
        if nxt != PROTO_TCP:
            counts["ipv6_extension_headers" if nxt in (0, 43, 44, 60) else "not_tcp"] += 1
            return None
        src, dst = bytes(data[off + 8:off + 24]), bytes(data[off + 24:off + 40])
        tcp_at, ip_end = off + 40, off + 40 + _u16(data, off + 4)[0]
    else:
        counts["not_ip"] += 1
        return None
    if n < tcp_at + 20:
        counts["truncated_headers"] += 1
        return None
    sport, dport, seq, ack, doff, flags = _tcp(data, tcp_at)
    pay_at = tcp_at + (doff >> 4) * 4
    if pay_at < tcp_at + 20 or pay_at > ip_end:
        counts["malformed"] += 1
        return None
    if n < pay_at:
        counts["truncated_headers"] += 1
        return None
    if ip_end > n + cut:   # the IP length says more than was on the wire
        counts["malformed"] += 1
        return None
    have_end = min(ip_end, n)
    return Segment(ts_ns, _ip_text(src), sport, _ip_text(dst), dport, seq, ack, flags,
                   memoryview(data)[pay_at:have_end], ip_end - have_end)
