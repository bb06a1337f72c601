"""The wire log reader, on files laid out byte by byte as wirefwd.c documents them."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from core.errors import UserError
from workloads.cluster.wirelog import HEADER_BYTES, RECORD_DTYPE, read_records, read_wire_log

# Written from the layout comment in wirefwd.c, independently of RECORD_DTYPE.
REC = struct.Struct("<QQqBBH4s4sHHIIBBHHBB")
HEADER = b"PSLATWIR" + struct.pack("<II", 1, 56)


def rec(t_in=1_000, t_out=3_000, delay=2_000, src=0, dst=1, ethertype=0x0800, ip_src=b"\x0a\x4d\x00\x01",
        ip_dst=b"\x0a\x4d\x00\x02", sport=40000, dport=7777, seq=0xFFFF_FFF0, ack=5, flags=0x18, proto=6,
        payload=1448, frame=1514, drop=0) -> bytes:
    return REC.pack(t_in, t_out, delay, src, dst, ethertype, ip_src, ip_dst, sport, dport, seq, ack,
                    flags, proto, payload, frame, drop, 0)


def test_the_mirror_has_the_documented_size():
    assert REC.size == RECORD_DTYPE.itemsize == 56


def test_fields_units_and_host_names(tmp_path):
    p = tmp_path / "wire.bin"
    p.write_bytes(HEADER + rec() + rec(t_in=5_000, t_out=0, src=1, dst=0, ip_src=b"\x0a\x4d\x00\x02",
                                       ip_dst=b"\x0a\x4d\x00\x01", drop=1, proto=17, payload=3))
    df = read_wire_log(p, ["h0", "h1"])
    a, b = df.iloc[0], df.iloc[1]
    assert (a.src_host, a.dst_host, a.ip_src, a.ip_dst) == ("h0", "h1", "10.77.0.1", "10.77.0.2")
    assert (a.t_in_mono_ns, a.t_out_mono_ns, a.delay_applied_ns, a.delay_actual_ns) == (1000, 3000, 2000, 2000)
    assert (a.sport, a.dport, a.seq, a.ack, a.tcp_flags) == (40000, 7777, 0xFFFF_FFF0, 5, 0x18)
    assert (a.payload_bytes, a.frame_bytes, a.ethertype, a.dropped, a.drop_reason) == (
        1448, 1514, 0x0800, False, "")
    assert (b.src_host, b.dst_host, b.dropped, b.drop_reason, b.delay_actual_ns, b.ip_proto) == (
        "h1", "h0", True, "pool_full", -1, 17)


def test_a_record_being_written_is_not_read_yet_and_start_skips(tmp_path):
    p = tmp_path / "wire.bin"
    p.write_bytes(HEADER + rec(seq=1) + rec(seq=2) + rec(seq=3)[:20])
    assert list(read_records(p)["seq"]) == [1, 2]
    assert list(read_records(p, start=1)["seq"]) == [2]
    assert len(read_records(p, start=5)) == 0


def test_non_ip_frames_have_empty_addresses(tmp_path):
    p = tmp_path / "wire.bin"
    p.write_bytes(HEADER + rec(ethertype=0x0806, ip_src=bytes(4), ip_dst=bytes(4), proto=0))
    df = read_wire_log(p, ["h0", "h1"])
    assert (df.ip_src[0], df.ip_dst[0], df.ethertype[0]) == ("", "", 0x0806)


def test_empty_and_headerless_files(tmp_path):
    p = tmp_path / "wire.bin"
    p.write_bytes(b"")
    assert len(read_wire_log(p, ["h0"])) == 0
    p.write_bytes(HEADER)
    df = read_wire_log(p, ["h0"])
    assert len(df) == 0 and "delay_actual_ns" in df.columns


@pytest.mark.parametrize("header, words", [
    (b"NOTAWIRE" + struct.pack("<II", 1, 56), "bad magic"),
    (b"PSLATWIR" + struct.pack("<II", 2, 56), "version 2"),
    (b"PSLATWIR" + struct.pack("<II", 1, 64), "64-byte records"),
])
def test_foreign_files_are_refused(tmp_path, header, words):
    p = tmp_path / "wire.bin"
    p.write_bytes(header + bytes(56))
    with pytest.raises(UserError, match=words):
        read_records(p)


def test_missing_file_says_what_to_do(tmp_path):
    with pytest.raises(UserError, match="is the cluster up"):
        read_records(tmp_path / "nope.bin")


def test_many_records_read_fast_enough_to_follow_live(tmp_path):
    p = tmp_path / "wire.bin"
    n = 200_000
    arr = np.zeros(n, RECORD_DTYPE)
    arr["seq"] = np.arange(n)
    arr["ip_src"] = [10, 77, 0, 1]
    p.write_bytes(HEADER + arr.tobytes())
    df = read_wire_log(p, ["h0", "h1"])
    assert len(df) == n and df.seq.iloc[-1] == n - 1 and (df.ip_src == "10.77.0.1").all()
    assert HEADER_BYTES == len(HEADER)
