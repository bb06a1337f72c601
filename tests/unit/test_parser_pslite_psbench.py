"""The ps-lite parser on a real psbench job captured from the loopback
(tests/data/pslite/record_psbench.py: 1 server, 2 workers, reconnects, heartbeats):
every request slice and response in psbench's own ground truth is found on the
right connection, with its op, ids and key count, and nothing is left unparsed."""
from __future__ import annotations

import gzip
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from parsers.pslite.meta import Cmd
from parsers.pslite.parser import PsliteStreamParser

DATA = Path(__file__).resolve().parents[1] / "data" / "pslite"
DOC = json.loads(gzip.decompress((DATA / "psbench.json.gz").read_bytes()))
BLOB = (DATA / "psbench.streams.bin").read_bytes()
PORT_OF = {int(k): v["port"] for k, v in DOC["nodes"].items()}
ROLE_OF = {int(k): v["role"] for k, v in DOC["nodes"].items()}


def stream_bytes(st: dict) -> bytes:
    return BLOB[st["offset"]:st["offset"] + st["length"]]


def parse_all():
    """(stream, messages, parser) for every captured TCP direction, fed in 1500-byte chunks."""
    out = []
    for st in DOC["streams"]:
        b = stream_bytes(st)
        p = PsliteStreamParser()
        msgs = [m for i in range(0, len(b), 1500) for m in p.feed(b[i:i + 1500])] + p.close()
        out.append((st, msgs, p))
    return out


PARSED = parse_all()


def test_every_stream_parses_without_leftovers():
    assert len(PARSED) > 10  # scheduler, server and worker connections, and reconnects
    for st, msgs, p in PARSED:
        s = p.stats()
        assert (s.unparsed_bytes, s.pending_bytes, s.resyncs) == (0, 0, 0), st
        assert p.socket_type in (b"DEALER", b"ROUTER")
        if p.socket_type == b"ROUTER":
            assert msgs == []  # ps-lite answers on its own DEALER, another connection


def test_every_request_slice_is_found_on_its_connection():
    truth = Counter((r["sender"], r["recver"], r["timestamp"], r["op"], r["num_keys"])
                    for r in DOC["truth"] if r["role"] == "worker")
    req_bytes = {(r["sender"], r["timestamp"]): r["req_bytes"] for r in DOC["truth"] if r["role"] == "worker"}
    seen = Counter()
    for st, msgs, p in PARSED:
        for m in msgs:
            if m.kind.value != "data" or not m.request:
                continue
            assert ROLE_OF[m.sender_node_id] == "worker"
            recver = next(n for n, port in PORT_OF.items() if port == st["dport"])
            seen[(m.sender_node_id, recver, m.timestamp, m.ps_op.value, m.num_keys)] += 1
            # psbench counts meta + data frame bodies; we count their frame headers too
            headers = m.total_bytes - req_bytes[(m.sender_node_id, m.timestamp)]
            assert 2 * (1 + m.data_frames) <= headers <= 9 * (1 + m.data_frames)
            assert len(m.key_sample) == min(16, m.num_keys) and not m.has_pull_field
    assert seen == truth


def test_every_response_is_found_on_the_reverse_connection():
    truth = Counter((r["recver"], r["sender"], r["timestamp"], r["op"]) for r in DOC["truth"]
                    if r["role"] == "server")
    seen = Counter()
    for st, msgs, p in PARSED:
        for m in msgs:
            if m.kind.value == "data" and not m.request:
                to = next(n for n, port in PORT_OF.items() if port == st["dport"])
                seen[(m.sender_node_id, to, m.timestamp, m.ps_op.value)] += 1
    assert seen == truth


def test_control_messages_name_the_nodes_and_their_ports():
    listed = {}
    cmds = Counter()
    for st, msgs, p in PARSED:
        for m in msgs:
            if m.kind.value == "control":
                cmds[Cmd(m.cmd).name] += 1
                listed.update({n.node_id: n.port for n in m.nodes if n.node_id is not None})
    assert {"ADD_NODE", "BARRIER"} <= set(cmds) and cmds["HEARTBEAT"] > 0
    assert {k: v for k, v in listed.items() if k in PORT_OF} == PORT_OF


@pytest.mark.parametrize("seed", range(4))
def test_joining_psbench_streams_mid_way(seed):
    rng = random.Random(seed)
    for st, msgs, p in PARSED:
        if len(msgs) < 20:
            continue
        b = stream_bytes(st)
        cut = rng.randrange(1, len(b))
        q = PsliteStreamParser(mid_stream=True, start_offset=cut)
        got = q.feed(b[cut:]) + q.close()
        assert [(m.first_byte_offset, m.timestamp) for m in got] == \
               [(m.first_byte_offset, m.timestamp) for m in msgs if m.first_byte_offset >= cut]


def test_a_node_not_numbered_yet_has_no_id():
    """A worker's own ADD_NODE names itself with ps::Node::kEmpty before the scheduler's
    answer numbers it: that is no node id (as rawmeta.py reads BytePS's), so what an
    agent learns from it is never an id no node has."""
    from parsers.pslite.message import read_meta
    from parsers.pslite.meta import PBMeta, PS_META_EMPTY

    pb = PBMeta(request=True, push=False)
    pb.control.cmd = Cmd.ADD_NODE
    for node_id, port in ((PS_META_EMPTY, 9000), (9, 9001)):
        n = pb.control.node.add()
        n.id, n.role, n.hostname, n.port = node_id, 2, "10.0.0.1", port
    meta = read_meta(pb.SerializeToString())
    assert [(n.node_id, n.port) for n in meta.nodes] == [(None, 9000), (9, 9001)]
