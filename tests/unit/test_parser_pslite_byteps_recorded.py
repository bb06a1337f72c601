"""parsers/pslite on real BytePS bytes: every worker<->server connection of BytePS
0.2.5.post15's own ps-lite benchmark (tests/test_benchmark, 1 server x 2 workers, 4
keys, 10 push-pull rounds of 4096 bytes, 1 ms wire), captured on the wire and
reassembled per TCP direction (tests/data/byteps, made by `python -m workloads.byteps
--record`; see workloads/byteps/record.py).

The oracle is the job's own log, in recording.json: every message each node's van
sent, as ps-lite logged it with PS_VERBOSE=2 (workloads/byteps/oplog.py), per
direction in order, and the counts per node; the keys are what test_benchmark.cc
sends (a range's begin plus the key's index). Parsed whole, in random chunks, joined
mid-stream or with garbage between messages, the streams give those messages, as
RawMeta, and MXNet's PBMeta through the same parser class stays PBMeta.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from parsers.protocol import PAIR_CONNECTION
from parsers.pslite import PsliteStreamParser
from parsers.pslite.message import BytepsMessage
from parsers.pslite.rawmeta import PBMETA, RAWMETA
from parsers.sniff import SniffingParser
# the synthetic streams' helpers: random chunks, a message's fields, every byte counted
from test_parser_pslite_byteps import _accounted, _ident, _parse

DATA = Path(__file__).resolve().parents[1] / "data" / "byteps"
INDEX = json.loads((DATA / "recording.json").read_text())
MXNET_STREAM = Path(__file__).resolve().parents[1] / "data" / "pslite" / "mxnet.w2s.dealer.bin"
BUDGET_BYTES = 300_000


def _bytes(entry: dict) -> bytes:
    data = gzip.decompress((DATA / entry["file"]).read_bytes())
    assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    return data


# (connection, direction name, bytes, oracle, the sender's node id)
DIRECTIONS = [(c, d, _bytes(c[d]), c[d]["oracle"],
               c["worker_node_id"] if d == "to_server" else c["server_node_id"])
              for c in INDEX["connections"] for d in ("to_server", "to_worker")]
# the worker's connection into the server: requests up, answers back on it
DATA_DIRECTIONS = [x for x in DIRECTIONS if x[0]["initiator"] == "worker"]


def _name(x) -> str:
    c, d = x[0], x[1]
    return f"{c['worker']}-{c['initiator']}-{d}"


WHOLE = {_name(x): _parse(x[2])[0] for x in DIRECTIONS}


def test_the_recording_is_the_whole_job_and_its_log_adds_up():
    """1 server x 2 workers, both connections of every pair, under budget; each node's
    log says what the benchmark's arguments imply, and both ends agree."""
    assert (INDEX["servers"], INDEX["workers"]) == (1, 2) and INDEX["byteps"] == "0.2.5.post15"
    assert Counter((c["worker"], c["initiator"]) for c in INDEX["connections"]) == {
        (w, i): 1 for w in ("worker-0", "worker-1") for i in ("worker", "server")}
    assert sum(p.stat().st_size for p in DATA.iterdir()) <= BUDGET_BYTES
    counts, expected, b = INDEX["counts"], INDEX["expected"], INDEX["benchmark"]
    keys = INDEX["servers"] * b["keys_per_server"]
    assert b["mode"] == 1 and expected["worker"] == {
        "push": keys + b["repeat"] * keys, "pull": b["repeat"] * keys}
    assert counts["unread_lines"] == 0 and counts["scheduler"]["stopped"]
    for name, w in counts["workers"].items():
        assert w["sent"] == w["answers"] == expected["worker"], name
        assert w["rounds"] == [b["repeat"]] and w["stopped"]
        assert counts["servers"]["server-0"]["by_worker"][name] == expected["worker"]
    s = counts["servers"]["server-0"]
    assert s["received"] == s["answered"] == expected["server"]["server-0"] and s["stopped"]


@pytest.mark.parametrize("x", DIRECTIONS, ids=_name)
def test_every_byte_decodes_as_rawmeta_as_the_log_says(x):
    conn, direction, data, oracle, sender = x
    msgs, p = _parse(data)
    s = p.stats()
    assert (s.unparsed_bytes, s.lost_bytes, s.resyncs, s.pending_bytes) == (0, 0, 0, 0)
    assert s.message_bytes + s.handshake_bytes == len(data) and s.messages == len(msgs)
    assert len(msgs) == len(oracle)
    if not oracle:      # the server's DEALER into the worker's ROUTER: the handshake only
        assert s.handshake_bytes == len(data) > 0 and p.variant is None
        return
    assert p.variant == RAWMETA
    # the worker's DEALER says who it is in READY; the server names itself in the
    # sender-id frame before every answer
    for m, o in zip(msgs, oracle):
        assert isinstance(m, BytepsMessage) and m.protocol == "pslite" and not m.has_pull_field
        assert (m.request, m.op, m.call_id, m.head, m.app_id, m.customer_id) == (
            o["request"], o["op"], o["timestamp"], o["head"], o["app_id"], o["customer_id"])
        assert m.request == (direction == "to_server") and m.sender_node_id == sender
        assert m.pair_scope == PAIR_CONNECTION and not m.control
        sizes = o["data_sizes"]
        assert m.data_frames == len(sizes)
        if sizes:
            assert m.num_keys * 8 == sizes[0] and m.value_bytes == sizes[1]
            # one key per message: the benchmark's begin (0 for server 0) + index
            key = o["key"]
            assert m.key_sample == (key,) and m.key_sample_complete
            assert m.detail() == {"variant": "byteps", "wire_key": key,
                                  "declared_key": key >> 16, "key_partition": key & 0xFFFF}
        else:
            assert m.num_keys == 0 and m.value_bytes == 0 and m.detail() == {"variant": "byteps"}


def test_parsed_counts_are_the_logs_counts():
    """Per worker its requests by op and the answers it got; the server's requests."""
    counts = INDEX["counts"]
    sent, answers, at_server = Counter(), Counter(), Counter()
    for (conn, direction, _data, _o, _s) in DATA_DIRECTIONS:
        for m in WHOLE[_name((conn, direction))]:
            if direction == "to_server":
                sent[(conn["worker"], m.op)] += 1
                at_server[(conn["server"], m.op)] += 1
            else:
                answers[(conn["worker"], m.op)] += 1
    for name, w in counts["workers"].items():
        assert {op: sent[(name, op)] for op in ("push", "pull")} == w["sent"]
        assert {op: answers[(name, op)] for op in ("push", "pull")} == w["answers"]
    for name, s in counts["servers"].items():
        assert {op: at_server[(name, op)] for op in ("push", "pull")} == s["received"]


@pytest.mark.parametrize("x", DATA_DIRECTIONS, ids=_name)
@pytest.mark.parametrize("seed", range(3))
def test_any_chunking_gives_the_same_messages(x, seed):
    msgs, p = _parse(x[2], random.Random(seed))
    assert [_ident(m) for m in msgs] == [_ident(m) for m in WHOLE[_name(x)]] and _accounted(p)


@pytest.mark.parametrize("x", DATA_DIRECTIONS, ids=_name)
def test_joined_mid_stream_recovers_and_then_agrees(x):
    """Cut anywhere (in the handshake, a sender-id frame, a RawMeta, a value): the
    parser finds the next message and, from the one after it on, exactly the messages
    of the whole stream. The first may start later: cut inside a server's 5-byte
    sender-id frame, its message is taken from its RawMeta on, its sender unknown."""
    conn, direction, data, _oracle, _sender = x
    whole = WHOLE[_name(x)]
    rng = random.Random(_name(x))
    answer = direction == "to_worker"   # answers name their sender in every message
    by_end = {m.last_byte_offset: m for m in whole}
    cuts = {1, 40, 64 + 20, whole[1].first_byte_offset + 2, whole[1].first_byte_offset + 9,
            whole[5].first_byte_offset + 60, whole[5].last_byte_offset - 100,
            *(rng.randrange(len(data) // 2, len(data)) for _ in range(4))}
    for cut in sorted(cuts):
        msgs, p = _parse(data[cut:], rng, mid_stream=True, start_offset=cut)
        after = [m for m in whole if m.first_byte_offset >= cut]
        assert msgs and _accounted(p) and p.variant == RAWMETA, cut
        first = by_end[msgs[0].last_byte_offset]
        assert (msgs[0].request, msgs[0].op, msgs[0].call_id) == (
            first.request, first.op, first.call_id), cut
        assert msgs[0].first_byte_offset >= first.first_byte_offset
        assert len(msgs) >= len(after) and len(msgs) <= len(after) + 1, cut
        rest = whole[len(whole) - len(msgs) + 1:]
        assert [_ident(m, answer) for m in msgs[1:]] == [_ident(m, answer) for m in rest], cut
        assert p.stats().resyncs >= 1


@pytest.mark.parametrize("x", DATA_DIRECTIONS, ids=_name)
@pytest.mark.parametrize("seed", range(3))
def test_garbage_between_messages_is_survived_and_counted(x, seed):
    """Random bytes before some messages: every byte is accounted for, the garbage
    counted as unparsed, the messages found where they moved to (garbage may swallow
    the message after it through a bogus frame size, never invent one)."""
    conn, direction, data, _oracle, _sender = x
    whole = WHOLE[_name(x)]
    rng = random.Random(seed)
    parts, pos, shift, want, junk_bytes = [], 0, 0, [], 0
    for i, m in enumerate(whole):
        parts.append(data[pos:m.first_byte_offset])
        if i and rng.random() < 0.2:
            junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
            parts.append(junk)
            shift += len(junk)
            junk_bytes += len(junk)
        parts.append(data[m.first_byte_offset:m.end_offset])
        want.append((m.first_byte_offset + shift, m.last_byte_offset + shift, m.call_id))
        pos = m.end_offset
    msgs, p = _parse(b"".join(parts), rng)
    got = [(m.first_byte_offset, m.last_byte_offset, m.call_id) for m in msgs]
    assert junk_bytes and set(got) <= set(want) and len(got) >= len(want) * 3 // 4
    s = p.stats()
    assert _accounted(p) and s.pending_bytes == 0 and s.resyncs >= 1
    # what is not in a message found is unparsed: the garbage and what it swallowed
    assert s.unparsed_bytes >= junk_bytes
    assert s.message_bytes == sum(m.total_bytes for m in msgs)


def test_pbmeta_and_rawmeta_through_one_parser_class_without_confusion():
    """MXNet's real PBMeta stream and BytePS's real RawMeta stream, fed in turns to two
    parsers of the one class: each keeps its variant and gives what it gives alone."""
    pb = MXNET_STREAM.read_bytes()
    raw = DATA_DIRECTIONS[0][2]
    alone_pb, _ = _parse(pb)
    alone_raw = WHOLE[_name(DATA_DIRECTIONS[0])]
    assert alone_pb and not any(isinstance(m, BytepsMessage) for m in alone_pb)
    p_pb, p_raw = PsliteStreamParser(), PsliteStreamParser()
    got_pb, got_raw, rng = [], [], random.Random(7)
    i = j = 0
    while i < len(pb) or j < len(raw):
        n = rng.randint(1, 2000)
        got_pb += p_pb.feed(pb[i:i + n])
        got_raw += p_raw.feed(raw[j:j + n])
        i, j = i + n, j + n
    got_pb += p_pb.close()
    got_raw += p_raw.close()
    assert p_pb.variant == PBMETA and p_raw.variant == RAWMETA
    assert [_ident(m) for m in got_pb] == [_ident(m) for m in alone_pb]
    assert [_ident(m) for m in got_raw] == [_ident(m) for m in alone_raw]
    assert all(isinstance(m, BytepsMessage) for m in got_raw)
    assert not any(isinstance(m, BytepsMessage) for m in got_pb)
    assert p_pb.stats().unparsed_bytes == p_raw.stats().unparsed_bytes == 0
    # the sniffer, which tells a connection's protocol from its first bytes, takes both
    for data, want in ((pb, alone_pb), (raw, alone_raw)):
        s = SniffingParser()
        msgs = s.feed(data) + s.close()
        assert s.verdict == "pslite" and [_ident(m) for m in msgs] == [_ident(m) for m in want]
