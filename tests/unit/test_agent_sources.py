"""agent.sources.ProcessSelector: a process refused when first seen (before its
exec or setns) is selected once it becomes what the user asked for; the rescan's
maps prefilter misses no framework library."""
from __future__ import annotations

import subprocess
import sys
import time

from agent.sources import RECHECK_S, YOUNG_S, ProcessSelector, Selection


def _comm(pid: int) -> bytes:
    with open(f"/proc/{pid}/comm", "rb") as f:
        return f.read().strip()


def test_a_process_that_execs_into_the_selected_comm_is_picked_up():
    sel = ProcessSelector(Selection(comms=(b"sleep".ljust(16, b"\0"),)))
    p = subprocess.Popen(["sh", "-c", "read go; exec sleep 30"], stdin=subprocess.PIPE)
    try:
        assert not sel.selected(p.pid)          # still "sh": refused (and remembered)
        assert not sel.selected(p.pid)
        p.stdin.write(b"go\n")
        p.stdin.flush()
        deadline = time.monotonic() + 10
        while _comm(p.pid) != b"sleep" and time.monotonic() < deadline:
            time.sleep(0.01)                    # waiting for the exec itself
        assert _comm(p.pid) == b"sleep"
        while not sel.selected(p.pid) and time.monotonic() < deadline:
            time.sleep(RECHECK_S / 5)
        assert sel.selected(p.pid)
        assert p.pid in sel.running()
    finally:
        p.kill()
        p.wait()


def test_a_refusal_stands_once_the_process_is_old():
    sel = ProcessSelector(Selection(comms=(b"no-such-comm".ljust(16, b"\0"),)))
    p = subprocess.Popen(["sleep", "30"])
    try:
        assert not sel.selected(p.pid)
        first, _ = sel._young[p.pid]
        sel._young[p.pid] = (first - YOUNG_S - 1, first - YOUNG_S - 1)   # as if seen long ago
        assert not sel.selected(p.pid) and p.pid not in sel._young
    finally:
        p.kill()
        p.wait()


def test_the_maps_prefilter_misses_no_framework_library():
    """_may_map_framework says no only where targets_of_pid finds nothing: every process
    of this machine, and one that has just loaded libzmq."""
    import os

    from agent.sources import _may_map_framework
    from probes.framework import targets_of_pid

    code = "import sys, zmq; print(zmq.zmq_version(), flush=True); sys.stdin.read()"
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as p:
        p.stdout.readline()   # ready: libzmq is mapped
        assert _may_map_framework(p.pid) and [t.layer for t in targets_of_pid(p.pid)] == ["zmq"]
        checked = 0
        for pid in [int(d) for d in os.listdir("/proc") if d.isdigit()]:
            try:
                found = targets_of_pid(pid)
            except Exception:   # exited meanwhile
                continue
            checked += 1
            assert _may_map_framework(pid) or not found, pid
        p.stdin.close()
    assert checked > 3


def test_rescan_reads_maps_again_only_when_the_process_mapped_something(monkeypatch):
    """A process waiting for its framework library: its maps are read once, not at every
    rescan while its address space keeps its size; once it loads libzmq it is probed."""
    import agent.sources as sources
    from agent.sources import LiveSource

    code = ("import sys; print('ready', flush=True); sys.stdin.readline(); import zmq; "
            "print('loaded', flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE) as p:
        assert p.stdout.readline() == b"ready\n"   # waiting on stdin: its address space holds still
        reads, probed = [], []
        real = sources._may_map_framework
        monkeypatch.setattr(sources, "_may_map_framework", lambda pid: reads.append(pid) or real(pid))
        live = LiveSource(Selection(pids=(p.pid,)), sink=lambda probe, raw: None)
        live._probe_library = lambda lib, pid, layer=None, found_in=None: probed.append((lib.name, pid, layer))
        for _ in range(4):
            live.rescan(force=True)
        assert probed == [] and reads == [p.pid]
        p.stdin.write(b"go\n")
        p.stdin.flush()
        assert p.stdout.readline() == b"loaded\n"
        live.rescan(force=True)
        assert [(layer, pid) for _lib, pid, layer in probed] == [("zmq", p.pid)]
        assert probed[0][0].startswith("libzmq")
        p.stdin.close()
