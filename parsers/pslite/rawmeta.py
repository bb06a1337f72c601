"""BytePS's ps-lite meta frame: the raw C struct `RawMeta` that its fork sends where
dmlc's and MXNet's ps-lite send a PBMeta protobuf, and how a parser tells the two apart.

The layout is BytePS 0.2.5.post15's (its PyPI sdist, 3rdparty/ps-lite), x86-64 (LP64:
int 4 bytes, size_t and uint64_t 8, bool 1, natural alignment), little-endian:

  src/meta.h, struct RawMeta (88 bytes; its members are at these offsets):
      0 int head              4 int body_size
      8 RawControl control: 8 int cmd, 12 int node_size, 16 int barrier_group,
                            (20: 4 bytes padding), 24 uint64_t msg_sig
     32 bool request         (33: 3 bytes padding)
     36 int app_id           40 int timestamp     44 int data_type_size
     48 int customer_id      52 bool push         53 bool simple_app  (54: 2 padding)
     56 int data_size        (60: 4 bytes padding)
     64 uint64_t key         72 uint64_t addr     80 int val_len      84 int option
  src/van.cc, Van::PackMeta and Van::GetPackMetaLen: after the struct, `body_size`
  bytes of meta.body, then `data_type_size` ints (ps::DataType of each data frame),
  then `control.node_size` RawNode entries; the frame is exactly that long.
  src/meta.h, struct RawNode (168 bytes): 0 int role, 4 int id, 8 char hostname[64],
  72 int port, 76 bool is_recovery, 80 int customer_id, 84 char endpoint_name[64],
  152 size_t endpoint_name_len, 160 int aux_id.

What PackMeta guarantees, and so what a frame must hold to be read as a RawMeta:
- `bzero(raw, sizeof(RawMeta))` before the fields are set: the struct's 13 padding
  bytes are zero, and a data message's control (cmd EMPTY) is all zero (node_size,
  barrier_group and msg_sig are set only for a non-empty control);
- request, push and simple_app are C++ bools: 0 or 1;
- the frame's size is GetPackMetaLen's sum of the three counts above.
Not checked: RawNode's padding (its entries are not zeroed, only their two names are),
`key`, `val_len` and `option` (KVWorker::Send leaves ps::Meta's key and option
unset, message.h: stack bytes go on the wire) and `addr` (a pointer in the sender).

Telling it from a PBMeta (`decode_meta`): a frame is tried as a RawMeta first when it
is at least RAW_META_BYTES long and as a PBMeta otherwise or when that fails. A
PBMeta's first byte is a protobuf tag (0x08, `head`: MXNet always sets it) and a
RawMeta's is the low byte of its int `head` (BytePS's command word, or kEmpty's 0xff),
so the first byte alone does not decide; the size equation and the zero padding do.
A PBMeta that passes them would need 13 zero bytes at fixed offsets and a length
equal to a sum of counts read from its own bytes: we know of none (ps-lite's data
metas are 10-30 bytes, under the struct's size). The other way, a RawMeta does not
decode as a ps-lite PBMeta: its zero bytes are protobuf tag 0, which protobuf
refuses. Failure cases: a BytePS meta whose body holds bytes that happen to make it
a valid PBMeta too is read as a RawMeta (we try the struct first); a RawMeta from a
build with another layout (other versions of the fork add fields: the size equation
fails) is read as neither, and the stream's messages are not recognised. Once a
direction has delivered a message, its variant is fixed (parser.py): a PBMeta
stream is never read as RawMeta again, nor the other way.

BytePS's sender: RawMeta has no sender field. A server answers a worker's data
request through its ROUTER (src/zmq_van.h, ZMQVan::NonWorkerSendMsg): it sends the
worker's routing id (which the ROUTER consumes), then its own id "ps<N>" as a frame
of its own, then the meta and data; the worker's receive thread takes frame 0 as
that sender id (ZMQVan::CallZmqRecvThread, GetNodeID). On the wire, that direction's
messages start with a short frame "ps<digits>" with MORE set: ROUTING_ID_BYTES_MAX
bounds it ("ps" and the digits of an int).
"""
from __future__ import annotations

import re
import struct

import numpy as np

from .hunt import REGEX_MAX_BYTES
from .message import MAX_CONTROL_CMD, MAX_DATA_FRAMES, Kind, MetaInfo, NodeInfo, data_types_ok, ids_ok, read_meta
from .meta import PS_META_EMPTY

RAW_META_BYTES = 88
RAW_NODE_BYTES = 168
DATA_TYPE_INT_BYTES = 4      # one int per data frame
HOSTNAME_BYTES = 64

# the struct up to simple_app (offset 54): what a framework record's 64-byte copy of
# the frame holds, and all that is decoded (data_size, key, addr, val_len, option not)
_RAW_HEAD = struct.Struct("<iiiii4xQB3xiiiiBB")
RAW_HEAD_BYTES = _RAW_HEAD.size
assert RAW_HEAD_BYTES == 54
_RAW_NODE = struct.Struct("<ii64siB3xi64s4xQi4x")
assert _RAW_NODE.size == RAW_NODE_BYTES
# the padding and every byte the struct's bzero leaves zero on a data message's
# control: (start, end) ranges of the frame
_PADDING = ((20, 24), (33, 36), (54, 56), (60, 64))
_ZERO4 = bytes(4)

# "ps" + the decimal digits of an int node id (10 at most)
ROUTING_ID_BYTES_MIN = 3
ROUTING_ID_BYTES_MAX = 12

# variants of a direction's meta frame (parser.py fixes one per direction)
PBMETA = "pbmeta"
RAWMETA = "rawmeta"


def raw_head(body, size: int) -> tuple | None:
    """The struct's fields up to `push`/`simple_app` from the first bytes of a frame of
    `size` bytes (at least RAW_HEAD_BYTES of it in `body`), checked as the module
    docstring says (size equation, padding, bools, control); None if it fails."""
    if size < RAW_META_BYTES or len(body) < RAW_HEAD_BYTES:
        return None
    f = _RAW_HEAD.unpack_from(body, 0)
    (_head, body_size, cmd, node_size, barrier_group, msg_sig, request, app_id, timestamp,
     dt_size, customer_id, push, simple_app) = f
    if (body_size < 0 or not 0 <= dt_size <= MAX_DATA_FRAMES or node_size < 0
            or size != RAW_META_BYTES + body_size + DATA_TYPE_INT_BYTES * dt_size + RAW_NODE_BYTES * node_size):
        return None
    if request > 1 or push > 1 or simple_app > 1 or not 0 <= cmd <= MAX_CONTROL_CMD:
        return None
    mv = memoryview(body)
    for a, b in _PADDING:
        if b <= len(mv) and mv[a:b] != _ZERO4[:b - a]:
            return None
    if cmd == 0 and (node_size or barrier_group or msg_sig):
        return None
    if not ids_ok(_unset(app_id), _unset(customer_id), _unset(timestamp)):
        return None
    return f


def read_raw_meta(body) -> MetaInfo | None:
    """Decode a RawMeta frame (struct, body, data types, nodes); None unless it is one
    as PackMeta packs it (module docstring). Never raises."""
    n = len(body)
    f = raw_head(body, n)
    if f is None:
        return None
    (head, body_size, cmd, node_size, _barrier_group, _msg_sig, request, app_id, timestamp,
     dt_size, customer_id, push, simple_app) = f
    app_id, customer_id, timestamp = _unset(app_id), _unset(customer_id), _unset(timestamp)
    at = RAW_META_BYTES + body_size
    dts = struct.unpack_from("<%di" % dt_size, body, at) if dt_size else ()
    if not data_types_ok(dts):
        return None
    at += DATA_TYPE_INT_BYTES * dt_size
    nodes = tuple(_node(body, at + i * RAW_NODE_BYTES) for i in range(node_size))
    kind = Kind.CONTROL if cmd else Kind.DATA
    return MetaInfo(kind, cmd, bool(request), bool(push), None, bool(simple_app), head, app_id,
                    customer_id, timestamp, tuple(dts), nodes, raw=True)


def _unset(v: int) -> int | None:
    """A RawMeta always carries its ids; kEmpty there is what an absent PBMeta field is."""
    return None if v == PS_META_EMPTY else v


def _node(body, at: int) -> NodeInfo:
    role, node_id, host, port, _rec, _cust, _ep, _ep_len, _aux = _RAW_NODE.unpack_from(body, at)
    # PackMeta copies the hostname without its NUL when it fills all 64 bytes
    host = host.split(b"\0", 1)[0].decode("utf-8", "replace")
    return NodeInfo(None if node_id == PS_META_EMPTY else node_id, role, host,
                    None if port == PS_META_EMPTY else port)


def decode_meta(body, variant: str | None) -> MetaInfo | None:
    """A meta frame of a direction whose variant is `variant` (None: not known yet, try
    RawMeta then PBMeta, as the module docstring says)."""
    if variant == PBMETA:
        return read_meta(body)
    if variant == RAWMETA:
        return read_raw_meta(body)
    if len(body) >= RAW_META_BYTES:
        meta = read_raw_meta(body)
        if meta is not None:
            return meta
    return read_meta(body)


def routing_id(body) -> bytes | None:
    """The frame's bytes if it is a BytePS server's sender-id frame ("ps<digits>")."""
    if ROUTING_ID_BYTES_MIN <= len(body) <= ROUTING_ID_BYTES_MAX and body[:2] == b"ps":
        b = bytes(body)
        if b[2:].isdigit():
            return b
    return None


# Hunting (hunt.py's patterns are PBMeta's): where a BytePS message may start, as
# regular expressions of at most hunt.TAIL_BYTES + 1 bytes, so that the hunt's long
# scan (which keeps that tail) finds each. Every match is then judged whole.
# - a sender-id frame: MORE, a size of 3..12, "ps" and a digit;
# - a short frame (flags 0x00/0x01) of 88..255 bytes whose body_size's high byte is
#   zero (a body under 16 MiB) and whose control cmd's low byte is at most 31;
# - a long frame of 256..65535 bytes (a control message with nodes, or a body).
_RAW_PATTERNS = re.compile(
    rb"\x01(?=[\x03-\x0c]ps[0-9])"
    rb"|[\x00\x01](?=[\x58-\xff].{7}\x00[\x00-\x1f])"
    rb"|[\x02\x03](?=\x00{6}[\x01-\xff])", re.S)


def raw_candidates(buf, start: int = 0) -> list[int]:
    """Sorted positions from `start` on where a BytePS message may start: the regular
    expression through a few bytes, numpy through more (hunt.py's reasons; the
    expression alone cost 25 ms a MiB of zeros, where every byte starts a try)."""
    if len(buf) - start < REGEX_MAX_BYTES:
        return [m.start() for m in _RAW_PATTERNS.finditer(buf, start)]
    a = np.frombuffer(buf, dtype=np.uint8)[start:]
    n = len(a)
    found = []
    if n >= 5:
        r = np.flatnonzero(a[:n - 4] == 1)
        r = r[(a[r + 1] >= 3) & (a[r + 1] <= 12) & (a[r + 2] == 0x70) & (a[r + 3] == 0x73)]   # "ps"
        found.append(r[(a[r + 4] >= 0x30) & (a[r + 4] <= 0x39)])
    if n >= 11:
        q = np.flatnonzero(a[:n - 10] <= 1)
        q = q[a[q + 1] >= 0x58]
        found.append(q[(a[q + 9] == 0) & (a[q + 10] <= 0x1F)])
    if n >= 8:
        g = np.flatnonzero((a[:n - 7] | 1) == 3)
        for k in range(1, 7):
            g = g[a[g + k] == 0]
        found.append(g[a[g + 7] >= 1])
    if not found:
        return []
    return (np.sort(np.concatenate(found)) + start).tolist()
