"""Build baidu_std messages, and Paddle's parameter-server payloads, for tests and fuzzing.

`RpcSpec` says what one message carries; `message_bytes` frames it as brpc does (the
12-byte header, the RpcMeta, the payload, the attachment); `encode_stream` joins
messages and says where each sits. The Paddle helpers lay out a table request as
BrpcPsClient does (paddle.py's docstring) and a PsResponseMessage.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .paddle import (CMD_IDS, PS_METHOD, PS_SERVICE, PULL_DENSE, PULL_SPARSE, PUSH_DENSE,
                     PUSH_SPARSE, PsRequestMessage, PsResponseMessage)
from .rpcmeta import MAGIC, RpcMeta

_U32_LE = struct.Struct("<I")


@dataclass
class RpcSpec:
    """One baidu_std message. A response sets request=False (and error_code...)."""
    request: bool = True
    correlation_id: int | None = 1
    service_name: str = PS_SERVICE
    method_name: str = PS_METHOD
    log_id: int | None = None
    trace_id: int | None = None
    span_id: int | None = None
    parent_span_id: int | None = None
    request_id: str | None = None
    timeout_ms: int | None = None
    error_code: int | None = 0  # responses: brpc always sets it
    error_text: str | None = None
    compress_type: int | None = None
    payload: bytes = b""
    attachment: bytes = b""
    # announced size (body_size counts it, so a test can feed the bytes itself); None:
    # len(attachment)
    attachment_size: int | None = None
    meta_extra: bytes = b""  # raw fields appended to the meta (unknown to the parser)

    def meta(self) -> RpcMeta:
        m = RpcMeta()
        if self.request:
            r = m.request
            r.service_name = self.service_name.encode()
            r.method_name = self.method_name.encode()
            for name in ("log_id", "trace_id", "span_id", "parent_span_id", "timeout_ms"):
                if getattr(self, name) is not None:
                    setattr(r, name, getattr(self, name))
            if self.request_id is not None:
                r.request_id = self.request_id.encode()
        else:
            m.response.SetInParent()
            if self.error_code is not None:
                m.response.error_code = self.error_code
            if self.error_text is not None:
                m.response.error_text = self.error_text.encode()
        if self.correlation_id is not None:
            m.correlation_id = self.correlation_id
        if self.compress_type is not None:
            m.compress_type = self.compress_type
        size = self.attachment_size if self.attachment_size is not None else len(self.attachment)
        if size:
            m.attachment_size = size
        return m


def message_bytes(spec: RpcSpec) -> bytes:
    """Header, meta, payload, attachment (what of it `spec.attachment` holds)."""
    meta = spec.meta().SerializeToString() + spec.meta_extra
    attachment = spec.attachment_size if spec.attachment_size is not None else len(spec.attachment)
    body_size = len(meta) + len(spec.payload) + attachment
    return (MAGIC + struct.pack(">II", body_size, len(meta)) + meta + spec.payload
            + spec.attachment)


def encode_stream(specs: Sequence[RpcSpec | bytes]):
    """The messages one after the other (raw bytes pass through as they are).
    Returns (bytes, [(first, last) offsets of each RpcSpec's message])."""
    parts, spans, pos = [], [], 0
    for s in specs:
        b = message_bytes(s) if isinstance(s, RpcSpec) else bytes(s)
        if isinstance(s, RpcSpec):
            spans.append((pos, pos + len(b) - 1))
        parts.append(b)
        pos += len(b)
    return b"".join(parts), spans


# ---------------------------------------------------------------- Paddle payloads
def ps_request(cmd_id: int, table_id: int = 0, params: Sequence[bytes] = (),
               client_id: int = 0, data: bytes | None = None) -> bytes:
    m = PsRequestMessage(cmd_id=cmd_id, table_id=table_id, client_id=client_id)
    m.params.extend(params)
    if data is not None:
        m.data = data
    return m.SerializeToString()


def ps_response(err_code: int = 0, err_msg: str = "", data: bytes | None = None) -> bytes:
    m = PsResponseMessage(err_code=err_code, err_msg=err_msg.encode())
    if data is not None:
        m.data = data
    return m.SerializeToString()


def _keys_bytes(keys) -> bytes:
    return np.asarray(keys, dtype="<u8").tobytes()


def pull_sparse(table_id: int, keys, correlation_id: int = 1, is_training: bool = True,
                client_id: int = 0, **meta) -> RpcSpec:
    """PullSparse: params[0] = n, attachment = is_training, n keys, n uint32 counts."""
    keys = sorted(set(int(k) for k in keys))
    attachment = (bytes([1 if is_training else 0]) + _keys_bytes(keys)
                  + np.ones(len(keys), dtype="<u4").tobytes())
    payload = ps_request(PULL_SPARSE, table_id, [_U32_LE.pack(len(keys))], client_id)
    return RpcSpec(correlation_id=correlation_id, payload=payload, attachment=attachment, **meta)


def push_sparse(table_id: int, keys, value_bytes: int = 32, correlation_id: int = 1,
                client_id: int = 0, cmd_id: int = PUSH_SPARSE, **meta) -> RpcSpec:
    """PushSparse: params[0] = n, data = n keys then n values of value_bytes each."""
    keys = [int(k) for k in keys]
    values = bytes(range(256)) * (len(keys) * value_bytes // 256 + 1)
    data = _keys_bytes(keys) + values[:len(keys) * value_bytes]
    payload = ps_request(cmd_id, table_id, [_U32_LE.pack(len(keys))], client_id, data)
    return RpcSpec(correlation_id=correlation_id, payload=payload, **meta)


def pull_dense(table_id: int, num_per_shard: int, correlation_id: int = 1, client_id: int = 0,
               **meta) -> RpcSpec:
    payload = ps_request(PULL_DENSE, table_id, [_U32_LE.pack(num_per_shard)], client_id)
    return RpcSpec(correlation_id=correlation_id, payload=payload, **meta)


def push_dense(table_id: int, num_per_shard: int, correlation_id: int = 1, client_id: int = 0,
               **meta) -> RpcSpec:
    """PushDenseRawGradient: data = uint32 num_per_shard, then that many floats."""
    data = _U32_LE.pack(num_per_shard) + np.zeros(num_per_shard, dtype="<f4").tobytes()
    payload = ps_request(PUSH_DENSE, table_id, (), client_id, data)
    return RpcSpec(correlation_id=correlation_id, payload=payload, **meta)


def control(cmd_name: str, table_id: int = 0, params: Sequence[bytes] = (),
            correlation_id: int = 1, **meta) -> RpcSpec:
    payload = ps_request(CMD_IDS[cmd_name], table_id, params)
    return RpcSpec(correlation_id=correlation_id, payload=payload, **meta)


def response(correlation_id: int, err_code: int = 0, err_msg: str = "", data: bytes | None = None,
             attachment: bytes = b"", **meta) -> RpcSpec:
    """Paddle's answer: a PsResponseMessage; pulled values go in the attachment."""
    return RpcSpec(request=False, correlation_id=correlation_id,
                   payload=ps_response(err_code, err_msg, data), attachment=attachment, **meta)
