"""Traffic no protocol parser recognised, in the report (issue 13): a host whose traffic
was traced but not understood is said as such, never as having no traffic; the JSON
summary counts it (unmatched.connections_unrecognised, bytes_unrecognised). Run dirs
made by the agent's pipeline from synthetic calls (test_agent_streams), no root."""
from __future__ import annotations

import json

from agent.daemon import Pipeline
from agent.hosts import HostMap
from test_agent_decode import ISN_C, calls_of, stream
from test_agent_streams import HTTP_REQUEST, HTTP_RESPONSE, _exchange


def _run_dir(tmp_path, with_pslite: bool):
    pipe = Pipeline(tmp_path, HostMap("h1", names={}), {"clock": {}})
    records = _exchange(4, sk=0x1, local=("10.0.0.1", 41001)) + _exchange(2, sk=0x2, local=("10.0.0.1", 41002))
    if with_pslite:
        records += calls_of(stream(2)[0], 200, ISN_C)
    for r in records:
        pipe.handle("sockcalls", r)
    pipe.close()
    return tmp_path / "h1"


def test_a_host_with_only_unrecognised_traffic_is_not_said_to_have_none(tmp_path):
    from reports.load import read_host

    problems = read_host(_run_dir(tmp_path, with_pslite=False)).problems
    moved = 6 * (len(HTTP_REQUEST) + len(HTTP_RESPONSE))
    assert any(f"has no messages it understood: 2 connections with {moved:,} bytes traced there, protocol "
               "not recognised" in p for p in problems), problems
    assert not any("no traffic traced" in p for p in problems), problems


def test_the_summary_and_the_findings_count_it(tmp_path, capsys, monkeypatch):
    import sys

    import pytest

    from pslat import cli
    from reports.dissect import dissect
    from reports.viewmodel import build_model

    run = _run_dir(tmp_path, with_pslite=True)
    d = dissect([run])
    m = build_model(d, [run])
    assert m["summary"]["unmatched"]["connections_unrecognised"] == 2
    assert m["summary"]["unmatched"]["bytes_unrecognised"] == 6 * (len(HTTP_REQUEST) + len(HTTP_RESPONSE))
    [g] = m["unrecognised"]["groups"]
    assert g["threads"] == ["pslat-test"] and g["connections"] == 2 and g["port"] == 9000
    [f] = [f for f in m["findings"] if f.startswith("Traffic not recognised")]
    assert "2 connections" in f and "by pslat-test (port 9000)" in f, f
    monkeypatch.setattr(sys, "argv", ["pslat", "report", str(run), "-f", "json"])
    with pytest.raises(SystemExit):
        cli.main()
    assert json.loads(capsys.readouterr().out)["unmatched"]["connections_unrecognised"] == 2
