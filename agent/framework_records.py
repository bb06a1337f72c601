"""The framework probe's ring records -> framework messages (probes/framework.py):
the records of one message joined, its meta decoded once per distinct frame."""
from __future__ import annotations

from parsers.pslite.meta import is_node_identity, node_id_of_identity
from probes import framework as _fw
from probes.events import PID_MAX, TIME_NS_MAX

_MISSING = object()
META_CACHE_MAX = 4096  # meta frames decoded, kept until both ends' records came (cleared when full)
# struct fw_event unpacked here as probes.framework.unpack_event does
_FW_LEGACY_BYTES = _fw._LEGACY_BYTES
_FW_FIXED_SIZE = _fw._FIXED.size
_FW_FIXED_UNPACK = _fw._FIXED.unpack_from
_FW_LENS = 11 + _fw.MAX_FRAMES   # head_len[] in _FIXED's values
_FW_HEAD_AT = tuple(range(_FW_FIXED_SIZE, _FW_FIXED_SIZE + _fw.CAPTURE_BYTES * _fw.MAX_FRAMES, _fw.CAPTURE_BYTES))


class FrameworkDecoder:
    """Raw framework-probe events -> probes.framework.FrameworkMessage.

    The same as probes.framework.MessageAssembler (the pieces of one (thread,
    socket, direction) joined up to the one without "more"; a ROUTER's first
    frame is the peer's routing id), on tuples unpacked straight from the ring
    record instead of an object per event: this ran ~4 times per ps-lite
    message (once per frame) and was the agent's largest per-event cost; the
    kernel now sends one event per message. zmq_socket events and the ps-lite
    layer go through the probe's own assembler.
    """

    def __init__(self):
        from probes.framework import Kind, MessageAssembler

        self._asm = MessageAssembler()
        self._open: dict[tuple, list] = {}
        self._send, self._recv = int(Kind.ZMQ_SEND), int(Kind.ZMQ_RECV)
        self._unpack = _fw.unpack_event
        self._metas: dict[tuple, object] = {}
        self._nodes: dict[bytes, int | None] = {}   # routing id -> ps-lite node id
        # routing ids named as ps-lite's ("ps<digits>") whose node id does not fit the
        # sender column (int32): refused, counted (meta.json's framework_values_rejected)
        self.values_rejected = 0

    @property
    def open_messages(self) -> int:
        return len(self._open)

    def feed(self, raw: bytes):
        if len(raw) == _FW_LEGACY_BYTES:
            (kind, tgid, tid, sock, ts, first_ret, ret_ts, _ret, more, _arg, sizes, heads) = \
                self._unpack(raw)
        elif len(raw) < _FW_FIXED_SIZE:
            raise ValueError(f"framework record of {len(raw)} bytes is shorter than its header")
        else:   # probes.framework.unpack_event, inlined: once per zmq message
            v = _FW_FIXED_UNPACK(raw)
            ts, first_ret, ret_ts, sock, tgid, tid, kind, more, n = v[0], v[1], v[2], v[3], v[5], v[6], v[8], v[9], v[10]
            if n > _fw.MAX_FRAMES:
                raise ValueError(f"framework record claims {n} frames")
            sizes = v[11:11 + n]
            heads = tuple([raw[at:at + ln] for at, ln in zip(_FW_HEAD_AT, v[_FW_LENS:_FW_LENS + n])])
        if ts > TIME_NS_MAX or first_ret > TIME_NS_MAX or ret_ts > TIME_NS_MAX or tgid > PID_MAX or tid > PID_MAX:
            raise ValueError(f"framework record with times {ts}, {first_ret}, {ret_ts} or ids {tgid}, {tid} "
                             "no kernel gives")
        if kind != self._send and kind != self._recv:
            from probes.framework import decode_event
            return self._asm.feed(decode_event(raw))
        key = (tgid, tid, sock, kind)
        pieces = self._open.get(key) if self._open else None
        if more:
            piece = (ts, first_ret, ret_ts, sizes, heads)
            if pieces is None:
                self._open[key] = [piece]
            else:
                pieces.append(piece)
            return None
        if pieces is not None:
            del self._open[key]
            pieces.append((ts, first_ret, ret_ts, sizes, heads))
            first = pieces[0]
            ts, first_ret = first[0], first[1]
            sizes = tuple([s for p in pieces for s in p[3]])
            heads = tuple([h for p in pieces for h in p[4]])
        return self._message(kind == self._send, tgid, tid, sock, ts, first_ret, ret_ts, sizes, heads)

    def _message(self, send: bool, tgid: int, tid: int, sock: int, ts: int, first_ret: int,
                 ret_ts: int, sizes: tuple, heads: tuple):
        peer, at = None, 0
        sock_type = self._asm._sock_types.get((tgid, sock))
        if len(sizes) >= 2 and (sock_type == _fw.ZMQ_ROUTER or (
                sock_type is None and _fw._looks_like_routing_id(heads[0], sizes[0]))):
            peer, at = heads[0], 1
        meta = self._meta(heads[at], sizes[at], peer if not send else None) if at < len(sizes) else None
        return _frozen(_fw.FrameworkMessage, {
            "layer": "zmq", "direction": "send" if send else "recv", "tgid": tgid, "tid": tid, "sock": sock,
            "ts_ns": ts if send else ret_ts, "call_ts_ns": ts, "ret_ts_ns": ret_ts,
            "first_ret_ts_ns": first_ret, "total_bytes": sum(sizes), "frames": len(sizes), "peer": peer,
            "meta": meta, "frame_sizes": sizes, "frame_heads": heads})

    def _meta(self, head: bytes, size: int, peer: bytes | None):
        """decode_pbmeta of a meta frame, the sender taken from a received message's
        routing id. Cached: the sender's and the receiver's records of one message carry
        the same meta (one agent per kernel sees both), and MetaIds is immutable."""
        key = (head, size)
        meta = self._metas.get(key, _MISSING)
        if meta is _MISSING:
            if len(self._metas) >= META_CACHE_MAX:
                self._metas.clear()
            meta = self._metas[key] = _fw.decode_pbmeta(head, size)
        if meta is not None and peer is not None:
            node = self._nodes.get(peer, _MISSING)
            if node is _MISSING:
                if len(self._nodes) >= META_CACHE_MAX:
                    self._nodes.clear()
                node = self._nodes[peer] = node_id_of_identity(peer)
                if node is None and is_node_identity(peer):
                    self.values_rejected += 1
            if node is not None:
                meta = _replace_sender(meta, node)
        return meta


def _frozen(cls, fields: dict):
    """An instance of the frozen dataclass cls with these fields (all of them, in order).
    Its __init__ sets each through object.__setattr__: ~1.5 us per FrameworkMessage, on
    every framework record; the instance is the same (eq, repr, hash)."""
    obj = _new(cls)
    obj.__dict__.update(fields)
    return obj


_new = object.__new__


def _replace_sender(meta, node: int):
    # dataclasses.replace, without its per-call field introspection
    d = dict(meta.__dict__)
    d["sender"] = node
    return _frozen(_fw.MetaIds, d)
