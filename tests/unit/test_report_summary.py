"""The JSON summary is a contract (issue 4, README "Report JSON summary"): its schema, checked."""
import json
from pathlib import Path

import pytest

from reports import components as C
from reports.dissect import dissect
from workloads.simulated.job import Sim, simulate
from reports.summary import summary

DATA = Path(__file__).resolve().parents[1] / "data" / "reports"
STAT = {"mean", "p50", "p90", "p99"}
SOURCES = {"shared", "disciplined", "estimated", "none"}
GROUP_NAMES = set(C.GROUPS)


def _stat(x, where):
    if x is None:
        return
    assert isinstance(x, dict) and set(x) == STAT, f"{where}: {x!r} is not a stat object"
    for k in STAT:
        assert isinstance(x[k], float), f"{where}.{k}: {x[k]!r} is not a float (microseconds)"
    assert x["p50"] <= x["p90"] <= x["p99"], where


def _groups(g, where):
    assert {"host", "nic", "wire"} <= set(g) <= GROUP_NAMES, where
    for k, v in g.items():
        _stat(v, f"{where}.{k}")


def check_contract(s: dict) -> None:
    """Fails on anything the contract does not allow."""
    assert {"requests", "unmatched", "hosts", "clock", "by_op"} <= set(s)
    assert isinstance(s["requests"], int) and s["requests"] >= 0
    assert set(s["unmatched"]) == {"requests_without_response", "messages_without_request", "messages_unparsed",
                                   "connections_unrecognised", "bytes_unrecognised"}
    assert all(isinstance(v, int) and v >= 0 for v in s["unmatched"].values())
    assert isinstance(s["hosts"], list) and all(isinstance(h, str) for h in s["hosts"])
    for key, c in s["clock"].items():
        a, _, b = key.partition("~")
        assert a and b and a < b and a in s["hosts"] and b in s["hosts"], key
        assert {"offset_us", "drift_ppm", "uncertainty_us", "source"} <= set(c)
        assert c["source"] in SOURCES
        for k in ("offset_us", "drift_ppm", "uncertainty_us"):
            assert c[k] is None if c["source"] == "none" else isinstance(c[k], float), (key, k)
    total = 0
    for op, o in s["by_op"].items():
        assert isinstance(op, str)
        assert isinstance(o["count"], int) and o["count"] > 0
        total += o["count"]
        _stat(o["e2e_us"], f"{op}.e2e_us")
        assert set(o["components_us"]) <= set(C.COMPONENTS)
        assert set(o["subcomponents_us"]) <= set(C.SUBS)
        for part in ("components_us", "subcomponents_us"):
            for k, v in o[part].items():
                assert v is not None
                _stat(v, f"{op}.{part}.{k}")
        _groups(o["groups_us"], f"{op}.groups_us")
        for by in ("by_server", "by_worker"):
            assert sum(b["count"] for b in o[by].values()) == o["count"], (op, by)
            for host, b in o[by].items():
                assert set(b) == {"count", "e2e_us", "groups_us"}
                _stat(b["e2e_us"], f"{op}.{by}.{host}")
                _groups(b["groups_us"], f"{op}.{by}.{host}.groups_us")
    assert total <= s["requests"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    simulate(out, Sim(requests=100, clocks={"ps1": (2_000_000, 10.0)}, lose_end=0.02, negative_wire_at=(4,),
                      seed=21))
    return dissect([out])


def test_live_summary_keeps_the_contract(live):
    s = summary(live)
    check_contract(s)
    json.dumps(s, allow_nan=False)   # plain JSON: no NaN, no numpy types
    assert set(s["by_op"]) == {"pull", "push"}
    assert s["requests"] == live.stats.requests
    assert set(s["clock"]) == {"ps0~w0", "ps0~w1", "ps1~w0", "ps1~w1"}
    assert s["clock"]["ps1~w0"]["offset_us"] == pytest.approx(2000, abs=s["clock"]["ps1~w0"]["uncertainty_us"])


def test_stat_values_are_the_requests(live):
    """p50 of a component is the median of that column of the per-request table, in us."""
    s = summary(live)
    done = live.complete
    pulls = done[done["op"] == "pull"]
    assert s["by_op"]["pull"]["count"] == len(pulls)
    med = pulls["server_user"].astype("float64").median() / 1e3
    assert s["by_op"]["pull"]["components_us"]["server_user"]["p50"] == pytest.approx(med, abs=1e-3)
    assert s["by_op"]["pull"]["e2e_us"]["mean"] == pytest.approx(pulls["e2e"].astype("float64").mean() / 1e3,
                                                                 abs=1e-3)


def test_stored_example_keeps_the_contract():
    """The example the README and the golden rendering use."""
    check_contract(json.loads((DATA / "summary_small.json").read_text()))


@pytest.mark.parametrize("bad", [
    lambda s: s.pop("unmatched"),
    lambda s: s["by_op"]["pull"]["e2e_us"].pop("p90"),
    lambda s: s["by_op"]["pull"]["groups_us"].pop("wire"),
    lambda s: s["clock"].update({"w0~ps0": s["clock"]["ps0~w0"]}),
    lambda s: s["by_op"]["pull"]["components_us"].update({"client_kernel": {"mean": 1.0, "p50": 1.0,
                                                                             "p90": 1.0, "p99": 1.0}}),
])
def test_the_check_can_fail(bad):
    s = json.loads((DATA / "summary_small.json").read_text())
    bad(s)
    with pytest.raises(AssertionError):
        check_contract(s)
