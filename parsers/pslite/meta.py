"""ps-lite's PBMeta protobuf schema (src/meta.proto), built at import time.

The schema is declared here as data and turned into protobuf message classes
with the protobuf library, so there is no protoc step and no generated file to
keep in sync. Field numbers follow dmlc/ps-lite's meta.proto (as shipped inside
MXNet); variants (BytePS, newer ps-lite) add fields that we do not declare, and
protobuf keeps those as unknown fields, so their messages still parse.

Every field is declared `optional` even where ps-lite says `required`: the wire
format is identical, and a parser must not reject a message for a field it
does not need.
"""
from __future__ import annotations

import enum

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto
_OPT, _REP = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

# (name, number, type, label, message type name or None)
_SCHEMA = {
    "PBNode": [
        ("role", 1, _F.TYPE_INT32, _OPT, None),
        ("id", 2, _F.TYPE_INT32, _OPT, None),
        ("hostname", 3, _F.TYPE_STRING, _OPT, None),
        ("port", 4, _F.TYPE_INT32, _OPT, None),
        ("is_recovery", 5, _F.TYPE_BOOL, _OPT, None),
        ("customer_id", 10, _F.TYPE_INT32, _OPT, None),
    ],
    "PBControl": [
        ("cmd", 1, _F.TYPE_INT32, _OPT, None),
        ("node", 2, _F.TYPE_MESSAGE, _REP, ".ps.PBNode"),
        ("barrier_group", 3, _F.TYPE_INT32, _OPT, None),
        ("msg_sig", 4, _F.TYPE_UINT64, _OPT, None),
    ],
    "PBMeta": [
        ("head", 1, _F.TYPE_INT32, _OPT, None),
        ("body", 2, _F.TYPE_BYTES, _OPT, None),
        ("control", 3, _F.TYPE_MESSAGE, _OPT, ".ps.PBControl"),
        ("request", 4, _F.TYPE_BOOL, _OPT, None),
        ("push", 5, _F.TYPE_BOOL, _OPT, None),
        ("simple_app", 6, _F.TYPE_BOOL, _OPT, None),
        ("app_id", 7, _F.TYPE_INT32, _OPT, None),
        ("timestamp", 8, _F.TYPE_INT32, _OPT, None),
        ("data_type", 9, _F.TYPE_INT32, _REP, None),  # packed on the wire
        ("customer_id", 10, _F.TYPE_INT32, _OPT, None),
        ("data_size", 11, _F.TYPE_INT32, _OPT, None),  # total bytes of the data frames
        ("pull", 12, _F.TYPE_BOOL, _OPT, None),  # newer ps-lite only; absent in MXNet's
        ("priority", 13, _F.TYPE_INT32, _OPT, None),  # newer ps-lite / BytePS
    ],
}


def _build():
    fdp = descriptor_pb2.FileDescriptorProto(name="pslat/ps_meta.proto", package="ps", syntax="proto2")
    for msg_name, fields in _SCHEMA.items():
        m = fdp.message_type.add(name=msg_name)
        for name, number, ftype, label, type_name in fields:
            f = m.field.add(name=name, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
            if name == "data_type":
                f.options.packed = True
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {n: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"ps.{n}")) for n in _SCHEMA}


_CLASSES = _build()
PBNode = _CLASSES["PBNode"]
PBControl = _CLASSES["PBControl"]
PBMeta = _CLASSES["PBMeta"]


class Role(enum.IntEnum):
    """ps::Node::Role"""
    SERVER = 0
    WORKER = 1
    SCHEDULER = 2


class Cmd(enum.IntEnum):
    """ps::Control::Command"""
    EMPTY = 0
    TERMINATE = 1
    ADD_NODE = 2
    BARRIER = 3
    ACK = 4
    HEARTBEAT = 5


class DataType(enum.IntEnum):
    """ps::DataType, the element type of each data frame (PBMeta.data_type)."""
    CHAR = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    UINT8 = 5
    UINT16 = 6
    UINT32 = 7
    UINT64 = 8
    FLOAT = 9
    DOUBLE = 10
    OTHER = 11


DATA_TYPE_BYTES = {
    DataType.CHAR: 1, DataType.INT8: 1, DataType.INT16: 2, DataType.INT32: 4,
    DataType.INT64: 8, DataType.UINT8: 1, DataType.UINT16: 2, DataType.UINT32: 4,
    DataType.UINT64: 8, DataType.FLOAT: 4, DataType.DOUBLE: 8,
}

# ps::Meta::kEmpty and ps::Node::kEmpty (std::numeric_limits<int>::max()): a field the
# sender did not set (PBMeta leaves it out; BytePS's RawMeta carries the value)
PS_META_EMPTY = 2**31 - 1

# ps-lite node ids: the scheduler is 1; groups are bit masks; server rank r is
# 8 + 2r and worker rank r is 9 + 2r (ps::Postoffice::ServerRankToID / WorkerRankToID).
SCHEDULER_ID = 1
SERVER_GROUP = 2
WORKER_GROUP = 4


def server_id(rank: int) -> int:
    return 8 + 2 * rank


def worker_id(rank: int) -> int:
    return 9 + 2 * rank


def identity_of(node_id: int) -> bytes:
    """The ZMQ identity a ps-lite DEALER announces: "ps" + decimal node id."""
    return b"ps%d" % node_id


# A node id is an int in ps-lite (int32 in PBNode) and in the run dir's sender and
# recver columns: a larger one from a peer's identity is refused, not passed on.
NODE_ID_MAX = 2**31 - 1
_NODE_ID_DIGITS_MAX = len(str(NODE_ID_MAX))


def is_node_identity(identity: bytes) -> bool:
    """Named as ps-lite names its DEALERs ("ps" + decimal digits), whatever the value:
    with node_id_of_identity None, a node id out of range (rejected, to be counted)."""
    return identity.startswith(b"ps") and identity[2:].isdigit()


def node_id_of_identity(identity: bytes) -> int | None:
    """The node id in a ps-lite identity, None if it is not one or does not fit int32.
    The identity is whatever bytes the peer chose: its length is checked before int()
    (which refuses 4,300 digits and more, and costs quadratic time below that)."""
    digits = identity[2:]
    if (len(digits) > _NODE_ID_DIGITS_MAX or not identity.startswith(b"ps")
            or not digits.isdigit()):
        return None
    node = int(digits)
    return node if node <= NODE_ID_MAX else None
