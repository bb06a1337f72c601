"""What a protocol package gives the rest of pslat (DESIGN.md, "Protocols").

A protocol is a package under parsers/ (parsers/pslite, parsers/brpc, ...) with a
stream parser and a message type, registered in parsers/registry.py. The agent,
the run dir and the reports use only what is named here; a protocol's own fields
travel in its messages' `detail()`.

The stream parser (one direction of one TCP connection):

    p = Parser(mid_stream=False, start_offset=0, key_sample_max=16)
    p.feed(bytes) / p.gap(n) / p.unparsed(n) / p.skip(n) / p.close()   -> [messages]
                       gap: n bytes lost; unparsed: n bytes seen elsewhere and judged
                       to hold no message; skip: n bytes inside a message's body that
                       the kernel's walker went past without copying (known, not lost)
    p.stats()          ParserStats: fed_bytes + gap_bytes == message_bytes +
                       handshake_bytes + unparsed_bytes + lost_bytes + pending_bytes
    p.recognised()     the stream spoke this protocol (a message or handshake parsed)
    p.synced           following the stream (not hunting)
    p.next_sync()      (stream offset, unit index) where the kernel's walker could
                       start following this direction, or None
    Parser.PROTOCOL    the registered name
    p.take_walked(messages, offset, n)   optional: the messages of a call of n bytes at
                       `offset` that the kernel's walker followed from a message's start
                       to a message's end, from its items (agent/calls.py
                       whole_messages), the same as feeding the call would give; None
                       (nothing changed) when it cannot tell them exactly: feed it then

Bytes come in any chunking, with gaps, from the stream's start or from anywhere
in it (mid_stream: the parser hunts for sync); offsets count from the byte after
the SYN.

A message (one request, response or control message on one direction):

    protocol           the registered name
    first_byte_offset, last_byte_offset (inclusive), end_offset, total_bytes
    control            a message of the protocol's own upkeep, not a request/response
    request            True, False (a response), or None (not known)
    op                 one of OPS; op_name: the protocol's own name for it, or None
    pair_scope         PAIR_NODES or PAIR_CONNECTION (below)
    call_space, call_id   the ids a response repeats from its request (int64 or None):
                       call_id the call's number, call_space the space it counts in
                       (a protocol with one counter per connection leaves it None)
    sender_node_id     the sending node's id when the message itself names it, else None
    nodes              node announcements it carries: tuple of objects with
                       node_id, hostname, port (empty for most protocols)
    num_keys, key_sample (sorted, chosen by hash), key_sample_complete, value_bytes
    detail()           the protocol's own fields as a small dict of str -> int | str | bool

Pairing a response with its request:
- PAIR_CONNECTION: on the same TCP connection, by (call_space, call_id): brpc's
  correlation id, an HTTP/2 stream id;
- PAIR_NODES: across connections, by (call_space, call_id) and the two node ids
  (request: sender -> recver; response: recver <- sender): ps-lite, where each
  node sends on its own connection into the other's.
"""
from __future__ import annotations

from dataclasses import dataclass

# the shared vocabulary of `op`: "pushpull" for variants that fuse both, "simple" for
# data that is neither (ps-lite's SimpleApp), "rpc" for a call of any other method,
# "unknown" for a response whose op the bytes do not tell (its request's, once paired)
OPS = ("push", "pull", "pushpull", "control", "simple", "rpc", "unknown")
DATA_OPS = ("push", "pull", "pushpull")

PAIR_NODES = "nodes"
PAIR_CONNECTION = "connection"
PAIR_SCOPES = (PAIR_NODES, PAIR_CONNECTION)

# what a connection's protocol column says when no parser is named
UNRECOGNISED = "unrecognised"   # bytes moved and no registered parser understood them
NO_BYTES = "none"               # no byte moved (or none was captured)


def key_text(key: int) -> str:
    """A key id as every view shows it (report tables, `pslat top`): hexadecimal, as
    parameter servers' keys are often ranges of a 64-bit space split among servers."""
    return f"{int(key):#x}"


@dataclass(slots=True)
class ParserStats:
    """Byte and message counters of one stream (all since the parser was made).

    fed_bytes + gap_bytes == message_bytes + handshake_bytes + unparsed_bytes
                             + lost_bytes + pending_bytes
    (gap bytes that fell inside a body the parser walks anyway are not lost: they are
    part of that message's bytes).
    """
    fed_bytes: int
    gap_bytes: int
    message_bytes: int
    handshake_bytes: int  # a protocol's greetings and commands (ZMTP's), else 0
    unparsed_bytes: int  # seen but not understood: garbage, partial messages cut by a gap
    lost_bytes: int  # announced lost by gap() and not absorbed inside a walked body
    pending_bytes: int  # in a message or a hunting window still in progress
    messages: int
    resyncs: int  # times sync was found by hunting (mid-stream start, after a gap or garbage)
    desyncs: int  # times a synced stream met bytes that made no sense and went hunting
    # values from the wire refused because no column could hold them (ps-lite: a READY
    # identity "ps<digits>" whose node id does not fit the sender column's int32)
    values_rejected: int = 0
