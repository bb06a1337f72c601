"""Incremental parser of one direction of one TCP connection carrying ps-lite over ZMTP 3.

Feed it the bytes of the stream in order, in chunks cut anywhere (`feed`); say when
bytes were lost (`gap`); get back the ps-lite messages whose last byte arrived. It
keeps only frame headers, the meta frame (up to `meta_max_bytes`) and the key
sample: data frames are walked, never buffered.

Sync. A stream that starts with the ZMTP greeting is in sync from its first byte.
One joined mid-stream, or one that lost bytes where a frame header was, is
"hunting": it scans for a frame header followed by a PBMeta that decodes as a
ps-lite meta (message.read_meta), then follows that candidate *tentatively*: the
data frames must agree with the meta (count, element widths, keys/vals/lens sizes)
and the next message's meta must decode too (for a message whose keys and values
passed those checks, that is evidence enough; so is the end of the stream). Only
then is the chain confirmed and its messages released; if a link fails, the parser
goes back to the byte after the candidate and scans again (it keeps a bounded
replay of what it consumed meanwhile). A synced stream that meets a header or meta
that makes no sense (garbage) hunts again from the byte after that header, so the
messages that follow are not swallowed by a bogus frame size. resync.py holds that
part; this file walks a healthy stream.

Meta variants. MXNet's ps-lite sends a PBMeta, BytePS's fork a RawMeta struct, with
its server's sender id as a frame of its own before it on answers to a worker
(rawmeta.py). A direction's first message fixes which one it speaks (`variant`);
until then both are tried (and hunted for), after it only that one.

Every byte ends up counted once: in a message, in the handshake (greeting and
commands), as unparsed (seen, not understood), as lost (announced by `gap`), or
still pending (a message or a hunting window in progress): see `stats()`.
Nothing raises on bad input.
"""
from __future__ import annotations

import struct

import numpy as np

from parsers.protocol import ParserStats

from parsers.keysample import KEY_BYTES, KeySampler, bottom_k
from .message import KEY_TYPES, Kind, MetaInfo, PsMessage, element_bytes, infer_op, ps_message, read_meta
from .meta import is_node_identity, node_id_of_identity
from .rawmeta import PBMETA, RAWMETA, decode_meta, routing_id
from .resync import ResyncMixin
from .walked import KEYS_BUFFER_MAX_BYTES, walked_message
from .states import (_COMMAND, _DATA, _DISCARD, _GAP, _GREETING, _HEADER, _HUNT, _KEYS,
                     _KEYS_SMALL, _META, _OPAQUE, _SKIP)
from .zmtp import (CLEAR_MECHANISMS, FLAG_COMMAND, FLAG_LONG, FLAG_MORE, FLAGS_RESERVED,
                   GREETING_BYTES, Greeting, greeting_prefix_ok, parse_command, parse_greeting)

_U64_BE = struct.Struct(">Q")
_KEYS_UNPACK: dict = {}   # n -> unpack_from of n little-endian keys (sampled whole)
# Commands are small (READY carries a few properties); larger means garbage.
COMMAND_MAX_BYTES = 65536
# A keys frame split across chunks is buffered up to KEYS_BUFFER_MAX_BYTES (walked.py,
# which samples as this does) and sampled once; a larger one is streamed through a KeySampler.
# A data frame claiming more than this while a chain is still tentative is not believed.
TENTATIVE_FRAME_MAX_BYTES = 1 << 34


class PsliteStreamParser(ResyncMixin):
    """One direction of one ZMTP connection (see the module docstring).

    mid_stream: the first byte fed is not the connection's first byte (start hunting).
    start_offset: stream offset of the first byte fed (message offsets count from it).
    """
    PROTOCOL = "pslite"

    def __init__(self, *, mid_stream: bool = False, start_offset: int = 0,
                 meta_max_bytes: int = 65536, key_sample_max: int = 16,
                 replay_max_bytes: int = 256 * 1024):
        self.meta_max_bytes = meta_max_bytes
        self.key_sample_max = key_sample_max
        self.replay_max_bytes = max(1, replay_max_bytes)
        self.offset = start_offset  # stream offset of the next byte
        self.greeting: Greeting | None = None
        self.socket_type: bytes | None = None  # from READY
        self.identity: bytes | None = None  # from READY
        self.sender_node_id: int | None = None  # ps-lite identity "ps<id>"
        self.error_reason: bytes | None = None  # from an ERROR command
        # the meta frames' variant (rawmeta.PBMETA, RAWMETA), fixed by the direction's
        # first message; None until then
        self.variant: str | None = None
        self._start = start_offset
        self._fed = self._gaps = 0
        self._msg_bytes = self._hs_bytes = self._unparsed = self._lost = 0
        self._messages = self._resyncs = self._desyncs = self._rejected = 0
        self._acct = start_offset  # every byte before this one is counted somewhere
        self._state = _HUNT if mid_stream else _GREETING
        self._out: list[PsMessage] = []
        # frame in progress
        self._hdr = bytearray()  # a frame header split across chunks
        self._body = bytearray()  # a buffered body (greeting, meta, command, few keys)
        self._frame_hdr = b""  # header bytes of the buffered frame, to rescan it if it is garbage
        self._frame_abs = 0  # its stream offset
        self._need = 0  # bytes still to buffer (_META, _COMMAND, _KEYS_SMALL)
        self._remaining = 0  # bytes still to walk (_KEYS, _SKIP)
        self._more = False  # MORE flag of the current frame
        # message in progress
        self._frame_idx = 0  # 0: the next frame starts a message (meta); i: i-th data frame
        self._msg_first = 0
        self._meta: MetaInfo | None = None
        self._meta_bytes = 0
        # a BytePS server's sender-id frame before the meta (rawmeta.py): its node id,
        # and the stream offset of the message's first byte (that frame's header)
        self._routed = False
        self._routed_sender: int | None = None
        self._routed_first = 0
        self._dts: tuple[int, ...] = ()
        self._has_keys = False
        self._num_keys = 0
        self._value_bytes = 0
        self._sample: tuple[int, ...] = ()
        self._sampler: KeySampler | None = None
        # hunting window
        self._hunt = bytearray()
        self._hunt_base = start_offset
        self._hunt_scanned = 0  # bytes of the window already scanned for candidates
        self._hunt_scanned_long = 0  # and for long headers and greetings (hunt.LONG_SCAN_BYTES)
        # candidates waiting for bytes, by stream offset: {offset: end needed}, and two
        # heaps over it, of (end needed, offset) and of offsets (entries of decided
        # candidates are skipped when they come up): see ResyncMixin._hunt_feed
        self._undecided: dict[int, int] = {}
        self._undecided_by_end: list[tuple[int, int]] = []
        self._undecided_at: list[int] = []
        # tentative chain
        self._tentative = False
        self._tent_start = 0
        self._tent_msgs = 0
        self._snapshot: tuple = ()
        self._pending: list[PsMessage] = []
        self._replay: list = []  # work items consumed while tentative
        self._replay_bytes = 0
        self._replay_over = [0, 0]  # unparsed, lost bytes past the replay cap

    # ---------------------------------------------------------------- public API
    def feed(self, data) -> list[PsMessage]:
        """Parse the next bytes of the stream; return the messages they completed."""
        if type(data) is bytes:   # the agent's case: a view of bytes is flat unsigned bytes
            mv = memoryview(data)
        else:
            mv = data if isinstance(data, memoryview) else memoryview(data)
            if mv.format != "B" or mv.ndim != 1:
                mv = mv.cast("B")
        self._fed += len(mv)
        out = self._out = []
        if self._state == _HUNT:   # _consume's first step when hunting, without its loop
            base = self.offset
            self.offset = base + len(mv)
            items = self._hunt_feed(mv, base)
        else:
            items = self._consume(mv)
        if items:
            self._run(items)
        return out

    def gap(self, n_bytes: int) -> list[PsMessage]:
        """`n_bytes` of the stream were lost (not seen). Returns messages this completes
        (a gap that falls inside a data frame the parser skips anyway loses nothing)."""
        out = self._out = []
        if n_bytes > 0:
            self._gaps += n_bytes
            if self._state == _SKIP and self._remaining >= n_bytes and not self._tentative:
                # inside a data frame (the kernel's walker skipped its body): _on_gap's
                # first case, without the work loop
                self._remaining -= n_bytes
                self.offset += n_bytes
                if not self._remaining:
                    self._frame_done(self.offset)
                return out
            self._run([(_GAP, n_bytes)])
        return out

    # Bytes inside frame bodies that the kernel's walker went past without copying are
    # a gap to this parser: it walks data frames anyway, and keys the walker did not
    # sample leave the sample incomplete.
    skip = gap

    def unparsed(self, n_bytes: int) -> list[PsMessage]:
        """`n_bytes` of the stream were examined elsewhere and hold no message (the
        kernel's walker searched them for a chain of frames and found none): not fed
        here, counted unparsed rather than lost, and a break in the stream as a gap
        is. Returns messages this completes (none: a tentative chain is rolled back)."""
        out = self._out = []
        if n_bytes > 0:
            self._gaps += n_bytes   # not fed: fed + gap bytes still add up (ParserStats)
            self._run([(_DISCARD, (n_bytes, 0))])
        return out

    def close(self) -> list[PsMessage]:
        """End of stream. No more bytes will come to confirm a tentative chain, so the
        messages it completed (meta and data frames consistent) are accepted as they
        are. A meta or command frame still being buffered never completes: if garbage
        claimed a long size, messages may hide in the bytes it took, so they are
        scanned again. What is left pending becomes unparsed."""
        out = self._out = []
        while True:
            if self._tentative and self._tent_msgs:
                self._confirm()
            st = self._state
            if st in (_META, _COMMAND):
                prefix, prefix_abs = self._frame_hdr + bytes(self._body), self._frame_abs
            elif st == _HEADER and self._hdr:
                prefix, prefix_abs = bytes(self._hdr), self.offset - len(self._hdr)
            else:
                break
            self._body.clear()
            self._hdr.clear()
            if self._tentative:
                items = self._rollback(None, 0)
            else:
                self._fail(prefix, prefix_abs)
                items = self._hunt_feed(memoryview(b""), self.offset)
            if items:
                self._run(items)
        if self._tentative:
            self._rollback_counters()
        self._unparsed += self.offset - self._acct
        self._acct = self.offset
        self._start_hunt(b"", self.offset)
        return out

    @property
    def synced(self) -> bool:
        """In sync and confirmed (not hunting, not following a tentative chain)."""
        return self._state not in (_HUNT, _OPAQUE) and not self._tentative

    def recognised(self) -> bool:
        """The stream spoke this protocol: a greeting, a command or a message was parsed."""
        return self._messages > 0 or self._hs_bytes > 0

    @staticmethod
    def starts_stream(prefix) -> bool | None:
        """Whether a stream whose first bytes are `prefix` speaks ZMTP 3 (None: too few
        bytes to tell)."""
        if not greeting_prefix_ok(prefix):
            return False
        return True if len(prefix) > 10 else None

    def next_sync(self) -> tuple[int, int] | None:
        """(stream offset, frame index in its message) of the frame header expected next,
        when in sync at a header boundary: where the kernel's walker can start."""
        if not self.synced or self._state != _HEADER or self._hdr:
            return None
        return self.offset, self._frame_idx

    def take_walked(self, messages: list, offset: int, total: int) -> list[PsMessage] | None:
        """The messages of a call of `total` bytes at stream `offset` that the kernel's
        walker followed from a message's start to a message's end (agent/calls.py
        whole_messages: (start, end, pieces, keys) per message), read without feeding
        them (walked.py), when this parser is at a message boundary there; the parser
        then stands after the call as if it had been fed. None, with nothing changed:
        feed the call instead."""
        variant = self.variant
        if (self._state != _HEADER or self._tentative or self._hdr or self._frame_idx or self._routed
                or self.offset != offset or (variant is not PBMETA and variant is not RAWMETA)):
            return None
        out, fed = [], 0
        raw = variant is RAWMETA
        for start, end, pieces, keys in messages:
            got = walked_message(start, end, pieces, keys, offset, self.sender_node_id, raw, self.meta_max_bytes,
                                 self.key_sample_max, self._sample_of)
            if got is None:
                return None
            out.append(got[0])
            fed += got[1]
        for m in out:
            end_abs = m.last_byte_offset + 1
            self._msg_bytes += end_abs - self._acct
            self._acct = end_abs
        self._messages += len(out)
        self._fed += fed
        self._gaps += total - fed
        self.offset = offset + total
        return out

    def stats(self) -> ParserStats:
        # while tentative, what the chain consumed is pending: count from the snapshot
        if self._tentative:
            msgs, mb, hb, unp, lost, acct = self._snapshot
        else:
            msgs, mb, hb, unp, lost, acct = (self._messages, self._msg_bytes, self._hs_bytes,
                                             self._unparsed, self._lost, self._acct)
        return ParserStats(self._fed, self._gaps, mb, hb, unp, lost, self.offset - acct, msgs,
                           self._resyncs, self._desyncs, self._rejected)

    # ---------------------------------------------------------------- work loop
    def _run(self, items: list) -> None:
        """Process work items in order; a rollback puts its replay in front."""
        items.reverse()  # a stack: pop() takes the next item
        while items:
            kind, x = items.pop()
            if kind == _DATA:
                more = self._consume(x)
            elif kind == _GAP:
                more = self._on_gap(x)
            else:
                more = self._on_discard(*x)
            if more:
                items.extend(reversed(more))

    def _consume(self, mv: memoryview) -> list | None:
        """Parse `mv`; return work items to run instead of its unparsed rest (rollback,
        or a chain found while hunting), else None."""
        n = len(mv)
        base = self.offset
        pos = 0
        while pos < n:
            st = self._state
            if st == _SKIP:
                r = self._remaining
                if r > n - pos:
                    self._remaining = r - (n - pos)
                    pos = n
                    break
                pos += r
                self._remaining = 0
                self._frame_done(base + pos)
            elif st == _HEADER:
                if self._hdr or (n - pos < 9 and (n - pos < 2 or mv[pos] & FLAG_LONG)):
                    # slow path: a header that may be split across chunks
                    hdr, pos = self._take_header(mv, pos)
                    if hdr is None:
                        break
                    flags, size, hl = hdr[0], self._size_of(hdr), len(hdr)
                    hdr_abs = base + pos - hl
                else:
                    flags = mv[pos]
                    if flags & FLAG_LONG:
                        size = _U64_BE.unpack_from(mv, pos + 1)[0]
                        hl = 9
                    else:
                        size = mv[pos + 1]
                        hl = 2
                    if self._frame_idx and not (flags & ~(FLAG_MORE | FLAG_LONG)) and not self._tentative:
                        # Hot path, inlined: a data frame of a message in a synced stream.
                        pos += hl
                        self._more = more = flags & FLAG_MORE
                        i = self._frame_idx
                        if i == 1 and self._has_keys:
                            pos = self._keys_frame(mv, pos, size, base)
                        else:
                            if i == 2:
                                self._value_bytes = size
                            if size > n - pos:
                                self._state, self._remaining = _SKIP, size
                            else:
                                pos += size
                                if more:
                                    self._frame_idx = i + 1
                                else:
                                    self._finish_message(base + pos)
                        continue
                    if (not self._frame_idx and not (flags & (FLAG_COMMAND | FLAGS_RESERVED))
                            and 0 < size <= self.meta_max_bytes and size <= n - pos - hl):
                        # Hot path, inlined: a message's meta frame, all of it in this chunk.
                        self._frame_hdr = bytes(mv[pos:pos + hl])
                        self._frame_abs = self._msg_first = base + pos
                        self._more = flags & FLAG_MORE
                        pos += hl + size
                        if self._on_meta(mv[pos - size:pos], base + pos) is False:
                            return self._rollback(mv, pos)
                        continue
                    hdr = mv[pos:pos + hl]
                    hdr_abs = base + pos
                    pos += hl
                if self._on_header(flags, size, hdr, hdr_abs) is False:
                    return self._rollback(mv, pos)
            elif st == _KEYS:
                take = min(self._remaining, n - pos)
                self._sampler.add(mv[pos:pos + take])
                pos += take
                self._remaining -= take
                if not self._remaining:
                    self._frame_done(base + pos)
            elif st == _META or st == _COMMAND or st == _KEYS_SMALL:
                need = self._need
                if not self._body and n - pos >= need:
                    body = mv[pos:pos + need]
                    pos += need
                else:
                    take = min(need - len(self._body), n - pos)
                    self._body += mv[pos:pos + take]
                    pos += take
                    if len(self._body) < need:
                        break
                    body = bytes(self._body)
                    self._body.clear()
                if self._on_body(st, body, base + pos) is False:
                    return self._rollback(mv, pos)
            elif st == _HUNT:
                self.offset = base + n
                return self._hunt_feed(mv[pos:], base + pos)
            elif st == _GREETING:
                pos = self._greeting_feed(mv, pos, base)
            else:  # _OPAQUE: CURVE-encrypted traffic
                self._unparsed += n - pos
                self._acct += n - pos
                pos = n
        self.offset = base + n
        if self._tentative:
            self._record(mv)
        elif self._state == _HUNT and len(self._hunt) > self._hunt_scanned:
            # a failure at the very end of mv left bytes to rescan: do it now, not
            # when (if ever) more bytes come
            return self._hunt_feed(mv[n:], base + n)
        return None

    # ---------------------------------------------------------------- frames
    def _take_header(self, mv, pos):
        """Gather a frame header across chunks: (header bytes, new pos) or (None, pos)."""
        h = self._hdr
        n = len(mv)
        if not h:
            h.append(mv[pos])
            pos += 1
        want = 9 if h[0] & FLAG_LONG else 2
        take = min(want - len(h), n - pos)
        h += mv[pos:pos + take]
        pos += take
        if len(h) < want:
            return None, pos
        hdr = bytes(h)
        h.clear()
        return hdr, pos

    @staticmethod
    def _size_of(hdr) -> int:
        return _U64_BE.unpack_from(hdr, 1)[0] if hdr[0] & FLAG_LONG else hdr[1]

    def _on_header(self, flags: int, size: int, hdr, hdr_abs: int):
        """A frame header was read. Returns False to roll back a tentative chain."""
        if flags & FLAGS_RESERVED:
            return self._fail(hdr, hdr_abs)
        self._more = bool(flags & FLAG_MORE)
        if self._frame_idx == 0:
            self._frame_hdr = bytes(hdr)
            self._frame_abs = hdr_abs
            if flags & FLAG_COMMAND:
                if flags & FLAG_MORE or size == 0 or size > COMMAND_MAX_BYTES or self._routed:
                    return self._fail(hdr, hdr_abs)
                self._state, self._need = _COMMAND, size
            else:
                if size == 0 or size > self.meta_max_bytes:
                    return self._fail(hdr, hdr_abs)
                self._msg_first = hdr_abs
                self._state, self._need = _META, size
            return None
        # a data frame of the message in progress
        if flags & FLAG_COMMAND:
            return self._fail(hdr, hdr_abs)
        i = self._frame_idx
        if self._tentative and not self._data_frame_plausible(i, size):
            return False
        if i == 1 and self._has_keys:
            self._keys_frame(b"", 0, size, hdr_abs + len(hdr))
            return None
        if i == 2:
            self._value_bytes = size
        self._state, self._remaining = _SKIP, size
        if size == 0:
            self._frame_done(hdr_abs + len(hdr))
        return None

    def _keys_frame(self, mv, pos: int, size: int, base: int) -> int:
        """The keys frame's header was read (its body starts at mv[pos], stream offset
        base + pos). Samples it at once if it is all here and small, else sets up
        buffering (a few keys) or streaming (many). Returns the new pos."""
        self._num_keys = n = size // KEY_BYTES
        if size <= len(mv) - pos:  # all of it is here: sample in one go
            self._sample = self._sample_of(mv, pos, n)
            pos += size
            self._frame_done(base + pos)
            return pos
        if size <= KEYS_BUFFER_MAX_BYTES:  # cheaper to sample once than to stream
            self._state, self._need = _KEYS_SMALL, size
            return pos
        self._sampler = KeySampler(self.key_sample_max)
        self._state, self._remaining = _KEYS, size
        return pos

    def _data_frame_plausible(self, i: int, size: int) -> bool:
        """Strict checks on data frame i (1-based) of a tentative chain: what ps-lite
        sends (one frame per data_type, keys/vals/lens sizes that agree)."""
        dts = self._dts
        if i > len(dts) or size > TENTATIVE_FRAME_MAX_BYTES:
            return False
        if bool(self._more) != (i < len(dts)):
            return False
        if size % element_bytes(dts[i - 1]):
            return False
        if self._has_keys and self._num_keys:
            if i == 2 and len(dts) == 2 and (size // element_bytes(dts[1])) % self._num_keys:
                return False  # without lens, every key has the same number of values
            if i == 3 and size // element_bytes(dts[2]) != self._num_keys:
                return False  # one len per key
        return True

    def _on_body(self, st: int, body, end_abs: int):
        """A buffered frame body is complete (meta, command or a few keys)."""
        if st == _META:
            return self._on_meta(body, end_abs)
        if st == _COMMAND:
            cmd = parse_command(body)
            if cmd is None:
                return self._fail(self._frame_hdr + bytes(body), self._frame_abs)
            if cmd.name == b"READY":
                self.socket_type = cmd.properties.get(b"socket-type", self.socket_type)
                if b"identity" in cmd.properties:
                    self.identity = ident = cmd.properties[b"identity"]
                    self.sender_node_id = node_id_of_identity(ident)
                    if self.sender_node_id is None and is_node_identity(ident):
                        self._rejected += 1
            elif cmd.name == b"ERROR":
                self.error_reason = cmd.error_reason
            self._hs_bytes += end_abs - self._acct
            self._acct = end_abs
            self._state = _HEADER
            return None
        # _KEYS_SMALL: a keys frame buffered whole
        self._sample = self._sample_of(body, 0, len(body) // KEY_BYTES)
        self._frame_done(end_abs)
        return None

    def _sample_of(self, buf, pos: int, n: int) -> tuple[int, ...]:
        """The sample of n keys at buf[pos:]: all of them if few, else by hash."""
        if n <= self.key_sample_max:
            if not n:
                return ()
            unpack = _KEYS_UNPACK.get(n)
            if unpack is None:
                unpack = _KEYS_UNPACK[n] = struct.Struct("<%dQ" % n).unpack_from
            return tuple(sorted(unpack(buf, pos)))
        return bottom_k(np.frombuffer(buf, "<u8", n, pos), self.key_sample_max)

    def _on_meta(self, body, end_abs: int):
        variant = self.variant
        more = self._more
        if variant is PBMETA:
            meta = read_meta(body)
        else:
            if more and not self._routed:
                ident = routing_id(body)
                if ident is not None:
                    return self._on_routing_id(ident)
            meta = decode_meta(body, variant)
            if self._routed:
                # the sender-id frame comes only before a RawMeta (zmq_van.h)
                if meta is not None and not meta.raw:
                    meta = None
                self._msg_first = self._routed_first
        if meta is None:
            return self._fail(self._frame_hdr + bytes(body), self._frame_abs)
        if more != bool(meta.data_types):  # ps-lite sends one data frame per data_type
            return self._fail(self._frame_hdr + bytes(body), self._frame_abs)
        if self._tentative and self._tent_msgs:
            self._confirm()  # the next meta decodes: the chain holds
        if variant is None and not self._tentative:
            self.variant = RAWMETA if meta.raw else PBMETA
        self._meta = meta
        self._meta_bytes = len(body)
        self._dts = meta.data_types
        self._has_keys = (meta.kind is Kind.DATA and not meta.simple_app and bool(self._dts)
                          and self._dts[0] in KEY_TYPES)
        self._num_keys = self._value_bytes = 0
        self._sample = ()
        self._sampler = None
        if more:
            self._frame_idx = 1
            self._state = _HEADER
        else:
            self._finish_message(end_abs)
        return None

    def _on_routing_id(self, ident: bytes):
        """Frame 0 was a BytePS server's sender id: the meta comes next."""
        self._routed = True
        self._routed_sender = node_id_of_identity(ident)
        if self._routed_sender is None and not self._tentative:   # a replay would count it again
            self._rejected += 1
        self._routed_first = self._msg_first
        self._state = _HEADER
        return None

    def _frame_done(self, end_abs: int) -> None:
        if self._more:
            self._frame_idx += 1
            self._state = _HEADER
        else:
            self._finish_message(end_abs)

    def _finish_message(self, end_abs: int) -> None:
        meta = self._meta
        sampler = self._sampler
        if sampler is not None:
            sample, complete = sampler.result(), sampler.complete
        else:
            sample, complete = self._sample, True
        data_frames = self._frame_idx
        sender = self._routed_sender if self._routed else self.sender_node_id
        msg = ps_message(self._msg_first, end_abs - 1, meta, infer_op(meta, data_frames), sender,
                         self._num_keys, sample, complete, self._value_bytes, data_frames, self._meta_bytes)
        self._messages += 1
        self._msg_bytes += end_abs - self._acct
        self._acct = end_abs
        if self._tentative:
            self._pending.append(msg)
            self._tent_msgs += 1
            if data_frames >= 2 or self._routed:
                # keys and values that agree with data_type and with each other: random
                # bytes practically never do that, so the chain holds without waiting
                # for the next meta (which garbage or a gap may keep from coming). Nor
                # a sender-id frame "ps<digits>" before a RawMeta of the right size with
                # its 13 padding bytes zero (rawmeta.py): BytePS's answers to pushes
                # carry no data frames, and would otherwise wait
                self._confirm()
        else:
            self._out.append(msg)
        self._reset_message()
        self._state = _HEADER

    def _reset_message(self) -> None:
        self._frame_idx = 0
        self._meta = None
        self._routed = False
        self._sampler = None
        if self._hdr:
            self._hdr.clear()
        if self._body:
            self._body.clear()

    # ---------------------------------------------------------------- greeting
    def _greeting_feed(self, mv, pos: int, base: int) -> int:
        g = self._body
        take = min(GREETING_BYTES - len(g), len(mv) - pos)
        g += mv[pos:pos + take]
        pos += take
        greeting = parse_greeting(g) if len(g) == GREETING_BYTES else None
        if greeting is None and not (len(g) < GREETING_BYTES and greeting_prefix_ok(g)):
            # Not a greeting (a stream we joined without knowing it): hunt from its
            # first byte, which may well start a message.
            prefix = bytes(g)
            g.clear()
            self._start_hunt(prefix, base + pos - len(prefix))
            return pos
        if greeting is None:
            return pos
        g.clear()
        self.greeting = greeting
        self._hs_bytes += GREETING_BYTES
        self._acct = base + pos
        self._state = _HEADER if greeting.mechanism in CLEAR_MECHANISMS else _OPAQUE
        return pos
