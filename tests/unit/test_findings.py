"""reports.findings: agent health once per agent (one agent writes a run dir per traced
namespace, each meta.json with the same agent-wide probe counters), rows dropped per host,
and traffic gaps per host."""
import json
import re

import numpy as np
import pandas as pd

from reports.dissect import dissect
from reports.findings import agents, health_findings, traffic_gaps
from workloads.simulated.job import Sim, simulate
from reports.viewmodel import build_model


def _row(host, probes, run_id=None, rows_dropped=0):
    return {"host": host, "run_id": run_id, "rows_dropped": rows_dropped,
            "probes": {p: {"seen": s, "lost": lost} for p, (s, lost) in probes.items()}}


def _model(health):
    return {"health": health, "timeline": {"unaligned": []}}


def test_one_agent_of_three_namespaces_counts_its_probes_once():
    counters = {"sockcalls": (1000, 40), "netstack": (500, 0)}
    health = [_row(h, counters, run_id="r1") for h in ("h0", "h1", "h2")]
    assert [a["hosts"] for a in agents(health)] == [["h0", "h1", "h2"]]
    (f, *_) = health_findings(_model(health))
    assert len(re.findall(r"lost \d", f)) == 1 and "the agent of h0, h1, h2 sockcalls lost 40 of 1,040 events" in f
    ok = [_row(h, {"sockcalls": (1000, 0)}, run_id="r1") for h in ("h0", "h1", "h2")]
    assert health_findings(_model(ok))[0] == "Agent health: no events lost (1,000 events seen by the probes)."


def test_run_dirs_flushed_at_different_times_take_the_agent_latest_counters():
    # each host's meta.json is rewritten at its own flush: the counters only grow
    health = [_row("h0", {"sockcalls": (900, 3)}, "r1"), _row("h1", {"sockcalls": (1000, 5)}, "r1")]
    (a,) = agents(health)
    assert a["probes"]["sockcalls"] == {"seen": 1000, "lost": 5}
    assert "the agent of h0, h1 sockcalls lost 5 of 1,005 events" in health_findings(_model(health))[0]


def test_agents_per_host_stay_apart_and_rows_dropped_are_per_host():
    health = [_row("ps0", {"sockcalls": (700, 7)}, "a"), _row("w0", {"sockcalls": (700, 7)}, "b"),
              _row("w1", {"sockcalls": (300, 0)}, "c", rows_dropped=12)]
    assert len(agents(health)) == 3   # same counters, different runs: two agents
    f = health_findings(_model(health))[0]
    assert "ps0 sockcalls lost 7 of 707" in f and "w0 sockcalls lost 7 of 707" in f
    assert "w1 dropped 12 rows" in f and "the agent of" not in f
    clean = [_row("ps0", {"sockcalls": (700, 0)}, "a"), _row("w0", {"sockcalls": (300, 0)}, "b")]
    assert "1,000 events seen by the probes of 2 agents" in health_findings(_model(clean))[0]


def test_without_run_id_identical_counters_mean_one_agent():
    health = [_row("h0", {"sockcalls": (800, 2)}), _row("h1", {"sockcalls": (800, 2)}),
              _row("h2", {"sockcalls": (100, 0)}), _row("h3", {})]
    assert sorted(a["hosts"] for a in agents(health)) == [["h0", "h1"], ["h2"], ["h3"]]


def test_report_of_one_agent_run_dirs(tmp_path):
    """Run dirs as one agent writes them (a run_id, the agent's counters in every meta.json):
    the model's findings name the loss once and count the events once."""
    simulate(tmp_path, Sim(requests=60, workers=2, servers=1, seed=3, run_id="agent-run-1"))
    hosts = sorted(p.name for p in tmp_path.iterdir() if (p / "meta.json").exists())
    assert len(hosts) == 3
    for h in hosts:
        meta = json.loads((tmp_path / h / "meta.json").read_text())
        meta["counters"]["probes"] = {"sockcalls": {"seen": 5000, "lost": 11}, "netstack": {"seen": 2000, "lost": 0}}
        (tmp_path / h / "meta.json").write_text(json.dumps(meta))
    m = build_model(dissect([tmp_path]), [tmp_path])
    assert {h["run_id"] for h in m["health"]} == {"agent-run-1"}
    (f,) = [f for f in m["findings"] if f.startswith("Agent health")]
    assert len(re.findall(r"lost \d", f)) == 1
    assert f"the agent of {', '.join(hosts)} sockcalls lost 11 of 5,011 events" in f

    # the health tables: one row for the agent, its counters once
    import io

    from rich.console import Console

    from reports.html import render
    from reports.term_report import health_view
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None).print(*health_view(m))
    assert buf.getvalue().count("5,000 / 11") == 1 and ", ".join(hosts) in buf.getvalue()
    page = render(m)
    health = page[page.index('<section id="health">'):]
    assert health.count("5,000 / 11") == 1


def test_traffic_gap_named_per_host():
    t = np.arange(0, 10_000_000_000, 10_000_000)          # a message every 10 ms for 10 s
    t = t[(t < 3_000_000_000) | (t >= 5_000_000_000)]      # none from 3 s to 5 s
    gaps = traffic_gaps({"w0": t, "ps0": np.arange(0, 10_000_000_000, 10_000_000)}, {"w0": 0, "ps0": None})
    assert [(g["host"], round(g["from_s"], 2), round(g["to_s"], 2)) for g in gaps] == [("w0", 2.99, 5.0)]


def test_requests_whose_operation_name_was_not_seen_are_counted():
    from reports.findings import unnamed_op_findings
    from reports.viewmodel import unnamed_ops

    done = pd.DataFrame({"protocol": ["grpc"] * 4 + ["pslite"] * 2, "op": ["rpc", "pull", "rpc", "rpc", "push", "pull"],
                         "op_name": [None, "/ps.PS/Pull", None, None, "push", "pull"]})
    m = unnamed_ops(done)
    assert m["unnamed_ops"] == {"grpc": (3, 4)} and m["unnamed_ops_ops"] == {"grpc": ["rpc"]}
    (f,) = unnamed_op_findings(m)
    assert f.startswith("Operation names not seen: 3 of 4 grpc requests") and "(rpc)" in f
    assert unnamed_op_findings(unnamed_ops(done[done.protocol == "pslite"])) == []
