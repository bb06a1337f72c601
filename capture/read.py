"""Capture files -> packet records: pcap (microsecond and nanosecond, either byte order)
and pcapng (sections, several interfaces, each with its link type and time resolution).

    with CaptureReader(path) as r:
        for ts_ns, link_type, data, wire_len in r: ...   # data: the captured bytes
        r.stats                                           # ReadStats: records, truncated tail, ...

Times are what the capturing host wrote: CLOCK_REALTIME ns (tcpdump's). The file is
mapped, not read into memory (a 1 GB capture costs page cache, not heap), and only a
regular file is opened; the pages already read are released as it goes
(RELEASE_EVERY_BYTES), so a capture of any size costs tens of MB. Everything in it is
outside data: a record's length is checked against the file and a bound before it is
used; a record cut off by the end of the file
(tcpdump killed mid-write) ends the reading and is counted; a file that is neither
format raises CaptureError, which says so.

Why a reader of our own (bench/capture.py measures it, docs/capture.md has the figures):
scapy's RawPcapReader and dpkt's pcap.Reader do the same framing a record at a time in
Python from file reads, at less than half this speed (1 GB: 1.8 s here, 4.2 and 4.5 s
there); their header decoding is slower still (capture/decode.py).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field

from agent.safefile import open_regular

# a record's captured bytes at most this (tcpdump's largest snap length is 262,144)
MAX_RECORD_BYTES = 1 << 18
# pcapng blocks other than packets (options, name resolution, statistics) at most this
MAX_BLOCK_BYTES = 16 << 20
MAX_INTERFACES = 4096          # per pcapng section
MAX_CAPTURE_BYTES = 1 << 40    # a larger "capture" is not one (mmap of a device-sized file)
# pages read are dropped from the mapping this often: the page cache keeps them, our RSS does not
RELEASE_EVERY_BYTES = 64 << 20

PCAP_MAGIC = {  # first four bytes -> (byte order, ns per tick)
    b"\xd4\xc3\xb2\xa1": ("<", 1000), b"\xa1\xb2\xc3\xd4": (">", 1000),
    b"\x4d\x3c\xb2\xa1": ("<", 1), b"\xa1\xb2\x3c\x4d": (">", 1),
}
PCAPNG_SHB = b"\x0a\x0d\x0d\x0a"
NG_BYTE_ORDER_MAGIC = 0x1A2B3C4D
NG_IDB, NG_OPB, NG_SPB, NG_EPB = 1, 2, 3, 6
NG_SHB_TYPE = 0x0A0D0D0A
IF_TSRESOL = 9


class CaptureError(Exception):
    """The file cannot be read as a capture; str() names it and says why."""


@dataclass
class ReadStats:
    format: str = ""               # "pcap" | "pcapng"
    records: int = 0               # packet records read
    truncated_tail: bool = False   # the file ends inside a record (its rest is lost)
    corrupt: str = ""              # why reading stopped early at a record that cannot be right
    records_without_time: int = 0  # pcapng simple packet blocks: no timestamp, not used
    records_unknown_interface: int = 0
    interfaces: list = field(default_factory=list)   # pcapng: (link type, ns per tick) per interface
    link_types: set = field(default_factory=set)


class CaptureReader:
    """See the module docstring. Iterate once."""

    def __init__(self, path):
        self.path = path
        self.stats = ReadStats()
        self._pos = 0   # where the format's reader is in the file (the pages before it are read)
        try:
            self._file = open_regular(path, MAX_CAPTURE_BYTES)
        except OSError as e:
            raise CaptureError(f"{path}: cannot open ({e.strerror or e})") from None
        try:
            size = self._file.seek(0, 2)
            self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except (OSError, ValueError) as e:
            self._file.close()
            raise CaptureError(f"{path}: cannot map ({e})") from None
        head = bytes(self._map[:4])
        if head in PCAP_MAGIC:
            self.stats.format = "pcap"
        elif head == PCAPNG_SHB:
            self.stats.format = "pcapng"
        else:
            self.close()
            raise CaptureError(f"{path}: not a pcap or pcapng capture (it starts with {head.hex() or 'nothing'}); "
                               "give files written by tcpdump -w, dumpcap or Wireshark")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        m = getattr(self, "_map", None)
        if isinstance(m, mmap.mmap):
            m.close()
        self._file.close()

    def __iter__(self):
        records = self._pcap() if self.stats.format == "pcap" else self._pcapng()
        release_at = RELEASE_EVERY_BYTES
        n = 0
        try:
            for rec in records:
                n += 1
                yield rec
                if self._pos >= release_at:
                    release_at = self._release(self._pos)
        finally:
            self.stats.records = n

    def _release(self, pos: int) -> int:
        """Drops the mapping's pages before `pos` (whole pages) from this process; returns where
        to do it next."""
        upto = pos - pos % mmap.PAGESIZE
        try:
            self._map.madvise(mmap.MADV_DONTNEED, 0, upto)
        except (OSError, ValueError):
            pass   # not on this platform: the kernel reclaims clean file pages anyway
        return pos + RELEASE_EVERY_BYTES

    def _pcap(self):
        m, st = self._map, self.stats
        end = len(m)
        if end < 24:
            st.truncated_tail = True
            return
        order, tick_ns = PCAP_MAGIC[bytes(m[:4])]
        link_type = struct.unpack_from(order + "I", m, 20)[0] & 0xFFFF   # the upper bits: FCS length
        st.link_types.add(link_type)
        rec = struct.Struct(order + "IIII").unpack_from
        frac_max = 1_000_000_000 // tick_ns
        pos = 24
        while pos + 16 <= end:
            sec, frac, caplen, wire_len = rec(m, pos)
            if caplen > MAX_RECORD_BYTES or frac >= frac_max:
                st.corrupt = (f"record at byte {pos:,}: captured length {caplen:,}"
                              if caplen > MAX_RECORD_BYTES else f"record at byte {pos:,}: time fraction {frac:,}")
                return
            data_end = pos + 16 + caplen
            if data_end > end:
                st.truncated_tail = True
                return
            self._pos = pos = data_end
            yield sec * 1_000_000_000 + frac * tick_ns, link_type, m[pos - caplen:pos], max(wire_len, caplen)
        st.truncated_tail = pos != end

    def _pcapng(self):
        m, st = self._map, self.stats
        end = len(m)
        pos = 0
        order = "<"
        ifaces: list[tuple[int, int, int]] = []   # (link type, ticks per second, snaplen)
        while pos + 12 <= end:
            if bytes(m[pos:pos + 4]) == PCAPNG_SHB:
                bom = bytes(m[pos + 8:pos + 12])
                order = "<" if struct.unpack("<I", bom)[0] == NG_BYTE_ORDER_MAGIC else ">"
                if struct.unpack(order + "I", bom)[0] != NG_BYTE_ORDER_MAGIC:
                    st.corrupt = f"section header at byte {pos:,}: no byte-order magic"
                    return
                ifaces = []   # interfaces are per section
            btype, blen = struct.unpack_from(order + "II", m, pos)
            if blen < 12 or blen % 4 or blen > MAX_RECORD_BYTES + MAX_BLOCK_BYTES:
                st.corrupt = f"block at byte {pos:,}: length {blen:,}"
                return
            if pos + blen > end:
                st.truncated_tail = True
                return
            body = pos + 8
            body_end = pos + blen - 4
            self._pos = pos = pos + blen
            if btype == NG_EPB or btype == NG_OPB:
                if btype == NG_EPB:
                    iface, hi, lo, caplen, wire_len = struct.unpack_from(order + "IIIII", m, body)
                else:
                    iface, _drops, hi, lo, caplen, wire_len = struct.unpack_from(order + "HHIIII", m, body)
                data = body + 20
                if data + caplen > body_end:
                    st.corrupt = f"packet block at byte {body - 8:,}: captured length {caplen:,} beyond the block"
                    return
                if iface >= len(ifaces):
                    st.records_unknown_interface += 1
                    continue
                link_type, per_s, _snap = ifaces[iface]
                ticks = (hi << 32) | lo
                ts_ns = ticks * (1_000_000_000 // per_s) if per_s <= 1_000_000_000 and \
                    1_000_000_000 % per_s == 0 else ticks * 1_000_000_000 // per_s
                yield ts_ns, link_type, m[data:data + caplen], max(wire_len, caplen)
            elif btype == NG_IDB:
                if len(ifaces) >= MAX_INTERFACES:
                    st.corrupt = f"more than {MAX_INTERFACES} interfaces in a section"
                    return
                link_type, _res, snap = struct.unpack_from(order + "HHI", m, body)
                ifaces.append((link_type, _tsresol(m, body + 8, body_end, order), snap))
                st.interfaces.append((link_type, ifaces[-1][1]))
                st.link_types.add(link_type)
            elif btype == NG_SPB:
                st.records_without_time += 1
        st.truncated_tail = pos != end


def _tsresol(m, pos: int, end: int, order: str) -> int:
    """An interface's ticks per second from its options (if_tsresol; default microseconds)."""
    while pos + 4 <= end:
        code, length = struct.unpack_from(order + "HH", m, pos)
        if code == 0:
            break
        if code == IF_TSRESOL and length >= 1 and pos + 5 <= end:
            v = m[pos + 4]
            exp = v & 0x7F
            if exp <= 18 if not v & 0x80 else exp <= 60:   # finer than 1 ns (or absurd): the default
                return 10 ** exp if not v & 0x80 else 1 << exp
            return 1_000_000
        pos += 4 + ((length + 3) & ~3)
    return 1_000_000
