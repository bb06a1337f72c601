"""A framework's venv of its own (MXNet, PaddlePaddle, PyTorch): its python, whether the
setup scripts finished it (the stamp they write once pip succeeded), and making it with
the same commands on first use. Each framework's venv.py names its own directory,
packages and wording."""
from __future__ import annotations

import subprocess
from pathlib import Path

from core.errors import UserError

SYS_PYTHON = "/usr/bin/python3"   # the distro's Python, as the setup scripts use
STAMP_FILE = ".pslat-stamp"
PIP_TIMEOUT_S = 900.0             # a fresh Paddle install took 105 s here; room for a slow mirror


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_ready(venv: Path, stamp: str) -> bool:
    f = venv / STAMP_FILE
    return venv_python(venv).exists() and f.exists() and f.read_text().strip() == stamp


def ensure_venv(venv: Path, stamp: str, packages: tuple[str, ...], what: str, create: bool = True,
                sys_python: str = SYS_PYTHON, pip_args: tuple[str, ...] = (),
                missing_hint: str = "run `make setup`") -> Path:
    """The venv's python; creates it first (venv, then pip install the packages) if it is
    missing and create is true. what: "the MXNet venv", for the messages."""
    if venv_ready(venv, stamp):
        return venv_python(venv)
    if not create:
        raise UserError(f"{what} {venv} is missing or incomplete; {missing_hint}")
    cmds = [[sys_python, "-m", "venv", str(venv)],
            [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", *pip_args, *packages]]
    for cmd in cmds:
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise UserError(f"cannot create {what} {venv} ({e}); run `make setup`") from e
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise UserError(f"cannot create {what} {venv}: `{' '.join(cmd)}` failed: "
                            f"{' | '.join(tail)}; run `make setup`")
    (venv / STAMP_FILE).write_text(stamp + "\n")
    return venv_python(venv)
