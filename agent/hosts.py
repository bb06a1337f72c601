"""Which host an event belongs to, and how this host's clock relates to real time.

Host ids (DESIGN.md "Data flow"): one agent traces one kernel; in the virtual
cluster several "hosts" are network namespaces of that kernel and share one
hostname, so a namespace that `ip netns` names (/run/netns/NAME, whose inode is
the namespace's inode, the one the probes report as netns_ino) is the host of
that name. Every other namespace is this machine: --host-id, else the
hostname.

Clock: BPF timestamps are CLOCK_MONOTONIC. The mapping to CLOCK_REALTIME is
read as several (monotonic, realtime, monotonic) triples; the narrowest one
bounds the offset best (its width is the uncertainty). Whether realtime can be
trusted across hosts is the kernel's NTP state (adjtimex: STA_UNSYNC clear
means some daemon disciplines the clock) and, where chronyc exists, what it
says.
"""
from __future__ import annotations

import ctypes
import os
import platform
import shutil
import socket
import subprocess
import time
from pathlib import Path

from probes.filters import NETNS_DIR

CLOCK_SAMPLES = 9
STA_UNSYNC = 0x0040        # include/uapi/linux/timex.h
STA_PLL, STA_FLL = 0x0001, 0x0008
TIME_ERROR = 5             # adjtimex return: clock not synchronised


def netns_names(netns_dir: Path = NETNS_DIR) -> dict[int, str]:
    """{namespace inode: `ip netns` name} for every named namespace."""
    out: dict[int, str] = {}
    try:
        entries = list(Path(netns_dir).iterdir())
    except OSError:
        return out
    for p in entries:
        try:
            out.setdefault(os.stat(p).st_ino, p.name)
        except OSError:
            continue  # a namespace being deleted, or a stale mount point
    return out


def own_netns_ino() -> int | None:
    try:
        return os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return None


class HostMap:
    """netns inode -> host id. Named namespaces are hosts of their own; the rest is
    this machine (host_id, else the hostname)."""

    def __init__(self, host_id: str | None = None, names: dict[int, str] | None = None,
                 netns_dir: Path = NETNS_DIR):
        self.default = host_id or socket.gethostname()
        self._names = dict(names) if names is not None else netns_names(netns_dir)
        self._netns_dir = netns_dir
        self._given_names = names is not None
        self._unnamed: set[int] = set()

    def host_of(self, netns_ino: int) -> str:
        name = self._names.get(netns_ino)
        if name is None and not self._given_names and netns_ino not in self._unnamed:
            # a namespace made after the agent started: look once more, then keep the answer
            self._names.update(netns_names(self._netns_dir))
            name = self._names.get(netns_ino)
            if name is None:
                self._unnamed.add(netns_ino)
        return name if name is not None else self.default

    def set(self, netns_ino: int, host_id: str) -> None:
        """Fix a namespace's host (replay: what the live agent decided)."""
        if host_id == self.default:
            self._names.pop(netns_ino, None)
            self._unnamed.add(netns_ino)
        else:
            self._names[netns_ino] = host_id

    def names(self) -> dict[int, str]:
        return dict(self._names)

    def named(self, netns_ino: int) -> str | None:
        """The `ip netns` name of a namespace, if it has one."""
        return self._names.get(netns_ino)


def clock_mapping(samples: int = CLOCK_SAMPLES) -> dict:
    """CLOCK_MONOTONIC -> CLOCK_REALTIME: realtime_ns = monotonic_ns + offset_ns,
    from the narrowest of `samples` (mono, real, mono) readings."""
    best = None
    for _ in range(max(1, samples)):
        m1 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m2 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        width = m2 - m1
        if best is None or width < best[0]:
            best = (width, r - (m1 + m2) // 2, m1)
    width, offset, at = best
    return {"offset_ns": offset, "uncertainty_ns": (width + 1) // 2, "taken_monotonic_ns": at,
            "samples": samples}


class _Timex(ctypes.Structure):
    # struct timex (x86-64 glibc): the fields up to `tai`, then padding
    _fields_ = [("modes", ctypes.c_uint), ("offset", ctypes.c_long), ("freq", ctypes.c_long),
                ("maxerror", ctypes.c_long), ("esterror", ctypes.c_long), ("status", ctypes.c_int),
                ("constant", ctypes.c_long), ("precision", ctypes.c_long),
                ("tolerance", ctypes.c_long), ("time_sec", ctypes.c_long),
                ("time_usec", ctypes.c_long), ("tick", ctypes.c_long), ("ppsfreq", ctypes.c_long),
                ("jitter", ctypes.c_long), ("shift", ctypes.c_int), ("stabil", ctypes.c_long),
                ("jitcnt", ctypes.c_long), ("calcnt", ctypes.c_long), ("errcnt", ctypes.c_long),
                ("stbcnt", ctypes.c_long), ("tai", ctypes.c_int), ("_pad", ctypes.c_int * 11)]


def clock_discipline() -> dict:
    """Is the realtime clock disciplined (NTP/chrony/PTP)? Read-only adjtimex (modes 0)."""
    out: dict = {"source": "adjtimex"}
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        tx = _Timex()
        state = libc.adjtimex(ctypes.byref(tx))
        if state < 0:
            raise OSError(ctypes.get_errno(), "adjtimex failed")
        out.update(state=state, status=tx.status, maxerror_us=tx.maxerror, esterror_us=tx.esterror,
                   synced=bool(state != TIME_ERROR and not tx.status & STA_UNSYNC))
    except (OSError, AttributeError) as e:
        out.update(synced=None, error=str(e))
    chronyc = shutil.which("chronyc")
    if chronyc:
        try:
            r = subprocess.run([chronyc, "-c", "tracking"], capture_output=True, text=True, timeout=2)
            fields = r.stdout.strip().split(",")
            if r.returncode == 0 and len(fields) > 5:
                # reference id, name, stratum, ref time, system time offset (s), ...
                out["chronyc"] = {"reference": fields[1], "stratum": int(fields[2]),
                                  "system_offset_s": float(fields[4])}
        except (OSError, subprocess.SubprocessError, ValueError):
            pass
    ptp = sorted(str(p) for p in Path("/dev").glob("ptp*"))
    if ptp:
        out["ptp_devices"] = ptp
    return out


def kernel_info() -> dict:
    u = platform.uname()
    return {"release": u.release, "version": u.version, "machine": u.machine}


def boot_id() -> str | None:
    """This boot of this kernel: run dirs with the same one read the same CLOCK_MONOTONIC."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
