"""bench.capacity's pure parts: the rate steps, the memory verdict, the cost per
message beyond idle, and the headline figures."""
from __future__ import annotations

import argparse
import json

import pytest

from bench.capacity import CLOSED, headline, marginal, parse_args, parse_rates, rss_summary
from bench.common import json_line


def test_rates_must_be_positive_ascending_and_distinct():
    assert parse_rates("10,25,50") == [10.0, 25.0, 50.0]
    for bad in ("", "x", "10,5", "10,10", "0,10", "-5"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_rates(bad)


def test_options_validated():
    a = parse_args([])
    assert a.rss_duration_s == 600.0 and a.rates == sorted(a.rates)
    assert parse_args(["--rss-duration-s", "0"]).rss_duration_s == 0
    for bad in (["--rss-duration-s", "-1"], ["--step-s", "0"], ["--warmup-s", "9", "--step-s", "8"],
                ["--rss-duration-s", "60", "--rss-warmup-s", "60"], ["--rates", "5,1"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_flat_memory_and_growing_memory():
    # a start-up climb, then flat with noise: flat once the warm-up is left out
    flat = [(0, 200.0), (10, 290.0)] + [(t, 300.0 + (1 if t % 20 else -1)) for t in range(30, 601, 10)]
    r = rss_summary(flat, warmup_s=30, duration_s=600, flat_mb=16)
    assert r["flat"] is True and abs(r["slope_mb_per_min"]) < 0.1 and r["rss_max_mb"] == 301.0
    assert r["under_budget"] is True
    # 2 MB a minute: 20 MB over ten minutes
    growing = [(t, 300.0 + 2 * t / 60) for t in range(0, 601, 10)]
    g = rss_summary(growing, warmup_s=30, duration_s=600, flat_mb=16)
    assert g["flat"] is False and g["slope_mb_per_min"] == pytest.approx(2.0)
    assert rss_summary([(0, 500.0), (5, 500.0), (10, 500.0)], 0, 10)["under_budget"] is False
    # filling up to a bound for the first three minutes, then staying: flat (bounded), though
    # a line through the whole run slopes upwards
    bounded = [(t, 330.0 + min(t, 180) * 1.5) for t in range(0, 601, 5)]
    b = rss_summary(bounded, warmup_s=30, duration_s=600, flat_mb=16)
    assert b["flat"] is True and b["slope_mb_per_min"] > 10 and b["rss_half_mb"] == pytest.approx(600.0)


def _step(rate, msgs_per_s, lost, cpu_cores_idle=0.05, cpu_per_msg=5e-4, wall_s=10.0, **kw):
    msgs = msgs_per_s * wall_s
    return {"rate_per_worker": rate, "messages_per_s": msgs_per_s, "job_messages": msgs, "wall_s": wall_s,
            "lost": lost, "cpu_s": (cpu_cores_idle + cpu_per_msg * msgs_per_s) * wall_s,
            "cpu_s_per_100k_messages": ((cpu_cores_idle + cpu_per_msg * msgs_per_s) * wall_s) * 1e5 / msgs,
            "bpf_ns": (1e6 + 30_000 * msgs_per_s) * wall_s, "rss_mb": 300.0, **kw}


def test_marginal_cost_leaves_out_the_idle_cost():
    steps = [_step(r, m, 0) for r, m in ((10, 160), (50, 800), (100, 1600))]
    cpu = marginal(steps, "cpu_s")
    assert cpu["per_100k_messages"] == pytest.approx(50.0) and cpu["idle_per_s"] == pytest.approx(0.05)
    assert marginal(steps, "bpf_ns")["per_message"] == pytest.approx(30_000)
    assert marginal(steps[:2], "cpu_s") is None
    assert marginal(steps + [{"rate_per_worker": 200, "error": "x"}], "cpu_s")["steps"] == 3


def test_headline_is_the_fastest_step_without_loss():
    steps = [_step(10, 160, 0), _step(50, 800, 0), _step(100, 1600, 12), _step(CLOSED, 3400, 900),
             {"rate_per_worker": 200, "error": "RuntimeError: boom"}]
    floor = [_step(r, m, 0, hits_per_message=70.0) for r, m in ((10, 160), (50, 800), (CLOSED, 4000))]
    h = headline(steps, floor, None)
    assert h["max_rate_no_loss_msgs_per_s"] == 800 and h["max_rate_no_loss_step"] == 50
    assert h["lowest_rate_with_loss_msgs_per_s"] == 1600
    assert (h["closed_loop_lost"], h["closed_loop_msgs_per_s"]) == (900, 3400)
    assert h["floor"]["closed_loop_msgs_per_s"] == 4000
    assert h["cpu_marginal"] is None     # two steps without loss: too few for a line
    steps.insert(0, _step(5, 80, 0))
    steps.append(_step(400, 6400, 5000, cpu_per_msg=1e-4))   # lost events: did less work, left out
    h = headline(steps, floor, None)
    assert h["cpu_marginal"]["per_100k_messages"] == pytest.approx(50.0) and h["cpu_marginal"]["steps"] == 3
    d = json.loads(json_line(h))
    assert {"max_rate_no_loss_msgs_per_s", "cpu_s_per_100k_messages", "rss", "floor"} <= set(d)
