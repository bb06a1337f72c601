"""What the parser says about one ps-lite message, and how a PBMeta frame is read.

ps-lite (every variant we know: dmlc, MXNet's copy, BytePS) serialises the message
meta with `head`, `push`, `request` and `simple_app` always set, so a frame that
lacks `request` or `push` is not a ps-lite meta. That, and sane values in the fields
we use, is what lets the parser tell a real meta from bytes that merely decode as
protobuf (any short byte string does).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from parsers.protocol import PAIR_CONNECTION, PAIR_NODES

from .bytepskeys import server_rank, split_key
from .meta import DATA_TYPE_BYTES, PS_META_EMPTY, Cmd, DataType, PBMeta

# What a data frame may claim as its element type: ps::DataType values (0..11)
MAX_DATA_TYPE = max(DataType)
# ps-lite sends keys, vals and lens; we allow a few more frames for variants
MAX_DATA_FRAMES = 8
# Control commands: ps-lite has 0..5; variants (BytePS, P3, PHub) add a few more
MAX_CONTROL_CMD = 31
INT32_MAX = 2**31 - 1
KEY_TYPES = (DataType.UINT64, DataType.INT64)



class Kind(str, enum.Enum):
    CONTROL = "control"  # PBMeta.control set: ADD_NODE, BARRIER, HEARTBEAT, TERMINATE, ACK
    DATA = "data"  # application traffic (KVWorker/KVServer, or SimpleApp when simple_app)


class Op(str, enum.Enum):
    PUSH = "push"
    PULL = "pull"
    PUSHPULL = "pushpull"  # both flags set (variants that fuse the two)
    UNKNOWN = "unknown"  # a data response whose op the meta does not tell (see PsMessage)
    NONE = "none"  # control and SimpleApp messages: neither push nor pull


@dataclass(slots=True)
class NodeInfo:
    """One node of a control message (ADD_NODE lists them: the way to map host:port to ids)."""
    node_id: int | None
    role: int | None
    hostname: str
    port: int | None


@dataclass(slots=True)
class PsMessage:
    """One ps-lite message seen on one direction of one TCP connection.

    Offsets count bytes from the connection's first byte in this direction (the
    byte after the SYN), so TCP sequence = initial sequence + 1 + offset (mod 2**32).

    The fields are ps-lite's; the properties below them are what every protocol's
    message gives (parsers/protocol.py).

    `ps_op`: newer ps-lite sends both `push` and `pull`; then they are taken as they
    are. Older ps-lite, such as the copy inside MXNet, has no `pull` field: a data
    request that is not a push is then a pull; a response with `push` set answers a
    push; a response without it that carries data frames answers a pull; a response
    without either is marked UNKNOWN (an empty pull answer and a SimpleApp reply
    look alike there). Control and SimpleApp messages have op NONE.
    """
    first_byte_offset: int  # stream offset of the first byte of its first frame header
    last_byte_offset: int  # stream offset of its last byte (inclusive)
    kind: Kind
    cmd: int  # ps::Control::Command for control messages; 0 (EMPTY) for data
    request: bool
    ps_op: Op
    has_pull_field: bool  # False for older ps-lite (MXNet): op was inferred
    simple_app: bool
    head: int
    app_id: int | None
    customer_id: int | None
    timestamp: int | None  # ps-lite's request number (per customer), not a time; None if unset
    sender_node_id: int | None  # from the READY identity "ps<id>"; None if not seen
    num_keys: int
    key_sample: tuple[int, ...]  # up to N keys chosen by hash (parsers/keysample.py), sorted
    key_sample_complete: bool  # False when a gap hid part of the keys frame
    value_bytes: int  # size of the vals frame
    data_frames: int  # frames after the meta frame
    meta_bytes: int  # size of the PBMeta frame body
    data_types: tuple[int, ...]
    nodes: tuple[NodeInfo, ...]  # control messages (ADD_NODE...): the nodes they list
    # what every protocol's message gives (parsers/protocol.py), worked out once by
    # ps_message(): they are read several times per message on the agent's hot path
    control: bool
    op: str              # shared vocabulary: control, simple (SimpleApp data), or ps_op's value
    op_name: str         # the command's name for control messages (ps::Control::Command), else the op
    call_space: int | None   # app_id and customer_id (call_space_of)
    call_id: int | None      # the timestamp

    protocol = "pslite"
    pair_scope = PAIR_NODES

    @property
    def total_bytes(self) -> int:
        """Bytes on the wire: every frame header and body of the message."""
        return self.last_byte_offset - self.first_byte_offset + 1

    @property
    def end_offset(self) -> int:
        """The stream offset just after the message (exclusive end)."""
        return self.last_byte_offset + 1

    def detail(self) -> dict:
        """What call_space, call_id and op_name leave out (app_id and customer_id are
        call_space: legacy.ps_ids)."""
        if self.kind is Kind.CONTROL:
            return {"cmd": self.cmd}
        return {"simple_app": True} if self.simple_app else {}


@dataclass(slots=True)
class BytepsMessage(PsMessage):
    """A ps-lite message of BytePS's fork (its meta a RawMeta: rawmeta.py).

    Its pairing scope is its own: BytePS's server answers a worker's data request
    through its ROUTER, on the connection the request came in on (src/zmq_van.h,
    ZMQVan::NonWorkerSendMsg), so a data message pairs on its connection. Control and
    SimpleApp messages go out through the sender's DEALER into the peer's ROUTER, as
    in MXNet, and pair between node ids."""

    @property
    def pair_scope(self) -> str:
        return PAIR_NODES if self.control or self.simple_app else PAIR_CONNECTION

    def detail(self) -> dict:
        """PsMessage's, the variant, the smallest sampled key as on the wire and its
        declared key and partition where the wire key determines them (bytepskeys.py; BytePS sends one
        key per message)."""
        d = PsMessage.detail(self)
        d["variant"] = "byteps"
        if self.key_sample:
            d["wire_key"] = key = self.key_sample[0]
            split = split_key(key, server_rank(self.sender_node_id))
            if split is not None:
                d["declared_key"], d["key_partition"] = split
        return d


_CMD_NAMES = {c.value: c.name for c in Cmd}


def op_name_of(control: bool, cmd: int, op: str) -> str:
    """ps-lite's own name of a message: its command's for control messages
    (ps::Control::Command), simple_app for SimpleApp data, else the op."""
    if control:
        return _CMD_NAMES.get(cmd) or f"cmd_{cmd}"
    return "simple_app" if op == "simple" else op


# (kind, cmd, ps_op, app_id, customer_id) -> (control, op, op_name, call_space): a job
# has a handful of each, and ps_message runs once per message on the agent's hot path;
# cleared when full (a peer that varies its ids costs the work, not memory)
_DERIVED: dict[tuple, tuple] = {}
_DERIVED_MAX = 4096


def ps_message(first: int, last: int, meta: "MetaInfo", ps_op: Op, sender_node_id, num_keys: int,
               key_sample: tuple, key_sample_complete: bool, value_bytes: int, data_frames: int,
               meta_bytes: int) -> PsMessage:
    """A PsMessage of a parsed meta, with the protocol-neutral fields filled in."""
    key = (meta.kind, meta.cmd, ps_op, meta.app_id, meta.customer_id)
    derived = _DERIVED.get(key)
    if derived is None:
        control = meta.kind is Kind.CONTROL
        op = "control" if control else "simple" if ps_op is Op.NONE else ps_op.value
        derived = (control, op, op_name_of(control, meta.cmd, op), call_space_of(meta.app_id, meta.customer_id))
        if len(_DERIVED) >= _DERIVED_MAX:
            _DERIVED.clear()
        _DERIVED[key] = derived
    cls = BytepsMessage if meta.raw else PsMessage
    return cls(first, last, meta.kind, meta.cmd, meta.request, ps_op, meta.pull is not None,
                     meta.simple_app, meta.head, meta.app_id, meta.customer_id, meta.timestamp, sender_node_id,
                     num_keys, key_sample, key_sample_complete, value_bytes, data_frames, meta_bytes,
                     meta.data_types, meta.nodes, *derived, meta.timestamp)


# a half of call_space whose field the meta left out (ps-lite sets app_id on a control
# message without customer_id): no id ps-lite gives out (they count up from 0)
ABSENT_ID = -(1 << 31)


def call_space_of(app_id: int | None, customer_id: int | None) -> int | None:
    """app_id and customer_id (each an int32 of PBMeta) in one int64; None when both are
    absent, an absent half as ABSENT_ID."""
    if app_id is None and customer_id is None:
        return None
    a = ABSENT_ID if app_id is None else app_id
    c = ABSENT_ID if customer_id is None else customer_id
    v = (a & 0xFFFFFFFF) << 32 | (c & 0xFFFFFFFF)
    return v - (1 << 64) if v >= 1 << 63 else v



@dataclass(slots=True)
class MetaInfo:
    """The fields of a PBMeta that the parser uses, read once."""
    kind: Kind
    cmd: int
    request: bool
    push: bool
    pull: bool | None  # None: the field is absent (older ps-lite)
    simple_app: bool
    head: int
    app_id: int | None
    customer_id: int | None
    timestamp: int | None
    data_types: tuple[int, ...]
    nodes: tuple[NodeInfo, ...]
    raw: bool = False   # BytePS's RawMeta (rawmeta.py), not a PBMeta


# read_meta's results by frame bytes: one agent that traces several hosts (network
# namespaces) sees each message's meta twice, sent and received. MetaInfo is not
# changed by its users, so one object can serve both. Only small frames (data
# messages' metas are tens of bytes; a hunt judges candidates up to 64 KiB long).
META_CACHE_MAX = 4096
META_CACHE_BODY_MAX = 512
_meta_cache: dict[bytes, MetaInfo | None] = {}


def read_meta(body) -> MetaInfo | None:
    """Decode a PBMeta frame body; None unless it is a plausible ps-lite meta."""
    if len(body) > META_CACHE_BODY_MAX:
        return _read_meta(body)
    key = bytes(body)
    got = _meta_cache.get(key, _MISSING)
    if got is _MISSING:
        if len(_meta_cache) >= META_CACHE_MAX:
            _meta_cache.clear()
        got = _meta_cache[key] = _read_meta(key)
    return got


_MISSING = object()


def data_types_ok(dts: tuple) -> bool:
    """A meta's data types: at most MAX_DATA_FRAMES, each a ps::DataType."""
    return not dts or (len(dts) <= MAX_DATA_FRAMES and min(dts) >= 0 and max(dts) <= MAX_DATA_TYPE)


def ids_ok(app_id: int | None, customer_id: int | None, timestamp: int | None) -> bool:
    """ids are int32 >= 0 in ps-lite (kEmpty is INT_MAX); a negative one is not a meta's."""
    return ((app_id is None or app_id >= 0) and (customer_id is None or customer_id >= 0)
            and (timestamp is None or timestamp >= 0))


def _read_meta(body) -> MetaInfo | None:
    try:
        m = PBMeta.FromString(body)
    except (DecodeError, ValueError, TypeError):
        return None
    has = m.HasField
    if not (has("request") and has("push")):
        return None
    dts = tuple(m.data_type[:])   # a slice is a list: ~4 times faster than iterating the field
    if not data_types_ok(dts):
        return None
    app_id = m.app_id if has("app_id") else None
    customer_id = m.customer_id if has("customer_id") else None
    timestamp = m.timestamp if has("timestamp") else None
    if not ids_ok(app_id, customer_id, timestamp):
        return None
    nodes: tuple[NodeInfo, ...] = ()
    if has("control"):
        c = m.control
        if not (0 <= c.cmd <= MAX_CONTROL_CMD):
            return None
        kind, cmd = Kind.CONTROL, c.cmd
        if c.node:
            # a node not given its id yet says kEmpty (a worker's own ADD_NODE, before the
            # scheduler's answer numbers it): no id, as rawmeta.py reads it
            nodes = tuple(NodeInfo(n.id if n.HasField("id") and n.id != PS_META_EMPTY else None,
                                   n.role if n.HasField("role") else None,
                                   n.hostname, n.port if n.HasField("port") else None)
                          for n in c.node)
    else:
        kind, cmd = Kind.DATA, 0
    return MetaInfo(kind, cmd, m.request, m.push, m.pull if has("pull") else None, m.simple_app, m.head, app_id, customer_id, timestamp, dts, nodes)


def infer_op(meta: MetaInfo, data_frames: int) -> Op:
    """push/pull per the PsMessage docstring."""
    if meta.kind is Kind.CONTROL or meta.simple_app:
        return Op.NONE
    if meta.pull is not None:
        if meta.push and meta.pull:
            return Op.PUSHPULL
        if meta.push:
            return Op.PUSH
        if meta.pull:
            return Op.PULL
        return Op.UNKNOWN
    if meta.push:
        return Op.PUSH
    if meta.request or data_frames > 0:
        return Op.PULL
    return Op.UNKNOWN


def element_bytes(data_type: int) -> int:
    """Width of one element of a data frame; 1 for CHAR/OTHER (any size is whole)."""
    return DATA_TYPE_BYTES.get(data_type, 1)
