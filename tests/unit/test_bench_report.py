"""bench.report's pure parts: sizes, growth exponents, fixed vs per-request cost."""
from __future__ import annotations

import argparse
import math

import pytest

from bench.report import fixed_and_marginal, growth_exponent, last_step_exponent, parse_sizes, per_request_us


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
