"""Reader of the wire's per-frame ground truth (the binary log wirefwd writes).

File: a 16-byte header (magic b"PSLATWIR", u32 version, u32 record size), then
fixed-size little-endian records, one per frame per output port; the layout is
the comment above log_record() in wirefwd.c, mirrored by RECORD_DTYPE.
The forwarder flushes whole records as it goes, so a live file is read up to
its last whole record; `start` lets a follower read only what is new.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path

import numpy as np
import pandas as pd

from core.errors import UserError

MAGIC = b"PSLATWIR"
VERSION = 1
HEADER_BYTES = 16

RECORD_DTYPE = np.dtype([
    ("t_in_mono_ns", "<u8"),
    ("t_out_mono_ns", "<u8"),      # 0: dropped (see drop_reason)
    ("delay_applied_ns", "<i8"),
    ("src_idx", "u1"),
    ("dst_idx", "u1"),
    ("ethertype", "<u2"),
    ("ip_src", "u1", (4,)),        # network order, as on the wire
    ("ip_dst", "u1", (4,)),
    ("sport", "<u2"),
    ("dport", "<u2"),
    ("seq", "<u4"),
    ("ack", "<u4"),
    ("tcp_flags", "u1"),
    ("ip_proto", "u1"),
    ("payload_bytes", "<u2"),
    ("frame_bytes", "<u2"),
    ("drop_reason", "u1"),
    ("reserved", "u1"),
])
assert RECORD_DTYPE.itemsize == 56

DROP_REASONS = {0: "", 1: "pool_full", 2: "send_error", 3: "shutdown"}
ETH_P_IP = 0x0800
IPPROTO_TCP = 6


def read_records(path: Path, start: int = 0) -> np.ndarray:
    """The whole records in the file from record `start` on, as a structured array."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            header = f.read(HEADER_BYTES)
            if len(header) < HEADER_BYTES:
                return np.zeros(0, RECORD_DTYPE)  # the forwarder has not written it yet
            if header[:8] != MAGIC:
                raise UserError(f"{path} is not a wire log (bad magic); give the wire.bin of a cluster")
            version = int.from_bytes(header[8:12], "little")
            rec_bytes = int.from_bytes(header[12:16], "little")
            if version != VERSION or rec_bytes != RECORD_DTYPE.itemsize:
                raise UserError(f"{path}: wire log version {version} with {rec_bytes}-byte records; "
                                f"this pslat reads version {VERSION}; rebuild with `make setup`")
            f.seek(HEADER_BYTES + start * rec_bytes)
            data = f.read()
    except FileNotFoundError:
        raise UserError(f"no wire log at {path}; is the cluster up?") from None
    whole = len(data) - len(data) % rec_bytes  # a record being written is not read yet
    return np.frombuffer(data[:whole], dtype=RECORD_DTYPE)


def _dotted(col: np.ndarray) -> np.ndarray:
    # per unique address, not per row: a log has few hosts and many frames
    as_u32 = col.astype(np.uint32) @ np.array([1 << 24, 1 << 16, 1 << 8, 1], dtype=np.uint32)
    uniq, inv = np.unique(as_u32, return_inverse=True)
    names = np.array([str(ipaddress.IPv4Address(int(u))) if u else "" for u in uniq], dtype=object)
    return names[inv] if len(uniq) else np.zeros(0, dtype=object)


def to_frame(recs: np.ndarray, host_names: list[str]) -> pd.DataFrame:
    """Records -> DataFrame with units in the names and host names for the ports."""
    names = np.array(list(host_names) + ["?"], dtype=object)
    def host(idx: np.ndarray) -> np.ndarray:
        return names[np.minimum(idx.astype(np.int64), len(host_names))]
    t_in = recs["t_in_mono_ns"].astype(np.int64)
    t_out = recs["t_out_mono_ns"].astype(np.int64)
    dropped = t_out == 0
    return pd.DataFrame({
        "t_in_mono_ns": t_in,
        "t_out_mono_ns": t_out,
        "delay_applied_ns": recs["delay_applied_ns"].astype(np.int64),
        # what the frame really spent in the wire, from kernel receive to send
        "delay_actual_ns": np.where(dropped, np.int64(-1), t_out - t_in),
        "src_host": host(recs["src_idx"]),
        "dst_host": host(recs["dst_idx"]),
        "src_idx": recs["src_idx"].astype(np.int64),
        "dst_idx": recs["dst_idx"].astype(np.int64),
        "ethertype": recs["ethertype"].astype(np.int64),
        "ip_src": _dotted(recs["ip_src"]),
        "ip_dst": _dotted(recs["ip_dst"]),
        "ip_proto": recs["ip_proto"].astype(np.int64),
        "sport": recs["sport"].astype(np.int64),
        "dport": recs["dport"].astype(np.int64),
        "seq": recs["seq"].astype(np.int64),
        "ack": recs["ack"].astype(np.int64),
        "tcp_flags": recs["tcp_flags"].astype(np.int64),
        "payload_bytes": recs["payload_bytes"].astype(np.int64),
        "frame_bytes": recs["frame_bytes"].astype(np.int64),
        "dropped": dropped,
        "drop_reason": pd.Series(recs["drop_reason"]).map(DROP_REASONS).fillna("unknown").to_numpy(),
    })


def read_wire_log(path: Path, host_names: list[str], start: int = 0) -> pd.DataFrame:
    return to_frame(read_records(path, start), host_names)
