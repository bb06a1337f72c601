"""One direction of one TCP connection as a capture saw it -> its bytes in stream order,
with gaps, and the capture time of every byte.

    d = Reassembly(parser)                  # a stream parser (parsers/protocol.py)
    msgs = d.segment(seg_offset, payload, missing, ts_ns)   # messages the parser completed
    msgs += d.finish()                      # at the end of the capture: holes become gaps
    d.time_of(offset)                       # capture time of the segment that carried that byte

Offsets count from the byte after the SYN (from seq 1 when the SYN was not captured),
as agent/streams.py's do; the caller unwraps sequence numbers into them
(`unwrap`). A segment ahead of the next expected byte waits (out of order); one
behind it is a retransmission, and only its bytes not yet seen are new. A hole that
stays open while more than OOO_MAX_BYTES or OOO_MAX_SEGMENTS wait beyond it (or the
capture point's directions hold more than HELD_MAX_BYTES together), or to the end of
the capture, is lost (the capture dropped the packet): the parser is told of a gap of
that size and resynchronises if it hid a header. Bytes that the snap length cut off a
captured segment (`missing`) are a gap too, counted apart. A segment beyond WINDOW_MAX
either way belongs to no stream here (garbage, a forged sequence number) and is
dropped, counted.

A byte's time is the capture time of the first segment seen carrying it (a
retransmission does not move it): at a sender's capture point that is when the
byte first left for the wire, at a receiver's when it first arrived.
"""
from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from parsers.sniff import SniffingParser

MASK32 = 0xFFFFFFFF
OOO_MAX_BYTES = 8 << 20      # held out of order per direction before the hole is declared lost
OOO_MAX_SEGMENTS = 8192
HELD_MAX_BYTES = 256 << 20   # held out of order by all directions of a capture point together
MARKS_MAX = 65536            # segment times kept per direction for messages still in progress
# A segment this far from the next expected byte is no part of the stream (a receiver grants
# far less window: Linux's tcp_rmem max is 6 MiB, 32 MiB on tuned hosts): counted, dropped,
# unless RESYNC_SEGMENTS of them in a row continue one another (the capture lost that much).
WINDOW_MAX = 64 << 20
RESYNC_SEGMENTS = 4
# In-order bytes go to the parser this many at a time, or at flush(): a parser's cost is
# mostly per call (its messages come later, with the same times: each segment's time is
# kept apart). The capture point flushes a direction as soon as a segment of another one
# comes, so messages still come out in the order of the capture (what learns node ids
# from them relies on it).
FEED_BYTES = 64 << 10


def unwrap(seq: int, base: int, near: int) -> int:
    """The stream offset with these low 32 bits (seq - base - 1 mod 2**32) nearest `near`."""
    off = (near & ~MASK32) | ((seq - base - 1) & MASK32)
    if off < near - (1 << 31):
        off += 1 << 32
    elif off > near + (1 << 31):
        off -= 1 << 32
    return off


@dataclass(slots=True)
class DirectionStats:
    segments: int = 0            # segments with payload
    captured_bytes: int = 0      # their payload as captured (retransmitted and dropped ones too)
    bytes: int = 0               # payload bytes the segments carried into the stream (captured or cut off)
    retransmitted_bytes: int = 0  # bytes seen again (their first copy was used)
    ahead_segments: int = 0      # arrived ahead of the next expected byte (reordered, or after a loss)
    lost_bytes: int = 0          # holes no segment filled (the capture missed them)
    truncated_bytes: int = 0     # cut off by the snap length
    out_of_window_segments: int = 0   # beyond WINDOW_MAX from the stream: dropped


@dataclass(slots=True)
class HeldBytes:
    """What every direction of a capture point holds out of order, against HELD_MAX_BYTES."""
    held: int = 0
    limit: int = HELD_MAX_BYTES


class Reassembly:
    def __init__(self, parser, start_offset: int, held: HeldBytes | None = None):
        self.parser = parser
        self.next = start_offset          # the next byte the parser expects
        self.stats = DirectionStats()
        self.held = held if held is not None else HeldBytes()
        self._far = (-1, 0)               # (end offset, count) of the latest out-of-window run
        self._unfed: list[bytes] = []     # in order, not yet given to the parser (FEED_BYTES at a time)
        self._unfed_bytes = 0
        self._ooo: dict[int, tuple[bytes, int, int]] = {}   # offset -> (captured, missing, ts_ns)
        self._ooo_heap: list[int] = []
        self._ooo_bytes = 0
        self._mark_ends: list[int] = []   # end offsets of delivered segments, ascending
        self._mark_ts: list[int | None] = []
        self._marks_dropped_to = start_offset   # bytes before this have no time any more

    def segment(self, off: int, payload, missing: int, ts_ns: int) -> list:
        """A segment with payload at stream offset `off`; returns what the parser completed."""
        st = self.stats
        st.segments += 1
        st.captured_bytes += len(payload)
        length = len(payload) + missing
        end = off + length
        if off - self.next > WINDOW_MAX or self.next - end > WINDOW_MAX:
            st.out_of_window_segments += 1
            run = self._far[1] + 1 if off == self._far[0] else 1
            self._far = (end, run)
            if run < RESYNC_SEGMENTS or off < self.next:
                return []
            # the stream went on that far: what lay between is lost
            out = self.finish_holes()
            hole = off - self.next
            st.lost_bytes += hole
            self.next = off
            self._mark(off, None)
            return out + self._gap(hole) + self._deliver(off, payload, missing, ts_ns)
        if end <= self.next:
            st.retransmitted_bytes += length
            return []
        if off > self.next:
            st.ahead_segments += 1
            old = self._ooo.get(off)
            if old is not None:
                if len(old[0]) + old[1] >= length:
                    st.retransmitted_bytes += length
                    return []
                self._hold(-len(old[0]))
            else:
                heapq.heappush(self._ooo_heap, off)
            self._ooo[off] = (bytes(payload), missing, ts_ns)
            self._hold(len(payload))
            out: list = []
            while self._ooo and (self._ooo_bytes > OOO_MAX_BYTES or len(self._ooo) > OOO_MAX_SEGMENTS
                                 or self.held.held > self.held.limit):
                out += self._skip_hole()
            return out
        out = self._deliver(off, payload, missing, ts_ns)
        if self._ooo:
            out += self._drain()
        return out

    def _deliver(self, off: int, payload, missing: int, ts_ns: int) -> list:
        st = self.stats
        parser = self.parser
        skip = self.next - off   # >= 0: bytes of it already delivered
        cap = len(payload)
        out: list = []
        if skip:
            st.retransmitted_bytes += min(skip, cap + missing)
        end = off + cap + missing
        if skip < cap:
            self._unfed.append(payload[skip:] if skip else payload)
            self._unfed_bytes += cap - skip
            if self._unfed_bytes >= FEED_BYTES:
                out += self._feed()
        lost = min(missing, end - max(self.next, off + cap))
        if lost > 0:
            st.truncated_bytes += lost
            out += self._gap(lost)
        st.bytes += end - self.next
        self.next = end
        self._mark(end, ts_ns)
        return out

    def _mark(self, end: int, ts_ns: int | None) -> None:
        self._mark_ends.append(end)
        self._mark_ts.append(ts_ns)
        if len(self._mark_ends) > MARKS_MAX:
            drop = MARKS_MAX // 4
            self._marks_dropped_to = self._mark_ends[drop - 1]
            del self._mark_ends[:drop], self._mark_ts[:drop]

    def flush(self) -> list:
        """What waits in order goes to the parser in one piece; returns its messages."""
        return self._feed()

    def _feed(self) -> list:
        if not self._unfed:
            return []
        data = self._unfed[0] if len(self._unfed) == 1 else b"".join(self._unfed)
        self._unfed, self._unfed_bytes = [], 0
        parser = self.parser
        out = parser.feed(data)
        if type(parser) is SniffingParser and parser.chosen is not None:
            self.parser = parser.chosen   # it has seen every byte: fed directly from now on (as agent/streams.py)
        return out

    def _gap(self, n: int) -> list:
        return self._feed() + self.parser.gap(n)

    def _hold(self, n: int) -> None:
        self._ooo_bytes += n
        self.held.held += n

    def _drain(self) -> list:
        """Delivers the waiting segments that the next expected byte has reached."""
        out: list = []
        heap, ooo = self._ooo_heap, self._ooo
        while heap and heap[0] <= self.next:
            off = heapq.heappop(heap)
            data, missing, ts = ooo.pop(off)
            self._hold(-len(data))
            if off + len(data) + missing > self.next:
                out += self._deliver(off, data, missing, ts)
            else:
                self.stats.retransmitted_bytes += len(data) + missing
        return out

    def _skip_hole(self) -> list:
        """The hole before the first waiting segment is lost: a gap, then what follows it."""
        hole = self._ooo_heap[0] - self.next
        self.stats.lost_bytes += hole
        self.next += hole
        self._mark(self.next, None)   # bytes of a hole have no time
        out = self._gap(hole)
        return out + self._drain()

    def finish_holes(self) -> list:
        """Every hole still open is lost: what waits beyond them goes to the parser."""
        out: list = []
        while self._ooo:
            out += self._skip_hole()
        return out

    def finish(self) -> list:
        """The capture ended: every hole still open is lost; the parser is closed."""
        out = self.finish_holes()
        return out + self._feed() + self.parser.close()

    def time_of(self, offset: int) -> int | None:
        """Capture time of the segment that carried the byte at `offset` (None: not kept, or
        the byte was in a hole)."""
        i = bisect.bisect_right(self._mark_ends, offset)
        if i >= len(self._mark_ends) or offset < self._marks_dropped_to:
            return None
        return self._mark_ts[i]

    def release(self, offset: int) -> None:
        """Messages up to `offset` are out: their segments' times are not needed again."""
        i = bisect.bisect_right(self._mark_ends, offset)
        if i:
            self._marks_dropped_to = self._mark_ends[i - 1]
            del self._mark_ends[:i], self._mark_ts[:i]
