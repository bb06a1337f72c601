"""bench.overhead's pure parts: argument validation, ratios per round against the
round's own baseline, A/A noise, verdicts and the JSON contract of the last line."""
from __future__ import annotations

import json

import pytest

from bench.common import json_line
from bench.overhead import Run, parse_args, settings, summarize


def test_defaults_and_validation():
    a = parse_args([])
    assert a.settings == ["production", "worst"] and a.pairs >= 7
    assert parse_args(["--settings", "worst", "--pairs", "2"]).settings == ["worst"]
    for bad in (["--settings", "nope"], ["--settings", ","], ["--pairs", "0"], ["--duration-s", "-1"],
                ["--warmup-s", "5", "--duration-s", "5"], ["--rate", "0"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_settings_match_the_issue():
    s = settings(rate=50, small_keys=4, small_dim=2)
    prod, worst = s["production"], s["worst"]
    assert prod.wire_delay_ms == 1.0 and all(j.opts["server_delay_ms"] == 1.0 for j in prod.jobs)
    assert {j.name: j.open_loop for j in prod.jobs} == {"closed": False, "open": True}
    assert [j.opts.get("rate") for j in prod.jobs] == [None, 50]
    assert worst.wire_delay_ms == 0.0 and "floor" in worst.conditions
    assert all("server_delay_ms" not in j.opts and "rate" not in j.opts for j in worst.jobs)
    for st in s.values():
        assert {"baseline", "agent", "baseline2"} <= set(st.conditions)


def _run(setting, rnd, cond, tput, p99, open_tput=None, open_p99=None, lost=0):
    jobs = {"closed": {"slices_per_s": tput, "p99_us": p99}}
    if open_p99 is not None:
        jobs["open"] = {"slices_per_s": open_tput, "p99_us": open_p99}
    tracer = {"cpu_s": 1.0, "rss_mb": 300.0, "lost": lost, "messages": 10} if cond == "agent" else {}
    return Run(setting, rnd, cond, jobs, tracer)


def test_production_ratios_are_medians_over_rounds_against_each_rounds_baseline():
    s = settings(50, 4, 2)["production"]
    runs = []
    # round k: baseline throughput 1000 * (k+1) (drift between rounds); the agent 2% slower,
    # its open-loop p99 5% higher; baseline2 within 1% of baseline
    for k in range(3):
        b = 1000.0 * (k + 1)
        runs += [_run("production", k, "baseline", b, 100.0, 400.0, 10.0),
                 _run("production", k, "agent", b * 0.98, 100.0, 400.0, 10.5, lost=k),
                 _run("production", k, "baseline2", b * (1.01 if k % 2 else 0.99), 100.0, 400.0, 10.0)]
    out = summarize(s, runs)
    assert out["throughput_ratio"] == pytest.approx(0.98)
    assert out["p99_ratio"] == pytest.approx(1.05)
    assert out["aa_noise_throughput"] == pytest.approx(0.01)
    assert out["aa_noise"] == pytest.approx(0.01)
    assert out["verdict_throughput"] == "misses" and out["verdict_p99"] == "misses"
    assert out["agent_lost_events"] == [0, 1, 2]
    assert out["agent_runs_with_loss"] == 2
    assert out["rounds"] == 3 and out["failed_runs"] == 0


def test_a_failed_run_drops_only_its_pair():
    s = settings(50, 4, 2)["worst"]
    runs = []
    for k in range(3):
        runs += [_run("worst", k, "baseline", 1000.0, 1.0), _run("worst", k, "baseline2", 1000.0, 1.0),
                 _run("worst", k, "floor", 900.0, 1.0), _run("worst", k, "agent", 800.0 if k else 10.0, 1.0)]
    runs[3] = Run("worst", 0, "agent", error="RuntimeError: pslat agent exited with 1")
    out = summarize(s, runs)
    assert out["failed_runs"] == 1
    assert out["throughput_ratios"]["n"] == 2 and out["throughput_ratio"] == pytest.approx(0.8)
    assert out["floor_throughput_ratio"] == pytest.approx(0.9)
    assert out["loss_vs_floor"] == pytest.approx(2.0)
    assert out["verdict"] == "misses"


def test_last_line_carries_the_contract_keys():
    runs = [_run("production", 0, c, 1000.0, 100.0, 400.0, 10.0) for c in ("baseline", "agent", "baseline2")]
    runs += [_run("worst", 0, c, 1000.0, 1.0) for c in ("baseline", "agent", "baseline2", "floor")]
    s = settings(50, 4, 2)
    line = json_line({name: summarize(s[name], runs) for name in ("production", "worst")})
    d = json.loads(line)
    assert {"throughput_ratio", "p99_ratio", "aa_noise"} <= set(d["production"])
    assert {"throughput_ratio", "floor_throughput_ratio"} <= set(d["worst"])
    assert d["production"]["throughput_ratio"] == 1.0
