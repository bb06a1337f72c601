"""Processes whose messages go around the kernel's sockets (BytePS's RDMA, UCX and
libfabric vans): told from their environment (parsers/pslite/vans.py, via
parsers.registry), read from /proc (agent/bypass.py), kept in meta.json and said in
the report."""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from agent.bypass import BypassWatch, read_environ
from agent.runmeta import check_meta
from parsers.pslite.vans import kernel_bypass
from parsers.registry import kernel_bypass as all_protocols
from reports.findings import bypass_findings


@pytest.mark.parametrize("env, transport", [
    ({}, None),
    ({b"DMLC_ENABLE_RDMA": b"zmq"}, None),
    ({b"DMLC_ENABLE_RDMA": b"0"}, None),
    ({b"DMLC_ENABLE_RDMA": b"ibverbs"}, "RDMA verbs"),
    ({b"DMLC_ENABLE_RDMA": b"1"}, "RDMA verbs"),            # deprecated spelling, same van
    ({b"DMLC_ENABLE_RDMA": b"fabric"}, "libfabric"),
    ({b"DMLC_ENABLE_RDMA": b"ucx"}, "UCX"),
    ({b"DMLC_ENABLE_RDMA": b"IBVERBS"}, None),              # Van::Create compares exactly: it stops
    ({b"DMLC_ENABLE_UCX": b"1"}, "UCX"),
    ({b"DMLC_ENABLE_UCX": b" 2abc"}, "UCX"),                # atoi: 2
    ({b"DMLC_ENABLE_UCX": b"0"}, None),
    ({b"DMLC_ENABLE_UCX": b"yes"}, None),                   # atoi: 0
    ({b"DMLC_ENABLE_UCX": b"0", b"DMLC_ENABLE_RDMA": b"ibverbs"}, "RDMA verbs"),
    ({b"DMLC_ENABLE_UCX": b"1", b"DMLC_ENABLE_RDMA": b"zmq"}, "UCX"),   # UCX wins
])
def test_the_van_a_byteps_environment_chooses(env, transport):
    got = kernel_bypass(env)
    assert (got or {}).get("transport") == transport
    if transport:
        assert all_protocols(env) == [dict(got, protocol="pslite")]


def test_a_hostile_value_is_shown_short_and_printable():
    got = kernel_bypass({b"DMLC_ENABLE_UCX": b"1<b>\x1b[31m" + b"x" * 100})
    assert got["setting"] == "DMLC_ENABLE_UCX=1<b>?[31mxxxxxxx" and len(got["setting"]) == 32


def test_a_real_processs_environment_is_read_and_judged_once():
    env = dict(os.environ, DMLC_ENABLE_RDMA="ibverbs")
    p = subprocess.Popen(["sleep", "30"], env=env)
    try:
        for _ in range(100):   # until the exec
            if (read_environ(p.pid) or {}).get(b"DMLC_ENABLE_RDMA"):
                break
            time.sleep(0.01)
        assert read_environ(p.pid)[b"DMLC_ENABLE_RDMA"] == b"ibverbs"
        w = BypassWatch()
        (found,) = w.note(p.pid, lambda pid: 4026531840)
        assert found == {"pid": p.pid, "comm": "sleep", "netns": 4026531840, "protocol": "pslite",
                         "transport": "RDMA verbs", "setting": "DMLC_ENABLE_RDMA=ibverbs"}
        assert w.note(p.pid, lambda pid: 0) == []            # once per process
        assert w.note(os.getpid(), lambda pid: 0) == []      # this one uses no bypassing van
    finally:
        p.kill()
        p.wait()
    assert read_environ(p.pid) is None


def test_meta_json_keeps_well_formed_entries_only():
    good = {"pid": 7, "comm": "worker", "protocol": "pslite", "transport": "UCX", "setting": "DMLC_ENABLE_UCX=1"}
    meta, problems = check_meta({"host_id": "h1", "kernel_bypass": [good]}, "m")
    assert meta["kernel_bypass"] == [good] and not problems
    for bad in ([dict(good, pid="7")], [dict(good, comm=None)], good, [good] * 65):
        meta, problems = check_meta({"host_id": "h1", "kernel_bypass": bad}, "m")
        assert "kernel_bypass" not in meta and len(problems) == 1


def test_the_report_says_what_it_cannot_see():
    (text,) = bypass_findings({"kernel_bypass": [
        {"host": "h2", "pid": 41, "comm": "test_benchmark", "protocol": "pslite", "transport": "RDMA verbs",
         "setting": "DMLC_ENABLE_RDMA=ibverbs"}]})
    assert text.startswith("Traffic invisible to pslat: on h2, process 41 (test_benchmark) moves its pslite "
                           "messages over RDMA verbs (DMLC_ENABLE_RDMA=ibverbs)")
    assert bypass_findings({"kernel_bypass": []}) == []
