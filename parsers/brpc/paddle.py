"""PaddlePaddle's parameter server on brpc: its messages, its commands and where the
keys of a table request sit.

Facts, as read (paddlepaddle==3.0.0 is what the tests install; the wheel's
paddle/version says commit 6ed5dd3833c32c3b21e14b1fb1a71f5a535a0fcc):
- paddle/fluid/distributed/ps/service/sendrecv.proto, from the serialized descriptor
  that the wheel's paddle/base/libpaddle.so embeds: package paddle.distributed;
  service PsService, method `service` (PsRequestMessage -> PsResponseMessage), beside
  FLService, SendAndRecvVariable, SendToWorker, SendToSwitch, SendS2S, RecvFromSwitch;
  PsRequestMessage cmd_id=1 (uint32, required), table_id=2 (uint32), params=3
  (repeated bytes), client_id=4 (int32), data=5 (bytes); PsResponseMessage
  err_code=1 (int32, required), err_msg=2 (string, required), data=3 (bytes); enum
  PsCmdID: the 52 values of CMDS below (0..48, 101, 200, 201).
- paddle/fluid/distributed/ps/service/brpc_ps_client.cc at commit 02be97fc (the
  stored version nearest 3.0.0 found: it has PS_REVERT and
  PS_CHECK_SAVE_PRE_PATCH_DONE, as 3.0.0's enum does):
  - BrpcPsClient::PullSparse (and PullSparseParam, GEO): cmd PS_PULL_SPARSE_TABLE,
    params[0] = the uint32 count n of distinct keys for that server; the request
    attachment is a 1-byte is_training flag, then the n keys (uint64, sorted, unique),
    then n uint32 repeat counts: 1 + 12 n bytes. log_id = the time in ms.
  - PushSparseAsyncShardPush, PushSparseRawGradient(Partial): cmd
    PS_PUSH_SPARSE_TABLE (PushSparseParam: PS_PUSH_SPARSE_PARAM), params[0] = uint32
    n, data = n uint64 keys then n values of the accessor's update_size; the request
    compress type is FLAGS_pserver_communicate_compress_type (0 by default: "none:0
    snappy:1 gzip:2 zlib:3 lz4:4"), which compresses the whole PsRequestMessage.
    brpc_ps_server.cc (commit 03b6c3bf) reads it the same way ("|---keysData---|
    ---valuesData---|", num from params(0)).
  - PullDense: cmd PS_PULL_DENSE_TABLE, params[0] = uint32 num_per_shard (values per
    server), no keys; the values come back in the response attachment.
  - PushDenseRawGradient: cmd PS_PUSH_DENSE_TABLE, data = uint32 num_per_shard then
    that many floats (compressed as above when the flag is set).
  - PushDenseParam: cmd PS_PUSH_DENSE_PARAM, the values in the attachment.
Integers inside params and data are the sender's memory (x86: little-endian).

Only the prefix of a payload is kept (the data of a push can be megabytes), so the
request is read by walking its fields in order (protobuf's C++ serializer writes them
by field number: cmd_id, table_id, params, client_id, then data), not by the protobuf
library; the classes below build payloads for tests.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from parsers.protowire import varint

from .rpcmeta import build_messages, text_of

PS_SERVICE = "paddle.distributed.PsService"
PS_METHOD = "service"

SENDRECV_PROTO = """
message PsRequestMessage {
    optional uint32 cmd_id = 1;
    optional uint32 table_id = 2;
    repeated bytes params = 3;
    optional int32 client_id = 4;
    optional bytes data = 5;
}
message PsResponseMessage {
    optional int32 err_code = 1;
    optional bytes err_msg = 2;
    optional bytes data = 3;
}
"""
_CLASSES = build_messages("pslat/paddle_sendrecv.proto", "paddle.distributed", SENDRECV_PROTO)
PsRequestMessage = _CLASSES["PsRequestMessage"]
PsResponseMessage = _CLASSES["PsResponseMessage"]

PULL, PUSH, CONTROL, RPC = "pull", "push", "control", "rpc"

# PsCmdID: number, Paddle's name, op in the shared vocabulary
_CMD_TABLE_TEXT = """
0 PS_PULL_DENSE_TABLE pull
1 PS_PUSH_DENSE_TABLE push
2 PS_PULL_SPARSE_TABLE pull
3 PS_PUSH_SPARSE_TABLE push
4 PS_SHRINK_TABLE control
5 PS_SAVE_ONE_TABLE control
6 PS_SAVE_ALL_TABLE control
7 PS_LOAD_ONE_TABLE control
8 PS_LOAD_ALL_TABLE control
9 PS_CLEAR_ONE_TABLE control
10 PS_CLEAR_ALL_TABLE control
11 PS_PUSH_DENSE_PARAM push
12 PS_STOP_SERVER control
13 PS_SAVE_ONE_CACHE_TABLE control
14 PS_GET_CACHE_THRESHOLD control
15 PS_CACHE_SHUFFLE control
16 PS_COPY_TABLE control
17 PS_COPY_TABLE_BY_FEASIGN control
18 PS_PULL_SPARSE_TABLE_WITH_DEPENDENCY pull
19 PS_PUSH_SPARSE_TABLE_WITH_DEPENDENCY push
20 PS_PRINT_TABLE_STAT control
21 PS_SAVE_ONE_TABLE_PREFIX control
22 PS_SAVE_ONE_TABLE_WITH_WHITELIST control
23 PS_LOAD_ONE_TABLE_WITH_WHITELIST control
24 PS_PULL_GEO_PARAM pull
25 PS_BARRIER control
26 PS_PUSH_SPARSE_PARAM push
27 PS_START_PROFILER control
28 PS_STOP_PROFILER control
29 PS_PUSH_GLOBAL_STEP push
30 PS_PULL_GRAPH_LIST pull
31 PS_GRAPH_SAMPLE_NEIGHBORS pull
32 PS_GRAPH_SAMPLE_NODES pull
33 PS_GRAPH_GET_NODE_FEAT pull
34 PS_GRAPH_CLEAR control
35 PS_GRAPH_ADD_GRAPH_NODE push
36 PS_GRAPH_REMOVE_GRAPH_NODE push
37 PS_GRAPH_SET_NODE_FEAT push
38 PS_GRAPH_SAMPLE_NODES_FROM_ONE_SERVER pull
39 PS_GRAPH_USE_NEIGHBORS_SAMPLE_CACHE control
40 PS_GRAPH_LOAD_GRAPH_SPLIT_CONFIG control
41 PEER_ROLE_IS_WORKER control
42 PEER_ROLE_IS_SWITCH control
43 PS_SAVE_WITH_SCOPE control
44 PS_SAVE_WITH_SHARD control
45 PS_QUERY_WITH_SCOPE rpc
46 PS_QUERY_WITH_SHARD rpc
47 PS_REVERT control
48 PS_CHECK_SAVE_PRE_PATCH_DONE control
101 PS_S2S_MSG rpc
200 PUSH_FL_CLIENT_INFO_SYNC rpc
201 PUSH_FL_STRATEGY rpc
"""
_CMD_TABLE = [(int(n), name, op) for n, name, op in
              (line.split() for line in _CMD_TABLE_TEXT.strip().splitlines())]
CMDS: dict[int, tuple[str, str]] = {n: (name, op) for n, name, op in _CMD_TABLE}
CMD_IDS: dict[str, int] = {name: n for n, name, _ in _CMD_TABLE}

PULL_DENSE, PUSH_DENSE = CMD_IDS["PS_PULL_DENSE_TABLE"], CMD_IDS["PS_PUSH_DENSE_TABLE"]
PULL_SPARSE, PUSH_SPARSE = CMD_IDS["PS_PULL_SPARSE_TABLE"], CMD_IDS["PS_PUSH_SPARSE_TABLE"]
PUSH_SPARSE_PARAM = CMD_IDS["PS_PUSH_SPARSE_PARAM"]
# commands whose request carries no keys at all (num_keys 0): the control ones, and
# table ops that name no rows
_NO_KEYS = {n for n, _, op in _CMD_TABLE if op == CONTROL} | {
    PULL_DENSE, PUSH_DENSE, CMD_IDS["PS_PUSH_DENSE_PARAM"], CMD_IDS["PS_PULL_GEO_PARAM"],
    CMD_IDS["PS_PUSH_GLOBAL_STEP"]}
KEY_BYTES = 8  # uint64 feature ids
PULL_SPARSE_FLAG_BYTES = 1  # is_training, before the keys
PULL_SPARSE_COUNT_BYTES = 4  # one uint32 repeat count per key, after the keys
_U32_LE = struct.Struct("<I")


def cmd_of(cmd_id: int | None) -> tuple[str | None, str]:
    """(Paddle's name, op) of a PsCmdID; (None, "rpc") for a number 3.0.0 does not have."""
    name, op = CMDS.get(cmd_id, (None, RPC)) if cmd_id is not None else (None, RPC)
    return name, op


# ---------------------------------------------------------------- walking fields
def _int32(v: int) -> int:
    """A varint as protobuf's int32 reads it (negative ones are sent as 10 bytes)."""
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


@dataclass(slots=True)
class RequestHead:
    """What the prefix of a PsRequestMessage showed."""
    cmd_id: int | None = None
    table_id: int | None = None
    params: tuple[bytes, ...] = ()  # each cut to its first 8 bytes
    client_id: int | None = None
    data_at: int | None = None  # offset of the data field's bytes in the payload
    data_bytes: int = 0
    reason: str | None = None  # why the walk stopped before the data field, if it did


def _walk_fields(buf, end: int):
    """(number, wire type, value) of each field of buf[:end], in order: value is the
    varint for wire type 0, (offset, size) of the bytes for wire type 2 (which may run
    past `end`), None for the fixed-width ones. Where it cannot go on, it yields
    (None, None, why) and stops."""
    i = 0
    while i < end:
        got = varint(buf, i, end)
        if got is not None:
            tag, i = got
            number, wire = tag >> 3, tag & 7
            if wire in (1, 5):
                i += 8 if wire == 1 else 4
                if i <= end:
                    yield number, wire, None
                    continue
            elif wire in (0, 2):
                got = varint(buf, i, end)
                if got is not None:
                    value, i = got
                    yield number, wire, value if wire == 0 else (i, value)
                    i += value if wire == 2 else 0
                    continue
            else:
                yield None, None, "payload is not a PsRequestMessage"
                return
        yield None, None, "payload prefix cut inside a field"
        return


def read_request_head(prefix, payload_bytes: int) -> RequestHead:
    """Walk the fields of a PsRequestMessage in `prefix` (the first bytes of a payload
    of `payload_bytes`) up to the start of its data field."""
    head = RequestHead()
    params = []
    end = len(prefix)
    reason = None
    for number, wire, value in _walk_fields(prefix, end):
        if number is None:
            reason = value
            break
        if wire == 0:
            if number == 1:
                head.cmd_id = value & 0xFFFFFFFF
            elif number == 2:
                head.table_id = value & 0xFFFFFFFF
            elif number == 4:
                head.client_id = _int32(value)
        elif wire == 2:
            at, size = value
            if at + size > payload_bytes:
                reason = "payload is not a PsRequestMessage"
                break
            if number == 5:
                head.data_at, head.data_bytes = at, size
                break   # the last field C++ writes; its bytes may run past the prefix
            if at + size > end:
                reason = "payload prefix cut inside a field"
                break
            if number == 3:
                params.append(bytes(prefix[at:at + min(size, 8)]))
    else:
        if end < payload_bytes:
            reason = "payload prefix ended before the data field"
    head.params = tuple(params)
    if head.cmd_id is None and reason is None:
        reason = "payload has no cmd_id"
    head.reason = reason
    return head


def read_response_head(prefix) -> tuple[int, str] | None:
    """(err_code, err_msg) when the payload starts as a PsResponseMessage does (its two
    required fields first); None otherwise."""
    fields = _walk_fields(prefix, len(prefix))
    code, msg = next(fields, None), next(fields, None)
    if code is None or code[:2] != (1, 0) or msg is None or msg[:2] != (2, 2):
        return None
    at, size = msg[2]
    return _int32(code[2]), text_of(bytes(prefix[at:min(len(prefix), at + size)]))


# ---------------------------------------------------------------- keys of a request
@dataclass(slots=True)
class KeysLayout:
    """Where one request's keys are, or why they cannot be read."""
    num_keys: int | None = None
    region: str | None = None  # "payload" or "attachment": where the n keys sit
    region_at: int = 0  # offset of the first key in that region
    dense_values: int | None = None  # values per server shard (dense table ops)
    reason: str | None = None


def _u32_param(head: RequestHead) -> int | None:
    if head.params and len(head.params[0]) >= 4:
        return _U32_LE.unpack_from(head.params[0])[0]
    return None


def keys_layout(head: RequestHead, prefix, attachment_bytes: int) -> KeysLayout:
    """Where the keys of a table request sit (see the module docstring)."""
    cmd = head.cmd_id
    if cmd is None:
        return KeysLayout(reason=head.reason)
    name = CMDS.get(cmd, ("PsCmdID %d" % cmd,))[0]
    if cmd == PULL_SPARSE:
        n = _u32_param(head)
        if n is None:
            return KeysLayout(reason="PS_PULL_SPARSE_TABLE without its key count in params[0]")
        want = PULL_SPARSE_FLAG_BYTES + n * (KEY_BYTES + PULL_SPARSE_COUNT_BYTES)
        if attachment_bytes != want:
            return KeysLayout(reason="attachment of %d bytes, not 1 + 12 x %d keys"
                              % (attachment_bytes, n))
        return KeysLayout(n, "attachment", PULL_SPARSE_FLAG_BYTES)
    if cmd in (PUSH_SPARSE, PUSH_SPARSE_PARAM):
        n = _u32_param(head)
        if n is None:
            return KeysLayout(reason="%s without its key count in params[0]" % name)
        if head.data_at is None:
            return KeysLayout(reason=head.reason or "%s without a data field" % name)
        if head.data_bytes < n * KEY_BYTES:
            return KeysLayout(reason="data of %d bytes, shorter than %d keys"
                              % (head.data_bytes, n))
        return KeysLayout(n, "payload", head.data_at)
    if cmd == PULL_DENSE:
        return KeysLayout(0, dense_values=_u32_param(head))
    if cmd == PUSH_DENSE:
        at = head.data_at
        dense = (_U32_LE.unpack_from(prefix, at)[0]
                 if at is not None and at + 4 <= len(prefix) else None)
        return KeysLayout(0, dense_values=dense)
    if cmd in _NO_KEYS:
        return KeysLayout(0)
    return KeysLayout(reason="key layout of %s not read" % name)
