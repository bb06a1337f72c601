"""bench.common's pure parts: ratios, spreads, A/A noise, verdicts, fits, rotation,
the strict JSON line, argument types and psbench figures from a ground truth."""
from __future__ import annotations

import argparse
import json
import math

import numpy as np
import pandas as pd
import pytest

from bench.common import (aa_noise, agent_counters, at_least, job_figures, json_line, linear_fit, median, order_of,
                          positive, ratio, slope_per_s, spread, verdict)


def test_ratio_refuses_missing_zero_and_non_finite():
    assert ratio(3.0, 2.0) == 1.5
    for num, den in ((None, 1.0), (1.0, None), (1.0, 0.0), (1.0, -2.0), (math.nan, 1.0), (1.0, math.inf)):
        assert ratio(num, den) is None


def test_median_and_spread_ignore_missing_values():
    assert median([1.0, None, 3.0, 2.0]) == 2.0
    assert median([None]) is None
    s = spread([0.9, None, 1.1, 1.0, 1.2, 0.8])
    assert (s["min"], s["p50"], s["max"], s["n"]) == (0.8, 1.0, 1.2, 5)
    assert spread([])["n"] == 0 and spread([])["p50"] is None


def test_aa_noise_is_the_median_distance_of_aa_ratios_from_one():
    assert aa_noise([0.95, 1.02, 1.10, None]) == pytest.approx(0.05)
    assert aa_noise([None]) is None


@pytest.mark.parametrize("value,target,noise,higher,expected", [
    (0.995, 0.99, 0.001, True, "meets"),
    (0.97, 0.99, 0.05, True, "within noise"),
    (0.90, 0.99, 0.05, True, "misses"),
    (1.01, 1.02, None, False, "meets"),
    (1.04, 1.02, 0.05, False, "within noise"),
    (1.30, 1.02, 0.05, False, "misses"),
    (None, 1.02, 0.05, False, "unmeasured"),
])
def test_verdict(value, target, noise, higher, expected):
    assert verdict(value, target, noise, higher) == expected


def test_linear_fit_recovers_a_line_and_needs_three_spread_points():
    x = np.arange(10.0)
    intercept, slope = linear_fit(x, 3.0 + 0.5 * x)
    assert intercept == pytest.approx(3.0) and slope == pytest.approx(0.5)
    assert linear_fit([1, 2], [1, 2]) is None
    assert linear_fit([1, 1, 1], [1, 2, 3]) is None
    assert slope_per_s([0, 60, 120, 180], [300, 300, 300, 300]) == pytest.approx(0.0)
    assert slope_per_s([0, 60, 120], [300, 301, 302]) == pytest.approx(1 / 60)
    with pytest.raises(ValueError):
        linear_fit([1, 2, 3], [1, 2])


def test_rounds_rotate_so_no_condition_always_runs_first():
    conds = ("baseline", "agent", "baseline2")
    orders = [order_of(k, conds) for k in range(6)]
    assert all(sorted(o) == sorted(conds) for o in orders)
    assert {o[0] for o in orders[:3]} == set(conds)
    assert orders[3] == orders[0]


def test_json_line_is_one_strict_line():
    line = json_line({"a": math.nan, "b": [np.float64(1.5), math.inf], "c": {"d": np.int64(3)}, 4: "x"})
    assert "\n" not in line
    assert json.loads(line) == {"a": None, "b": [1.5, None], "c": {"d": 3}, "4": "x"}


def test_argument_types_refuse_bad_values():
    assert positive(float)("2.5") == 2.5 and at_least(1)("7") == 7
    for bad in ("0", "-1", "nan", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive(float)(bad)
    for bad in ("0", "1.5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            at_least(1)(bad)


def _truth(open_loop: bool) -> pd.DataFrame:
    # worker rows: 10 slices, one every 100 ms from t=0; each takes 2 ms (closed) and,
    # in open loop, was due 1 ms before its issue; the last one never answered
    rows = []
    for k in range(10):
        issued = k * 100_000_000
        rows.append({"role": "worker", "sender": 9, "app_id": 0, "customer_id": 0, "timestamp": k,
                     "t_issued_ns": issued, "t_scheduled_ns": issued - 1_000_000 if open_loop else None,
                     "t_completed_ns": None if k == 9 else issued + 2_000_000})
    rows.append({"role": "server", "sender": 9, "app_id": 0, "customer_id": 0, "timestamp": 0,
                 "t_issued_ns": None, "t_scheduled_ns": None, "t_completed_ns": None})
    return pd.DataFrame(rows).astype({"t_issued_ns": "Int64", "t_scheduled_ns": "Int64", "t_completed_ns": "Int64"})


def test_job_figures_leave_out_the_warmup_and_count_from_when_due_in_open_loop():
    closed = job_figures(_truth(False), warmup_s=0.2, open_loop=False)
    assert closed["slices"] == 7 and closed["unanswered"] == 1       # slices 2..8 answered, 9 not
    assert closed["p99_us"] == pytest.approx(2000.0)
    assert closed["span_s"] == pytest.approx(0.602)                  # 0.2 s .. 0.802 s
    assert closed["slices_per_s"] == pytest.approx(7 / 0.602)
    assert closed["messages_all"] == 10 + 9                          # requests + responses, whole job
    opened = job_figures(_truth(True), warmup_s=0.2, open_loop=True)
    assert opened["p50_us"] == pytest.approx(3000.0)
    assert opened["issue_lag_p99_us"] == pytest.approx(1000.0)
    assert opened["p99_from_issue_us"] == pytest.approx(2000.0)


def test_agent_counters_read_lost_events_from_meta(tmp_path):
    probes = {"sockcalls": {"seen": 100, "lost": 0}, "netstack": {"seen": 50, "lost": 7}}
    for host, msgs in (("h0", 10), ("h1", 12)):
        (tmp_path / host).mkdir()
        (tmp_path / host / "meta.json").write_text(json.dumps({"host_id": host, "counters": {
            "probes": probes, "messages": msgs, "rows_dropped": 1, "events_undecodable": {"netstack": 2}}}))
    c = agent_counters(tmp_path)
    assert (c["lost"], c["seen"], c["messages"], c["rows_dropped"], c["undecodable"]) == (7, 150, 22, 2, 2)
    assert c["messages_by_host"] == {"h0": 10, "h1": 12}
