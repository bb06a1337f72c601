"""agent.sources.ProcessSelector: a process refused when first seen (before its
exec or setns) is selected once it becomes what the user asked for."""
from __future__ import annotations

import subprocess
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
