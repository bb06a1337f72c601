"""Packets -> a pcapng file with interfaces named per host and a comment per packet
(draft-ietf-opsawg-pcapng: section header, interface description and enhanced packet
blocks), the output format of `pslat agent --pcap` (issue 17 item 2).

    with PcapngWriter(path) as w:
        i = w.interface(LINK_LINUX_SLL2, "h2", "network namespace h2", snaplen=262144)
        w.packet(i, ts_ns, data, wire_len, comment="pslat: ...", outbound=True)

Written by hand rather than with scapy's RawPcapNgWriter (checked, scapy 2.8): scapy
takes the time as float seconds at microsecond resolution, where the agent's times are
nanoseconds (here if_tsresol is 9: ns ticks, exact), writes no interface description,
and wants a Packet object per packet for comments and interface names. dpkt's pcapng
writer is not installed (and writes no per-packet comments through its Writer).

Comments come from traced data (process names, protocol fields): they are bounded
(COMMENT_BYTES_MAX, cut on a character) and written as UTF-8 text; nothing here reads them.
"""
from __future__ import annotations

import struct

SHB, IDB, EPB = 0x0A0D0D0A, 1, 6
BYTE_ORDER_MAGIC = 0x1A2B3C4D
OPT_END, OPT_COMMENT = 0, 1
IF_NAME, IF_DESCRIPTION, IF_TSRESOL = 2, 3, 9
EPB_FLAGS = 2
EPB_INBOUND, EPB_OUTBOUND = 1, 2          # epb_flags' direction bits
COMMENT_BYTES_MAX = 4096                  # an option may hold 65,535; a comment that long reads as nothing
NAME_BYTES_MAX = 256
INTERFACES_MAX = 4096                     # the pcapng reader's bound too (capture/read.py)


def _text(s: str, limit: int) -> bytes:
    b = s.encode("utf-8", "replace")
    if len(b) > limit:
        b = b[:limit].decode("utf-8", "ignore").encode()   # never a character cut in two
    return b


def _option(code: int, value: bytes) -> bytes:
    return struct.pack("<HH", code, len(value)) + value + b"\0" * (-len(value) % 4)


def _block(btype: int, body: bytes) -> bytes:
    body += b"\0" * (-len(body) % 4)
    n = len(body) + 12
    return struct.pack("<II", btype, n) + body + struct.pack("<I", n)


class PcapngWriter:
    """One section, little-endian; interfaces declared before their packets."""

    def __init__(self, path):
        self._f = open(path, "wb")
        self._interfaces = 0
        self._f.write(_block(SHB, struct.pack("<IHHq", BYTE_ORDER_MAGIC, 1, 0, -1)   # section length unknown
                             + _option(OPT_COMMENT, b"written by pslat agent --pcap") + _option(OPT_END, b"")))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        self._f.close()

    def interface(self, link_type: int, name: str, description: str = "", snaplen: int = 262144) -> int:
        """Declares an interface; returns its id for packet()."""
        if self._interfaces >= INTERFACES_MAX:
            raise ValueError(f"more than {INTERFACES_MAX} interfaces in one capture")
        opts = _option(IF_NAME, _text(name, NAME_BYTES_MAX))
        if description:
            opts += _option(IF_DESCRIPTION, _text(description, NAME_BYTES_MAX))
        opts += _option(IF_TSRESOL, b"\x09") + _option(OPT_END, b"")
        self._f.write(_block(IDB, struct.pack("<HHI", link_type, 0, snaplen) + opts))
        self._interfaces += 1
        return self._interfaces - 1

    def packet(self, interface: int, ts_ns: int, data: bytes, wire_len: int, comment: str = "",
               outbound: bool | None = None) -> None:
        """One packet (ts_ns: ns since the epoch, the interface's ticks)."""
        if not 0 <= interface < self._interfaces:
            raise ValueError(f"interface {interface} was not declared")
        opts = b""
        if comment:
            opts += _option(OPT_COMMENT, _text(comment, COMMENT_BYTES_MAX))
        if outbound is not None:
            opts += _option(EPB_FLAGS, struct.pack("<I", EPB_OUTBOUND if outbound else EPB_INBOUND))
        if opts:
            opts += _option(OPT_END, b"")
        data = bytes(data)
        head = struct.pack("<IIIII", interface, ts_ns >> 32, ts_ns & 0xFFFFFFFF, len(data), max(wire_len, len(data)))
        self._f.write(_block(EPB, head + data + b"\0" * (-len(data) % 4) + opts))
