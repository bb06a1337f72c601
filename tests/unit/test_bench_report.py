"""bench.report's pure parts: sizes, growth exponents, fixed vs per-request cost."""
from __future__ import annotations

import argparse
import math

import pytest

from bench.report import (describe, fixed_and_marginal, growth_exponent, last_step_exponent, parse_sizes,
                          per_request_us)


def test_sizes_are_ascending_distinct_and_not_tiny():
    assert parse_sizes("10000,100000,1000000") == [10_000, 100_000, 1_000_000]
    for bad in ("", "x", "100000,10000", "1000,1000", "10"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_sizes(bad)


def test_linear_and_quadratic_growth_are_told_apart():
    sizes = [10_000, 100_000, 1_000_000]
    assert growth_exponent(sizes, [0.1, 1.0, 10.0]) == pytest.approx(1.0)
    assert growth_exponent(sizes, [0.01, 1.0, 100.0]) == pytest.approx(2.0)
    assert growth_exponent(sizes[:2], [0.1, 1.0]) is None
    # a fixed start-up cost hides the growth overall, not between the largest sizes
    t = [4.0 + 2e-5 * n for n in sizes]
    assert growth_exponent(sizes, t) < 0.6
    assert last_step_exponent(sizes, t) == pytest.approx(math.log10(24.0 / 6.0))
    assert last_step_exponent(sizes, t) > growth_exponent(sizes, t)
    lin = fixed_and_marginal(sizes, t)
    assert lin["fixed_s"] == pytest.approx(4.0) and lin["us_per_request"] == pytest.approx(20.0)


def test_per_request_cost():
    assert per_request_us(2.0, 1_000_000) == pytest.approx(2.0)
    assert per_request_us(None, 10) is None and per_request_us(1.0, 0) is None


def test_line_shows_wall_cpu_and_load():
    """On a shared machine wall time alone misleads: the line gives CPU time and load beside it."""
    m = {"requests": 1_000_000, "generated": {"hosts": 40, "run_dir_bytes": 312 * 2**20}, "dissect_s": 14.2,
         "summary_json_s": 1.3, "html_s": 10.7, "html_bytes": 5 * 2**20, "total_s": 26.1, "us_per_request": 26.1,
         "cpu_s": 24.5, "load_avg_1m": 5.3, "hwm_after_json_mb": 2400.0, "hwm_mb": 2450.0,
         "hwm_after_imports_mb": 111.0}
    line = describe(m)
    assert "total 26.10 s" in line and "24.50 s CPU" in line and "load 5.3" in line and "2,450 MB" in line
    assert "Chromium" not in line
    m["browser"] = {"load_s": 3.14, "ready": True, "plots": 19, "plots_expected": 19, "errors": 0}
    assert describe(m).endswith("; Chromium: 19 plots drawn in 3.14 s, 0 errors")
    m["browser"] = {"load_s": 120.0, "ready": False, "plots": 3, "plots_expected": 19, "errors": 1}
    assert "NOT every plot drawn (3 of 19), 1 errors" in describe(m)
