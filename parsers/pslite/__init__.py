"""parsers/pslite: ps-lite over ZMTP 3, from the bytes of one TCP direction to messages.

    p = PsliteStreamParser()            # or mid_stream=True, start_offset=...
    for chunk in chunks: msgs += p.feed(chunk)
    p.gap(n_bytes)                      # bytes the agent lost
    p.stats()                           # messages, unparsed, lost, resyncs...
"""
from .message import Kind, NodeInfo, Op, PsMessage
from .parser import ParserStats, PsliteStreamParser

__all__ = ["Kind", "NodeInfo", "Op", "ParserStats", "PsMessage", "PsliteStreamParser"]
