"""How the ps-lite stream parser loses and finds sync (a mixin of PsliteStreamParser,
kept apart so that parser.py reads as the walk of a healthy stream).

- Losing sync: bytes that make no sense where a frame should be (`_fail`), a gap
  that does not fall inside a frame the parser skips anyway (`_on_gap`).
- Hunting: scan a bounded window for where a message may start (hunt.candidates),
  decode the meta there (`_judge`), and follow the first good candidate.
- Tentative chains: what follows a candidate is parsed with strict checks and its
  messages are held back until the chain is confirmed (`_confirm`). If a link
  breaks, the counters go back to where the chain started, and the bytes it took
  (a replay, up to `replay_max_bytes`; beyond that only counted) are hunted again
  from the byte after the candidate (`_rollback`).
"""
from __future__ import annotations

import struct
from heapq import heappop, heappush

from .hunt import LONG_SCAN_BYTES, SHORT_TAIL_BYTES, TAIL_BYTES, candidates, short_candidates
from parsers.keysample import KeySampler
from .message import BytepsMessage
from .rawmeta import PBMETA, RAWMETA, ROUTING_ID_BYTES_MAX, ROUTING_ID_BYTES_MIN, decode_meta, raw_candidates, routing_id
from .states import _DATA, _DISCARD, _GAP, _GREETING, _HEADER, _HUNT, _KEYS, _KEYS_SMALL, _SKIP
from .zmtp import FLAG_LONG, FLAG_MORE, GREETING_BYTES, parse_greeting

_U64_BE = struct.Struct(">Q")
# what a hunting candidate turned out to be
_REJECT, _NEED_MORE, _ACCEPT_FRAME, _ACCEPT_GREETING = range(4)


class ResyncMixin:
    # ---------------------------------------------------------------- losing sync
    def _fail(self, prefix, prefix_abs: int):
        """Bytes at `prefix_abs` (`prefix`: the ones already taken from the stream) make
        no sense here. Tentative: roll back (returns False). Synced: what came before in
        this message is unparsed; hunt again from the byte after `prefix_abs`."""
        if self._tentative:
            return False
        self._desyncs += 1
        self._unparsed += prefix_abs + 1 - self._acct
        self._acct = prefix_abs + 1
        self._start_hunt(prefix[1:], prefix_abs + 1)
        return None

    def _start_hunt(self, window, window_abs: int) -> None:
        """Go hunting; `window` (bytes from stream offset `window_abs`) is scanned first."""
        self._reset_message()
        self._state = _HUNT
        self._hunt = bytearray(window)
        self._hunt_base = window_abs
        self._hunt_scanned = 0
        self._hunt_scanned_long = 0
        self._undecided = {}
        self._undecided_by_end = []
        self._undecided_at = []

    def _lose_sync(self) -> None:
        """Drop whatever is in progress as unparsed (a gap or discard follows)."""
        self._unparsed += self.offset - self._acct
        self._acct = self.offset
        self._start_hunt(b"", self.offset)

    def _on_gap(self, n: int) -> list | None:
        st = self._state
        if st == _KEYS_SMALL and self._need - len(self._body) >= n:
            # stream the few keys we have through a sampler, which can skip
            s = self._sampler = KeySampler(self.key_sample_max)
            s.add(self._body)
            self._remaining = self._need - len(self._body)
            self._body.clear()
            st = self._state = _KEYS
        if st in (_SKIP, _KEYS) and self._remaining >= n:
            if st == _KEYS:
                self._sampler.skip(n)
            self._remaining -= n
            self.offset += n
            if self._tentative:
                self._record(None, n)
            if not self._remaining:
                self._frame_done(self.offset)
            return None
        if self._tentative:
            return self._rollback(None, 0) + [(_GAP, n)]
        self._lose_sync()
        self._lost += n
        self.offset += n
        self._acct = self._hunt_base = self.offset
        return None

    def _on_discard(self, unparsed: int, lost: int) -> list | None:
        """Bytes past a replay's cap: counted, and a break in the stream."""
        if self._tentative:
            return self._rollback(None, 0) + [(_DISCARD, (unparsed, lost))]
        self._lose_sync()
        self._unparsed += unparsed
        self._lost += lost
        self.offset += unparsed + lost
        self._acct = self._hunt_base = self.offset
        return None

    # ---------------------------------------------------------------- hunting
    def _hunt_feed(self, mv, mv_abs: int) -> list | None:
        """Scan for a message start (or a greeting); on one, return the window from it
        as work to parse (tentatively); else keep only what may still start one.

        A candidate whose meta is not all here yet stays undecided (kept, judged again
        once the bytes it needs have come) but does not stop the scan: a later candidate
        that is whole and valid wins, since a real meta rarely contains a valid-looking
        message. Each byte is scanned once and each candidate judged at most twice, so
        hunting costs the same in 10-byte reads as in 1,500-byte ones (judging every
        undecided candidate again on every read cost 14 s against 0.07 s for 65 KB of
        headers that each claim a 65,535-byte meta)."""
        buf = self._hunt
        if not buf:
            self._start_hunt(b"", mv_abs)
            buf = self._hunt
        buf += mv
        base = self._hunt_base
        n = len(buf)
        undecided = self._undecided
        # earlier bytes were scanned already, except matches that did not fit in them;
        # long headers and greetings only every LONG_SCAN_BYTES (see hunt.py)
        scanned_long = self._hunt_scanned_long
        if n - scanned_long >= LONG_SCAN_BYTES:
            start = max(0, min(self._hunt_scanned - SHORT_TAIL_BYTES, scanned_long - TAIL_BYTES))
            found = candidates(buf, start)
            if self.variant is not PBMETA:
                # BytePS's metas are at least 90 bytes with their header, so the long
                # scan finds them before they can be judged (rawmeta._RAW_PATTERNS)
                raw = raw_candidates(buf, start)
                if raw:
                    found = sorted(set(found).union(raw))
            scanned_long = n
        else:
            found = short_candidates(buf, max(0, self._hunt_scanned - SHORT_TAIL_BYTES))
        if undecided:
            if found:
                found = [j for j in found if base + j not in undecided]
            by_end = self._undecided_by_end
            end = base + n
            if by_end[0][0] <= end:   # some have all the bytes they need
                ready = []
                while by_end and by_end[0][0] <= end:
                    at = heappop(by_end)[1]
                    del undecided[at]
                    ready.append(at - base)
                found = sorted(ready + found) if found or len(ready) > 1 else ready
        for j in found:
            # the bytes a candidate needs before it can be judged (see _judge)
            flags = buf[j]
            if flags == 0xFF:
                need, size = j + GREETING_BYTES, 0
            else:
                need, size = self._frame_need(buf, j)
                if self.variant is not PBMETA and need <= n and self._routing_frame(buf, j):
                    # a sender-id frame: judged with the meta frame after it
                    need, size = self._frame_need(buf, need)
            if need > n and size <= self.meta_max_bytes:
                at = base + j
                undecided[at] = base + need
                heappush(self._undecided_by_end, (base + need, at))
                heappush(self._undecided_at, at)
                continue
            verdict = self._judge(buf, j)
            if verdict != _REJECT:
                self._drop_hunted(j)
                rest = bytes(buf)
                buf.clear()
                self._undecided, self._undecided_by_end, self._undecided_at = {}, [], []
                self.offset = base + j
                if verdict == _ACCEPT_GREETING:
                    self._resyncs += 1
                    self._state = _GREETING
                else:
                    self._begin_tentative(base + j)
                return [(_DATA, memoryview(rest))]
        # keep what may still start a match, or is not yet scanned for long ones
        k = min(n, scanned_long) - TAIL_BYTES
        if undecided:
            first = self._undecided_at
            while first[0] not in undecided:
                heappop(first)
            k = min(k, first[0] - base)
        if k > 0:
            self._drop_hunted(k)
        else:
            k = 0
        self._hunt_scanned = n - k
        self._hunt_scanned_long = scanned_long - k
        return None

    def _drop_hunted(self, k: int) -> None:
        """The first k bytes of the hunting window cannot start anything: unparsed."""
        if k:
            del self._hunt[:k]
            self._unparsed += k
            self._hunt_base += k
            self._acct = self._hunt_base

    @staticmethod
    def _frame_need(buf, j: int) -> tuple[int, int]:
        """(end offset in buf, size) of the frame whose header is at buf[j]: where its
        body would end, or, with too few bytes for its header, where the header does
        (judged again then)."""
        if len(buf) - j < 2 or (buf[j] & FLAG_LONG and len(buf) - j < 9):
            return j + (9 if len(buf) > j and buf[j] & FLAG_LONG else 2), 0
        if buf[j] & FLAG_LONG:
            size = _U64_BE.unpack_from(buf, j + 1)[0]
            return j + 9 + size, size
        size = buf[j + 1]
        return j + 2 + size, size

    @staticmethod
    def _routing_frame(buf, j: int) -> bool:
        """A BytePS sender-id frame ("ps<digits>", MORE) at buf[j] (rawmeta.py)."""
        size = buf[j + 1]
        return (buf[j] == FLAG_MORE and ROUTING_ID_BYTES_MIN <= size <= ROUTING_ID_BYTES_MAX
                and routing_id(buf[j + 2:j + 2 + size]) is not None)

    def _judge(self, buf, j: int) -> int:
        if buf[j] == 0xFF:
            if len(buf) - j < GREETING_BYTES:
                return _NEED_MORE
            return _ACCEPT_GREETING if parse_greeting(buf[j:j + GREETING_BYTES]) else _REJECT
        variant = self.variant
        routed = variant is not PBMETA and len(buf) - j >= 2 + ROUTING_ID_BYTES_MIN and self._routing_frame(buf, j)
        if routed:
            j += 2 + buf[j + 1]
            if len(buf) - j < 2:
                return _NEED_MORE
        long = buf[j] & FLAG_LONG
        hl = 9 if long else 2
        if len(buf) - j < hl:
            return _NEED_MORE
        size = _U64_BE.unpack_from(buf, j + 1)[0] if long else buf[j + 1]
        if size > self.meta_max_bytes:
            return _REJECT
        if len(buf) - j < hl + size:
            return _NEED_MORE
        meta = decode_meta(memoryview(buf)[j + hl:j + hl + size], RAWMETA if routed else variant)
        if meta is None:
            return _REJECT
        if bool(buf[j] & FLAG_MORE) != bool(meta.data_types):
            return _REJECT
        return _ACCEPT_FRAME

    # ---------------------------------------------------------------- tentative chains
    def _begin_tentative(self, start_abs: int) -> None:
        self._tentative = True
        self._tent_start = start_abs
        self._tent_msgs = 0
        self._snapshot = (self._messages, self._msg_bytes, self._hs_bytes, self._unparsed,
                          self._lost, self._acct)
        self._pending = []
        self._replay = []
        self._replay_bytes = 0
        self._replay_over = [0, 0]
        self._state = _HEADER
        self._reset_message()

    def _record(self, data, n_gap: int = 0) -> None:
        """Keep what a tentative chain consumed (`data`, or `n_gap` lost bytes), up to
        the cap, for a rollback: the replay is always a contiguous prefix of the chain
        (copied, as the caller may reuse its buffer); the rest is only counted."""
        over = self._replay_over
        n_data = len(data) if data is not None else 0
        if over[0] or over[1]:
            over[0] += n_data
            over[1] += n_gap
            return
        if data is None:
            self._replay.append((_GAP, n_gap))
            return
        room = self.replay_max_bytes - self._replay_bytes
        take = min(room, n_data)
        if take > 0:
            self._replay.append((_DATA, bytes(data[:take])))
            self._replay_bytes += take
        over[0] += n_data - take

    def _confirm(self) -> None:
        if self.variant is None and self._pending:
            self.variant = RAWMETA if isinstance(self._pending[0], BytepsMessage) else PBMETA
        self._tentative = False
        self._resyncs += 1
        self._out.extend(self._pending)
        self._pending = []
        self._replay = []

    def _rollback_counters(self) -> None:
        (self._messages, self._msg_bytes, self._hs_bytes, self._unparsed, self._lost,
         self._acct) = self._snapshot
        self._tentative = False
        self._pending = []

    def _rollback(self, mv, pos: int) -> list:
        """The tentative chain broke (in `mv` at `pos`, or at a gap when mv is None): go
        back to the byte after the chain's start and hunt again over what it consumed."""
        self._rollback_counters()
        items = self._replay
        self._replay = []
        over_unparsed, over_lost = self._replay_over
        rest = None
        if mv is not None:
            # mv[:pos] was consumed by the chain (replayed up to the cap); mv[pos:] is new
            room = 0 if (over_unparsed or over_lost) else self.replay_max_bytes - self._replay_bytes
            if pos <= room:
                items.append((_DATA, mv))
            else:
                if room > 0:
                    items.append((_DATA, mv[:room]))
                over_unparsed += pos - max(room, 0)
                rest = mv[pos:]
        if over_unparsed or over_lost:
            items.append((_DISCARD, (over_unparsed, over_lost)))
        if rest is not None and len(rest):
            items.append((_DATA, rest))
        # The replay starts with the chain's first bytes (the cap is >= 1 byte), and
        # the first of them is the one byte known not to start a message.
        kind, first = items[0]
        items[0] = (kind, first[1:])
        self._unparsed += 1
        self.offset = self._acct = self._tent_start + 1
        self._start_hunt(b"", self.offset)
        return items
