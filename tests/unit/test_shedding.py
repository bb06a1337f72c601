"""Load shedding without root: the pair hash's mirror (symmetric, uniform, nested rates),
the controller's rule, the framework judge, and the report's scaling."""
from __future__ import annotations

import ipaddress
import random
from types import SimpleNamespace

import pytest

from core.errors import UserError
from agent.shedding import (MIN_KEEP_UNITS, FrameworkShedJudge, IntervalStats, SamplingRecord, Shedder,
                            ShedUnits, effective_rate)
from probes.filters import SAMPLE_UNITS, pair_hash16, pair_kept, rate_of, shed_units_of
from reports.summary import scaled


def _ips(n: int, seed: int = 1) -> list[str]:
    rnd = random.Random(seed)
    return [str(ipaddress.IPv4Address(rnd.getrandbits(32))) for _ in range(n)]


def test_pair_hash_is_symmetric_and_ipv4_equals_its_v4_mapped_form():
    for a, b in zip(_ips(200, 1), _ips(200, 2)):
        assert pair_hash16(a, b) == pair_hash16(b, a)
        assert pair_hash16(a, b) == pair_hash16(f"::ffff:{a}", b) == pair_hash16(a, f"::ffff:{b}")
    assert pair_hash16("fe80::1", "2001:db8::2") == pair_hash16("2001:db8::2", "fe80::1")


def test_pair_hash_is_uniform_over_neighbouring_addresses():
    # a cluster's addresses differ in their last bits: the hash must still spread them
    hs = [pair_hash16(f"10.77.{i // 256}.{i % 256}", "10.77.0.1") for i in range(1, 20001)]
    buckets = [0] * 16
    for h in hs:
        assert 0 <= h < SAMPLE_UNITS
        buckets[h >> 12] += 1
    expect = len(hs) / 16
    chi2 = sum((b - expect) ** 2 / expect for b in buckets)
    assert chi2 < 37.7, buckets   # chi-square, 15 degrees of freedom, p = 0.001
    for rate in (0.5, 0.25, 0.1):
        kept = sum(pair_kept(f"10.77.{i // 256}.{i % 256}", "10.77.0.1", shed_units_of(rate))
                   for i in range(1, 20001)) / 20000
        assert kept == pytest.approx(rate, abs=0.02)


def test_a_lower_rate_sheds_a_superset():
    pairs = list(zip(_ips(500, 3), _ips(500, 4)))
    kept = {r: {p for p in pairs if pair_kept(*p, shed_units_of(r))} for r in (1.0, 0.7, 0.3, 0.05)}
    assert kept[1.0] == set(pairs)
    assert kept[0.05] <= kept[0.3] <= kept[0.7] <= kept[1.0]


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, float("nan"), True, "0.5"])
def test_rates_out_of_range_are_user_errors(bad):
    with pytest.raises(UserError):
        shed_units_of(bad)


def test_units_round_trip():
    assert shed_units_of(1.0) == 0 and rate_of(0) == 1.0
    assert rate_of(shed_units_of(0.25)) == 0.25
    assert shed_units_of(1e-9) == SAMPLE_UNITS - 1   # at least one unit kept


def _interval(now_s: float, kernel: int, framework: int, consumed: int, busy_s: float, lost: int = 0):
    return IntervalStats(now_ns=int(now_s * 1e9), interval_s=1.0,
                         produced={"sockcalls": kernel, "framework": framework}, lost=lost,
                         consumed=consumed, busy_s=busy_s)


def test_fixed_rate_never_moves():
    s = Shedder(0.5, 0)
    assert s.mode == "fixed" and s.rate == 0.5
    assert s.observe(_interval(1, 100_000, 0, 10_000, 1.0, lost=90_000)) is None
    assert s.history == [[0, 0.5]]


def test_overload_cuts_at_once_to_the_rate_that_fits_at_most_halving():
    s = Shedder(None, 0)
    # the consumer takes 10k events per busy second; the probes make 30k/s, 10k of them
    # framework events (not reduced by sampling): 0.7 * 10k - 10k < 0, no rate helps:
    # no cut on utilisation (it would only throw data away), a cut on losses
    assert s.observe(_interval(1, 20_000, 10_000, 10_000, 1.0)) is None
    assert s.rate == 1.0 and s.saturated_by_framework == 1
    assert s.observe(_interval(2, 20_000, 10_000, 10_000, 1.0, lost=500)) is not None
    assert s.rate == 0.5
    s = Shedder(None, 0)
    # 20k kernel + 2k framework per second against 10k/s: r' = (7k - 2k) / 20k = 0.25 -> 0.5 now
    s.observe(_interval(1, 20_000, 2_000, 10_000, 1.0))
    assert s.rate == 0.5
    # still too much at 0.5 on the next look: r' = 0.5 * (7k - 1k) / 10k = 0.3
    s.observe(_interval(2, 10_000, 1_000, 10_000, 1.0))
    assert s.rate == pytest.approx(0.3, abs=2 / SAMPLE_UNITS)
    assert [r for _, r in s.history][:2] == [1.0, 0.5]


def test_a_busy_consumer_that_keeps_up_is_not_cut():
    """Draining 95% of the wall time but emptying the rings: on cores shared with the job
    the wall time overstates the agent's cost; nothing is lost, so nothing is shed."""
    s = Shedder(None, 0)
    st = _interval(1, 20_000, 2_000, 10_000, 1.0)
    st.behind = False
    assert s.observe(st) is None and s.rate == 1.0


def test_losses_halve_once_then_wait_for_the_backlog():
    s = Shedder(None, 0)
    s.observe(_interval(1, 1000, 0, 1000, 0.1, lost=50))
    assert s.rate == 0.5
    # the rings still hold the old rate's backlog: no second cut on losses alone
    assert s.observe(_interval(2, 500, 0, 500, 0.05, lost=20)) is None
    assert s.rate == 0.5


def test_room_raises_slowly_and_not_past_what_fits():
    s = Shedder(None, 0)
    s.observe(_interval(1, 20_000, 0, 10_000, 1.0))      # cut to 0.35
    low = s.rate
    rates = []
    for t in range(2, 40):   # now 1k events/s at 10% busy: room
        s.observe(_interval(t, int(20_000 * s.rate / low * 0.05), 0, int(20_000 * s.rate / low * 0.05),
                            0.1 * s.rate / low))
        rates.append(s.rate)
    assert rates[:3] == [low] * 3                          # calm for a while first
    rises = [b / a for a, b in zip(rates, rates[1:]) if b != a]
    assert rises and all(r <= 1.25 + 1e-3 for r in rises)
    assert rates[-1] == 1.0


def test_effective_rate_is_time_weighted():
    h = [[0, 1.0], [10, 0.5], [30, 0.25]]
    assert effective_rate(h, 40) == pytest.approx((10 * 1 + 20 * 0.5 + 10 * 0.25) / 40)
    assert effective_rate([[5, 0.5]], 5) == 0.5
    u = ShedUnits(h)
    assert u.between(12, 14) == (SAMPLE_UNITS // 2, SAMPLE_UNITS // 2)
    assert u.between(5, 35) == (0, 3 * SAMPLE_UNITS // 4)


def _judge(rate: float):
    ids = SimpleNamespace(tgid_of_endpoint={("10.0.0.1", 5000): 100, ("10.0.0.2", 6000): 200},
                          node_of_tgid={100: 9, 200: 8}, sender_of={}, node_of_addr={}, version=1)
    return FrameworkShedJudge(ids, [[0, rate]])


def _fm(tgid: int, ts=10**9):
    return SimpleNamespace(tgid=tgid, ret_ts_ns=ts)


def test_framework_records_of_shed_pairs_are_judged_by_the_mirror():
    h = pair_hash16("10.0.0.1", "10.0.0.2")
    below = rate_of(h + 1)                   # sheds this pair
    above = rate_of(h)                       # keeps it
    # the peer's node id as the record's protocol facts give it (parsers/pslite/framework.py)
    assert _judge(below).drop_now(_fm(100), True, 8, 2 * 10**9)
    assert not _judge(above).drop_now(_fm(100), True, 8, 2 * 10**9)
    assert _judge(below).shed(_fm(200), False, 9, 2 * 10**9)
    assert not _judge(above).shed(_fm(200), False, 9, 2 * 10**9)
    assert not _judge(1.0).shed(_fm(200), False, None, 2 * 10**9)   # nothing shed: unmatched
    j = _judge(0.5)
    assert j.shed(_fm(100), True, None, 2 * 10**9) and j.unresolved == 1


def test_sampling_notes_fill_meta_and_the_judge():
    meta = {}
    corr = SimpleNamespace(shed_judge=None, ids=SimpleNamespace())
    rec = SamplingRecord(meta, corr)
    live = SimpleNamespace(sampling_rate=1.0)
    rec.on_note({"ts_ns": 0, "rate": 1.0, "mode": "adaptive"}, live)
    assert corr.shed_judge is None
    rec.on_note({"ts_ns": 10, "rate": 0.5, "mode": "adaptive"}, live)
    rec.finish(20)
    assert meta["sampling"]["rate"] == 0.5 and live.sampling_rate == 0.5
    assert meta["sampling"]["history"] == [[0, 1.0], [10, 0.5]]
    assert meta["sampling"]["effective_rate"] == 0.75
    assert corr.shed_judge is not None


def _summary():
    by = {"h1": {"count": 3, "e2e_us": None, "groups_us": {}}}
    return {"requests": 10, "by_op": {"push": {"count": 8, "counts": {"wire_req": 6}, "by_server": by,
                                                "by_worker": {"h2": {"count": 8}}}}}


def test_report_counts_are_scaled_and_say_so():
    s = scaled(_summary(), 0.25)
    assert s["sampling"] == {"rate": 0.25, "scaled": True}
    assert s["sampled_requests"] == 10 and s["requests"] == 40
    op = s["by_op"]["push"]
    assert op["count"] == 32 and op["counts"] == {"wire_req": 24}
    assert op["by_server"]["h1"]["count"] == 12 and op["by_worker"]["h2"]["count"] == 32
    s = scaled(_summary(), None)
    assert s["sampling"] == {"rate": 1.0, "scaled": False} and s["requests"] == 10


def _budget_interval(now_s: float, kernel: int, framework: int, cpu_s: float):
    st = _interval(now_s, kernel, framework, kernel + framework, 0.1)
    st.behind, st.cpu_s = False, cpu_s    # the consumer keeps up: only the budget speaks
    return st


def test_cpu_budget_cuts_a_consumer_that_keeps_up_to_the_rate_that_fits():
    s = Shedder(None, 0, cpu_budget=0.1)
    assert s.observe(_budget_interval(1, 8_000, 2_000, 0.09)) is None and s.rate == 1.0   # under it
    # 0.3 CPU s per s for 8k kernel + 2k framework events: at r', 0.3 * (2k + 8k r') / 10k = 0.08
    # -> r' = 1/12, but at most halving per look
    s.observe(_budget_interval(2, 8_000, 2_000, 0.3))
    assert s.rate == 0.5
    assert s.observe(_budget_interval(3, 4_000, 2_000, 0.2)) is None    # cooldown: the backlog's CPU
    # 0.2 * (2k + 4k r'/0.5) / 6k = 0.08 -> r'/0.5 = 0.1: again at most halving
    s.observe(_budget_interval(4, 4_000, 2_000, 0.2))
    assert s.rate == 0.25
    # within the budget and calm: a rise only while its predicted CPU stays under 0.8 of it
    for t in range(5, 20):
        s.observe(_budget_interval(t, int(16_000 * s.rate), 2_000, 0.079))
    assert s.rate == 0.25


def test_cpu_budget_rises_when_there_is_room():
    s = Shedder(None, 0, cpu_budget=0.5)
    s.observe(_budget_interval(1, 10_000, 0, 1.0))
    assert s.rate == 0.5
    for t in range(2, 40):
        s.observe(_budget_interval(t, int(10_000 * s.rate), 0, 0.1 * s.rate))   # 0.1 CPU s at rate 1
    assert s.rate == 1.0


def test_cpu_budget_below_the_framework_events_cost_goes_to_the_least():
    s = Shedder(None, 0, cpu_budget=0.01)
    for t in range(1, 60):
        s.observe(_budget_interval(t, int(1_000 * s.rate), 9_000, 0.2))
    assert s.rate == rate_of(SAMPLE_UNITS - MIN_KEEP_UNITS)
