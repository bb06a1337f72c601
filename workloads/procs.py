"""The processes of a framework job (MXNet, PaddlePaddle, PyTorch, BytePS): each started in a
session of its own, so its whole group can be signalled; what a failure says of them."""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

REAP_TIMEOUT_S = 10.0


@dataclass
class ProcInfo:
    """One process of a job placed on a cluster host (Paddle's, BytePS's)."""
    name: str          # "server-0", "worker-1", ...
    role: str
    index: int
    host: str          # host name (the netns name)
    addr: str
    port: int          # the port it listens on
    pid: int
    log: Path          # its stdout and stderr
    returncode: int | None = None


def popen_logged(cluster, host, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """argv inside a cluster host, its stdout and stderr into `log`, stdin closed, in a
    session of its own (its whole group can then be signalled by its pid)."""
    with open(log, "wb") as f:
        return cluster.popen(host, argv, env=env, stdin=subprocess.DEVNULL, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)


def signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)   # its own session: the group is its pid
    except ProcessLookupError:
        pass


def kill_and_reap(procs: list[subprocess.Popen]) -> list[int | None]:
    """SIGKILL every group still running, then reap each; its return code, or None when it
    did not go within REAP_TIMEOUT_S."""
    import signal

    for p in procs:
        if p.poll() is None:
            signal_group(p, signal.SIGKILL)
    out: list[int | None] = []
    for p in procs:
        try:
            out.append(p.wait(timeout=REAP_TIMEOUT_S))
        except subprocess.TimeoutExpired:
            out.append(None)
    return out


def log_tail(path: Path, lines: int) -> str:
    """The last lines of a process's log, on one line, for an error message."""
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""
