"""The HTML report and the view model behind it, on simulated run dirs with known truth
(workloads.simulated.job + workloads.simulated.views); the browser tests are in tests/privileged."""
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from reports.concurrency import in_flight
from reports.dissect import dissect
from reports.extra import RunContext
from reports.html import render, script_json
from workloads.simulated.job import Sim, simulate
from workloads.simulated.views import ViewSim, add_views
from reports.skew import key_skew
from reports.viewmodel import build_model


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("views")
    simulate(out, Sim(requests=400, workers=4, servers=2, seed=11, nic=True, clocks={"ps1": (2_000_000, 10.0)}))
    truth = add_views(out, ViewSim(keys_per_request=48, key_space=20_000, zipf_s=1.2,
                                   lost={"ps1": {"netstack": 7}}))
    d = dissect([out])
    return out, d, truth, build_model(d, [out])


def test_script_json_cannot_leave_its_script_element():
    text = script_json({"h": "</script><script>alert(1)</script><!--", "u": "\u2028&"})
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == {"h": "</script><script>alert(1)</script><!--", "u": "\u2028&"}


def _truth_shares(counts: pd.Series) -> tuple[float, float]:
    c = counts.sort_values(ascending=False).to_numpy(dtype=float)
    return (c[:int(np.ceil(0.01 * len(c)))].sum() / c.sum(), c[:int(np.ceil(0.1 * len(c)))].sum() / c.sum())


def test_key_skew_estimates_match_the_truth(run):
    """Bottom-16 samples of 48 keys per message: the estimated top shares and distinct keys are
    within a few percent of the true ones computed from every key."""
    out, d, truth, _ = run
    k = key_skew(RunContext.open([out], d))
    for op in ("push", "pull"):
        o = k[op]
        assert not o["exact"] and 0 < o["subset_fraction"] < 1
        top1, top10 = _truth_shares(truth[op])
        assert abs(o["top1_share"] - top1) < 0.05, (o["top1_share"], top1)
        assert abs(o["top10_share"] - top10) < 0.05, (o["top10_share"], top10)
        assert abs(o["distinct_keys_est"] / len(truth[op]) - 1) < 0.15
        # the estimated hottest keys are truly hot, with about their true counts
        for h in o["hot_keys"][:3]:
            true = truth[op].get(np.uint64(int(h["key"], 16)), 0)
            assert true > 0 and abs(h["updates"] / true - 1) < 0.35, (h, true)
        assert 0.8 < o["zipf_s"] < 1.6


def test_in_flight_counts_connections_not_requests():
    # process p: conn a has two overlapping requests (one busy period), conn b one request
    g = np.array(["p", "p", "p", "p"])
    c = np.array(["a", "a", "b", "a"])
    t0 = np.array([0, 5, 8, 30])
    t1 = np.array([10, 20, 12, 40])
    # at t=0: a only -> 1; t=5: a (still) -> 1; t=8: a and b -> 2; t=30: a alone again -> 1
    assert in_flight(g, c, t0, t1).tolist() == [1, 1, 2, 1]


def test_model_sections(run):
    _, d, truth, m = run
    assert set(m["breakdown"]) == {"pull", "push"}
    for op, b in m["breakdown"].items():
        # mean contributions add up to the mean e2e (the components add up per request)
        assert sum(b["components_us"].values()) == pytest.approx(b["e2e_mean_us"], rel=1e-9)
        assert sum(b["groups_us"].values()) == pytest.approx(b["e2e_mean_us"], rel=1e-9)
        q = m["cdf"][op]["series"]["e2e"]["us"]
        assert q == sorted(q) and len(q) == len(m["cdf"][op]["q"])
    c = m["connections"]
    assert c["traced"] and c["total"]["connects"] == c["total"]["accepts"] == sum(truth["connections"].values()) // 2
    assert any("ps1 netstack lost 7" in f for f in m["findings"])
    assert any(f.startswith("pull:") and "host-side" in f for f in m["findings"])
    # no row per request in the model
    assert len(json.dumps(m, default=str)) < 400_000


def test_not_traced_connections_say_so(tmp_path):
    simulate(tmp_path, Sim(requests=40, seed=2))
    d = dissect([tmp_path])
    m = build_model(d, [tmp_path])
    assert m["connections"]["traced"] is False and "not traced" in m["connections"]["why"]
    assert any("not traced" in f for f in m["findings"])
    assert "why_none" in m["skew"]
    render(m)   # every section renders with the parts missing


def test_html_is_self_contained_and_escapes(run):
    _, _, _, m = run
    m = json.loads(json.dumps(m, default=str))
    evil = '<svg/onload=alert(1)></script><!--"\'&'
    m["findings"].append(evil)
    m["processes"].append({"host": evil, "pid": 1, "threads": 1, "comms": [evil]})
    m["breakdown"]["pull"]["by_server"]["hosts"][evil] = m["breakdown"]["pull"]["by_server"]["hosts"]["ps0"]
    html = render(m)
    assert evil not in html and "<svg/onload" not in html
    assert html.count("&lt;svg/onload=alert(1)&gt;") >= 2
    # nothing is fetched: no src/href to another resource
    assert not re.search(r"""<(script|link|img|iframe)[^>]+(src|href)=""", html)
    assert "default-src 'none'" in html
    data = re.search(r'<script type="application/json" id="pslat-data">(.*?)</script>', html, re.S).group(1)
    figs = json.loads(data)["figures"]
    assert len(figs) >= 10 and all(f"id=\"{f['div']}\"" in html for f in figs)
    assert any("&lt;svg/onload=alert(1)&gt;" in json.dumps(f) for f in figs)   # escaped for plotly's text too


def test_worker_only_run_names_the_untraced_side(tmp_path):
    """Only the worker's host traced: the concurrency table has no server rows of zeros;
    it says that side was not traced."""
    simulate(tmp_path, Sim(requests=40, seed=2, workers=1, servers=1, traced=("w0",)))
    m = build_model(dissect([tmp_path / "w0"]), [tmp_path / "w0"])
    assert all(per["server"]["requests_counted"] == 0 for per in m["concurrency"].values())
    page = render(m)
    section = page[page.index('<section id="concurrency">'):page.index('<section id="connections">')]
    assert "No server side counted" in section and ">server</td>" not in section


def test_per_host_bars_keep_their_scale_under_a_long_tail(run):
    """A host's e2e p99 far above its mean (a run's start-up) is a label over its bar, not a point
    on the bars' axis that would squash them to a few pixels."""
    _, _, _, m = run
    m = json.loads(json.dumps(m, default=str))
    hosts = m["breakdown"]["pull"]["by_server"]["hosts"]
    bars_us = [sum(v or 0 for v in h["groups_us"].values()) for h in hosts.values()]
    hosts["ps0"]["e2e_p99_us"] = 100 * max(bars_us)
    html = render(m)
    data = re.search(r'<script type="application/json" id="pslat-data">(.*?)</script>', html, re.S).group(1)
    fig = next(f for f in json.loads(data)["figures"]
               if f["layout"].get("title", {}).get("text", "").startswith("pull per server"))
    assert max(bars_us) < fig["layout"]["yaxis"]["range"][1] < 2 * max(bars_us)
    labels = [a["text"] for a in fig["layout"]["annotations"]]
    assert len(labels) == len(hosts) and all(t.startswith("p50 ") and "<br>p99 " in t for t in labels)
    assert all(trace["type"] == "bar" for trace in fig["data"])


def test_one_worker_gets_a_line_not_a_chart_of_zeros(tmp_path):
    """With one worker no key's pushes can be merged: the aggregation chart would be all zeros."""
    simulate(tmp_path, Sim(requests=60, seed=3, workers=1, servers=1))
    add_views(tmp_path, ViewSim(keys_per_request=16, key_space=2_000))
    dirs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    page = render(build_model(dissect(dirs), dirs))
    section = page[page.index('<section id="skew">'):page.index('<section id="clocks">')]
    assert "would remove no push bytes here" in section
    assert any("would remove no push bytes here" in f for f in build_model(dissect(dirs), dirs)["findings"])
    figs = json.loads(re.search(r'<script type="application/json" id="pslat-data">(.*?)</script>', page,
                                re.S).group(1))["figures"]
    assert not any("aggregating" in f["layout"].get("title", {}).get("text", "") for f in figs)
