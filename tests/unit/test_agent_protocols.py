"""The agent's pipeline with more than one protocol (issue 13): each connection's
protocol told from its first bytes (or forced by --protocol), messages of both in
one messages table with the protocol-neutral columns, and the report pairing a
brpc response with its request on its connection by correlation id. Synthetic
calls through agent.daemon.Pipeline (prefix format: each call's first 256 bytes),
no root."""
from __future__ import annotations

import json

import pytest

from agent.daemon import Pipeline
from core.errors import UserError
from agent.hosts import HostMap
from agent.rundir import read_run_dir
from parsers.brpc import encode as benc
from test_agent_decode import ISN_C, ISN_S, calls_of, record, stream

CLIENT, SERVER = ("10.0.0.1", 41000), ("10.0.0.2", 8500)
KEYS = [[3, 9, 27], [5, 25], list(range(100, 110))]


def _brpc_calls(garbage: bytes = b"") -> list[bytes]:
    """A Paddle trainer's pull-sparse requests and the server's answers, one call each."""
    out, sent, got = [], 0, 0
    if garbage:
        out.append(record(True, ISN_C + 1, len(garbage), garbage, ts=500_000, local=CLIENT, remote=SERVER, sk=0x77))
        sent += len(garbage)
    for i, keys in enumerate(KEYS):
        q = benc.message_bytes(benc.pull_sparse(4, keys, correlation_id=100 + i))
        p = benc.message_bytes(benc.response(100 + i, data=b"\1" * 24))
        t = 1_000_000 * (i + 1)
        out.append(record(True, ISN_C + 1 + sent, len(q), q[:256], ts=t, local=CLIENT, remote=SERVER, sk=0x77))
        out.append(record(False, ISN_S + 1 + got, len(p), p[:256], ts=t + 400_000, local=CLIENT, remote=SERVER,
                          sk=0x77))
        sent, got = sent + len(q), got + len(p)
    return out


def _run(tmp_path, records, protocols=None):
    pipe = Pipeline(tmp_path, HostMap("h1", names={}), {"clock": {}}, protocols=protocols)
    for r in records:
        pipe.handle("sockcalls", r)
    pipe.correlator.close()
    pipe.close()
    return tmp_path / "h1"


def test_brpc_and_pslite_side_by_side_each_told_by_its_first_bytes(tmp_path):
    run = _run(tmp_path, _brpc_calls() + calls_of(stream(4)[0], 200, ISN_C))
    rd = read_run_dir(run)
    m = rd.tables["messages"]
    assert rd.meta["format_version"] == 2
    b = m[m.protocol == "brpc"]
    assert len(b) == 2 * len(KEYS) and set(m.protocol) == {"brpc", "pslite"}
    q = b[b.request.astype(bool)].sort_values("call_id")
    assert list(q.call_id) == [100, 101, 102] and set(q.op) == {"pull"}
    assert set(q.op_name) == {"PS_PULL_SPARSE_TABLE"} and list(q.num_keys) == [len(k) for k in KEYS]
    assert all(json.loads(d)["table_id"] == 4 for d in q.detail)
    assert set(b.pair_scope) == {"connection"} and b.sender.isna().all() and b.call_space.isna().all()
    p = m[m.protocol == "pslite"]
    assert set(p.pair_scope) == {"nodes"} and p.call_id.notna().any()
    streams = rd.tables["streams"]
    assert set(streams.protocol) == {"brpc", "pslite"}


def test_the_report_pairs_brpc_on_its_connection_by_correlation_id(tmp_path):
    from reports.dissect import dissect

    d = dissect([_run(tmp_path, _brpc_calls())])
    t = d.requests
    assert len(t) == len(KEYS) and set(t.protocol) == {"brpc"} and set(t.op) == {"pull"}
    assert sorted(t.call_id) == [100, 101, 102] and set(t.op_name) == {"PS_PULL_SPARSE_TABLE"}
    assert sorted(t.num_keys) == sorted(len(k) for k in KEYS)


def test_a_forced_protocol_reads_a_stream_whose_first_bytes_are_not_its_own(tmp_path):
    junk = b"\0junk before the first header\0"
    told = read_run_dir(_run(tmp_path / "a", _brpc_calls(junk))).tables
    # each direction is told by its own first bytes: the answers are found, the requests not
    assert not told["messages"].request.astype(bool).any() and len(told["messages"]) == len(KEYS)
    forced = read_run_dir(_run(tmp_path / "b", _brpc_calls(junk), protocols={8500: "brpc"}))
    m = forced.tables["messages"]
    assert len(m[m.protocol == "brpc"]) == 2 * len(KEYS)
    assert forced.meta["config"]["protocols"] == {"8500": "brpc"}


def test_a_bad_protocol_option_is_a_clear_error(tmp_path):
    from agent.agent_cli import agent

    for bad, why in (("8500", "expected PORT=NAME"), ("8500=thrift", "unknown protocol 'thrift'")):
        with pytest.raises(UserError, match=why):
            agent(out=tmp_path / "o", protocol=[bad], replay=tmp_path / "none.rec")
