"""Cluster input validation and addressing: refused before anything is created, no root needed."""
from __future__ import annotations

import math
import subprocess
import sys

import pytest

from core.errors import UserError
from workloads.cluster.cluster import Cluster
from workloads.cluster.spec import MAX_HOSTS, WIRE_NS, make_spec, parse_pair_delay


def test_a_count_names_hosts_h0_to_hn_with_addresses_and_macs():
    spec = make_spec(3, wire_delay_ms=2.0)
    assert [(h.name, h.netns, h.addr, h.ifname) for h in spec.hosts] == [
        ("h0", "h0", "10.77.0.1", "eth0"), ("h1", "h1", "10.77.0.2", "eth0"),
        ("h2", "h2", "10.77.0.3", "eth0")]
    assert len({h.mac for h in spec.hosts} | {h.wire_mac for h in spec.hosts}) == 6
    assert spec.delay_ms == {(a, b): 2.0 for a in ("h0", "h1", "h2") for b in ("h0", "h1", "h2") if a != b}


def test_pair_delays_override_one_direction_only():
    spec = make_spec(["ps0", "w0"], wire_delay_ms=1.0, pair_delay_ms={("w0", "ps0"): 5})
    assert spec.delay_ms == {("ps0", "w0"): 1.0, ("w0", "ps0"): 5.0}
    assert spec.host("w0").addr == "10.77.0.2"


@pytest.mark.parametrize("kwargs, words", [
    (dict(hosts=0), "at least 1 host"),
    (dict(hosts=-2), "at least 1 host"),
    (dict(hosts=[]), "at least 1 host"),
    (dict(hosts=MAX_HOSTS + 1), f"at most {MAX_HOSTS}"),
    (dict(hosts=True), "count or a list"),
    (dict(hosts=["h0", "h0"]), "unique"),
    (dict(hosts=["a/b"]), "bad host name"),
    (dict(hosts=[""]), "bad host name"),
    (dict(hosts=["-x"]), "bad host name"),
    (dict(hosts=["x" * 33]), "bad host name"),
    (dict(hosts=[WIRE_NS]), "wire's own namespace"),
    (dict(hosts=2, wire_delay_ms=-1), ">= 0 ms"),
    (dict(hosts=2, wire_delay_ms=math.nan), ">= 0 ms"),
    (dict(hosts=2, wire_delay_ms=math.inf), ">= 0 ms"),
    (dict(hosts=2, wire_delay_ms="3"), "number of milliseconds"),
    (dict(hosts=2, wire_delay_ms=1e9), "more than the wire holds"),
    (dict(hosts=2, jitter_ms=-0.1), "jitter must be >= 0"),
    (dict(hosts=2, jitter_dist="pareto"), "unknown jitter distribution"),
    (dict(hosts=2, pair_delay_ms={("h0", "h9"): 1}), "unknown host 'h9'"),
    (dict(hosts=2, pair_delay_ms={("h0", "h0"): 1}), "does not reach itself"),
    (dict(hosts=2, pair_delay_ms={("h0", "h1"): -3}), "delay h0->h1 must be >= 0"),
    (dict(hosts=2, pair_delay_ms={"h0": 1}), "(source, destination) pair"),
    (dict(hosts=2, wait_s=-1), "wait_s"),
])
def test_bad_input_is_a_user_error(kwargs, words):
    with pytest.raises(UserError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Cluster(**kwargs)


def test_max_hosts_is_allowed():
    assert len(make_spec(MAX_HOSTS).hosts) == MAX_HOSTS
    assert make_spec(MAX_HOSTS).hosts[-1].addr == f"10.77.0.{MAX_HOSTS}"


def test_parse_pair_delay():
    assert parse_pair_delay("h0:h1=2.5") == (("h0", "h1"), 2.5)
    for bad in ("h0h1=2", "h0:h1", "h0:h1=x"):
        with pytest.raises(UserError, match="SRC:DST=MS"):
            parse_pair_delay(bad)


def test_unknown_host_lookup_names_the_hosts():
    with pytest.raises(UserError, match="hosts: h0, h1"):
        make_spec(2).host("h5")


def test_using_a_cluster_that_is_not_up_says_so():
    c = Cluster(2)
    with pytest.raises(UserError, match="not up"):
        c.popen("h0", ["true"])
    with pytest.raises(UserError, match="not up"):
        _ = c.wire_log_path


@pytest.mark.parametrize("args, words", [
    (["up", "--hosts", "0"], "at least 1 host"),
    (["up", "--hosts", "3", "--jitter-ms", "-2"], "jitter must be >= 0"),
    (["up", "--hosts", "2", "--pair-delay", "nonsense"], "SRC:DST=MS"),
])
def test_cli_bad_input_is_one_line_and_exit_2(args, words):
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "cluster", *args],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()]
    assert r.stderr.startswith("pslat: error: ") and words in r.stderr


def test_a_missing_forwarder_binary_says_to_run_setup(monkeypatch, tmp_path):
    from workloads.cluster import forwarder

    monkeypatch.setattr(forwarder, "BINARY", tmp_path / "wirefwd")
    with pytest.raises(UserError, match="make setup"):
        forwarder.binary()


def test_the_forwarder_config_names_every_port_and_pair(tmp_path):
    from workloads.cluster import forwarder

    spec = make_spec(["a", "b", "c"], wire_delay_ms=1.5, jitter_ms=0.25, pair_delay_ms={("c", "a"): 7})
    lines = forwarder.write_config(spec, tmp_path).read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("port ")] == [
        "port wp0 02:70:73:00:00:01", "port wp1 02:70:73:00:00:02", "port wp2 02:70:73:00:00:03"]
    delays = {tuple(ln.split()[1:3]): int(ln.split()[3]) for ln in lines if ln.startswith("delay ")}
    assert len(delays) == 6 and delays[("2", "0")] == 7_000_000 and delays[("0", "2")] == 1_500_000
    assert "jitter_ns 250000" in lines and f"log {tmp_path / 'wire.bin'}" in lines
