"""Starting and stopping wirefwd, the C frame forwarder that is the cluster's wire."""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from core.errors import UserError

from . import netns
from .spec import WIRE_NS, ClusterSpec

BINARY = Path(__file__).resolve().parent / "wirefwd"
READY_TIMEOUT_S = 10.0
# Busy-poll for the last 50 us before a frame is due: timerfd wake-ups in a VM
# land tens of microseconds late; spinning longer only burns the shared cores.
SPIN_NS = 50_000
# SCHED_FIFO priority of the wire. Measured on 2 shared cores with a busy
# neighbour: normal priority, p99 lateness 24-514 us (p99.9 up to 3.5 ms);
# FIFO 10, p99 1.7 us. The kernel's RT throttling bounds what it can take.
RT_PRIORITY = 10


def binary() -> Path:
    if not os.access(BINARY, os.X_OK):
        raise UserError(f"the wire forwarder {BINARY} is missing; build it with `make setup`")
    return BINARY


def write_config(spec: ClusterSpec, log_dir: Path) -> Path:
    lines = [f"log {log_dir / 'wire.bin'}", f"stats {log_dir / 'wirefwd.stats.json'}",
             f"jitter_ns {round(spec.jitter_ms * 1e6)}", f"jitter_dist {spec.jitter_dist}",
             f"seed {spec.seed}", f"spin_ns {SPIN_NS}", f"rt_priority {RT_PRIORITY}"]
    lines += [f"port {h.wire_ifname} {h.mac}" for h in spec.hosts]
    idx = {h.name: h.index for h in spec.hosts}
    lines += [f"delay {idx[a]} {idx[b]} {round(ms * 1e6)}" for (a, b), ms in spec.delay_ms.items()]
    path = log_dir / "wirefwd.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def start(spec: ClusterSpec, log_dir: Path) -> subprocess.Popen:
    """Run wirefwd in the wire namespace and wait for its 'ready' line."""
    conf = write_config(spec, log_dir)
    err_path = log_dir / "wirefwd.stderr"
    with err_path.open("wb") as err:
        # its own session: a Ctrl-C in the terminal reaches the owner, which stops
        # the wire last; `pslat cluster up` leaves it running after exiting
        proc = subprocess.Popen(netns.in_ns(WIRE_NS, [str(binary()), str(conf)]),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                start_new_session=True)
    line = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not line.endswith(b"\n") and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(proc.stdout.fileno(), 64)
        if not chunk:
            break
        line += chunk
    proc.stdout.close()
    if not line.startswith(b"ready "):
        stop(proc)
        why = err_path.read_text(errors="replace").strip().replace("\n", " | ") or "no output"
        raise UserError(f"the wire forwarder did not start: {why}; rebuild it with `make setup`")
    return proc


def stop(proc: subprocess.Popen, grace_s: float = 3.0) -> None:
    """SIGTERM (it flushes its log and writes its stats), then SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def read_stats(log_dir: Path) -> dict:
    try:
        return json.loads((log_dir / "wirefwd.stats.json").read_text())
    except FileNotFoundError:
        return {}


def request_stats(pid: int, log_dir: Path, timeout_s: float = 2.0) -> dict:
    """Ask a running forwarder for its counters (SIGUSR1) and wait for the new file."""
    path = log_dir / "wirefwd.stats.json"
    # wirefwd writes a temporary file and renames it over the old one, so a new
    # inode number (not the coarse mtime) tells that the answer has arrived
    before = path.stat().st_ino if path.exists() else 0
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.stat().st_ino != before:
            return read_stats(log_dir)
        time.sleep(0.005)
    raise UserError(f"the wire forwarder (pid {pid}) did not answer for its stats; "
                    "is the cluster up? (`pslat cluster status`)")
