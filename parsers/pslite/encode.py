"""Build ps-lite messages and their ZMTP bytes, the way ps-lite's ZMQ van sends them.

A ps-lite message is frame 0 = the serialized PBMeta, then one frame per entry of
PBMeta.data_type (KVWorker: keys uint64, vals, and lens int32 when values have
varying lengths). `MessageSpec.frames()` builds those frames (send them with pyzmq, as
the recorder in tests/data/pslite does); `encode_stream` frames them as ZMTP 3
bytes after a greeting and READY, for tests that want bytes without a socket.

BytePS's fork sends a RawMeta struct instead of the PBMeta (rawmeta.py):
`MessageSpec.raw_frames()` packs it as its Van::PackMeta does, with the server's
sender-id frame in front when the message goes out through its ROUTER.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .meta import PS_META_EMPTY, Cmd, DataType, PBMeta
from .rawmeta import RAW_META_BYTES
from .zmtp import FLAG_COMMAND, FLAG_LONG, FLAG_MORE, GREETING_BYTES


@dataclass
class MessageSpec:
    """What a ps-lite message says; `meta()` and `frames()` turn it into bytes."""
    request: bool = True
    push: bool = True
    pull: bool | None = None  # None: leave the field out (older ps-lite, MXNet)
    data_size: bool = True  # send data_size (field 11), as ps-lite's PackMeta does
    app_id: int = 0
    customer_id: int = 0
    timestamp: int | None = 0
    head: int = 0
    simple_app: bool = False
    control_cmd: Cmd | None = None
    control_nodes: Sequence[tuple] = ()  # (role, id, hostname, port)
    keys: Sequence[int] | None = None  # None: no data frames
    vals: bytes = b""
    val_type: DataType = DataType.FLOAT
    lens: Sequence[int] | None = None
    extra: dict = field(default_factory=dict)  # more PBMeta fields (body...)

    def meta(self) -> PBMeta:
        # the fields ps-lite's PackMeta always sets, then the optional ones
        m = PBMeta(head=self.head, push=self.push, request=self.request,
                   simple_app=self.simple_app, customer_id=self.customer_id, **self.extra)
        m.app_id = self.app_id
        if self.timestamp is not None:
            m.timestamp = self.timestamp
        if self.keys is not None:
            m.data_type.append(DataType.UINT64)
            m.data_type.append(self.val_type)
            if self.lens is not None:
                m.data_type.append(DataType.INT32)
        if self.control_cmd is not None:
            m.control.cmd = self.control_cmd
            for role, node_id, host, port in self.control_nodes:
                m.control.node.add(role=role, id=node_id, hostname=host, port=port)
        return m

    def data_frames(self) -> list[bytes]:
        data = []
        if self.keys is not None:
            data.append(np.asarray(self.keys, dtype="<u8").tobytes())
            data.append(bytes(self.vals))
            if self.lens is not None:
                data.append(np.asarray(self.lens, dtype="<i4").tobytes())
        return data

    def raw_frames(self, routing_id: bytes | None = None, body: bytes = b"", barrier_group: int = 0,
                   msg_sig: int = 0, key: int = 0, addr: int = 0, val_len: int = 0, option: int = 0) -> list[bytes]:
        """BytePS's frames: [sender id,] RawMeta, data. The struct's fields as PackMeta
        (src/van.cc) sets them; key, addr, val_len and option are whatever the sender's
        ps::Meta held (often stack bytes: rawmeta.py)."""
        data = self.data_frames()
        m = self.meta()
        dts = list(m.data_type)
        cmd = int(self.control_cmd) if self.control_cmd is not None else 0
        nodes = list(self.control_nodes) if cmd else []
        raw = bytearray(RAW_META_BYTES)   # bzero(raw, sizeof(RawMeta))
        ts = PS_META_EMPTY if self.timestamp is None else self.timestamp
        struct.pack_into("<ii", raw, 0, self.head, len(body))
        if cmd:
            struct.pack_into("<iii", raw, 8, cmd, len(nodes),
                             barrier_group if cmd == Cmd.BARRIER else 0)
            struct.pack_into("<Q", raw, 24, msg_sig if cmd == Cmd.ACK else 0)
        struct.pack_into("<B3xiiii", raw, 32, self.request, self.app_id, ts, len(dts), self.customer_id)
        struct.pack_into("<BB2xi4xQQii", raw, 52, self.push, self.simple_app, sum(map(len, data)),
                         key, addr, val_len, option)
        out = bytes(raw) + body + struct.pack("<%di" % len(dts), *dts)
        for role, node_id, host, port in nodes:
            h = host.encode()[:64]
            # RawNode: role, id, hostname[64], port, is_recovery, customer_id,
            # endpoint_name[64], endpoint_name_len, aux_id (padding: whatever was there)
            out += struct.pack("<ii64siB3xi64s4xQi4x", role, node_id, h, port, 0, 0, b"", 0, -1)
        return ([routing_id] if routing_id is not None else []) + [out] + data

    def frames(self) -> list[bytes]:
        data = self.data_frames()
        m = self.meta()
        if self.data_size:
            m.data_size = sum(map(len, data))
        if self.pull is not None:
            m.pull = self.pull
        return [m.SerializeToString()] + data


def frame_bytes(body: bytes, more: bool = False, command: bool = False) -> bytes:
    """One ZMTP frame: flags, 1- or 8-octet size (LONG above 255, as libzmq does), body."""
    flags = (FLAG_MORE if more else 0) | (FLAG_COMMAND if command else 0)
    n = len(body)
    if n > 255:
        return bytes([flags | FLAG_LONG]) + n.to_bytes(8, "big") + body
    return bytes([flags, n]) + body


def greeting_bytes(mechanism: bytes = b"NULL", as_server: bool = False, minor: int = 1) -> bytes:
    # libzmq fills the signature padding with ZMTP/1.0 compatibility data; any is valid
    g = b"\xff" + b"\x00" * 7 + b"\x01" + b"\x7f" + bytes([3, minor])
    g += mechanism.ljust(20, b"\x00") + bytes([1 if as_server else 0])
    g += b"\x00" * 31
    assert len(g) == GREETING_BYTES
    return g


def command_bytes(name: bytes, data: bytes = b"") -> bytes:
    return frame_bytes(bytes([len(name)]) + name + data, command=True)


def ready_bytes(socket_type: bytes = b"DEALER", identity: bytes | None = None) -> bytes:
    props = [(b"Socket-Type", socket_type)]
    if identity is not None:
        props.append((b"Identity", identity))
    data = b"".join(bytes([len(k)]) + k + len(v).to_bytes(4, "big") + v for k, v in props)
    return command_bytes(b"READY", data)


def message_bytes(frames: Sequence[bytes]) -> bytes:
    last = len(frames) - 1
    return b"".join(frame_bytes(f, more=i < last) for i, f in enumerate(frames))


def encode_stream(messages: Sequence[MessageSpec | Sequence[bytes]], identity: bytes | None = b"ps9",
                  socket_type: bytes = b"DEALER", handshake: bool = True):
    """Greeting + READY + the messages. Returns (bytes, [(first, last) offsets per message])."""
    parts = [greeting_bytes() + ready_bytes(socket_type, identity)] if handshake else []
    pos = len(parts[0]) if parts else 0
    spans = []
    for m in messages:
        b = message_bytes(m.frames() if isinstance(m, MessageSpec) else m)
        parts.append(b)
        spans.append((pos, pos + len(b) - 1))
        pos += len(b)
    return b"".join(parts), spans
