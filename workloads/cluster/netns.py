"""Thin wrappers around ip(8), ethtool(8), sysctl(8) and /proc for the cluster.

Every command is an argv list (no shell); names reaching here were validated
by spec.py. A failing command becomes a UserError naming the command.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from core.errors import UserError

NETNS_DIR = Path("/run/netns")
# The features that decide whether a frame on the wire is what TCP sent:
# segmentation offloads would hand the wire 64 KiB "frames", receive offloads
# would merge them, checksum offload would leave checksums for hardware that
# veth does not have (a frame re-sent by the forwarder would then be dropped).
OFFLOADS_OFF = ("tx", "rx", "tso", "gso", "gro")
OFFLOAD_FEATURES = ("tx-checksumming", "rx-checksumming", "scatter-gather",
                    "tcp-segmentation-offload", "generic-segmentation-offload",
                    "generic-receive-offload", "large-receive-offload",
                    "tx-udp-segmentation", "rx-gro-list", "rx-udp-gro-forwarding")


def tool(name: str) -> str:
    path = shutil.which(name, path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin:/usr/bin:/bin")
    if not path:
        raise UserError(f"{name} not found; install it with `make setup`")
    return path


def run(argv: list[str], stdin: str | None = None) -> str:
    p = subprocess.run(argv, input=stdin, capture_output=True, text=True)
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().replace("\n", " | ")
        raise UserError(f"`{' '.join(argv)}` failed: {msg}; see if a previous cluster is still up "
                        "(`pslat cluster status`)")
    return p.stdout


def in_ns(ns: str, argv: list[str]) -> list[str]:
    return [tool("ip"), "netns", "exec", ns, *argv]


def list_netns() -> set[str]:
    try:
        return set(os.listdir(NETNS_DIR))
    except FileNotFoundError:
        return set()


def add_netns(ns: str) -> None:
    run([tool("ip"), "netns", "add", ns])
    # no IPv6: no router solicitations or MLD reports in the wire's ground truth
    run(in_ns(ns, [tool("sysctl"), "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                   "net.ipv6.conf.default.disable_ipv6=1"]))


def del_netns(ns: str) -> None:
    if ns in list_netns():
        run([tool("ip"), "netns", "del", ns])


def ip_batch(ns: str, commands: list[str]) -> None:
    """Several `ip` commands in one process (e.g. N static ARP entries)."""
    run([tool("ip"), "-n", ns, "-batch", "-"], stdin="\n".join(commands) + "\n")


def offloads_off(ns: str, dev: str) -> dict[str, str]:
    """Turn the offloads off and return what ethtool then reports (the record)."""
    # ethtool exits non-zero when one feature is fixed on a device; the read-back
    # below is the truth that gets recorded and checked.
    subprocess.run(in_ns(ns, [tool("ethtool"), "-K", dev, *[w for f in OFFLOADS_OFF for w in (f, "off")]]),
                   capture_output=True, text=True)
    out = run(in_ns(ns, [tool("ethtool"), "-k", dev]))
    state = {}
    for line in out.splitlines():
        key, _, val = line.strip().partition(":")
        if key in OFFLOAD_FEATURES:
            state[key] = val.strip()
    still_on = [k for k in ("tx-checksumming", "tcp-segmentation-offload",
                            "generic-segmentation-offload", "generic-receive-offload")
                if state.get(k, "off").startswith("on")]
    if still_on:
        raise UserError(f"cannot turn off {', '.join(still_on)} on {dev} in {ns}; "
                        "frames would not fit the MTU. Check `ethtool -k` on veth")
    return state


def netns_pids(ns: str) -> list[int]:
    if ns not in list_netns():
        return []
    p = subprocess.run([tool("ip"), "netns", "pids", ns], capture_output=True, text=True)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: pid + this tell a
    live process from a later one that reused its pid. None when gone or zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def alive(pid: int | None, ticks: int | None) -> bool:
    return bool(pid) and ticks is not None and start_ticks(pid) == ticks


def terminate_pids(pids: list[int], grace_s: float = 2.0) -> None:
    """SIGTERM, wait until they are gone (polling /proc), then SIGKILL the rest."""
    live = {p: start_ticks(p) for p in pids}
    live = {p: t for p, t in live.items() if t is not None}
    for p in live:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        live = {p: t for p, t in live.items() if start_ticks(p) == t}
        if live:
            time.sleep(0.01)
    for p, t in live.items():
        if start_ticks(p) == t:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
