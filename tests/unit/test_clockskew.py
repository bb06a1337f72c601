"""agent.clockskew: the clock error `pslat agent --test-clock-skew` puts on one host."""
import pytest

from agent.clockskew import ClockSkew
from core.errors import UserError


def test_parse_and_apply_every_timestamp_and_nothing_else():
    k = ClockSkew.parse("h1:5000:50", t0_ns=1_000_000_000)
    assert (k.host, k.offset_ns, k.drift_ppm) == ("h1", 5_000_000, 50.0)
    row = {"ts_framework_ns": 3_000_000_000, "ts_xmit_last_ns": None, "runq_wait_ns": 7, "bytes": 9,
           "ts_close_ns": 1_000_000_000}
    k.apply(row)
    # 2 s after t0 at 50 ppm: 100 us of drift on top of the 5 ms offset
    assert row == {"ts_framework_ns": 3_005_100_000, "ts_xmit_last_ns": None, "runq_wait_ns": 7, "bytes": 9,
                   "ts_close_ns": 1_005_000_000}
    assert k.to_meta() == {"offset_ns": 5_000_000, "drift_ppm": 50.0, "t0_ns": 1_000_000_000}


def test_host_names_with_colons_keep_them():
    assert ClockSkew.parse("fe80::1:-250.5:-3", 0).host == "fe80::1"
    assert ClockSkew.parse("fe80::1:-250.5:-3", 0).offset_ns == -250_500


@pytest.mark.parametrize("text", ["h1", "h1:5", ":5:1", "h1:x:1", "h1:5:1e9", "h1:1e13:0"])
def test_bad_values_are_one_clear_error(text):
    with pytest.raises(UserError, match="--test-clock-skew"):
        ClockSkew.parse(text, 0)
