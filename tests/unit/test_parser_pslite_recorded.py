"""The ps-lite parser on byte streams recorded from real libzmq (tests/data/pslite/record.py):
every message sent is found with the right fields, whatever the chunking, and a
parser joined mid-stream or after a gap finds the messages that follow."""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from parsers.pslite.parser import PsliteStreamParser

DATA = Path(__file__).resolve().parents[1] / "data" / "pslite"
SCENARIOS = ("pslite", "mxnet")
M64 = (1 << 64) - 1


def load(scenario: str) -> dict:
    return json.loads(gzip.decompress((DATA / f"{scenario}.json.gz").read_bytes()))["streams"]


STREAMS = [(sc, name, f) for sc in SCENARIOS for name, f in load(sc).items()]
DEALER_STREAMS = [s for s in STREAMS if s[2]["socket_type"] == "DEALER"]


def ids(streams):
    return [name for _, name, _ in streams]


def feed_recorded(p: PsliteStreamParser, raw: bytes, sizes: list[int]) -> tuple[list, list[int]]:
    """Feed with the recv() sizes recorded; also return how many messages each recv completed."""
    msgs, per_recv, pos = [], [], 0
    for n in sizes:
        got = p.feed(raw[pos:pos + n])
        msgs += got
        per_recv.append(len(got))
        pos += n
    assert pos == len(raw)
    return msgs, per_recv


def parsed_whole(name: str):
    """The stream's bytes, the messages of one feed of all of them, and a seeded rng."""
    raw = (DATA / name).read_bytes()
    return raw, PsliteStreamParser().feed(raw), random.Random(name)


def splitmix64_finalizer(x: int) -> int:
    """A scalar reference of the hash keysample.py documents (splitmix64's finalizer)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & M64
    return x ^ (x >> 31)


def expected_sample(keys: list[int], k: int = 16) -> tuple[int, ...]:
    return tuple(sorted(sorted(keys, key=splitmix64_finalizer)[:k]))


@pytest.mark.parametrize("scenario,name,f", STREAMS, ids=ids(STREAMS))
def test_recorded_stream_with_recorded_chunking(scenario, name, f):
    raw = (DATA / name).read_bytes()
    p = PsliteStreamParser()
    msgs, per_recv = feed_recorded(p, raw, f["recv_chunk_bytes"])
    truth = f["messages"]
    assert p.greeting is not None and p.greeting.mechanism == b"NULL" and p.greeting.version_major == 3
    assert p.socket_type.decode() == f["socket_type"]
    assert p.sender_node_id == f["sender_node_id"]
    assert len(msgs) == len(truth)
    for m, t in zip(msgs, truth):
        got = {"kind": m.kind.value, "cmd": m.cmd, "request": m.request, "op": m.ps_op.value,
               "has_pull_field": m.has_pull_field, "app_id": m.app_id, "customer_id": m.customer_id,
               "timestamp": m.timestamp, "num_keys": m.num_keys, "value_bytes": m.value_bytes,
               "data_frames": m.data_frames, "total_bytes": m.total_bytes}
        assert got == {k: t[k] for k in got}
        assert m.sender_node_id == f["sender_node_id"]
        assert m.key_sample == expected_sample(t["keys"]) and m.key_sample_complete
    # messages tile the stream after the handshake, to its last byte
    assert all(a.end_offset == b.first_byte_offset for a, b in zip(msgs, msgs[1:]))
    if msgs:
        assert msgs[-1].last_byte_offset == len(raw) - 1
    s = p.stats()
    assert (s.unparsed_bytes, s.pending_bytes, s.lost_bytes) == (0, 0, 0)
    assert s.handshake_bytes + s.message_bytes == len(raw)


@pytest.mark.parametrize("scenario,name,f", DEALER_STREAMS, ids=ids(DEALER_STREAMS))
def test_libzmq_batches_several_messages_per_recv(scenario, name, f):
    """The point of recording real libzmq: one recv() holds several messages."""
    raw = (DATA / name).read_bytes()
    _, per_recv = feed_recorded(PsliteStreamParser(), raw, f["recv_chunk_bytes"])
    assert max(per_recv) >= 5


@pytest.mark.parametrize("scenario,name,f", DEALER_STREAMS, ids=ids(DEALER_STREAMS))
def test_recorded_stream_any_chunking_same_messages(scenario, name, f):
    raw, whole, rng = parsed_whole(name)
    for _ in range(3):
        p, out, pos = PsliteStreamParser(), [], 0
        while pos < len(raw):
            n = rng.choice([1, 2, 7, 64, 1500, 8192, 65536])
            out += p.feed(raw[pos:pos + n])
            pos += n
        assert out == whole


@pytest.mark.parametrize("scenario,name,f", DEALER_STREAMS, ids=ids(DEALER_STREAMS))
def test_recorded_stream_joined_mid_stream(scenario, name, f):
    raw, whole, rng = parsed_whole(name)
    for cut in [1, 50, 111] + rng.sample(range(len(raw)), 12):
        p = PsliteStreamParser(mid_stream=True, start_offset=cut)
        got = p.feed(raw[cut:]) + p.close()
        later = [m for m in whole if m.first_byte_offset >= cut]
        assert [(m.first_byte_offset, m.timestamp, m.num_keys) for m in got] == \
               [(m.first_byte_offset, m.timestamp, m.num_keys) for m in later]
        assert all(m.sender_node_id is None for m in got)  # READY was before the cut
        s = p.stats()
        assert s.unparsed_bytes == (later[0].first_byte_offset - cut if later else len(raw) - cut)
        assert s.resyncs == (1 if later else 0)


@pytest.mark.parametrize("scenario,name,f", DEALER_STREAMS, ids=ids(DEALER_STREAMS))
def test_recorded_stream_with_gaps(scenario, name, f):
    raw, whole, rng = parsed_whole(name)
    for _ in range(10):
        at = rng.randrange(200, len(raw) - 2000)
        n = rng.choice([1, 13, 600, 5000])
        p = PsliteStreamParser()
        got = p.feed(raw[:at]) + p.gap(n) + p.feed(raw[at + n:]) + p.close()
        before = [m for m in whole if m.last_byte_offset < at]
        assert got[:len(before)] == before
        # after the gap: every message whose first byte follows it, from the first one
        # whose chain confirms (a message with keys and values, or the next meta)
        after = [m for m in whole if m.first_byte_offset >= at + n]
        rest = got[len(before):]
        assert set(m.first_byte_offset for m in rest) <= set(m.first_byte_offset for m in whole)
        missed = [m for m in after if m not in rest]
        assert len(missed) <= 1 and all(m.data_frames == 0 for m in missed)
        s = p.stats()
        assert s.gap_bytes == n and s.lost_bytes in (0, n)
        assert s.fed_bytes + n == (s.message_bytes + s.handshake_bytes + s.unparsed_bytes
                                   + s.lost_bytes + s.pending_bytes)


@pytest.mark.parametrize("scenario,name,f", [s for s in STREAMS if s[2]["socket_type"] == "ROUTER"],
                         ids=ids([s for s in STREAMS if s[2]["socket_type"] == "ROUTER"]))
def test_router_direction_carries_only_the_handshake(scenario, name, f):
    raw = (DATA / name).read_bytes()
    p = PsliteStreamParser()
    assert p.feed(raw) == []
    assert p.socket_type == b"ROUTER" and p.sender_node_id is None
    assert p.stats().handshake_bytes == len(raw)
