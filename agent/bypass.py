"""Traced processes whose protocol messages go around the kernel's sockets (RDMA,
UCX, libfabric): every probe and capture misses that traffic, so the run says so
instead of reporting less than the job sent. Which settings do that is each
protocol's fact (parsers.registry.kernel_bypass); the agent reads a process's
environment once, when it first sees the process.

/proc/PID/environ is the process owner's text: read bounded, split on NUL and "=",
compared by the protocol's judge and never interpreted otherwise; what goes into the
run (comm, the setting) is cut short and printable.
"""
from __future__ import annotations

from typing import Callable

from parsers.registry import kernel_bypass

ENVIRON_MAX_BYTES = 256 * 1024   # Linux's ARG_MAX-bound environments are far smaller as a rule
PROCESSES_MAX = 4096             # processes looked at and remembered (forgotten when they exit)
REPORTED_MAX = 64                # bypassing processes listed per host in meta.json (the rest counted)
COMM_CHARS = 16                  # TASK_COMM_LEN


def read_environ(tgid: int) -> dict[bytes, bytes] | None:
    """The process's environment at its exec, {name: value}; None if it cannot be read
    (exited, or not ours to read). A name seen twice keeps its first value, as getenv."""
    try:
        with open(f"/proc/{tgid}/environ", "rb") as f:
            data = f.read(ENVIRON_MAX_BYTES)
    except OSError:
        return None
    env: dict[bytes, bytes] = {}
    for item in data.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name and name not in env:
            env[name] = value
    return env


def _comm(tgid: int) -> str:
    try:
        with open(f"/proc/{tgid}/comm", "rb") as f:
            raw = f.read(64).rstrip(b"\n")
    except OSError:
        return "?"
    return "".join(chr(c) if 0x20 <= c < 0x7F else "?" for c in raw[:COMM_CHARS])


class BypassWatch:
    """Each program a process runs judged once (an exec changes its comm and its
    environment: `ip netns exec` and shells fork before they exec the job); note()
    gives what to tell the run about a new one."""

    def __init__(self) -> None:
        self._seen: dict[int, str] = {}   # tgid -> the comm it was judged under

    def note(self, tgid: int, netns_of: Callable[[int], int | None]) -> list[dict]:
        """[{"pid", "comm", "netns", "protocol", "transport", "setting"}] for a process
        not judged before whose environment sends messages around the kernel; else []."""
        comm = _comm(tgid)
        if self._seen.get(tgid) == comm:
            return []
        if len(self._seen) >= PROCESSES_MAX:
            self._seen.clear()   # a process judged again says the same: reported once more at worst
        self._seen[tgid] = comm
        env = read_environ(tgid)
        found = kernel_bypass(env) if env else []
        if not found:
            return []
        netns = netns_of(tgid)
        return [dict(f, pid=tgid, comm=comm, netns=netns) for f in found]

    def forget_exited(self, alive: set[int]) -> None:
        for tgid in [t for t in self._seen if t not in alive]:
            del self._seen[tgid]
