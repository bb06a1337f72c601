"""`pslat check` on this machine, as root and through capsh with capabilities taken
away: the verdict and its exit status follow what the kernel allows (the ring buffer
check creates a map, so a dropped CAP_BPF shows there too), and as root the agent's
own prerequisites hold here (the rest of the privileged tests start it)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PSLAT = [sys.executable, "-m", "pslat.cli", "check"]

pytestmark = pytest.mark.privileged


def _check(prefix: list[str] = ()) -> tuple[int, list[str]]:
    argv = [*prefix, " ".join(PSLAT)] if prefix else PSLAT
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert not p.stderr.strip(), p.stderr
    return p.returncode, p.stdout.splitlines()


def test_as_root_everything_the_agent_needs_is_here():
    rc, lines = _check()
    assert rc == 0 and lines[-1] == "the agent can start here", lines
    assert all(line.startswith("ok ") for line in lines[:-1]), lines


def test_without_cap_bpf_and_cap_sys_admin_the_agent_cannot_start():
    capsh = shutil.which("capsh")
    assert capsh, "capsh (libcap2-bin) is missing: make setup installs it"
    rc, lines = _check([capsh, "--drop=cap_bpf,cap_sys_admin", "--", "-c"])
    bad = [line for line in lines if not line.startswith("ok ")]
    assert rc == 1 and lines[-1].startswith("the agent cannot start here"), lines
    assert bad[:3] == ["MISSING CAP_BPF: not effective; without it: load BPF programs and create maps",
                       "absent  CAP_SYS_ADMIN: not effective; without it: --netns (setns) and mounting tracefs",
                       "MISSING BPF ring buffer: cannot create one: Operation not permitted; without it: the "
                       "probes' output (needs CAP_BPF or root, and kernel 5.8)"], bad
    assert len(bad) == 4, bad


def test_as_nobody_root_and_tracefs_are_missing():
    rc, lines = _check([shutil.which("capsh"), "--user=nobody", "--", "-c"])
    missing = {line.split(":")[0].split(None, 1)[1] for line in lines if line.startswith("MISSING")}
    assert rc == 1 and {"root", "CAP_BPF", "BPF ring buffer", "tracefs"} <= missing, lines
