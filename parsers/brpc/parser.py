"""Incremental parser of one direction of one TCP connection speaking brpc's baidu_std.

Feed it the bytes of the stream in order, in chunks cut anywhere (`feed`); say when
bytes were lost (`gap`), judged elsewhere to hold no message (`unparsed`) or walked
over inside a body without being copied (`skip`: the kernel's walker); get back the
messages whose last byte arrived. A message is the 12-byte header ("PRPC",
body_size, meta_size: u32 big-endian), the RpcMeta (meta_size bytes), the payload and
the attachment (RpcMeta.attachment_size bytes at the end of the body). The parser
buffers the header, the meta (up to `meta_max_bytes`) and the first
`payload_prefix_max_bytes` of a payload it reads (Paddle's requests and any response);
the rest of a body is walked, never buffered, and the keys of a Paddle table request
stream through a hash-chosen sampler (parsers.keysample) as they pass.

Sync. A stream fed from its first byte is in sync there. One joined mid-stream, or one
that lost bytes where a header or meta was, or that met a header or meta that makes no
sense (garbage), is "hunting": it scans for b"PRPC" whose sizes are sane (meta_size
<= body_size, meta_size <= meta_max_bytes, body_size <= hunt_body_max_bytes) and whose
RpcMeta parses with a request (service and method named) or a response, a
correlation id, a known compress type and an attachment that fits
(rpcmeta.plausible_for_hunt). A candidate whose bytes have not all come yet is kept
undecided, but does not stop the scan: a later whole and valid one wins. The first
good candidate is followed *tentatively*, since an attachment may hold the magic or
a whole message: its message is held back until a header with the magic and sane
sizes follows at its computed end, or the stream ends or breaks there (close, gap,
unparsed; after at most the first bytes of such a header). If what follows is no
header, the parser goes back to the byte
after the candidate and hunts again over what it consumed meanwhile (a replay of up
to `replay_max_bytes`; bytes past that are counted unparsed). So after a resync the
first message comes out when the second one's header does, and a message found
between two runs of garbage is not believed.

Every byte ends up counted once: in a message, as unparsed (seen, not understood), as
lost (announced by `gap`), or still pending (a message or a hunting window in
progress): see `stats()`. Nothing raises on bad input.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from heapq import heappop, heappush

from parsers.keysample import KeySampler

from .paddle import (KEY_BYTES, PS_METHOD, PS_SERVICE, RPC, KeysLayout, RequestHead, cmd_of,
                     keys_layout, read_request_head, read_response_head)
from .rpcmeta import COMPRESS_NAMES, HEADER_BYTES, MAGIC, MetaInfo, plausible_for_hunt, read_meta

PROTOCOL = "brpc"
# A response carries its request's correlation_id, on the same connection (the other
# direction): pair within one connection, never across connections.
PAIRING_SCOPE = "connection"

_HEADER_FORMAT = struct.Struct(">4sII")
# parser states
_HEADER, _META, _BODY, _HUNT = range(4)
# work items (see _run)
_DATA, _GAP, _DISCARD, _END, _SKIP = range(5)
KEYS_SKIPPED = "keys not copied out by the kernel's walker"
# what a hunting candidate is, besides "undecided until this stream offset"
_REJECT, _ACCEPT = -1, -2
# the magic's last 3 bytes may start a match once more bytes come
_MAGIC_TAIL_BYTES = len(MAGIC) - 1


@dataclass(slots=True)
class ParserStats:
    """Byte and message counters of one stream (all since the parser was made).

    fed_bytes + gap_bytes == message_bytes + handshake_bytes + unparsed_bytes
                             + lost_bytes + pending_bytes
    (the same fields as parsers.pslite's ParserStats; baidu_std has no handshake; gap
    bytes that fell inside a body the parser walks anyway are part of that message).
    """
    fed_bytes: int
    gap_bytes: int  # announced by gap() and by unparsed()
    message_bytes: int
    handshake_bytes: int  # always 0
    unparsed_bytes: int  # seen but not understood: garbage, messages cut by a gap
    lost_bytes: int  # announced lost by gap() and not absorbed inside a walked body
    pending_bytes: int  # in a message or a hunting window still in progress
    messages: int
    resyncs: int  # times sync was found by hunting (mid-stream start, after a gap or garbage)
    desyncs: int  # times a synced stream met a header or meta that made no sense
    values_rejected: int = 0  # kept for the shared shape: brpc refuses no value


@dataclass(slots=True)
class BrpcMessage:
    """One baidu_std message seen on one direction of one TCP connection.

    Offsets count bytes from the connection's first byte in this direction. A request
    and its response share `correlation_id` (PAIRING_SCOPE). `op` is the shared
    vocabulary ("pull", "push", "control", "rpc"): "rpc" for a request to any other
    service; None for a response (its request's op, once paired) and for a Paddle
    request whose command could not be read (`keys_reason` says why).
    """
    first_byte_offset: int  # stream offset of the "P" of its header
    last_byte_offset: int  # stream offset of its last byte (inclusive)
    end_offset: int  # the stream offset just after it (exclusive end)
    request: bool
    correlation_id: int | None
    service_name: str | None  # requests only (cut to rpcmeta.TEXT_MAX_CHARS)
    method_name: str | None
    log_id: int | None
    error_code: int | None  # responses only: brpc's error code
    error_text: str | None  # cut to rpcmeta.TEXT_MAX_CHARS
    compress_type: int  # 0 none, 1 snappy, 2 gzip, 3 zlib, 4 lz4 (the payload only)
    meta_bytes: int
    payload_bytes: int
    attachment_bytes: int
    op: str | None
    cmd_id: int | None  # Paddle: PsRequestMessage.cmd_id
    cmd_name: str | None  # Paddle's PsCmdID name (None for a number 3.0.0 lacks)
    table_id: int | None
    num_keys: int | None  # keys the request names (0: a request that names none)
    key_sample: tuple[int, ...]  # up to key_sample_max keys chosen by hash, sorted
    key_sample_complete: bool  # False when a gap hid some of the keys
    keys_reason: str | None  # why num_keys / the sample are missing, when they are
    dense_values: int | None  # Paddle dense ops: values per server shard
    ps_err_code: int | None  # a response read as Paddle's PsResponseMessage
    ps_err_msg: str | None
    lost_bytes: int  # bytes of this message announced lost (walked over)

    protocol = PROTOCOL
    # what every protocol's message gives (parsers/protocol.py)
    pair_scope = PAIRING_SCOPE
    control = False
    call_space = None         # one correlation-id counter per connection
    sender_node_id = None     # baidu_std names no nodes
    nodes = ()

    @property
    def total_bytes(self) -> int:
        """Bytes on the wire: header, meta, payload and attachment."""
        return self.end_offset - self.first_byte_offset

    @property
    def call_id(self) -> int | None:
        return self.correlation_id

    @property
    def value_bytes(self) -> int:
        return self.attachment_bytes

    @property
    def op_name(self) -> str | None:
        """Paddle's command name (or cmd_<id>), else service/method; None for a response."""
        if self.cmd_name is not None:
            return self.cmd_name
        if self.cmd_id is not None:
            return f"cmd_{self.cmd_id}"
        if self.service_name is not None or self.method_name is not None:
            return f"{self.service_name or ''}/{self.method_name or ''}"
        return None

    def detail(self) -> dict:
        d = {"table_id": self.table_id, "cmd_id": self.cmd_id, "error_code": self.error_code or None,
             "ps_err_code": self.ps_err_code or None, "keys_reason": self.keys_reason,
             "compress_type": self.compress_type or None, "log_id": self.log_id or None}
        return {k: v for k, v in d.items() if v is not None}


def _gather(buf: bytearray, mv, pos: int, need: int):
    """(the `need` bytes of a header or meta, new pos), gathered in `buf` across
    chunks; (None, pos) while some are still to come. Whole in mv: a view, no copy."""
    if not buf and len(mv) - pos >= need:
        return mv[pos:pos + need], pos + need
    take = min(need - len(buf), len(mv) - pos)
    buf += mv[pos:pos + take]
    if len(buf) < need:
        return None, pos + take
    whole = bytes(buf)
    buf.clear()
    return whole, pos + take


def _as_bytes_view(data) -> memoryview:
    mv = data if isinstance(data, memoryview) else memoryview(data)
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


class BrpcStreamParser:
    """One direction of one baidu_std connection (see the module docstring).

    mid_stream: the first byte fed is not the connection's first byte (start hunting).
    start_offset: stream offset of the first byte fed (message offsets count from it).
    """
    PROTOCOL = PROTOCOL

    def __init__(self, *, mid_stream: bool = False, start_offset: int = 0,
                 meta_max_bytes: int = 65536, key_sample_max: int = 16,
                 payload_prefix_max_bytes: int = 1024, replay_max_bytes: int = 256 * 1024,
                 hunt_body_max_bytes: int = 1 << 30):
        self.meta_max_bytes = meta_max_bytes
        self.key_sample_max = key_sample_max
        self.payload_prefix_max_bytes = payload_prefix_max_bytes
        self.replay_max_bytes = max(1, replay_max_bytes)
        self.hunt_body_max_bytes = hunt_body_max_bytes
        self.offset = start_offset  # stream offset of the next byte
        self._fed = self._gaps = 0
        self._msg_bytes = self._unparsed = self._lost = 0
        self._messages = self._resyncs = self._desyncs = 0
        self._acct = start_offset  # every byte before this one is counted somewhere
        self._out: list[BrpcMessage] = []
        # message in progress: header and meta
        self._hdr = bytearray()  # a header split across chunks
        self._hdr_bytes = b""  # the whole header, to hunt over it again if the meta is garbage
        self._meta_buf = bytearray()  # a meta split across chunks
        self._msg_first = 0
        self._body_size = self._meta_size = 0
        self._meta: MetaInfo | None = None
        # message in progress: the body walk, in body offsets (the meta starts at 0)
        self._body_pos = self._body_left = self._payload_end = 0
        self._msg_lost = 0
        self._paddle_request = False
        self._read_payload = False  # keep a payload prefix and decode it
        self._prefix = bytearray()
        self._prefix_end = 0  # body offset where the kept prefix ends
        self._head: RequestHead | None = None
        self._layout: KeysLayout | None = None
        self._ps_response: tuple[int, str] | None = None
        self._keys_reason: str | None = None
        self._keys_skipped = False  # skip() passed over keys the sample would hold
        self._sampler: KeySampler | None = None
        self._key_from = self._key_to = 0  # body offsets of the keys still to sample
        # hunting window: bytes from stream offset _hunt_base; candidates waiting for
        # bytes as {offset: end needed}, with heaps by end needed and by offset (stale
        # entries are skipped when they come up)
        self._hunt = bytearray()
        self._hunt_base = start_offset
        self._hunt_scanned = start_offset  # the magic was searched for before this offset
        self._undecided: dict[int, int] = {}
        self._undecided_by_end: list[tuple[int, int]] = []
        self._undecided_at: list[int] = []
        # tentative chain: its first message, counters to go back to, bytes to replay
        self._tentative = False
        self._tent_start = 0
        self._snapshot: tuple = ()
        self._pending: BrpcMessage | None = None
        self._replay: _Replay | None = None
        self._state = _HEADER
        if mid_stream:
            self._start_hunt(b"", start_offset)

    # ---------------------------------------------------------------- public API
    def feed(self, data) -> list[BrpcMessage]:
        """Parse the next bytes of the stream; return the messages they completed."""
        mv = _as_bytes_view(data)
        self._fed += len(mv)
        return self._work((_DATA, mv)) if len(mv) else []

    def gap(self, n_bytes: int) -> list[BrpcMessage]:
        """`n_bytes` of the stream were lost (not seen). A gap inside a body the parser
        walks anyway loses nothing but the keys it held; elsewhere sync is lost."""
        self._gaps += max(0, n_bytes)
        return self._work((_GAP, n_bytes)) if n_bytes > 0 else []

    def skip(self, n_bytes: int) -> list[BrpcMessage]:
        """`n_bytes` inside a message's body were walked over elsewhere (the kernel's
        walker) and not copied: known, not lost. What they held is not read: a payload
        prefix stops there, keys in them are not sampled (the message says so).
        Anywhere but inside a body they are a gap."""
        self._gaps += max(0, n_bytes)
        return self._work((_SKIP, n_bytes)) if n_bytes > 0 else []

    def unparsed(self, n_bytes: int) -> list[BrpcMessage]:
        """`n_bytes` of the stream were seen elsewhere and judged to hold no message:
        not fed here (so counted with the gap bytes, for the identity of ParserStats),
        counted unparsed rather than lost, and a break in the stream."""
        self._gaps += max(0, n_bytes)
        return self._work((_DISCARD, (n_bytes, 0))) if n_bytes > 0 else []

    def close(self) -> list[BrpcMessage]:
        """End of stream: a tentative message that ended exactly here is accepted; a
        header or meta cut short is hunted over again; what is left is unparsed."""
        out = self._work((_END, None))
        self._break_off()
        return out

    @property
    def synced(self) -> bool:
        """In sync and confirmed (not hunting, not following a tentative chain)."""
        return self._state != _HUNT and not self._tentative

    def recognised(self) -> bool:
        """The stream spoke baidu_std: a message was parsed (and confirmed)."""
        return self.stats().messages > 0

    @staticmethod
    def starts_stream(prefix) -> bool | None:
        """Whether a stream whose first bytes are `prefix` speaks baidu_std (None: too
        few bytes to tell)."""
        n = min(len(prefix), len(MAGIC))
        if bytes(prefix[:n]) != MAGIC[:n]:
            return False
        return True if n == len(MAGIC) else None

    def next_sync(self) -> tuple[int, int] | None:
        """(stream offset, 0) of the header expected next, when in sync between messages:
        where the kernel's walker can start."""
        if not self.synced or self._state != _HEADER or self._hdr:
            return None
        return self.offset, 0

    def stats(self) -> ParserStats:
        # while tentative, what the chain consumed is pending: count from the snapshot
        if self._tentative:
            msgs, mb, unp, lost, acct = self._snapshot
        else:
            msgs, mb, unp, lost, acct = (self._messages, self._msg_bytes, self._unparsed,
                                         self._lost, self._acct)
        return ParserStats(self._fed, self._gaps, mb, 0, unp, lost, self.offset - acct, msgs,
                           self._resyncs, self._desyncs)

    # ---------------------------------------------------------------- work loop
    def _work(self, item) -> list[BrpcMessage]:
        """Do one work item and what it leads to; return the messages released."""
        out = self._out = []
        self._run([item])
        return out

    def _run(self, items: list) -> None:
        """Do the work items in order. One may hand back items that go before the rest:
        a rollback's replay, or the hunting window from a candidate on."""
        todo = items[::-1]   # the next item is the last one
        while todo:
            kind, x = todo.pop()
            more = (self._consume(x) if kind == _DATA
                    else self._on_end() if kind == _END else self._on_break(kind, x))
            if more:
                todo += reversed(more)

    def _consume(self, mv: memoryview) -> list | None:
        """Parse `mv` (it starts at self.offset); return work items to run instead of
        its rest (a rollback, or a candidate found while hunting), else None."""
        n = len(mv)
        base = self.offset
        pos = 0
        while pos < n:
            st = self._state
            if st == _BODY:
                take = min(self._body_left, n - pos)
                self._walk(mv, pos, take)
                pos += take
                self._body_left -= take
                if not self._body_left:
                    self._finish(base + pos)
            elif st == _HEADER:
                hdr, pos = _gather(self._hdr, mv, pos, HEADER_BYTES)
                if hdr is None:
                    break
                if self._on_header(hdr, base + pos - HEADER_BYTES) is False:
                    return self._rollback(mv, pos)
            elif st == _META:
                body, pos = _gather(self._meta_buf, mv, pos, self._meta_size)
                if body is None:
                    break
                if self._on_meta(body, base + pos) is False:
                    return self._rollback(mv, pos)
            else:  # _HUNT
                self.offset = base + n
                self._hunt += mv[pos:]
                return self._hunt_scan(final=False)
        self.offset = base + n
        if self._tentative:
            self._replay.data(mv)
        return None

    # ---------------------------------------------------------------- one message
    def _on_header(self, hdr, hdr_abs: int):
        """A whole header was read. Returns False to roll back a tentative chain."""
        magic, body_size, meta_size = _HEADER_FORMAT.unpack_from(hdr)
        if (magic != MAGIC or not 0 < meta_size <= body_size or meta_size > self.meta_max_bytes
                or (self._tentative and body_size > self.hunt_body_max_bytes)):
            return self._fail(bytes(hdr), hdr_abs)
        if self._tentative and self._pending is not None:
            self._confirm()  # a header follows where the message said it would end
        self._msg_first = hdr_abs
        self._hdr_bytes = bytes(hdr)
        self._body_size, self._meta_size = body_size, meta_size
        self._state = _META
        return None

    def _on_meta(self, body, end_abs: int):
        """The meta was read (it ends at stream offset end_abs)."""
        meta = read_meta(body)
        if (meta is None or meta.attachment_bytes > self._body_size - self._meta_size
                or (self._tentative and not plausible_for_hunt(meta))):
            return self._fail(self._hdr_bytes + bytes(body), self._msg_first)
        self._begin_body(meta)
        if not self._body_left:
            self._finish(end_abs)
        return None

    def _begin_body(self, meta: MetaInfo) -> None:
        self._meta = meta
        self._state = _BODY
        self._body_pos = self._meta_size
        self._body_left = self._body_size - self._meta_size
        self._payload_end = self._body_size - meta.attachment_bytes
        self._msg_lost = 0
        self._head = self._layout = self._ps_response = self._sampler = None
        self._key_from = self._key_to = 0
        self._keys_reason = None
        self._keys_skipped = False
        self._prefix.clear()
        self._paddle_request = paddle = (meta.request and meta.service_name == PS_SERVICE
                                         and meta.method_name == PS_METHOD)
        # Paddle's requests say their command in the payload; any response may be
        # Paddle's (its request, on the other direction, says which): read both,
        # unless the payload is compressed
        self._read_payload = (paddle or not meta.request) and not meta.compress_type
        if paddle and meta.compress_type:
            self._keys_reason = "payload compressed (%s)" % COMPRESS_NAMES.get(
                meta.compress_type, "compress_type %d" % meta.compress_type)
        payload_bytes = self._payload_end - self._meta_size
        self._prefix_end = self._meta_size + (min(payload_bytes, self.payload_prefix_max_bytes)
                                              if self._read_payload else 0)
        if self._read_payload and self._prefix_end == self._meta_size:
            self._decode_payload()   # an empty payload

    def _walk(self, mv, pos: int, take: int) -> None:
        """The next `take` bytes of the body are mv[pos:pos + take]: keep what the
        payload prefix wants, sample what lies in the keys, walk over the rest."""
        b0 = self._body_pos
        if b0 < self._prefix_end:
            k = min(take, self._prefix_end - b0)
            self._prefix += mv[pos:pos + k]
            b0 += k
            pos += k
            take -= k
            self._body_pos = b0
            if b0 == self._prefix_end:
                self._decode_payload()
        if take:
            lo, hi = max(b0, self._key_from), min(b0 + take, self._key_to)
            if lo < hi:
                self._sampler.add(mv[pos + lo - b0:pos + hi - b0])
            self._body_pos = b0 + take

    def _body_gap(self, n: int, lost: bool) -> None:
        """`n` bytes of the body were lost, or skipped (not `lost`): what they held is
        not read or sampled. A sample that misses lost keys is kept, said incomplete; one
        that misses skipped keys is dropped (the keys it would hold are the first ones
        in the body: ps-lite and Paddle sort them)."""
        b0 = self._body_pos
        if b0 < self._prefix_end:
            self._prefix_end = b0   # the prefix stops here: read what came
            self._decode_payload(cut=lost)
        lo, hi = max(b0, self._key_from), min(b0 + n, self._key_to)
        if lo < hi and self._sampler is not None:
            if lost:
                self._sampler.skip(hi - lo)
            else:
                self._sampler = None
                self._keys_skipped = True
                self._key_from = self._key_to = 0   # keys that come after are not sampled either
        self._body_pos = b0 + n
        self._body_left -= n
        if lost:
            self._msg_lost += n

    def _decode_payload(self, cut: bool = False) -> None:
        """The payload prefix is complete, or `cut` short by a gap: read it, once."""
        if not self._read_payload:
            return
        self._read_payload = False
        meta, prefix = self._meta, self._prefix
        if not meta.request:
            self._ps_response = read_response_head(prefix)
            return
        payload_bytes = self._payload_end - self._meta_size
        self._head = head = read_request_head(prefix, payload_bytes)
        if cut:
            self._keys_reason = "a gap cut the payload after %d bytes" % len(prefix)
            return
        self._layout = layout = keys_layout(head, prefix, meta.attachment_bytes)
        if layout.region is None or not layout.num_keys:
            return
        at = self._meta_size if layout.region == "payload" else self._payload_end
        first = at + layout.region_at
        end = first + layout.num_keys * KEY_BYTES
        self._sampler = KeySampler(self.key_sample_max)
        seen = self._body_pos   # keys before this body offset sit in the prefix
        if first < seen:
            upto = min(end, seen)
            self._sampler.add(prefix[first - self._meta_size:upto - self._meta_size])
            first = upto
        self._key_from, self._key_to = first, end

    def _finish(self, end_abs: int) -> None:
        meta = self._meta
        head, layout, sampler = self._head, self._layout, self._sampler
        ps_err = self._ps_response
        if self._paddle_request:
            cmd_id = head.cmd_id if head is not None else None
            cmd_name, op = cmd_of(cmd_id)
            if cmd_id is None:
                op = None
            reason = (self._keys_reason or (layout.reason if layout is not None else None)
                      or (KEYS_SKIPPED if self._keys_skipped else None))
            num_keys = layout.num_keys if layout is not None and self._keys_reason is None else None
        else:
            cmd_id = cmd_name = None
            op = RPC if meta.request else None
            reason = None
            num_keys = None
        msg = BrpcMessage(
            self._msg_first, end_abs - 1, end_abs, meta.request, meta.correlation_id, meta.service_name,
            meta.method_name, meta.log_id, meta.error_code, meta.error_text, meta.compress_type,
            self._meta_size, self._payload_end - self._meta_size, meta.attachment_bytes, op,
            cmd_id, cmd_name, head.table_id if head is not None else None, num_keys,
            sampler.result() if sampler is not None else (),
            sampler.complete if sampler is not None else not self._keys_skipped, reason,
            layout.dense_values if layout is not None else None,
            ps_err[0] if ps_err is not None else None, ps_err[1] if ps_err is not None else None,
            self._msg_lost)
        self._messages += 1
        self._msg_bytes += end_abs - self._acct
        self._acct = end_abs
        if self._tentative:
            self._pending = msg
        else:
            self._out.append(msg)
        self._state = _HEADER
        self._meta = self._sampler = None

    # ---------------------------------------------------------------- losing sync
    def _fail(self, prefix: bytes, prefix_abs: int, desync: bool = True):
        """The bytes `prefix` (from stream offset prefix_abs, taken from the stream) are
        no header or meta. Tentative: roll back (returns False). Synced: hunt again
        from the byte after prefix_abs, over the rest of `prefix` first."""
        if self._tentative:
            return False
        self._desyncs += desync
        self._unparsed += prefix_abs + 1 - self._acct
        self._acct = prefix_abs + 1
        self._start_hunt(prefix[1:], prefix_abs + 1)
        return None

    def _start_hunt(self, window, window_abs: int) -> None:
        self._state = _HUNT
        self._hdr.clear()
        self._meta_buf.clear()
        self._meta = self._sampler = None
        self._hunt = bytearray(window)
        self._hunt_base = self._hunt_scanned = window_abs
        self._undecided = {}
        self._undecided_by_end = []
        self._undecided_at = []

    def _on_break(self, kind: int, x) -> list | None:
        """A gap (x = bytes lost) or a discard (x = (unparsed, lost) bytes)."""
        st = self._state
        if kind in (_GAP, _SKIP) and st == _BODY and self._body_left >= x:
            # inside a body the parser walks anyway: the message still ends where it said
            self._body_gap(x, lost=kind == _GAP)
            self.offset += x
            if self._tentative:
                self._replay.gap(kind, x)
            if not self._body_left:
                self._finish(self.offset)
            return None
        if self._tentative:
            if self._ends_here():
                self._confirm()
            else:
                return self._rollback(None, 0) + [(kind, x)]
        elif st == _HUNT:
            found = self._hunt_scan(final=True)
            if found:
                return found + [(kind, x)]
        self._break_off(*((0, x) if kind in (_GAP, _SKIP) else x))
        return None

    def _break_off(self, unparsed: int = 0, lost: int = 0) -> None:
        """Whatever is in progress (a message cut short, a hunting window) is unparsed,
        so are the next `unparsed` bytes, then `lost` bytes are lost: hunt after them."""
        self._unparsed += self.offset - self._acct + unparsed
        self._lost += lost
        self.offset += unparsed + lost
        self._acct = self.offset
        self._start_hunt(b"", self.offset)

    def _ends_here(self) -> bool:
        """Tentative, at a break or the end: the chain's message is complete and what
        came after it (if anything) is the start of a header: the stream breaks where
        the message said it would end, which is evidence enough."""
        hdr = bytes(self._hdr[:len(MAGIC)])
        return self._state == _HEADER and self._pending is not None and MAGIC.startswith(hdr)

    def _on_end(self) -> list | None:
        st = self._state
        if st == _HUNT:
            found = self._hunt_scan(final=True)
            return found + [(_END, None)] if found else None
        if self._tentative:
            if self._ends_here():
                self._confirm()
                return None
            return self._rollback(None, 0) + [(_END, None)]
        if st == _META or (st == _HEADER and self._hdr):
            # a header (and meta) cut short: garbage may have claimed a long meta and
            # hidden messages in it, so hunt over those bytes again
            if st == _META:
                prefix, at = self._hdr_bytes + bytes(self._meta_buf), self._msg_first
            else:
                prefix, at = bytes(self._hdr), self.offset - len(self._hdr)
            self._fail(prefix, at, desync=False)
            return [(_END, None)]
        return None

    # ---------------------------------------------------------------- hunting
    def _hunt_scan(self, final: bool) -> list | None:
        """Look for a message start in the hunting window (candidates that waited for
        bytes, then the magic in bytes not searched yet); on a good one, return the
        window from it as work to parse tentatively. Else keep only what may still
        start one. `final`: no more bytes will come (a break or the end) to decide a
        candidate that waits for them: it is rejected."""
        buf, base = self._hunt, self._hunt_base
        end_abs = base + len(buf)
        undecided, by_end = self._undecided, self._undecided_by_end
        ready = []
        while by_end and (final or by_end[0][0] <= end_abs):
            need, at = heappop(by_end)
            if undecided.get(at) == need:
                del undecided[at]
                ready.append(at)
        found = []
        j = buf.find(MAGIC, max(0, self._hunt_scanned - base))
        while j >= 0:
            found.append(base + j)
            j = buf.find(MAGIC, j + 1)
        self._hunt_scanned = max(self._hunt_scanned, end_abs - _MAGIC_TAIL_BYTES)
        for at in sorted(ready + found) if ready else found:
            verdict = self._judge(buf, at - base, base, final)
            if verdict == _ACCEPT:
                return self._accept(at)
            if verdict != _REJECT:
                if at not in undecided:
                    heappush(self._undecided_at, at)
                undecided[at] = verdict
                heappush(by_end, (verdict, at))
        # keep what may still start a message: the first undecided candidate, and the
        # last bytes (a magic cut by the end of the window)
        keep_from = end_abs if final else max(base, end_abs - _MAGIC_TAIL_BYTES)
        first = self._undecided_at
        while first and first[0] not in undecided:
            heappop(first)
        if first:
            keep_from = min(keep_from, first[0])
        self._drop_hunted(keep_from - base)
        return None

    def _judge(self, buf, j: int, base: int, final: bool) -> int:
        """_ACCEPT, _REJECT, or the stream offset up to which bytes are needed."""
        have = len(buf) - j
        if have < HEADER_BYTES:
            return _REJECT if final else base + j + HEADER_BYTES
        _, body_size, meta_size = _HEADER_FORMAT.unpack_from(buf, j)
        if (not 0 < meta_size <= body_size or meta_size > self.meta_max_bytes
                or body_size > self.hunt_body_max_bytes):
            return _REJECT
        if have < HEADER_BYTES + meta_size:
            return _REJECT if final else base + j + HEADER_BYTES + meta_size
        start = j + HEADER_BYTES
        meta = read_meta(memoryview(buf)[start:start + meta_size])
        if (meta is None or meta.attachment_bytes > body_size - meta_size
                or not plausible_for_hunt(meta)):
            return _REJECT
        return _ACCEPT

    def _drop_hunted(self, k: int) -> None:
        """The first k bytes of the hunting window cannot start a message: unparsed."""
        if k > 0:
            del self._hunt[:k]
            self._unparsed += k
            self._hunt_base += k
            self._acct = self._hunt_base

    def _accept(self, at: int) -> list:
        """Follow the candidate at stream offset `at` tentatively."""
        self._drop_hunted(at - self._hunt_base)
        rest = bytes(self._hunt)
        self._hunt = bytearray()
        self._undecided, self._undecided_by_end, self._undecided_at = {}, [], []
        self.offset = at
        self._tentative = True
        self._tent_start = at
        self._snapshot = (self._messages, self._msg_bytes, self._unparsed, self._lost, self._acct)
        self._pending = None
        self._replay = _Replay(self.replay_max_bytes)
        self._state = _HEADER
        self._hdr.clear()
        return [(_DATA, memoryview(rest))]

    # ---------------------------------------------------------------- tentative chains
    def _confirm(self) -> None:
        self._tentative = False
        self._resyncs += 1
        if self._pending is not None:
            self._out.append(self._pending)
        self._pending = None
        self._replay = None

    def _rollback(self, mv, pos: int) -> list:
        """The tentative chain broke (in `mv` at `pos`, or at a break when mv is None):
        go back to the byte after the chain's start and hunt again over what it
        consumed, then go on with the rest of mv."""
        (self._messages, self._msg_bytes, self._unparsed, self._lost,
         self._acct) = self._snapshot
        self._tentative = False
        self._pending = None
        replay, self._replay = self._replay, None
        if mv is not None:
            replay.data(mv[:pos])
        items = replay.work()
        if mv is not None and pos < len(mv):
            items.append((_DATA, mv[pos:]))
        self._unparsed += 1   # the candidate's first byte: known not to start a message
        self.offset = self._acct = self._tent_start + 1
        self._start_hunt(b"", self.offset)
        return items


class _Replay:
    """What a tentative chain consumed, to parse again if it breaks: a contiguous
    prefix of it up to `max_bytes` (copied: the caller may reuse its buffer), then
    only the count of the bytes fed and lost past that."""

    __slots__ = ("max_bytes", "items", "kept_bytes", "over_fed", "over_lost")

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.items: list = []
        self.kept_bytes = self.over_fed = self.over_lost = 0

    def data(self, mv) -> None:
        if self.over_fed or self.over_lost:
            self.over_fed += len(mv)
            return
        take = min(self.max_bytes - self.kept_bytes, len(mv))
        if take > 0:
            self.items.append((_DATA, bytes(mv[:take])))
            self.kept_bytes += take
        self.over_fed += len(mv) - take

    def gap(self, kind: int, n: int) -> None:
        """n bytes lost (_GAP) or skipped (_SKIP) inside the chain's bodies."""
        if self.over_fed or self.over_lost:
            self.over_lost += n
        else:
            self.items.append((kind, n))

    def work(self) -> list:
        """Work items for _run: the chain's bytes from its second one on (the first
        starts the candidate that failed), then a discard of what was past the cap."""
        items = self.items
        kind, first = items[0]   # the chain's first bytes: max_bytes >= 1 of them
        items[0] = (kind, first[1:])
        if self.over_fed or self.over_lost:
            items.append((_DISCARD, (self.over_fed, self.over_lost)))
        return items
