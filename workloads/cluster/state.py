"""The cluster's state file: what exists (or is about to), so any later process can remove it.

/run/pslat/cluster.json is written BEFORE a namespace is created and updated
as things start, so a set-up process killed at any point leaves a file that
names everything it may have made. One cluster per machine (host names are
machine-wide namespace names); a lock file serialises up and down.
"""
from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from core.errors import UserError

from . import netns

STATE_DIR = Path(os.environ.get("PSLAT_RUN_DIR", "/run/pslat"))
STATE_FILE = STATE_DIR / "cluster.json"
LOCK_FILE = STATE_DIR / "cluster.lock"
STATE_VERSION = 1


@contextmanager
def locked(timeout_s: float = 60.0) -> Iterator[None]:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    with LOCK_FILE.open("a") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise UserError(f"another pslat process has held {LOCK_FILE} for {timeout_s:g} s "
                                    "(bringing a cluster up or down); wait for it, then retry")
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def read() -> dict | None:
    try:
        data = json.loads(STATE_FILE.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError:
        raise UserError(f"{STATE_FILE} is corrupt; remove the namespaces it named by hand "
                        "(`ip netns list`), then delete the file") from None
    if data.get("version") != STATE_VERSION:
        raise UserError(f"{STATE_FILE} was written by another pslat version; "
                        "remove its namespaces by hand, then delete the file")
    return data


def write(data: dict) -> None:
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    tmp = STATE_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps(dict(data, version=STATE_VERSION), indent=1))
    os.replace(tmp, STATE_FILE)  # never a half-written file


def remove() -> None:
    STATE_FILE.unlink(missing_ok=True)


def in_use(data: dict) -> str | None:
    """Why the recorded cluster is live (so not ours to clean), or None if it is a leftover."""
    if data.get("detached"):
        fwd = data.get("forwarder") or {}
        if netns.alive(fwd.get("pid"), fwd.get("start_ticks")):
            return "it was brought up by `pslat cluster up` and its wire is running"
        return None
    owner = data.get("owner") or {}
    if netns.alive(owner.get("pid"), owner.get("start_ticks")):
        return f"process {owner['pid']} owns it"
    return None
