"""/metrics by Prometheus's conventions, on the recording with every probe
(tests/data/agent/netstack.rec.gz): Debian's `promtool check metrics` finds nothing to say, every
family is documented in docs/metrics.md, `sum by` is honest (a request's components, and its
groups, add up to its request time; sub-components stay within their parent), and the fine
buckets keep histogram_quantile (Prometheus's rule: linear inside the bucket) within 25% of
numpy's quantile of the values themselves."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.daemon import replay
from agent.http import registry_for
from agent.live import Hist, LiveAggregates

ROOT = Path(__file__).resolve().parents[2]
REC = ROOT / "tests" / "data" / "agent" / "netstack.rec.gz"
DOC = ROOT / "docs" / "metrics.md"


@pytest.fixture(scope="module")
def exposition() -> str:
    live = LiveAggregates(agent="recorded")
    with tempfile.TemporaryDirectory() as out:
        pipeline, _ = replay(REC, Path(out), live=live)
    live.tick({"sockcalls": {"lost": 0}, "netstack": {"lost": 2}}, sum(pipeline.events.values()))
    return generate_latest(registry_for(live, http_dropped=lambda: {"rate": 1})).decode()


def test_promtool_check_metrics_finds_nothing(exposition):
    promtool = shutil.which("promtool")
    assert promtool, "promtool (Debian's prometheus package) is missing: run make setup"
    r = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def test_every_family_is_documented_and_typed(exposition):
    fams = {f.name: f.type for f in text_string_to_metric_families(exposition)}
    doc = DOC.read_text()
    documented = set(re.findall(r"^\| `(pslat_\w+|process_\w+)`", doc, re.M))
    shown = {n + ("_total" if t == "counter" else "_info" if t == "info" else "") for n, t in fams.items()}
    assert shown <= documented, sorted(shown - documented)
    pslat_documented = {n for n in documented if n.startswith("pslat_")}
    assert pslat_documented <= shown, sorted(pslat_documented - shown)   # no stale rows
    assert fams["pslat_agent_cpu_seconds"] == "counter" and fams["pslat_sampling_ratio"] == "gauge"
    for n in ("pslat_request_seconds", "pslat_group_seconds", "pslat_component_seconds", "pslat_subcomponent_seconds"):
        assert fams[n] == "histogram"
    assert "process_resident_memory_bytes" in fams and "process_cpu_seconds" in fams


def _sums(exposition: str) -> dict[str, dict[tuple, float]]:
    out: dict[str, dict[tuple, float]] = defaultdict(dict)
    for f in text_string_to_metric_families(exposition):
        for s in f.samples:
            if s.name.endswith("_sum"):
                out[f.name][tuple(sorted(s.labels.items()))] = s.value
    return out


def test_sum_by_is_honest(exposition):
    sums = _sums(exposition)
    key = ("host", "op", "peer", "role")
    request = {tuple(v for k, v in labels if k in key): s for labels, s in sums["pslat_request_seconds"].items()}
    for fam, label in (("pslat_component_seconds", "component"), ("pslat_group_seconds", "group")):
        added: dict[tuple, float] = defaultdict(float)
        for labels, s in sums[fam].items():
            added[tuple(v for k, v in labels if k in key)] += s
        assert added.keys() == request.keys()
        for k, total in request.items():
            assert added[k] == pytest.approx(total, rel=1e-9, abs=1e-9), (fam, k)
    parents: dict[tuple, float] = {}
    for fam in ("pslat_component_seconds", "pslat_subcomponent_seconds"):
        for labels, s in sums[fam].items():
            d = dict(labels)
            parents[(d["host"], d["op"], d["peer"], d["role"], d.get("subcomponent", d.get("component")))] = s
    within: dict[tuple, float] = defaultdict(float)
    for labels, s in sums["pslat_subcomponent_seconds"].items():
        d = dict(labels)
        within[(d["host"], d["op"], d["peer"], d["role"], d["parent"])] += s
    assert within
    for k, s in within.items():
        assert s <= parents[k] + 1e-9, k


def _prometheus_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """histogram_quantile as Prometheus documents it: the bucket holding rank q*n, linear inside it
    (from 0 for the first), the highest finite bound for the +Inf bucket."""
    n = buckets[-1][1]
    rank = q * n
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    raise AssertionError("no bucket holds the rank")


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.0])
def test_fine_buckets_keep_p50_and_p99_within_25_percent(sigma):
    rng = np.random.default_rng(7)
    values_ns = np.exp(rng.normal(np.log(300_000), sigma, 20_000)).astype(np.int64)   # around 300 us
    live = LiveAggregates(agent="synthetic")
    h = live.totals.setdefault(("h1", "client", "push", "10.0.0.2"), {}).setdefault("e2e", Hist())
    for v in values_ns:
        h.add(int(v))
    (fam,) = [f for f in text_string_to_metric_families(generate_latest(registry_for(live)).decode())
              if f.name == "pslat_request_seconds"]
    buckets = [(float(s.labels["le"]), s.value) for s in fam.samples if s.name.endswith("_bucket")]
    assert len(buckets) >= 80   # 12 a decade, 1 us .. 10 s
    for q in (0.5, 0.99):
        want = np.quantile(values_ns, q) / 1e9
        got = _prometheus_quantile(q, buckets)
        assert abs(got - want) <= 0.25 * want, (sigma, q, got, want)
