"""A ps-lite framework record (probes.framework: a zmq message's frames at
zmq_msg_send/recv, or ps::Meta at ZMQVan::SendMsg/RecvMsg) and the wire message it
became: the ids they share, and the facts that must agree between them.

The agent's correlator (agent/correlate.py) groups records and wire messages by
(process, direction, call_space, call_id, request) and asks `RecordFacts.fits` of
every candidate pair; what is generic there (the peer's node id, a record's first
keys, binding a socket to the connection it sent on) uses the fields below.

What must agree, for ps-lite:
- the control command of a control message, the push flag of a data message;
- at the zmq layer, the bytes: the record's frame sizes give the message's ZMTP
  bytes exactly (a ROUTER's routing-id frame is not part of the message);
- the keys frame's first keys (the record copies the start of each frame) and the
  wire's key sample (parsers/keysample.py: bottom-k by hash): a first key that
  hashes below the sample's largest hash must be in the sample.
The peer: a ROUTER's routing id "ps<id>" names the sending node (zmq layer); at the
ps layer the meta names sender and receiver. BytePS (rawmeta.py): the meta frame is a
RawMeta, and a server's answers carry its id "ps<id>" as a frame of their own before
it (on the wire, unlike a routing id): on a worker's DEALER that frame names the sender.

Decoding the record's bytes is here too: the probe copies the first CAPTURE_BYTES of
each frame (or of ps::Meta) and knows nothing of ps-lite; the ids of the meta (a
PBMeta frame, or ps::Meta's leading ints) and which frame is a routing id are
ps-lite's and ZMQ's facts.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field, fields

import numpy as np

from parsers.keysample import key_hash
from parsers.protowire import varint

from .message import call_space_of
from .meta import PS_META_EMPTY, PBMeta, is_node_identity, node_id_of_identity
from .rawmeta import raw_head, routing_id

ZMQ_DEALER, ZMQ_ROUTER = 5, 6   # public libzmq socket type numbers
ROUTING_ID_MAX_BYTES = 255      # libzmq refuses longer routing ids
# ps::Meta as in the ps-lite MXNet 1.9 ships: int head, app_id, customer_id,
# timestamp, sender, recver; bool request, push, simple_app (then the body
# string, whose layout depends on the C++ ABI: not read). Verified on a real
# kvstore by tests/privileged/test_framework_probe_mxnet.py.
PS_META_FORMAT = "<6i3?"
_PS_META_BYTES = struct.calcsize(PS_META_FORMAT)


# ---- a record's bytes -> its ids ---------------------------------------------------------

@dataclass(frozen=True)
class MetaIds:
    """The ids of a ps-lite message. None: not present (or cut off by the capture)."""
    app_id: int | None
    customer_id: int | None
    timestamp: int | None
    request: bool | None
    push: bool | None
    head: int | None = None
    control_cmd: int | None = None   # ps::Control::Command when a control message
    simple_app: bool | None = None
    sender: int | None = None
    recver: int | None = None
    truncated: bool = False          # the meta frame was longer than the capture

    def with_sender(self, sender: int) -> "MetaIds":
        """These ids with the sender set (dataclasses.replace without its per-call field
        introspection: once per received framework record)."""
        obj = object.__new__(MetaIds)
        obj.__dict__.update(self.__dict__)
        obj.__dict__["sender"] = sender
        return obj


def _whole_fields_prefix(buf: bytes) -> int:
    """Length of the longest prefix of buf made of whole protobuf fields."""
    pos = end = 0
    while pos < len(buf):
        got = varint(buf, pos, len(buf))
        if got is None:
            break
        key, pos = got
        wire_type = key & 7
        if wire_type == 0:
            got = varint(buf, pos, len(buf))
            if got is None:
                break
            pos = got[1]
        elif wire_type in (1, 5):
            pos += 8 if wire_type == 1 else 4
        elif wire_type == 2:
            got = varint(buf, pos, len(buf))
            if got is None:
                break
            pos = got[1] + got[0]
        else:
            break
        if pos > len(buf):
            break
        end = pos
    return end


def decode_pbmeta(head: bytes, size: int) -> MetaIds | None:
    """Ids from a PBMeta frame of `size` bytes whose first len(head) bytes were captured.

    A cut-off frame (control messages carry node lists) is decoded up to its
    last whole field; ids after the cut are None. None if it is not a PBMeta.
    """
    truncated = size > len(head)
    data = head[:_whole_fields_prefix(head)] if truncated else head
    try:
        pb = PBMeta.FromString(data)
    except Exception:  # protobuf's DecodeError, or worse on garbage
        return None
    # the fields present, in one call (a HasField and a getattr per id cost ~2 us more)
    present = pb.ListFields()
    if not data or not present:
        return None
    ids = dict(_NO_IDS)
    for fd, v in present:
        name = fd.name
        if name == "control":
            ids["control_cmd"] = v.cmd
        elif name in _PBMETA_IDS:
            ids[name] = v
    ids["truncated"] = truncated
    obj = object.__new__(MetaIds)   # as MetaIds(**ids), without the frozen __init__'s per-field setattr
    obj.__dict__.update(ids)
    return obj


_PBMETA_IDS = frozenset(("app_id", "customer_id", "timestamp", "request", "push", "head", "simple_app"))
_NO_IDS = {f.name: None for f in fields(MetaIds) if f.name != "truncated"}


def _opt(v: int) -> int | None:
    """An id as ps::Meta holds it: kEmpty is absent."""
    return None if v == PS_META_EMPTY else v


def decode_raw_meta(head: bytes, size: int) -> MetaIds | None:
    """Ids from a BytePS RawMeta frame of `size` bytes whose first len(head) bytes were
    captured (its ids all lie in the first RAW_HEAD_BYTES); None if it is not one."""
    f = raw_head(head, size)
    if f is None:
        return None
    hd, _body, cmd, _nodes, _barrier, _sig, request, app, ts, _dts, cust, push, simple = f

    return MetaIds(app_id=_opt(app), customer_id=_opt(cust), timestamp=_opt(ts), request=bool(request),
                   push=bool(push), head=_opt(hd), simple_app=bool(simple), control_cmd=cmd or None,
                   truncated=size > len(head))


def decode_meta_frame(head: bytes, size: int) -> MetaIds | None:
    """Ids from a meta frame of either variant, RawMeta tried first (rawmeta.py says why)."""
    return decode_raw_meta(head, size) or decode_pbmeta(head, size)


def decode_ps_meta(head: bytes) -> MetaIds | None:
    """Ids from the leading bytes of a ps::Meta (PS_META_FORMAT)."""
    if len(head) < _PS_META_BYTES:
        return None
    hd, app, cust, ts, sender, recver, request, push, simple = struct.unpack_from(PS_META_FORMAT, head)

    return MetaIds(app_id=_opt(app), customer_id=_opt(cust), timestamp=_opt(ts), request=request,
                   push=push, head=_opt(hd), simple_app=simple, sender=_opt(sender),
                   recver=_opt(recver))


def routing_id_frames(sock_type: int | None, sizes, heads) -> int:
    """How many of a zmq message's first frames are a ROUTER's routing id (0 or 1).

    By the socket's type where its zmq_socket was seen; otherwise told apart from a
    PBMeta by its bytes: ps-lite names its DEALERs "ps<node id>", libzmq generates
    5-byte ids starting with a zero byte, and a PBMeta starts with a field tag:
    never 0x00 (invalid tag), never "p" (field 14, not in PBMeta).
    """
    if len(sizes) < 2:
        return 0
    if sock_type is not None:
        return 1 if sock_type == ZMQ_ROUTER else 0
    size, head = sizes[0], heads[0]
    if size > ROUTING_ID_MAX_BYTES or not head:
        return 0
    return 1 if is_node_identity(head) or (size == 5 and head[0] == 0) else 0


def sender_id_frames(sizes, heads) -> int:
    """1 if a message's wire frames start with a BytePS server's sender id "ps<N>"
    before its meta (rawmeta.py), else 0."""
    return int(len(sizes) >= 2 and sizes[0] == len(heads[0]) and routing_id(heads[0]) is not None)


_MISSING = object()
META_CACHE_MAX = 4096  # meta frames decoded, kept until both ends' records came (cleared when full)


class ZmqRecordIds:
    """The ids of a record of the zmq layer (a message's frames): a ROUTER's routing id
    is the peer; the meta frame (PBMeta or RawMeta; behind BytePS's sender id) after it
    gives the ids, with the sender taken from a received message's routing id (or
    sender id). Decoded once per distinct meta frame: the
    sender's and the receiver's records of one message carry the same one (one agent per
    kernel sees both), and MetaIds is immutable."""
    keyed = False

    def __init__(self) -> None:
        self._metas: dict[tuple, MetaIds | None] = {}
        self._nodes: dict[bytes, int | None] = {}   # routing id -> node id
        # routing ids named as ps-lite's ("ps<digits>") whose node id does not fit the
        # sender column (int32): refused, counted (meta.json's framework_values_rejected)
        self.values_rejected = 0

    def fill(self, fields: dict, sock_type: int | None, request: bool | None) -> None:
        sizes, heads = fields["frame_sizes"], fields["frame_heads"]
        at = routing_id_frames(sock_type, sizes, heads)
        peer = fields["peer"] = heads[0] if at else None
        sid = sender_id_frames(sizes[at:], heads[at:])
        if sid and peer is None:
            peer = heads[at]   # a DEALER's receive: the sender id names who sent it
        at += sid
        if at >= len(sizes):
            fields["meta"] = None
            return
        key = (heads[at], sizes[at])
        meta = self._metas.get(key, _MISSING)
        if meta is _MISSING:
            if len(self._metas) >= META_CACHE_MAX:
                self._metas.clear()
            meta = self._metas[key] = decode_meta_frame(*key)
        if meta is not None and peer is not None and fields["direction"] == "recv":
            node = self._nodes.get(peer, _MISSING)
            if node is _MISSING:
                if len(self._nodes) >= META_CACHE_MAX:
                    self._nodes.clear()
                node = self._nodes[peer] = node_id_of_identity(peer)
                if node is None and is_node_identity(peer):
                    self.values_rejected += 1
            if node is not None:
                meta = meta.with_sender(node)
        fields["meta"] = meta


class PsRecordIds:
    """The ids of a record of the ps layer: the leading fields of ps::Meta."""
    keyed = False
    values_rejected = 0   # its ids are int32 as the meta gives them

    @staticmethod
    def fill(fields: dict, sock_type: int | None, request: bool | None) -> None:
        heads = fields["frame_heads"]
        fields["meta"] = decode_ps_meta(heads[0]) if heads else None


# ---- a record and its wire message --------------------------------------------------------


def zmtp_bytes(frame_sizes) -> int:
    """Bytes on the wire of ZMTP frames of these sizes (short header <= 255 bytes)."""
    total = 0
    for s in frame_sizes:
        total += s + (2 if s <= 255 else 9)
    return total


@dataclass(slots=True)
class RecordFacts:
    """What a ps-lite record says of the wire message it became."""
    ids: tuple                 # (call_space, call_id, request): the wire message's
    peer_id: int | None        # the peer's node id, when the record names it
    head_keys: tuple           # the keys frame's first keys, as the record copied them
    meta: MetaIds
    wire_bytes: int | None     # the message's ZMTP bytes (zmq layer), else None
    head_key_set: frozenset = field(init=False)

    def __post_init__(self):
        self.head_key_set = frozenset(self.head_keys)

    def fits(self, m, key_sample_max: int) -> bool:
        """Could wire message m (a parsers.pslite PsMessage) be this record's?"""
        if m.protocol != "pslite":
            return False
        meta = self.meta
        if m.control:
            if meta.control_cmd is not None and meta.control_cmd != m.cmd:
                return False
        elif meta.push is not None and (m.op == "push" or m.op == "pushpull") != bool(meta.push):
            return False
        if self.wire_bytes is not None and self.wire_bytes != m.total_bytes:
            return False
        if self.head_keys and m.num_keys and m.key_sample_complete and m.key_sample:
            sample = m.key_sample
            if m.num_keys <= key_sample_max:
                return self.head_key_set <= set(sample)
            # bottom-k by hash: a key of this frame hashing below the sample's largest
            # hash would be in the sample
            thr = key_hash(np.array(sample, dtype=np.uint64)).max()
            hk = np.array(self.head_keys, dtype=np.uint64)
            return set(hk[key_hash(hk) < thr].tolist()) <= set(sample)
        return True


_KEYS_UNPACK: dict = {}   # n -> unpack_from of n little-endian keys (n is at most the capture's 64 bytes / 8)


def record_facts(fm) -> RecordFacts | None:
    """The facts of a ps-lite framework record (probes.framework.FrameworkMessage of
    layer "zmq" or "ps"); None when it names no ids (its meta did not decode)."""
    meta = fm.meta
    if meta is None or getattr(meta, "truncated", False) and meta.timestamp is None:
        return None
    tx = fm.direction == "send"
    sizes, heads = tuple(fm.frame_sizes), tuple(fm.frame_heads)
    if fm.peer is not None and sizes:
        sizes, heads = sizes[1:], heads[1:]   # a ROUTER's routing id
    sid = sender_id_frames(sizes, heads) if fm.layer == "zmq" else 0
    if fm.layer == "ps":
        peer_id = meta.sender if not tx else meta.recver
    elif fm.peer:
        peer_id = node_id_of_identity(fm.peer)
    else:
        peer_id = node_id_of_identity(heads[0]) if sid and not tx else None
    head_keys: tuple = ()
    k = 1 + sid   # the keys frame: the one after the meta
    if len(heads) > k and len(heads[k]) >= 8 and sizes[k] % 8 == 0:
        n = min(len(heads[k]), sizes[k]) // 8
        unpack = _KEYS_UNPACK.get(n)
        if unpack is None:
            unpack = _KEYS_UNPACK[n] = struct.Struct(f"<{n}Q").unpack_from
        head_keys = unpack(heads[k])
    ids = (call_space_of(meta.app_id, meta.customer_id), meta.timestamp, meta.request)
    return RecordFacts(ids, peer_id, head_keys, meta, zmtp_bytes(sizes) if fm.layer == "zmq" and sizes else None)
