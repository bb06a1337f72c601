"""Maps of the agent's user space that outside events can grow, kept bounded.

DESIGN.md ("What the agent trusts"): every per-connection state has a cap, an
idle expiry and a counter. The maps are OrderedDicts that move what they use to
the end, so they hold their least recently used entries first: the cap evicts
from the front and an expiry stops at the first live entry, one step each, never
a scan. (A plain dict would do the same with pop and re-insert, but finding its
first entry walks over the deleted slots in front of it: quadratic under churn.)
What a map's owner does at an eviction (end a parser, emit a row) stays with the
owner; this only says what went.
"""
from __future__ import annotations

from collections import OrderedDict

# How long a connection may be idle before its state is dropped (agent.streams'
# parsers, agent.live's open connections). A ps-lite connection idle this long that
# speaks again comes back as a mid-stream join (its ISNs come with every call, so its
# id is the same; the first message may be lost while the parser finds sync).
CONN_IDLE_NS = 300 * 10**9
# Connections kept at most by each per-connection map: ~4.5 KB each in agent.streams
# (two parsers and their calls), so ~37 MB when full. ps-lite connects every node to
# every other: a host of a job of N nodes has about 2N connections (N = 4,000 fits).
# Where closes are lost (a full ring) the maps fill up to this, so it is what RSS
# grows by at most under connection churn.
CONNS_MAX = 8_192


def put_newest(table: OrderedDict, key, value, cap: int) -> int:
    """table[key] = value as its newest entry; the oldest go while it holds more than
    cap. Returns how many were evicted (for the owner's counter)."""
    table[key] = value
    table.move_to_end(key)
    evicted = 0
    while len(table) > cap:
        table.popitem(last=False)
        evicted += 1
    return evicted


def touch(table: OrderedDict, key) -> None:
    """Makes key (if present) the newest entry: it was used."""
    if key in table:
        table.move_to_end(key)
