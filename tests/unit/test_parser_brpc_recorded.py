"""parsers/brpc on real bytes: every trainer<->server connection of a PaddlePaddle 3.0.0
parameter-server job (2 servers x 2 trainers, 1 ms wire), captured on the wire and
reassembled per TCP direction (tests/data/brpc, made by `python -m workloads.paddle
--record`; see workloads/paddle/record.py).

The oracle is the job's own log, in recording.json: each server's brpc count of the
PsService requests it took and Paddle's count per table op (its CostProfiler bvars,
read from brpc's /vars), each trainer's distinct ids per step, Paddle's table ids.
Parsed whole, in random chunks, or joined mid-stream, the streams give the same
messages, all of them, every response paired with its request by correlation_id.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from parsers.brpc import BrpcStreamParser
from parsers.brpc.paddle import CMD_IDS, PS_METHOD, PS_SERVICE

DATA = Path(__file__).resolve().parents[1] / "data" / "brpc"
INDEX = json.loads((DATA / "recording.json").read_text())
SPARSE_OPS = ("PS_PULL_SPARSE_TABLE", "PS_PUSH_SPARSE_TABLE")
DENSE_OPS = ("PS_PULL_DENSE_TABLE", "PS_PUSH_DENSE_TABLE")


def _bytes(entry: dict) -> bytes:
    data = gzip.decompress((DATA / entry["file"]).read_bytes())
    assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"]
    return data


CONNS = [(c, _bytes(c["request"]), _bytes(c["response"])) for c in INDEX["connections"]]


def _fields(m) -> tuple:
    return (m.first_byte_offset, m.end_offset, m.request, m.correlation_id, m.service_name,
            m.method_name, m.cmd_id, m.table_id, m.num_keys, m.key_sample, m.dense_values,
            m.meta_bytes, m.payload_bytes, m.attachment_bytes, m.error_code, m.ps_err_code)


def _parse(data: bytes, chunks=None, **kw) -> tuple[list, BrpcStreamParser]:
    p = BrpcStreamParser(**kw)
    out, at = [], 0
    for n in chunks or [len(data)]:
        out += p.feed(data[at:at + n])
        at += n
    out += p.feed(data[at:]) + p.close()
    return out, p


WHOLE = [(_parse(req)[0], _parse(resp)[0]) for _, req, resp in CONNS]


def test_recording_is_the_whole_job():
    """Every trainer reached every server; 2 x 2 as recorded; under the size budget."""
    assert (INDEX["servers"], INDEX["trainers"]) == (2, 2)
    assert {(c["trainer"], c["server"]) for c, _, _ in CONNS} == {
        (t, s) for t in range(2) for s in range(2)}
    assert sum(p.stat().st_size for p in DATA.iterdir()) <= 300_000


def test_every_byte_is_in_a_message_and_every_response_pairs():
    for (conn, req, resp), (reqs, resps) in zip(CONNS, WHOLE):
        for data, msgs in ((req, reqs), (resp, resps)):
            _, p = _parse(data)
            s = p.stats()
            assert (s.message_bytes, s.unparsed_bytes, s.lost_bytes, s.resyncs) == (
                len(data), 0, 0, 0), conn
            assert s.messages == len(msgs)
        assert all(m.request for m in reqs) and not any(m.request for m in resps)
        # one response per request, by correlation_id on the same connection
        assert Counter(m.correlation_id for m in reqs) == Counter(
            m.correlation_id for m in resps), conn
        for m in reqs:
            assert (m.service_name, m.method_name) == (PS_SERVICE, PS_METHOD)
            assert m.cmd_name is not None and m.op is not None
        for r in resps:
            assert r.error_code in (None, 0) and r.ps_err_code == 0


def test_ops_and_tables_agree_with_the_jobs_own_counts():
    counts = INDEX["counts"]
    by_server_op, by_server = Counter(), Counter()
    keys_pulled = Counter()
    tables = counts["trainers"]["0"]["tables"]
    sparse, dense = set(tables["sparse"].values()), set(tables["dense"])
    for (conn, _, _), (reqs, _) in zip(CONNS, WHOLE):
        for m in reqs:
            by_server[conn["server"]] += 1
            by_server_op[(conn["server"], m.cmd_name)] += 1
            assert m.cmd_id == CMD_IDS[m.cmd_name]
            if m.cmd_name in SPARSE_OPS:
                assert m.table_id in sparse and m.num_keys > 0 and m.key_sample
                assert len(m.key_sample) == min(16, m.num_keys)
            if m.cmd_name in DENSE_OPS:
                assert m.table_id in dense and m.num_keys == 0 and m.dense_values > 0
            if m.cmd_name == "PS_PULL_SPARSE_TABLE":
                keys_pulled[conn["trainer"]] += m.num_keys
    for server, s in counts["servers"].items():
        assert by_server[int(server)] == s["requests"]
        for op, n in s["by_op"].items():
            assert by_server_op[(int(server), op)] == n, (server, op)
    # a pull of a step sends each server the distinct ids of its shard: over the
    # servers, the distinct ids the trainer fed that step
    for trainer, t in counts["trainers"].items():
        assert keys_pulled[int(trainer)] == sum(t["pull_sparse_keys"])


@pytest.mark.parametrize("seed", range(6))
def test_random_chunks_give_the_same_messages(seed):
    rng = random.Random(seed)
    for (_, req, resp), (reqs, resps) in zip(CONNS, WHOLE):
        for data, want in ((req, reqs), (resp, resps)):
            chunks = []
            while sum(chunks) < len(data):
                chunks.append(rng.choice([1, 2, 5, 11, 12, 13, 100, 1448, 4096, 65536]))
            got, _ = _parse(data, chunks)
            assert [_fields(m) for m in got] == [_fields(m) for m in want]


@pytest.mark.parametrize("seed", range(4))
def test_joined_mid_stream_finds_every_later_message(seed):
    """Joined at a random byte: from the first message that starts after it, every one."""
    rng = random.Random(seed)
    for (_, req, resp), (reqs, resps) in zip(CONNS, WHOLE):
        for data, want in ((req, reqs), (resp, resps)):
            if len(want) < 3:
                continue
            at = rng.randrange(1, want[-2].first_byte_offset)
            got, p = _parse(data[at:], [rng.choice([7, 300, 1448])] * 50, mid_stream=True,
                            start_offset=at)
            later = [_fields(m) for m in want if m.first_byte_offset >= at]
            assert [_fields(m) for m in got] == later, at
            assert p.stats().resyncs == 1
