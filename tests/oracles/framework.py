"""The reference the agent's framework decoder (agent/framework_records.py) is tested
against: ring events (probes.framework.FrameCall) -> framework messages, written for
clarity, an object per event, with no cache. The meta frames' ids come from the
decoders that tests/unit/test_zmq_layout_frames.py checks on their own."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from parsers.pslite.framework import ROUTING_ID_MAX_BYTES, ZMQ_ROUTER, decode_pbmeta, decode_ps_meta, decode_raw_meta
from parsers.pslite.meta import is_node_identity, node_id_of_identity
from probes.framework import CAPTURE_BYTES, FrameCall, FrameworkMessage, FwEvent, KeyedMessage, Kind

_BRPC = {Kind.BRPC_CLIENT_SEND: ("send", True), Kind.BRPC_CLIENT_RECV: ("recv", False),
         Kind.BRPC_SERVER_RECV: ("recv", True), Kind.BRPC_SERVER_SEND: ("send", False)}


def _looks_like_routing_id(head: bytes, size: int) -> bool:
    # ps-lite's DEALERs are "ps<node id>"; libzmq's own ids are 5 bytes from a zero byte
    if size > ROUTING_ID_MAX_BYTES or not head:
        return False
    return is_node_identity(head) or (size == 5 and head[0] == 0)


class MessageAssembler:
    def __init__(self) -> None:
        self._open: dict[tuple, list[FrameCall]] = defaultdict(list)
        self._sock_types: dict[tuple[int, int], int] = {}
        self.sockets = 0

    @property
    def open_messages(self) -> int:
        return len(self._open)

    def feed(self, call: FrameCall) -> FrameworkMessage | None:
        if call.kind == Kind.ZMQ_SOCKET:
            self._sock_types[(call.tgid, call.sock)] = call.arg
            self.sockets += 1
            return None
        if call.kind in (Kind.PS_SEND, Kind.PS_RECV):
            return self._ps_message(call)
        if call.kind in _BRPC:
            return self._brpc_message(call)
        direction = "send" if call.kind == Kind.ZMQ_SEND else "recv"
        key = (call.tgid, call.tid, call.sock, direction)
        pieces = self._open[key]
        pieces.append(call)
        if call.more:
            return None
        del self._open[key]
        return self._zmq_message(direction, pieces)

    def _zmq_message(self, direction: str, pieces: list[FrameCall]) -> FrameworkMessage:
        first, last = pieces[0], pieces[-1]
        sizes = tuple(s for p in pieces for s in p.sizes)
        heads = tuple(h for p in pieces for h in p.heads)
        sock_type = self._sock_types.get((first.tgid, first.sock))
        peer, at = None, 0
        if len(sizes) >= 2 and (sock_type == ZMQ_ROUTER or (
                sock_type is None and _looks_like_routing_id(heads[0], sizes[0]))):
            peer, at = heads[0], 1
        sender = peer
        if (at + 1 < len(sizes) and 3 <= sizes[at] <= 12 and len(heads[at]) == sizes[at]
                and heads[at][:2] == b"ps" and heads[at][2:].isdigit()):
            # BytePS: a server's id "ps<N>" as the frame before its RawMeta
            sender, at = sender or heads[at], at + 1
        meta = None
        if at < len(sizes):
            meta = decode_raw_meta(heads[at], sizes[at]) or decode_pbmeta(heads[at], sizes[at])
        if meta is not None and sender is not None and direction == "recv":
            node = node_id_of_identity(sender)
            if node is not None:
                meta = replace(meta, sender=node)
        return FrameworkMessage(
            layer="zmq", direction=direction, tgid=first.tgid, tid=first.tid, sock=first.sock,
            ts_ns=first.ts_ns if direction == "send" else last.ret_ts_ns,
            call_ts_ns=first.ts_ns, ret_ts_ns=last.ret_ts_ns,
            first_ret_ts_ns=first.first_ret_ts_ns, total_bytes=sum(sizes), frames=len(sizes),
            peer=peer, meta=meta, frame_sizes=sizes, frame_heads=heads)

    @staticmethod
    def _ps_message(call: FrameCall) -> FrameworkMessage:
        direction = "send" if call.kind == Kind.PS_SEND else "recv"
        head = call.heads[0] if call.heads else b""
        return FrameworkMessage(
            layer="ps", direction=direction, tgid=call.tgid, tid=call.tid, sock=call.sock,
            ts_ns=call.ts_ns if direction == "send" else call.ret_ts_ns,
            call_ts_ns=call.ts_ns, ret_ts_ns=call.ret_ts_ns, first_ret_ts_ns=call.ret_ts_ns,
            total_bytes=call.ret, frames=None, meta=decode_ps_meta(head), frame_heads=(head,))

    @staticmethod
    def _brpc_message(call: FrameCall) -> KeyedMessage:
        direction, request = _BRPC[call.kind]
        cid = call.sock - (1 << 64) if call.sock >= 1 << 63 else call.sock   # int64 on the wire
        return KeyedMessage(
            layer="brpc", direction=direction, tgid=call.tgid, tid=call.tid, sock=call.sock,
            ts_ns=call.ts_ns, call_ts_ns=call.ts_ns, ret_ts_ns=call.ret_ts_ns,
            first_ret_ts_ns=call.first_ret_ts_ns, total_bytes=0, frames=None,
            call_key=(None, cid, request))


def encode(call: FrameCall) -> bytes:
    """The ring record framework.bpf.c sends for this event."""
    e = FwEvent(ts_ns=call.ts_ns, first_ret_ts_ns=call.first_ret_ts_ns, ret_ts_ns=call.ret_ts_ns,
                sock=call.sock, ret=call.ret, tgid=call.tgid, tid=call.tid, arg=call.arg, kind=call.kind,
                more=call.more, frames=len(call.sizes))
    for i, (size, head) in enumerate(zip(call.sizes, call.heads)):
        e.sizes[i], e.head_len[i] = size, len(head)
        e.heads[i * CAPTURE_BYTES:i * CAPTURE_BYTES + len(head)] = head
    return bytes(e)[:FwEvent.heads.offset + len(call.sizes) * CAPTURE_BYTES]


class Checked:
    """The agent's decoder fed each event's ring record, checked against the reference
    fed the event: what the decoder gives, once both agree."""

    def __init__(self) -> None:
        from agent.framework_records import FrameworkDecoder

        self.decoder, self.oracle = FrameworkDecoder(), MessageAssembler()

    @property
    def open_messages(self) -> int:
        assert self.decoder.open_messages == self.oracle.open_messages
        return self.decoder.open_messages

    def feed(self, call: FrameCall):
        got, want = self.decoder.feed(encode(call)), self.oracle.feed(call)
        assert got == want and type(got) is type(want), (got, want)
        return got
