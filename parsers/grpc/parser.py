"""Incremental parser of one direction of one TCP connection speaking gRPC over HTTP/2.

HTTP/2 (RFC 9113): the client's direction starts with the 24-byte preface, then both
directions are frames: a 9-byte header (24-bit length, type, flags, 31-bit stream id,
big-endian) and a payload. Frame headers are read by hand with struct (one unpack per
frame, no object per frame; hyperframe wants whole frames, and a DATA frame's payload
is walked here, never buffered). Header blocks (HEADERS + CONTINUATION up to
END_HEADERS, at most `header_block_max_bytes`) are decoded by hpack_late.LateTable.
gRPC: DATA frames of a stream carry messages, each a 5-byte prefix (compressed flag,
u32 big-endian length) and its bytes, cut anywhere by frames. Each gRPC message is one
message here: request in the client's direction, response in the server's; call_id
the stream id (pairs on the connection). Trailers (`grpc-status`) come out as a
control message of the stream. RST_STREAM and GOAWAY are counted.

Byte accounting: a whole DATA frame counts as message bytes, every other frame and the
preface as handshake bytes (HTTP/2's own upkeep), a frame in progress as pending.

Joined mid-stream (or after a gap): hunt for a chain of CHAIN_FRAMES plausible frame
headers within `hunt_max_bytes`; then streams whose HEADERS were not seen are skipped
(their DATA counted unparsed: where a message starts in them is unknown) and the HPACK
table is marked incomplete (hpack_late). Nothing raises on bad input.
"""
from __future__ import annotations

import heapq
import re
import struct
from dataclasses import dataclass

from parsers.protocol import PAIR_CONNECTION, ParserStats

from .hpack_late import BlockError, LateTable

PROTOCOL = "grpc"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEADER = struct.Struct(">HBBBI")      # length hi 16, lo 8, type, flags, stream id
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x4, 0x8, 0x20
FRAME_MAX_BYTES = 1 << 24
CHAIN_FRAMES = 3           # plausible headers in a row before a hunt believes them
STREAMS_MAX = 4096         # streams followed at once per direction (oldest dropped, counted)
BODY_PREFIX_BYTES = 256    # of each message's protobuf, kept for the op
TEXT_MAX_CHARS = 200
_HEAD, _PAYLOAD, _HUNT = range(3)
# where a frame header may start: a known type (byte 3) and the stream id's reserved bit
# clear (byte 5); found by the regex engine, so a hunt's Python work is per candidate
_HEADER_START = re.compile(rb"(?=[\x00-\xff]{3}[\x00-\x09][\x00-\xff][\x00-\x7f])", re.DOTALL)


@dataclass(slots=True)
class GrpcMessage:
    first_byte_offset: int     # the first byte of the DATA frame holding its prefix
    last_byte_offset: int
    end_offset: int
    request: bool | None
    stream_id: int
    path: str | None           # :path where the stream's HEADERS named it
    compressed: bool
    grpc_bytes: int            # the gRPC message: 5-byte prefix + its length
    index_in_stream: int
    grpc_status: int | None = None   # trailers (a control message)
    grpc_message: str | None = None
    control: bool = False

    protocol = PROTOCOL
    pair_scope = PAIR_CONNECTION
    call_space = None
    sender_node_id = None
    nodes = ()
    num_keys = None
    key_sample = ()
    key_sample_complete = True

    @property
    def total_bytes(self) -> int:
        return self.end_offset - self.first_byte_offset

    @property
    def call_id(self) -> int:
        return self.stream_id

    @property
    def value_bytes(self) -> int:
        return max(0, self.grpc_bytes - 5)

    @property
    def op(self) -> str | None:
        if self.control:
            return "control"
        if not self.request:
            return None     # a response's op is its request's
        return _op_of_method(self.path)

    @property
    def op_name(self) -> str | None:
        return self.path

    def detail(self) -> dict:
        d = {"stream_id": self.stream_id, "index_in_stream": self.index_in_stream or None,
             "compressed": self.compressed or None, "grpc_status": self.grpc_status,
             "grpc_message": self.grpc_message, "method_unknown": (self.path is None and not self.control) or None}
        return {k: v for k, v in d.items() if v is not None}


class _Stream:
    __slots__ = ("path", "role", "prefix", "left", "first", "count")

    def __init__(self, path, role):
        self.path, self.role = path, role
        self.prefix = bytearray()     # a gRPC prefix cut across frames
        self.left = 0                 # bytes of the current message still to come
        self.first = 0
        self.count = 0


def _op_of_method(path: str | None) -> str:
    """pull or push where the method's name says so (`/pkg.Service/PullSparse`), else rpc."""
    name = path.rsplit("/", 1)[-1].lower() if path else ""
    return "pull" if name.startswith("pull") else "push" if name.startswith("push") else "rpc"


def _text(b) -> str | None:
    return None if b is None else b[:TEXT_MAX_CHARS].decode("utf-8", "replace")


class GrpcStreamParser:
    PROTOCOL = PROTOCOL

    def __init__(self, *, mid_stream: bool = False, start_offset: int = 0, key_sample_max: int = 16,
                 header_block_max_bytes: int = 65536, hunt_max_bytes: int = 256 * 1024):
        self.header_block_max_bytes = header_block_max_bytes
        self.hunt_max_bytes = hunt_max_bytes
        self.offset = start_offset
        self._acct = start_offset
        self._fed = self._gaps = 0
        self._msg_bytes = self._hs_bytes = self._unparsed = self._lost = 0
        self._messages = self._resyncs = self._desyncs = 0
        self.rst_streams = self.goaways = self.streams_dropped = 0
        self.header_blocks = self.bad_header_blocks = 0
        self.role: bool | None = None          # True: the client's direction (requests)
        self.table = LateTable(complete=not mid_stream)
        self.streams: dict[int, _Stream] = {}
        self._out: list = []
        self._buf = bytearray()                # a frame header, or a hunting window
        self._block = bytearray()              # a header block in progress
        self._block_stream = 0
        self._block_end_stream = False
        self._preface_left = 0 if mid_stream else len(PREFACE)
        self._state = _HUNT if mid_stream else _HEAD
        self._type = self._flags = self._sid = 0
        self._frame_first = 0
        self._left = 0                         # payload bytes of the current frame to come
        self._pad = 0
        self._frame_stream: _Stream | None = None
        self._payload_seen = 0
        self._block_too_large = False
        self._hunt_reset()

    @staticmethod
    def starts_stream(prefix) -> bool | None:
        """The client's preface, or (the server's direction) a SETTINGS frame on stream 0."""
        p = bytes(prefix[:len(PREFACE)])
        if PREFACE.startswith(p):
            return None if len(p) < 16 else True
        if len(p) < 9:
            return None if p == b"\0\0\0\0\0\0\0\0\0"[:len(p)] or (len(p) >= 4 and p[3] == SETTINGS) or len(p) < 4 else False
        hi, lo, t, fl, sid = FRAME_HEADER.unpack_from(p)
        n = hi << 8 | lo
        return t == SETTINGS and fl == 0 and sid == 0 and n % 6 == 0 and n <= 16384

    # ------------------------------------------------------------- the stream's calls
    def feed(self, data) -> list:
        mv = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else memoryview(data)
        self._fed += len(mv)
        self._run(mv)
        return self._take()

    def gap(self, n_bytes: int) -> list:
        return self._break(n_bytes, lost=True)

    def skip(self, n_bytes: int) -> list:
        return self._break(n_bytes, lost=True)

    def unparsed(self, n_bytes: int) -> list:
        return self._break(n_bytes, lost=False)

    def close(self) -> list:
        if self._state == _HUNT and self._buf:
            self._hunt(final=True)
        self._unparsed += self.offset - self._acct
        self._acct = self.offset
        self._buf.clear()
        return self._take()

    @property
    def synced(self) -> bool:
        return self._state != _HUNT

    def recognised(self) -> bool:
        return self._messages > 0 or self.header_blocks > 0

    def next_sync(self):
        return (self.offset, 0) if self._state == _HEAD and not self._buf and not self._preface_left else None

    def stats(self) -> ParserStats:
        pending = self.offset - self._acct
        return ParserStats(self._fed, self._gaps, self._msg_bytes, self._hs_bytes, self._unparsed, self._lost,
                           pending, self._messages, self._resyncs, self._desyncs)

    def counters(self) -> dict:
        """HTTP/2's own counts: RST_STREAM and GOAWAY frames, header blocks (decoded,
        refused), fields that named an HPACK entry never seen, streams dropped at the cap."""
        return {"rst_streams": self.rst_streams, "goaways": self.goaways, "header_blocks": self.header_blocks,
                "bad_header_blocks": self.bad_header_blocks, "hpack_unknown_refs": self.table.unknown_refs,
                "streams_dropped": self.streams_dropped}

    # ------------------------------------------------------------- internals
    def _take(self) -> list:
        out, self._out = self._out, []
        return out

    def _break(self, n: int, lost: bool) -> list:
        if n <= 0:
            return []
        self._gaps += n
        self._unparsed += self.offset - self._acct   # what was in progress is cut
        if lost:
            self._lost += n
        else:
            self._unparsed += n
        self.offset += n
        self._acct = self.offset
        self._lose_sync()
        return self._take()

    def _lose_sync(self) -> None:
        self._state = _HUNT
        self._hunt_reset()
        self._buf.clear()
        self._block.clear()
        self._preface_left = 0
        self.streams.clear()
        self.table.lose()

    def _run(self, mv) -> None:
        i, n = 0, len(mv)
        while i < n:
            if self._preface_left:
                take = min(self._preface_left, n - i)
                at = len(PREFACE) - self._preface_left
                if bytes(mv[i:i + take]) != PREFACE[at:at + take]:
                    self._preface_left = 0      # no preface: the server's direction
                    continue
                self._preface_left -= take
                i += take
                self.offset += take
                if not self._preface_left:
                    self.role = True
                    self._hs_bytes += self.offset - self._acct
                    self._acct = self.offset
                continue
            st = self._state
            if st == _HUNT:
                take = min(n - i, self.hunt_max_bytes)
                self._buf += mv[i:i + take]
                i += take
                self.offset += take
                rest = self._hunt(final=False)
                if rest is not None:
                    self._run(memoryview(rest))
                continue
            if st == _HEAD:
                take = min(9 - len(self._buf), n - i)
                self._buf += mv[i:i + take]
                i += take
                self.offset += take
                if len(self._buf) < 9:
                    continue
                hdr, self._buf = bytes(self._buf), bytearray()
                if not self._frame_start(hdr, self.offset - 9):
                    self._desyncs += 1
                    self._unparsed += self.offset - 9 + 1 - self._acct
                    self._acct = self.offset - 9 + 1
                    self._state = _HUNT
                    self._hunt_reset()
                    self.offset -= 8
                    self._buf = bytearray()
                    self._run(memoryview(hdr[1:]))
                continue
            # _PAYLOAD
            take = min(self._left, n - i)
            self._payload(mv[i:i + take])
            i += take
            self.offset += take
            self._left -= take
            if not self._left:
                self._frame_end()

    # frames
    @staticmethod
    def _header(hdr, at: int = 0) -> tuple[int, int, int, int] | None:
        """(length, type, flags, stream id) of the frame header at hdr[at:] if it could be
        HTTP/2's, else None."""
        hi, lo, t, fl, sid = FRAME_HEADER.unpack_from(hdr, at)
        length = hi << 8 | lo
        if sid & 0x80000000 or t > CONTINUATION:
            return None
        on_zero = t in (SETTINGS, PING, GOAWAY)
        if on_zero != (sid == 0) and t != WINDOW_UPDATE:
            return None
        if (t == SETTINGS and length % 6) or (t == PING and length != 8) or (t == WINDOW_UPDATE and length != 4) \
                or (t == RST_STREAM and length != 4) or (t == PRIORITY and length != 5) or length > FRAME_MAX_BYTES:
            return None
        return length, t, fl, sid

    def _frame_start(self, hdr: bytes, at: int) -> bool:
        h = self._header(hdr)
        if h is None:
            return False
        length, t, fl, sid = h
        if self._block and t != CONTINUATION:
            return False
        self._type, self._flags, self._sid, self._frame_first = t, fl, sid, at
        self._left, self._pad = length, 0
        self._payload_seen = 0
        self._frame_stream = self.streams.get(sid) if t == DATA else None
        self._state = _PAYLOAD
        if t in (HEADERS, CONTINUATION):
            if t == HEADERS:
                self._block_stream, self._block_end_stream = sid, bool(fl & END_STREAM)
        if t == RST_STREAM:
            self.rst_streams += 1
            self.streams.pop(sid, None)
        elif t == GOAWAY:
            self.goaways += 1
        if not length:
            self._frame_end()
        return True

    def _payload(self, mv) -> None:
        t = self._type
        if t in (HEADERS, CONTINUATION):
            if len(self._block) + len(mv) <= self.header_block_max_bytes:
                self._block += mv
            else:
                self._block = bytearray(b"\0" * 0)   # too large: refused at its end
                self._block_too_large = True
        elif t == DATA:
            s = self._frame_stream
            if s is None:
                return
            j, n = 0, len(mv)
            if self._flags & PADDED and self._payload_seen == 0 and n:
                self._pad = mv[0]
                j = 1
            self._payload_seen += n
            # padding sits at the payload's end: bytes within the last _pad are not data
            data_end = n - max(0, self._pad - (self._left - n)) if self._pad else n
            while j < data_end:
                if s.left:
                    k = min(s.left, data_end - j)
                    s.left -= k
                    j += k
                    if not s.left:
                        self._message_done(s, self.offset + j)
                    continue
                k = min(5 - len(s.prefix), data_end - j)
                if not s.prefix:
                    s.first = self._frame_first
                s.prefix += mv[j:j + k]
                j += k
                if len(s.prefix) == 5:
                    s.left = int.from_bytes(s.prefix[1:], "big")
                    if not s.left:
                        self._message_done(s, self.offset + j)

    def _message_done(self, s: _Stream, end: int) -> None:
        compressed = bool(s.prefix[0] & 1)
        size = 5 + int.from_bytes(s.prefix[1:], "big")
        s.prefix = bytearray()
        self._out.append(GrpcMessage(s.first, end - 1, end, s.role, self._sid, s.path, compressed, size, s.count))
        s.count += 1
        self._messages += 1

    def _frame_end(self) -> None:
        t, end = self._type, self.offset
        self._state = _HEAD
        if t == DATA and self._frame_stream is not None:
            self._msg_bytes += end - self._acct
        elif t == DATA:   # a stream whose HEADERS were not seen: where its messages start is unknown
            self._unparsed += end - self._acct
        else:
            self._hs_bytes += end - self._acct
        self._acct = end
        if t in (HEADERS, CONTINUATION) and self._flags & END_HEADERS:
            self._header_block()
        if t == DATA and self._flags & END_STREAM:
            self.streams.pop(self._sid, None)

    def _header_block(self) -> None:
        block, self._block = bytes(self._block), bytearray()
        if self._block_too_large:
            self._block_too_large = False
            self.bad_header_blocks += 1
            self.table.lose()
            return
        # HEADERS' own padding and priority fields come first
        fl, i, pad = self._flags, 0, 0
        if self._type == HEADERS:
            if fl & PADDED and block:
                pad, i = block[0], 1
            if fl & PRIORITY_FLAG:
                i += 5
        block = block[i:len(block) - pad] if pad <= len(block) - i else b""
        try:
            fields = self.table.decode(block)
        except BlockError:
            self.bad_header_blocks += 1
            return
        self.header_blocks += 1
        sid = self._block_stream
        got = {}
        for name, value in fields:
            if name is not None and name not in got:
                got[name] = value
        if b":method" in got:
            self.role = True
        elif b":status" in got:
            self.role = False
        s = self.streams.get(sid)
        if s is None and (b":method" in got or b":status" in got):
            if len(self.streams) >= STREAMS_MAX:
                self.streams.pop(next(iter(self.streams)))
                self.streams_dropped += 1
            s = self.streams[sid] = _Stream(_text(got.get(b":path")), self.role)
        if b"grpc-status" in got:   # trailers (or a trailers-only response)
            status = got[b"grpc-status"]
            code = int(status) if status is not None and status.isdigit() and len(status) < 4 else None
            m = GrpcMessage(self._frame_first, self.offset - 1, self.offset, False, sid,
                            s.path if s is not None else None, False, 0, s.count if s is not None else 0,
                            code, _text(got.get(b"grpc-message")), True)
            self._out.append(m)
        if self._block_end_stream:
            self.streams.pop(sid, None)

    # hunting
    def _hunt_reset(self) -> None:
        # Each start position is followed once, and again only when the bytes its chain
        # waits for arrive: a feed costs its own bytes, not the window's (a window of
        # hunt_max_bytes rescanned per small read was quadratic).
        self._scan_at = 0          # the next start position (absolute offset) to try
        self._waiting: list = []   # heap of (offset its next header ends at, start, next header, frames, CONTINUATION's stream)
        self._starts: list = []    # heap of the waiting chains' starts, lazily cleared
        self._live: set = set()    # the starts still waiting

    def _chain(self, buf, base: int, at: int, ok: int, cont: int, end: int):
        """Follow plausible headers from `at` (absolute): (next header's offset, frames,
        the stream a CONTINUATION must come on, or 0), or None where the chain breaks. A
        header block not ended must go on in a CONTINUATION of its stream (RFC 9113 6.2)."""
        while at + 9 <= end and ok < CHAIN_FRAMES:
            h = self._header(buf, at - base)
            if h is None:
                return None
            length, t, fl, sid = h
            if cont and (t != CONTINUATION or sid != cont) or (ok and not cont and t == CONTINUATION):
                return None
            cont = sid if t in (HEADERS, PUSH_PROMISE, CONTINUATION) and not fl & END_HEADERS else 0
            at += 9 + length
            ok += 1
        return at, ok, cont

    def _hunt(self, final: bool):
        """Bytes after a chain of CHAIN_FRAMES plausible frame headers in the window
        (from its first header on: parse them), else None and the window trimmed."""
        buf = self._buf
        end = self.offset
        base = end - len(buf)
        waiting, live = self._waiting, self._live
        found = None
        still = []
        while waiting and waiting[0][0] <= end:     # chains whose next header has arrived
            _, j, at, ok, cont = heapq.heappop(waiting)
            live.discard(j)
            r = self._chain(buf, base, at, ok, cont, end)
            if r is None:
                continue
            if r[1] >= CHAIN_FRAMES:
                found = j if found is None else min(found, j)
            else:
                still.append((r[0] + 9, j, *r))
        if found is None:
            last = end - 9      # the last start whose header is whole
            for mo in _HEADER_START.finditer(buf, max(self._scan_at, base) - base):
                j = base + mo.start()
                if j > last:
                    break
                r = self._chain(buf, base, j, 0, 0, end)
                if r is None:
                    continue
                if r[1] >= CHAIN_FRAMES:
                    found = j
                    break
                still.append((r[0] + 9, j, *r))
            self._scan_at = max(self._scan_at, end - 8)
        for w in still:
            if w[2] - w[1] <= self.hunt_max_bytes:   # a chain still going past the window's end
                heapq.heappush(waiting, w)
                if w[1] not in live:
                    live.add(w[1])
                    heapq.heappush(self._starts, w[1])
        if final:      # at the end, a chain that reaches it is believed too
            found = min([w[1] for w in waiting if w[2] >= end] + ([found] if found is not None else []), default=None)
        if found is not None:
            self._unparsed += found - self._acct
            self._acct = found
            self._resyncs += 1
            rest = bytes(buf[found - base:])
            self._buf = bytearray()
            self._state = _HEAD
            self.offset = found
            self._hunt_reset()
            return rest
        starts = self._starts
        while starts and starts[0] not in live:
            heapq.heappop(starts)
        keep = end if final else min(end - 8, starts[0] if starts else end)
        keep = max(keep, base, end - self.hunt_max_bytes)
        if keep > base:
            del buf[:keep - base]
            self._unparsed += keep - base
            self._acct += keep - base
            if starts and starts[0] < keep:
                self._waiting = [w for w in waiting if w[1] >= keep]
                heapq.heapify(self._waiting)
                self._live = {j for j in live if j >= keep}
                self._starts = [j for j in starts if j >= keep]
                heapq.heapify(self._starts)
        return None
