"""brpc's RpcMeta (src/brpc/policy/baidu_rpc_meta.proto), built at import time, and
how one meta is read and judged.

Facts, as read:
- The field numbers are those of the serialized descriptor of
  "brpc/policy/baidu_rpc_meta.proto" that paddlepaddle==3.0.0's paddle/base/libpaddle.so
  embeds (the brpc Paddle links): RpcMeta request=1, response=2, compress_type=3 (int32),
  correlation_id=4 (int64), attachment_size=5 (int32), chunk_info=6,
  authentication_data=7, stream_settings=8; RpcRequestMeta service_name=1,
  method_name=2 (both `required`), log_id=3, trace_id=4, span_id=5, parent_span_id=6
  (int64), request_id=7 (string), timeout_ms=8 (int32); RpcResponseMeta error_code=1
  (int32), error_text=2. brpc/options.proto in the same library: CompressType NONE=0,
  SNAPPY=1, GZIP=2, ZLIB=3, LZ4=4.
- apache/brpc src/brpc/policy/baidu_rpc_protocol.cpp (commit 013a28e9):
  ParseRpcMessage reads the 12-byte header "PRPC", body_size, meta_size (network byte
  order), refuses body_size > FLAGS_max_body_size and meta_size > body_size;
  SendRpcResponse always sets response.error_code, correlation_id and compress_type,
  and attachment_size only when there is an attachment; the response message is
  serialized compressed (SerializeAsCompressedData), the attachment is not.

Fields 6-8 are not declared: protobuf keeps them as unknown fields. Every field is
optional here (the wire format is the same) and the strings are declared `bytes`, so
that a meta with bad UTF-8 still parses; they are decoded with replacement.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

# shorthands for schemas declared as data (paddle.py uses them too)
FIELD = descriptor_pb2.FieldDescriptorProto
OPTIONAL, REPEATED = FIELD.LABEL_OPTIONAL, FIELD.LABEL_REPEATED

MAGIC = b"PRPC"
HEADER_BYTES = 12  # magic, body_size (u32 BE, without the header), meta_size (u32 BE)
# CompressType values of brpc/options.proto (see the module docstring)
COMPRESS_NAMES = {0: "none", 1: "snappy", 2: "gzip", 3: "zlib", 4: "lz4"}
# service, method and error text are cut to this many characters in a message
TEXT_MAX_CHARS = 256

# The schema, as the .proto says it (strings as bytes, every field optional)
RPC_META_PROTO = """
message RpcRequestMeta {
    optional bytes service_name = 1;
    optional bytes method_name = 2;
    optional int64 log_id = 3;
    optional int64 trace_id = 4;
    optional int64 span_id = 5;
    optional int64 parent_span_id = 6;
    optional bytes request_id = 7;
    optional int32 timeout_ms = 8;
}
message RpcResponseMeta {
    optional int32 error_code = 1;
    optional bytes error_text = 2;
}
message RpcMeta {
    optional RpcRequestMeta request = 1;
    optional RpcResponseMeta response = 2;
    optional int32 compress_type = 3;
    optional int64 correlation_id = 4;
    optional int32 attachment_size = 5;
}
"""

_FIELD = descriptor_pb2.FieldDescriptorProto
_LABELS = {"optional": _FIELD.LABEL_OPTIONAL, "repeated": _FIELD.LABEL_REPEATED}
_SCALARS = {"bytes": _FIELD.TYPE_BYTES, "int32": _FIELD.TYPE_INT32, "int64": _FIELD.TYPE_INT64,
            "uint32": _FIELD.TYPE_UINT32, "bool": _FIELD.TYPE_BOOL}
_MESSAGE_LINE = re.compile(r"\s*message\s+(\w+)\s*\{\s*$")
_FIELD_LINE = re.compile(r"\s*(optional|repeated)\s+(\w+)\s+(\w+)\s*=\s*(\d+)\s*;\s*$")


def build_messages(file_name: str, package: str, proto: str) -> dict:
    """Protobuf message classes from a schema written as a small subset of .proto
    (messages of optional and repeated fields of the scalar types above or of messages
    of the same text), built with the protobuf library: no protoc, no generated file.
    Returns {message name: class}; each schema gets a descriptor pool of its own."""
    fdp = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto2")
    msg = None
    for line in proto.splitlines():
        if not line.strip() or line.strip() == "}":
            continue
        if m := _MESSAGE_LINE.match(line):
            msg = fdp.message_type.add(name=m[1])
        elif (f := _FIELD_LINE.match(line)) and msg is not None:
            label, ftype, name, number = f.groups()
            field = msg.field.add(name=name, number=int(number), label=_LABELS[label])
            if ftype in _SCALARS:
                field.type = _SCALARS[ftype]
            else:
                field.type, field.type_name = _FIELD.TYPE_MESSAGE, f".{package}.{ftype}"
        else:
            raise ValueError(f"not in the .proto subset build_messages reads: {line!r}")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{m.name}"))
            for m in fdp.message_type}


_CLASSES = build_messages("pslat/brpc_rpc_meta.proto", "brpc.policy", RPC_META_PROTO)
RpcMeta = _CLASSES["RpcMeta"]
RpcRequestMeta = _CLASSES["RpcRequestMeta"]
RpcResponseMeta = _CLASSES["RpcResponseMeta"]


def text_of(raw: bytes) -> str:
    """A string field as a message shows it: UTF-8 with replacement, bounded."""
    return raw[:TEXT_MAX_CHARS * 4].decode("utf-8", "replace")[:TEXT_MAX_CHARS]


@dataclass(slots=True, frozen=True)
class MetaInfo:
    """The fields of one RpcMeta that a message reports, read once."""
    request: bool  # RpcMeta.request set (else RpcMeta.response is)
    correlation_id: int | None
    service_name: str | None
    method_name: str | None
    log_id: int | None
    error_code: int | None
    error_text: str | None
    compress_type: int  # 0 when absent
    attachment_bytes: int  # 0 when absent
    # what a hunt asks more of than a synced stream (see plausible_for_hunt)
    whole_request_names: bool  # a request with service and method names both non-empty
    has_correlation_id: bool


def read_meta(body) -> MetaInfo | None:
    """Decode an RpcMeta; None unless it parses and holds a request or a response
    (not both) with a non-negative attachment size."""
    try:
        m = RpcMeta.FromString(bytes(body))
    except (DecodeError, ValueError, TypeError, RuntimeError):
        return None
    has = m.HasField
    is_request, is_response = has("request"), has("response")
    if is_request == is_response:
        return None
    attachment = m.attachment_size
    if attachment < 0:
        return None
    if is_request:
        r = m.request
        service = text_of(r.service_name) if r.HasField("service_name") else None
        method = text_of(r.method_name) if r.HasField("method_name") else None
        log_id = r.log_id if r.HasField("log_id") else None
        error_code = error_text = None
        names = bool(r.service_name) and bool(r.method_name)
    else:
        r = m.response
        service = method = log_id = None
        error_code = r.error_code if r.HasField("error_code") else None
        error_text = text_of(r.error_text) if r.HasField("error_text") else None
        names = False
    return MetaInfo(is_request, m.correlation_id if has("correlation_id") else None,
                    service, method, log_id, error_code, error_text, m.compress_type,
                    attachment, names, has("correlation_id"))


def plausible_for_hunt(meta: MetaInfo) -> bool:
    """What a candidate found by hunting must also show, since any short byte string
    decodes as some protobuf: a correlation id (brpc sets one on every request and
    response), a request's two required names, a compress type brpc knows."""
    if not meta.has_correlation_id or meta.compress_type not in COMPRESS_NAMES:
        return False
    return meta.whole_request_names or not meta.request
