"""Which libraries of traced processes the agent agrees to probe.

A uprobe's library is read by the agent (ELF symbols by bcc, the zmq_msg_t
layout by a confined child) and its code then runs in the traced process with our
probes in it. A library that another user could have written is refused: the
file must be a regular file owned by root or by the traced process's own
(effective) user, and writable by nobody else (no group or other write bit).
A library probed in every process (--lib without a pid) must be root's.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from core.errors import UserError


def _process_euid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[2])
    except (OSError, IndexError, ValueError):
        return None
    return None


def refusal(library: Path, pid: int | None) -> str | None:
    """Why this library must not be probed for this process (None: it may be)."""
    try:
        st = os.stat(library)
    except OSError as e:
        return f"cannot stat it ({e.strerror})"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    owners = {0}
    if pid is not None:
        euid = _process_euid(pid)
        if euid is None:
            return f"cannot read the owner of process {pid}"
        owners.add(euid)
    if st.st_uid not in owners:
        whose = "not root" if pid is None else f"neither root nor the process's user (uid {max(owners)})"
        return f"owned by uid {st.st_uid}, {whose}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others than its owner (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check(library: Path, pid: int | None) -> None:
    """UserError naming the library and why, when it is refused."""
    why = refusal(library, pid)
    if why:
        where = f"process {pid}" if pid is not None else "every process"
        raise UserError(f"not probing {library} in {where}: {why}; the agent probes only "
                        "libraries that no other user could have written")
