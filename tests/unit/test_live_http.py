"""The agent's HTTP endpoint over the recorded psbench run: /metrics scraped and parsed by
prometheus-client's own parser, /snapshot.json, and bad --listen values."""
from __future__ import annotations

import json
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.daemon import replay
from core.errors import UserError
from agent.http import parse_listen, serve
from agent.live import LiveAggregates

REC = Path(__file__).resolve().parents[1] / "data" / "agent" / "psbench.rec.gz"


@pytest.fixture(scope="module")
def served():
    live = LiveAggregates(agent="recorded")
    with tempfile.TemporaryDirectory() as out:
        pipeline, _ = replay(REC, Path(out), live=live)
    live.tick({"sockcalls": {"lost": 3}, "framework": {"lost": 0}}, sum(pipeline.events.values()))
    server = serve("127.0.0.1:0", live)
    yield live, server, pipeline
    server.close()


def _get(server, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{server.address}{path}", timeout=5) as r:
        return r.read()


def test_metrics_parse_and_agree_with_the_live_totals(served):
    live, server, pipeline = served
    fams = {f.name: f for f in text_string_to_metric_families(_get(server, "/metrics").decode())}
    req = fams["pslat_request_seconds"]
    assert req.type == "histogram"
    by = {}
    for s in req.samples:
        key = (s.labels["role"], s.labels["op"])
        by.setdefault(key, {})
        if s.name.endswith("_bucket"):
            by[key].setdefault("buckets", []).append((float(s.labels["le"]), s.value))
        else:
            by[key][s.name.rsplit("_", 1)[1]] = s.value
    assert set(by) == {("client", "pull"), ("client", "push"), ("server", "pull"), ("server", "push")}
    for (role, op), d in by.items():
        tot = next(hs["e2e"] for (h, r, o, _), hs in live.totals.items() if (r, o) == (role, op))
        assert d["count"] == tot.n == 40 and d["sum"] == pytest.approx(tot.sum_ns / 1e9)
        values = [v for _, v in sorted(d["buckets"])]
        assert values == sorted(values) and values[-1] == 40     # cumulative, +Inf holds all
    comps = {s.labels["component"] for s in fams["pslat_component_seconds"].samples}
    assert {"server_user", "client_user_tx", "unsplit"} <= comps
    msgs = sum(s.value for s in fams["pslat_messages"].samples if s.name == "pslat_messages_total")
    assert msgs == sum(pipeline.rows.values()) == 386
    lost = {s.labels["probe"]: s.value for s in fams["pslat_events_lost"].samples if s.name.endswith("_total")}
    assert lost == {"sockcalls": 3, "framework": 0}
    assert fams["pslat_sampling_ratio"].samples[0].value == 1.0
    assert fams["pslat_connections_open"].samples[0].value == 25


def test_snapshot_json_is_the_live_snapshot(served):
    live, server, _ = served
    got = json.loads(_get(server, "/snapshot.json"))
    want = json.loads(json.dumps(live.snapshot()))
    assert got["groups"] == want["groups"] and got["keys"] == want["keys"]
    assert got["agents"][0]["lost"] == {"framework": 0, "sockcalls": 3}
    with pytest.raises(urllib.error.HTTPError) as e:
        _get(server, "/nothing")
    assert e.value.code == 404


@pytest.mark.parametrize("bad", ["9465", "localhost:9465", "127.0.0.1:99999", "127.0.0.1:x", ":80"])
def test_bad_listen_values_say_what_to_give(bad):
    with pytest.raises(UserError, match="ADDR:PORT"):
        parse_listen(bad)


def test_listen_values():
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9465") == ("::1", 9465)


def test_a_port_in_use_is_a_user_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(UserError, match="cannot listen"):
            serve(f"127.0.0.1:{s.getsockname()[1]}", LiveAggregates())
