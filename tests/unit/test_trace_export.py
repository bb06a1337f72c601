"""The Chrome/Perfetto trace export: structure Perfetto's JSON importer needs, nesting per
track, clock alignment (realtime, one base), and the merge onto a PyTorch profiler trace."""
import json

import numpy as np
import pytest

from reports import components as C
from reports.dissect import dissect
from workloads.simulated.job import Sim, simulate
from reports.trace import _place, build_trace, merge, span_sequence, validate, write_trace


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("trace")
    simulate(out, Sim(requests=120, workers=2, servers=2, seed=5, nic=True, clocks={"ps1": (3_000_000, 0.0)}))
    return out, dissect([out])


def test_trace_is_valid_and_complete(run, tmp_path):
    out, d = run
    path = tmp_path / "t.json"
    other = write_trace(d, path, [out])
    t = json.loads(path.read_text())
    assert validate(t) == []
    assert other["requests_written"] == len(d.complete) == 240
    xs = [e for e in t["traceEvents"] if e["ph"] == "X"]
    reqs = [e for e in xs if e["cat"] == "request" and "->" in e["name"]]
    assert len(reqs) == 240
    names = {e["args"]["name"] for e in t["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {"host w0", "host w1", "host ps0", "host ps1"}
    # each request's components tile it exactly
    by_track = {}
    for e in xs:
        by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    r = reqs[0]
    kids = sorted((e for e in by_track[(r["pid"], r["tid"])] if e["cat"] == "component"
                   and r["ts"] <= e["ts"] < r["ts"] + r["dur"]), key=lambda e: e["ts"])
    assert [k["name"] for k in kids] == C.BASE
    assert sum(k["dur"] for k in kids) == pytest.approx(r["dur"], abs=0.01)
    assert r["ts"] + r["dur"] == pytest.approx(kids[-1]["ts"] + kids[-1]["dur"], abs=0.002)


def test_one_timeline_across_hosts(run):
    """ps1's clock runs 3 ms ahead: on the trace, the server's slice of a request sits inside the
    worker's request slice (the clock models put it there), not 3 ms later."""
    out, d = run
    t = build_trace(d, [out])
    assert t["baseTimeNanoseconds"] % 10**9 == 0 and t["otherData"]["clock"].startswith("realtime of ")
    xs = [e for e in t["traceEvents"] if e["ph"] == "X" and e["cat"] == "request"]
    serve = [e for e in xs if e["name"].startswith("serve")]
    worker = {(e["args"]["worker_node"], e["args"]["call_id"], e["args"]["server_node"]): e for e in xs
              if "->" in e["name"]}
    assert serve
    for s in serve:
        w = worker[(s["args"]["worker_node"], s["args"]["call_id"], s["args"]["server_node"])]
        assert w["ts"] - 0.1 <= s["ts"] and s["ts"] + s["dur"] <= w["ts"] + w["dur"] + 0.1


def test_fold_sequences_and_unsplit_twice():
    # a real run without the netstack probe (tests/data/agent): host and network cannot be told apart
    present = {"client_user_tx", "server_user", "client_user_rx", C.UNSPLIT}
    folds = ("client_kernel_tx+client_nic_tx+wire_req+server_nic_rx+server_kernel_rx>unsplit;"
             "server_kernel_tx+server_nic_tx+wire_resp+client_nic_rx+client_kernel_rx>unsplit")
    seq = span_sequence(folds, present)
    assert seq == ["client_user_tx", "unsplit", "server_user", "unsplit", "client_user_rx"]
    vals = {"client_user_tx": 5, "server_user": 50, "unsplit": 40, "client_user_rx": 5}
    placed = _place(seq, vals, 1000, 100)
    # unsplit's two stretches are known only as a sum: the middle is one slice
    assert placed == [("client_user_tx", 1000, 5), ("unsplit+server_user", 1005, 90), ("client_user_rx", 1095, 5)]


def test_validator_catches_what_perfetto_rejects():
    ok = {"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
                          {"ph": "X", "name": "b", "ts": 2, "dur": 3, "pid": 1, "tid": 1}]}
    assert validate(ok) == []
    bad = {"traceEvents": [{"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
                           {"ph": "X", "name": "b", "ts": 5, "dur": 10, "pid": 1, "tid": 1},
                           {"ph": "X", "name": "c", "ts": 1, "dur": -1, "pid": 1, "tid": 2},
                           {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {}},
                           {"ph": "Q", "name": "d", "ts": 1, "pid": 1, "tid": 1}]}
    errs = validate(bad)
    assert any("without nesting" in e for e in errs) and any("dur >= 0" in e for e in errs)
    assert any("args.name" in e for e in errs) and any("unknown" in e for e in errs)
    assert validate([]) != []


def test_merge_onto_a_pytorch_trace(run):
    out, d = run
    ours = build_trace(d, [out], max_requests=10)
    assert ours["otherData"]["note"].startswith("the first 10 requests")
    theirs = {"baseTimeNanoseconds": ours["baseTimeNanoseconds"] - 2 * 10**9, "displayTimeUnit": "ms",
              "traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 5.0, "dur": 1.0, "pid": 4242, "tid": 4242}]}
    m = merge(ours, theirs)
    assert validate(m) == []
    first = next(e for e in ours["traceEvents"] if e["ph"] == "X")
    moved = [e for e in m["traceEvents"] if e.get("ph") == "X" and e["name"] == first["name"]][0]
    # the same realtime on their base: 2 s later in their us
    assert moved["ts"] == pytest.approx(first["ts"] + 2e6, abs=0.001) and moved["pid"] > 4242
    assert np.isclose(theirs["baseTimeNanoseconds"] + moved["ts"] * 1e3,
                      ours["baseTimeNanoseconds"] + first["ts"] * 1e3)


def test_flow_arrows_from_each_request_to_its_server_and_back(run):
    out, d = run
    t = build_trace(d, [out])
    ev = t["traceEvents"]
    slices = {}
    for e in ev:
        if e["ph"] == "X" and e["cat"] == "request":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
    flows = {}
    for e in ev:
        if e["ph"] in ("s", "f"):
            flows.setdefault(e["id"], {})[e["ph"]] = e

    def inside(e):   # the request slice on its track that holds its time
        return [n for a, b, n in slices.get((e["pid"], e["tid"]), []) if a - 0.0015 <= e["ts"] <= b + 0.0015]
    served = sum(1 for e in ev if e["ph"] == "X" and e["name"].startswith("serve "))
    assert len(flows) == 2 * served == 2 * 240
    for fid, f in flows.items():
        src, dst = inside(f["s"]), inside(f["f"])
        assert src and dst and f["f"]["bp"] == "e", (fid, f)
        if f["s"]["name"] == "request":
            assert any("->" in n for n in src) and any(n.startswith("serve ") for n in dst)
        else:
            assert any(n.startswith("serve ") for n in src) and any("->" in n for n in dst)
    assert validate(t) == []
    broken = {**t, "traceEvents": [e for e in ev if not (e["ph"] == "f" and e["id"] == 0)]}
    assert any("flow 0" in x for x in validate(broken))
