"""The Grafana dashboard (docs/grafana/pslat-dashboard.json) against Debian's Prometheus: a real
Prometheus server on loopback scrapes `pslat agent --replay ... --pace --listen` (the recording
with every probe, tests/data/agent/netstack.rec.gz, fed at its recorded pace so counters grow
between scrapes), and every panel's every query must return a series with a finite value, as
Grafana would evaluate it at the end of the replay. Prometheus's own histogram_quantile on the
fine buckets is held to the quantiles of the run dir the same replay wrote.

No root needed: the replay and the server are user processes (about 15 s, most of it the replay's
recorded pace)."""
from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "pslat-dashboard.json"
REC = ROOT / "tests" / "data" / "agent" / "netstack.rec.gz"
SCRAPE_S = 1
RATE_INTERVAL = "4s"   # Grafana's $__rate_interval at a 1 s scrape interval: 4 scrapes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout_s: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return r.read()


def _wait(cond, what: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what} within {timeout_s:g} s"
        time.sleep(0.2)   # polling a server's state, not waiting for a guessed time


def _ready(url: str) -> bool:
    try:
        return _get(url, 1.0) is not None
    except OSError:
        return False


def panel_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    return [(p["title"], t["expr"]) for p in dash["panels"] for t in p["targets"]]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """(query function, the end of the replay in Unix seconds, the replay's run dir)."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is missing: run make setup"
    tmp = tmp_path_factory.mktemp("prom")
    agent_port, prom_port = _free_port(), _free_port()
    (tmp / "prometheus.yml").write_text(
        f"global:\n  scrape_interval: {SCRAPE_S}s\n  evaluation_interval: {SCRAPE_S}s\n"
        f"scrape_configs:\n  - job_name: pslat\n    static_configs:\n      - targets: ['127.0.0.1:{agent_port}']\n")
    prom = subprocess.Popen([binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp / "prometheus.log", "w"))
    agent = None
    try:
        base = f"http://127.0.0.1:{prom_port}"
        _wait(lambda: _ready(f"{base}/-/ready"), "Prometheus ready", 30)
        agent = subprocess.Popen([sys.executable, "-m", "pslat.cli", "agent", "--replay", str(REC), "--pace",
                                  "--out", str(tmp / "run"), "--listen", f"127.0.0.1:{agent_port}",
                                  "--duration", "60"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
        for line in agent.stderr:   # its second line says the replay is done: the totals are whole
            if "replayed" in line:
                break
        else:
            raise AssertionError(f"the agent ended early: exit {agent.wait()}")
        t_end = time.time()

        def query(expr: str, at: float) -> list[dict]:
            url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
            got = json.loads(_get(url))
            assert got["status"] == "success", got
            return got["data"]["result"]

        # a scrape after the end: Prometheus holds the whole replay
        _wait(lambda: query("pslat_events_total", time.time()) and
              float(query("timestamp(pslat_events_total)", time.time())[0]["value"][1]) > t_end + 0.1,
              "a scrape after the replay", 15)
        yield query, t_end, tmp / "run"
    finally:
        for p in (agent, prom):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@pytest.mark.parametrize("title,expr", panel_queries(), ids=lambda x: re.sub(r"\W+", "_", x)[:40])
def test_every_panel_query_returns_data(prometheus, title, expr):
    query, t_end, _ = prometheus
    expr = expr.replace('=~"$host"', '=~".*"').replace("$__rate_interval", RATE_INTERVAL)
    result = query(expr, t_end)
    values = [float(r["value"][1]) for r in result]
    assert any(math.isfinite(v) for v in values), f"{title}: {expr} gave {result}"


def test_histogram_quantile_is_within_25_percent_of_the_run_dirs(prometheus):
    """Prometheus's p50 and p99 of the server's residence time (fine buckets) against the exact ones
    of the run dir the replay wrote: a server's request is its rx row's recv to its response's send."""
    import pandas as pd

    query, t_end, run = prometheus
    (host_dir,) = [d for d in run.iterdir() if d.is_dir()]
    rows = pd.concat(pd.read_parquet(f) for f in sorted(host_dir.glob("messages*.parquet")))
    data = rows[rows["op"].isin(["push", "pull"]) & ~rows["control"].astype(bool)]
    for op in ("push", "pull"):
        d = data[data["op"] == op]
        req = d[(d["direction"] == "rx") & d["request"]]
        resp = d[(d["direction"] == "tx") & ~d["request"]]
        # ps-lite pairs a response with its request by (timestamp, worker, server): sender/recver swap
        m = req.merge(resp, left_on=["call_id", "sender", "recver"], right_on=["call_id", "recver", "sender"],
                      suffixes=("_q", "_p"))
        exact = ((m["ts_txdone_last_ns_p"].fillna(m["ts_xmit_last_ns_p"]) -
                  m["ts_nic_rx_last_ns_q"].fillna(m["ts_netif_rx_last_ns_q"])) / 1e9)
        assert len(exact) == 80, len(exact)
        for q in (0.5, 0.99):
            got = query(f'histogram_quantile({q}, sum by (le) (pslat_request_seconds_bucket'
                        f'{{role="server",op="{op}"}}))', t_end)
            prom_q = float(got[0]["value"][1])
            want = float(exact.quantile(q, interpolation="higher"))
            print(f"{op} p{q * 100:g}: Prometheus {prom_q * 1e6:.1f} us, run dir {want * 1e6:.1f} us")
            assert abs(prom_q - want) <= 0.25 * want, (op, q, prom_q, want)
