"""agent.hosts (host ids per namespace, clock mapping, clock discipline) and the
agent's one-line errors for bad input."""
from __future__ import annotations

import os
import time

import pytest
from typer.testing import CliRunner

from pslat.cli import app
from agent.hosts import HostMap, clock_discipline, clock_mapping, netns_names
from agent.sources import ProcessSelector, Selection


def test_named_namespaces_are_hosts_and_the_rest_is_this_machine(tmp_path):
    (tmp_path / "h0").write_text("")
    (tmp_path / "h1").write_text("")
    names = netns_names(tmp_path)
    assert sorted(names.values()) == ["h0", "h1"]
    ino_h0 = os.stat(tmp_path / "h0").st_ino
    hm = HostMap("box", netns_dir=tmp_path)
    assert hm.host_of(ino_h0) == "h0" and hm.host_of(12345) == "box"
    (tmp_path / "late").write_text("")   # a namespace named after the agent started
    assert hm.host_of(os.stat(tmp_path / "late").st_ino) == "late"
    hm.set(777, "h9")
    assert hm.host_of(777) == "h9"
    assert HostMap(names={}).default   # the hostname


def test_clock_mapping_is_the_narrowest_reading():
    m = clock_mapping(samples=20)
    real = time.clock_gettime_ns(time.CLOCK_REALTIME)
    mono = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    assert abs(mono + m["offset_ns"] - real) < 50_000_000
    assert 0 <= m["uncertainty_ns"] < 1_000_000


def test_clock_discipline_reads_the_kernel_state():
    d = clock_discipline()
    assert d["source"] == "adjtimex" and d["synced"] in (True, False)
    assert isinstance(d["status"], int)


def test_process_selection_by_pid_comm_and_netns():
    me = os.getpid()
    comm = open(f"/proc/{me}/comm", "rb").read().strip()
    assert ProcessSelector(Selection(pids=(me,))).selected(me)
    assert not ProcessSelector(Selection(pids=(1,))).selected(me)
    assert ProcessSelector(Selection(comms=(comm.ljust(16, b"\0"),))).selected(me)
    ino = os.stat("/proc/self/ns/net").st_ino
    assert ProcessSelector(Selection(netns_inos=(ino,))).selected(me)
    assert not ProcessSelector(Selection(netns_inos=(ino + 1,))).selected(me)
    assert not Selection(pids=(me,)).dynamic and Selection(comms=(b"x" * 16,)).dynamic


@pytest.mark.parametrize("argv, says", [
    (["--pid", "999999999"], "--pid"),
    (["--netns", "no-such-netns-pslat"], "no such network namespace"),
    (["--comm", "x" * 20], "the kernel keeps only 15"),
    (["--port", "70000"], "out of range"),
    (["--replay", "x.rec", "--pid", "1"], "leave out the filters"),
    (["--replay", "/nonexistent.rec"], "cannot read the recording"),
    (["--duration", "-1"], "positive number"),
])
def test_bad_input_is_one_clear_line(tmp_path, argv, says):
    r = CliRunner().invoke(app, ["agent", "--out", str(tmp_path / "o"), *argv])
    assert r.exit_code != 0
    assert says in str(r.exception) or says in r.output
