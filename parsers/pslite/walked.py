"""ps-lite messages from the kernel walker's items of one call, without the stream parser.

A call the walker followed from a message's first byte to a message's last
(agent/calls.py `whole_messages`) carries, per message, its frame headers and meta
body as copied pieces and its keys frame as a KEYS item. When the direction's
parser is at a message boundary, these give the same PsMessage the parser would
build from the call's stream view (tests/unit/test_walked_fast_path.py checks it on
recorded traffic), at a fraction of the cost: no view, no state machine per piece.
Anything this does not cover exactly is None, and the call goes through the parser:
a ZMTP command, a meta or header that was not copied whole, a sender id that names no
node.
"""
from __future__ import annotations

import struct

from parsers.keysample import KeySampler

from .message import KEY_TYPES, Kind, PsMessage, infer_op, ps_message, read_meta
from .meta import node_id_of_identity
from .rawmeta import read_raw_meta, routing_id
from .zmtp import FLAG_COMMAND, FLAG_LONG, FLAG_MORE, FLAGS_RESERVED

_U64_BE = struct.Struct(">Q")
_KEY_BYTES = 8
KEYS_BUFFER_MAX_BYTES = 4096   # as the parser's: a keys frame up to this size it buffers and samples once


def _keys_sample(keys: list, at: int, size: int, num_keys: int, key_sample_max: int, sample_of):
    """(sample, complete) of a keys frame of `size` bytes at call offset `at` from its KEYS
    items, as the parser samples it from the stream view: a frame copied whole and small
    enough to buffer by sample_of, else through a KeySampler fed the keys the kernel kept
    (complete only if it kept them all). None for items that do not lie in the frame."""
    if size % _KEY_BYTES:
        return None
    if len(keys) == 1 and size <= KEYS_BUFFER_MAX_BYTES:
        k_off, count, mask, k_bytes = keys[0]
        if k_off == at and count == num_keys and mask == (1 << num_keys) - 1:
            return sample_of(k_bytes, 0, num_keys), True
    sampler = KeySampler(key_sample_max)
    kept = 0
    for k_off, count, mask, k_bytes in keys:
        if k_off < at or (k_off - at) % _KEY_BYTES or k_off + _KEY_BYTES * mask.bit_length() > at + size:
            return None
        if count != mask.bit_count():
            return None
        sampler.add(k_bytes)
        kept += count
    if kept < num_keys:
        sampler.skip(_KEY_BYTES * (num_keys - kept))
    return sampler.result(), sampler.complete


def walked_message(start: int, end: int, pieces: list, keys: list, base: int, sender_node_id: int | None,
                   raw: bool, meta_max_bytes: int, key_sample_max: int, sample_of) -> tuple[PsMessage, int] | None:
    """The message in call bytes [start, end) (stream offset of call byte 0: base), and the
    bytes it had copied; None unless this can read it exactly. raw: the direction speaks
    BytePS's RawMeta (a server's sender id may come first), else PBMeta.
    pieces: its BYTES items, (call offset, bytes) in call order; keys: its KEYS items,
    (call offset, count, mask, keys bytes); sample_of(buf, pos, n): the parser's sample of
    n keys copied whole (PsliteStreamParser._sample_of)."""
    pos, idx = start, 0
    meta = body = None
    has_keys = routed = False
    num_keys = value_bytes = fed = 0
    sample: tuple = ()
    complete = True
    n_pieces = len(pieces)
    pi, p_off, data = 0, -1, b""   # the piece looked in: pieces[pi], at call offset p_off
    while True:
        # the piece holding this frame's header (headers come in call order: look further on)
        while pos >= p_off + len(data):
            if pi == n_pieces:
                return None
            p_off, data = pieces[pi]
            pi += 1
            fed += len(data)
        at = pos - p_off
        if at < 0:
            return None   # a header the walker did not copy
        flags = data[at]
        long_ = flags & FLAG_LONG
        body_at = pos + (9 if long_ else 2)
        if body_at > p_off + len(data) or flags & (FLAGS_RESERVED | FLAG_COMMAND):
            return None
        size = _U64_BE.unpack_from(data, at + 1)[0] if long_ else data[at + 1]
        more = flags & FLAG_MORE
        if idx == 0:
            if size == 0 or size > meta_max_bytes or body_at + size > p_off + len(data):
                return None
            body = data[body_at - p_off:body_at - p_off + size]
            if raw and more and not routed:
                ident = routing_id(body)
                if ident is not None:   # a BytePS server's sender id: the meta is the next frame
                    sender_node_id = node_id_of_identity(ident)
                    if sender_node_id is None:
                        return None   # the parser counts it rejected
                    routed = True
                    pos = body_at + size
                    continue
            meta = read_raw_meta(body) if raw else read_meta(body)
            if meta is None or meta.raw != raw or bool(more) != bool(meta.data_types):
                return None
            dts = meta.data_types
            has_keys = meta.kind is Kind.DATA and not meta.simple_app and bool(dts) and dts[0] in KEY_TYPES
        elif idx == 1 and has_keys:
            num_keys = size // _KEY_BYTES
            if num_keys:
                got = _keys_sample(keys, body_at, size, num_keys, key_sample_max, sample_of)
                if got is None:
                    return None
                sample, complete = got
        elif idx == 2:
            value_bytes = size
        pos = body_at + size
        idx += 1
        if not more:
            break
    if pos != end:
        return None
    data_frames = idx - 1
    for _off, data in pieces[pi:]:
        fed += len(data)
    for k in keys:
        fed += _KEY_BYTES * k[1]
    msg = ps_message(base + start, base + end - 1, meta, infer_op(meta, data_frames), sender_node_id, num_keys,
                     sample, complete, value_bytes, data_frames, len(body))
    return msg, fed
