"""A stream parser that finds out which protocol the stream speaks, then is that
protocol's parser.

From a stream's first byte: its first bytes decide (registry.detect); a stream no
protocol starts like is opaque from there on (counted, never parsed). Joined
mid-stream (or a gap before the first bytes decided): every registered parser
hunts in it side by side until one recognises the stream; that one goes on alone.
Once `chosen` is set the caller can feed that parser directly (agent/streams.py
does), since it has seen every byte this one was given.
"""
from __future__ import annotations

from .protocol import UNRECOGNISED, ParserStats
from .registry import PROTOCOLS, detect

DETECT_BYTES_MAX = 16   # more than any protocol's signature: undecided after this, opaque
# a stream joined mid-stream that no hunter recognised in this many bytes is taken as
# opaque (hunting costs every parser's scan per byte; a parameter server's streams
# sync within their first messages) unless a hunter holds more than HUNT_PENDING_MAX
# bytes pending: a candidate chain it follows (a message with a data frame of many MB)
HUNT_BYTES_MAX = 4 << 20
HUNT_PENDING_MAX = 1 << 20


class OpaqueStream:
    """A stream in no protocol pslat knows: its bytes are counted, unparsed."""
    PROTOCOL = None
    synced = False

    def __init__(self, *, mid_stream: bool = False, start_offset: int = 0, fed_bytes: int = 0,
                 gap_bytes: int = 0, **_):
        """fed_bytes, gap_bytes: what the stream moved before this took it over."""
        self.offset = start_offset
        self._fed, self._gaps = fed_bytes, gap_bytes

    def feed(self, data) -> list:
        self._fed += len(data)
        self.offset += len(data)
        return []

    def gap(self, n_bytes: int) -> list:
        if n_bytes > 0:
            self._gaps += n_bytes
            self.offset += n_bytes
        return []

    unparsed = skip = gap

    def close(self) -> list:
        return []

    def recognised(self) -> bool:
        return False

    def next_sync(self):
        return None

    def stats(self) -> ParserStats:
        return ParserStats(self._fed, self._gaps, 0, 0, self._fed, self._gaps, 0, 0, 0, 0)


class SniffingParser:
    """See the module docstring. `chosen`: the parser that took over (None while
    undecided); `verdict`: its protocol's name, UNRECOGNISED, or None while undecided."""
    PROTOCOL = None

    def __init__(self, *, mid_stream: bool = False, start_offset: int = 0, key_sample_max: int = 16):
        self.key_sample_max = key_sample_max
        self.offset = start_offset
        self.chosen = None
        self.verdict: str | None = None
        self._head = bytearray()         # first bytes, from the stream's start, until they decide
        self._hunters: dict = {}         # name -> parser hunting mid-stream
        self._fed = self._gaps = 0
        if mid_stream:
            self._hunt(start_offset)

    def _make(self, name: str, mid_stream: bool, start: int):
        return PROTOCOLS[name](mid_stream=mid_stream, start_offset=start, key_sample_max=self.key_sample_max)

    def _hunt(self, start: int) -> None:
        self._hunters = {name: self._make(name, True, start) for name in PROTOCOLS}

    def _choose(self, parser, verdict: str) -> None:
        self.chosen, self.verdict = parser, verdict
        self._hunters = {}

    # -- the stream parser's calls ------------------------------------------------
    def feed(self, data) -> list:
        if self.chosen is not None:
            return self.chosen.feed(data)
        self._fed += len(data)
        self.offset += len(data)
        if self._hunters:
            return self._each(lambda p: p.feed(data))
        self._head += data
        name = detect(self._head[:DETECT_BYTES_MAX])
        if name is None and len(self._head) < DETECT_BYTES_MAX:
            return []
        start = self.offset - len(self._head)
        if name is None or name == UNRECOGNISED:
            p = OpaqueStream(start_offset=start)
            name = UNRECOGNISED
        else:
            p = self._make(name, False, start)
        head, self._head = bytes(self._head), bytearray()
        self._choose(p, name)
        return p.feed(head)

    def gap(self, n_bytes: int) -> list:
        return self._lose(n_bytes, "gap")

    def unparsed(self, n_bytes: int) -> list:
        return self._lose(n_bytes, "unparsed")

    def skip(self, n_bytes: int) -> list:
        return self._lose(n_bytes, "skip")

    def _lose(self, n_bytes: int, how: str) -> list:
        if self.chosen is not None:
            return getattr(self.chosen, how)(n_bytes)
        if n_bytes <= 0:
            return []
        if not self._hunters:
            # the first bytes did not decide before the stream broke: hunt from them on
            start = self.offset - len(self._head)
            self._hunt(start)
            head, self._head = bytes(self._head), bytearray()
            if head:
                self._each(lambda p: p.feed(head))
        self._gaps += n_bytes
        self.offset += n_bytes
        return self._each(lambda p: getattr(p, how)(n_bytes))

    def _each(self, work) -> list:
        """Work on every hunter; the first (in registry order) that recognises the
        stream is chosen and its messages returned."""
        won = None
        for name, p in self._hunters.items():
            got = work(p)
            if won is None and (got or p.recognised()):
                won = (name, p, got)
        if won is None:
            if self._fed + self._gaps > HUNT_BYTES_MAX and all(
                    p.stats().pending_bytes <= HUNT_PENDING_MAX for p in self._hunters.values()):
                self._choose(OpaqueStream(start_offset=self.offset, fed_bytes=self._fed, gap_bytes=self._gaps),
                             UNRECOGNISED)
            return []
        name, p, got = won
        self._choose(p, name)
        return got

    def close(self) -> list:
        if self.chosen is not None:
            return self.chosen.close()
        if self._hunters:
            return self._each(lambda p: p.close())
        return []

    @property
    def synced(self) -> bool:
        return self.chosen is not None and self.chosen.synced

    def recognised(self) -> bool:
        return self.chosen is not None and self.chosen.recognised()

    def next_sync(self):
        return self.chosen.next_sync() if self.chosen is not None else None

    def stats(self) -> ParserStats:
        if self.chosen is not None:
            return self.chosen.stats()
        if self._hunters:   # undecided: as the first protocol's hunter counts them
            return next(iter(self._hunters.values())).stats()
        return ParserStats(self._fed, 0, 0, 0, 0, 0, self._fed, 0, 0, 0)
