"""The framework probe's ring records (probes/framework.py) -> framework messages: the
records of one message joined, its ids decoded by its layer's protocol
(parsers.registry.FRAMEWORK_RECORD_IDS)."""
from __future__ import annotations

from collections import OrderedDict

from agent.bounded import put_newest
from parsers.registry import FRAMEWORK_RECORD_IDS
from probes import framework as _fw
from probes.events import PID_MAX, TIME_NS_MAX

# struct fw_event unpacked here as probes.framework.unpack_event does
_FW_LEGACY_BYTES = _fw._LEGACY_BYTES
_FW_FIXED_SIZE = _fw._FIXED.size
_FW_FIXED_UNPACK = _fw._FIXED.unpack_from
_FW_LENS = 11 + _fw.MAX_FRAMES   # head_len[] in _FIXED's values
_FW_HEAD_AT = tuple(range(_FW_FIXED_SIZE, _FW_FIXED_SIZE + _fw.CAPTURE_BYTES * _fw.MAX_FRAMES, _fw.CAPTURE_BYTES))
_SHAPES = {int(k): f for k, f in _fw.KINDS.items()}
_FRAMES = {int(k): (f.layer, f.direction == "send") for k, f in _fw.KINDS.items() if f.shape == "frames"}
SOCKETS_MAX = 65_536   # (process, socket) -> socket type: the least recently opened go first


class FrameworkDecoder:
    """Raw framework-probe events -> probes.framework.FrameworkMessage (KeyedMessage
    where the layer's records name their ids).

    By the shape of each kind (probes.framework.KINDS). Frames: the pieces of one
    (thread, socket, direction) joined up to the one without "more", a new socket's
    type kept for its later messages; tuples unpacked straight from the ring record
    instead of an object per event (once per frame, it was the agent's largest
    per-event cost). Calls: one event per message. Entries: one event per end of an RPC.
    The ids are the layer's protocol's (parsers.registry.FRAMEWORK_RECORD_IDS).
    tests/oracles/framework.py is the reference this is tested against.
    """

    def __init__(self):
        self._open: dict[tuple, list] = {}
        self._sock_types: OrderedDict[tuple[int, int], int] = OrderedDict()
        self.sockets = 0   # new-socket events seen
        self._ids = {layer: cls() for layer, cls in FRAMEWORK_RECORD_IDS.items()}
        # layer -> (its ids' fill, the record class): looked up once per message, not twice
        self._out = {layer: (ids.fill, _fw.KeyedMessage if ids.keyed else _fw.FrameworkMessage)
                     for layer, ids in self._ids.items()}

    @property
    def open_messages(self) -> int:
        """Messages with pieces seen but not their last one (yet)."""
        return len(self._open)

    @property
    def values_rejected(self) -> int:
        """Ids in records that no valid record has (meta.json's framework_values_rejected)."""
        return sum(d.values_rejected for d in self._ids.values())

    def feed(self, raw: bytes):
        if len(raw) == _FW_LEGACY_BYTES:
            (kind, tgid, tid, sock, ts, first_ret, ret_ts, ret, more, arg, sizes, heads) = _fw.unpack_event(raw)
        elif len(raw) < _FW_FIXED_SIZE:
            raise ValueError(f"framework record of {len(raw)} bytes is shorter than its header")
        else:   # probes.framework.unpack_event, inlined: once per framework message
            v = _FW_FIXED_UNPACK(raw)
            ts, first_ret, ret_ts, sock, ret, tgid, tid, arg, kind, more, n = v[:11]
            if n > _fw.MAX_FRAMES:
                raise ValueError(f"framework record claims {n} frames")
            sizes = v[11:11 + n]
            heads = tuple([raw[at:at + ln] for at, ln in zip(_FW_HEAD_AT, v[_FW_LENS:_FW_LENS + n])])
        if ts > TIME_NS_MAX or first_ret > TIME_NS_MAX or ret_ts > TIME_NS_MAX or tgid > PID_MAX or tid > PID_MAX:
            raise ValueError(f"framework record with times {ts}, {first_ret}, {ret_ts} or ids {tgid}, {tid} "
                             "no kernel gives")
        frames = _FRAMES.get(kind)
        if frames is not None:   # the probe's hottest kind: one event per message and end
            return self._frames(*frames, tgid, tid, sock, ts, first_ret, ret_ts, more, sizes, heads)
        facts = _SHAPES.get(kind)
        if facts is None:
            raise ValueError(f"framework record of kind {kind}, which the probe does not send")
        if facts.shape == "socket":
            put_newest(self._sock_types, (tgid, sock), arg, SOCKETS_MAX)
            self.sockets += 1
            return None
        fields = {"layer": facts.layer, "direction": facts.direction, "tgid": tgid, "tid": tid, "sock": sock,
                  "ts_ns": ts, "call_ts_ns": ts, "ret_ts_ns": ret_ts, "first_ret_ts_ns": first_ret,
                  "total_bytes": 0, "frames": None, "peer": None, "meta": None, "frame_sizes": (),
                  "frame_heads": ()}
        if facts.shape == "call":
            if facts.direction == "recv":
                fields["ts_ns"] = ret_ts
            fields["first_ret_ts_ns"] = ret_ts
            fields["total_bytes"] = ret
            fields["frame_heads"] = (heads[0] if heads else b"",)
        fill, cls = self._out[facts.layer]
        fill(fields, None, facts.request)
        return _frozen(cls, fields)

    def _frames(self, layer: str, send: bool, tgid: int, tid: int, sock: int, ts: int, first_ret: int,
                ret_ts: int, more: int, sizes: tuple, heads: tuple):
        key = (tgid, tid, sock, send)
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
        fields = {"layer": layer, "direction": "send" if send else "recv", "tgid": tgid, "tid": tid, "sock": sock,
                  "ts_ns": ts if send else ret_ts, "call_ts_ns": ts, "ret_ts_ns": ret_ts,
                  "first_ret_ts_ns": first_ret, "total_bytes": sum(sizes), "frames": len(sizes), "peer": None,
                  "meta": None, "frame_sizes": sizes, "frame_heads": heads}
        fill, cls = self._out[layer]
        fill(fields, self._sock_types.get((tgid, sock)), None)
        return _frozen(cls, fields)


def _frozen(cls, fields: dict):
    """An instance of the frozen dataclass cls with these fields (all of them, in order).
    Its __init__ sets each through object.__setattr__: ~1.5 us per FrameworkMessage, on
    every framework record; the instance is the same (eq, repr, hash)."""
    obj = _new(cls)
    obj.__dict__.update(fields)
    return obj


_new = object.__new__
