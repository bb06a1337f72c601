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
ps layer the meta names sender and receiver.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from parsers.keysample import key_hash

from .message import call_space_of
from .meta import node_id_of_identity


def zmtp_bytes(frame_sizes) -> int:
    """Bytes on the wire of ZMTP frames of these sizes (short header <= 255 bytes)."""
    return sum(s + (2 if s <= 255 else 9) for s in frame_sizes)


@dataclass(slots=True)
class RecordFacts:
    """What a ps-lite record says of the wire message it became."""
    ids: tuple                 # (call_space, call_id, request): the wire message's
    peer_id: int | None        # the peer's node id, when the record names it
    head_keys: tuple           # the keys frame's first keys, as the record copied them
    meta: object               # its MetaIds (probes.framework)
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
    if fm.layer == "ps":
        peer_id = meta.sender if not tx else meta.recver
    else:
        peer_id = node_id_of_identity(fm.peer) if fm.peer else None
    head_keys: tuple = ()
    if len(heads) >= 2 and len(heads[1]) >= 8 and sizes and sizes[1] % 8 == 0:
        n = min(len(heads[1]), sizes[1]) // 8
        head_keys = struct.unpack_from(f"<{n}Q", heads[1])
    ids = (call_space_of(meta.app_id, meta.customer_id), meta.timestamp, meta.request)
    return RecordFacts(ids, peer_id, head_keys, meta, zmtp_bytes(sizes) if fm.layer == "zmq" and sizes else None)
