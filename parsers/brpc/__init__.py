"""parsers/brpc: brpc's baidu_std (as PaddlePaddle's parameter server uses it), from the
bytes of one TCP direction to messages.

    p = BrpcStreamParser()              # or mid_stream=True, start_offset=...
    for chunk in chunks: msgs += p.feed(chunk)
    p.gap(n_bytes)                      # bytes the agent lost
    p.stats()                           # messages, unparsed, lost, resyncs...

A response pairs with the request of the same correlation_id on the same connection
(PAIRING_SCOPE).
"""
from .parser import PAIRING_SCOPE, PROTOCOL, BrpcMessage, BrpcStreamParser, ParserStats

__all__ = ["PAIRING_SCOPE", "PROTOCOL", "BrpcMessage", "BrpcStreamParser", "ParserStats"]
