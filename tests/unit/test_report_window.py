"""reports.window: the warm-up rule both ways, --since/--until, filters, the JSON's window and run.

demo_requests.csv.gz: start (s from the first request) and end-to-end (us) of every request of
`pslat demo` (2 servers x 4 workers, 100 requests/s per worker, 20 s; session 17), as the report
measured them; the job's start-up there (the issue's reading of the demo, and psbench's own
p99 of 373 ms against about 8 ms after it) fills its first 2.5-3.5 s."""
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from core.errors import UserError
from reports.dissect import dissect
from reports.summary import document
from reports.window import Choice, detect_warmup, select
from workloads.simulated.job import Sim, simulate

DATA = Path(__file__).resolve().parents[1] / "data" / "reports"


def test_finds_the_demos_start_up():
    r = pd.read_csv(DATA / "demo_requests.csv.gz")
    w = detect_warmup(r["start_s"].to_numpy(), r["e2e_us"].to_numpy())
    assert w.end_s is not None and 2.5 <= w.end_s <= 4.0, w
    assert w.share_of_time > 0.7 and w.share_of_requests < 0.25, w


def test_cuts_nothing_from_a_steady_run():
    rng = np.random.default_rng(3)
    for seed in range(20):   # heavy-tailed but steady: lognormal latency, 400 requests/s for 20 s
        rng = np.random.default_rng(seed)
        start = np.sort(rng.uniform(0, 20, 8000))
        e2e = rng.lognormal(np.log(1000), 1.0, 8000)
        assert detect_warmup(start, e2e).end_s is None, seed


def test_too_short_a_run_is_not_judged():
    w = detect_warmup(np.linspace(0, 3, 1000), np.r_[np.full(500, 1e5), np.full(500, 1e3)])
    assert w.end_s is None and "too short" in w.why


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("win")
    simulate(out, Sim(requests=400, workers=2, servers=2, seed=5))
    return dissect([out])


def test_window_filters_and_json(run):
    whole = select(run, Choice())
    assert whole.info.whole and whole.info.to_json()["warmup_s"] is None
    run_s = whole.info.run_s
    half = select(run, Choice(since=str(run_s / 2)))
    n_all, n_half = len(whole.window.requests), len(half.window.requests)
    assert 0.3 * n_all < n_half < 0.7 * n_all
    doc = document(half)
    assert doc["format_version"] == 2
    assert set(doc["run"]) == {"start_utc", "end_utc", "duration_s", "rate_per_s", "agent_version", "kernel"}
    assert set(doc["window"]) == {"since_s", "until_s", "warmup_s"}
    assert doc["requests"] == n_all and doc["windowed"]["requests"] == n_half   # whole run kept, window added
    assert doc["run"]["agent_version"] == "sim" and set(doc["run"]["rate_per_s"]) == {"pull", "push"}
    pull = select(run, Choice(ops=["pull"], servers=["ps0"]))
    r = pull.window.requests
    assert set(r["op"]) == {"pull"} and set(r["server_host"].astype(str)) == {"ps0"}
    with pytest.raises(UserError, match="no request matches"):
        select(run, Choice(ops=["nope"]))
    with pytest.raises(UserError, match="empty"):
        select(run, Choice(since="5", until="1"))
    with pytest.raises(UserError, match="seconds from the run's start"):
        select(run, Choice(since="yesterday"))
