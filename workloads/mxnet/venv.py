"""The MXNet venv (mxnet==1.9.1, numpy<1.24), its libmxnet.so, and the uprobe points in it.

MXNet 1.9.1 needs numpy<1.24 while pslat needs numpy>=1.24, so MXNet lives in
a venv of its own, made by scripts/setup.sh step 6; `ensure_venv` makes it on
first use with the same commands if it is missing.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from core.errors import UserError
from workloads import venvs
from workloads.symbols import UprobePoint, demangle, dynamic_symbols

ROOT = Path(__file__).resolve().parents[2]
# Same default and override as scripts/setup.sh.
VENV_DIR = Path(os.environ.get("PSLAT_MXNET_VENV", ROOT / ".venv-mxnet"))
# setup.sh writes this line into the venv's .pslat-stamp once pip succeeded.
PACKAGES = ("mxnet==1.9.1", "numpy<1.24")
STAMP = " ".join(PACKAGES)
SYS_PYTHON = venvs.SYS_PYTHON

# The framework boundary of ps-lite inside libmxnet.so: every message a node
# sends goes through ZMQVan::SendMsg, every one it receives comes out of
# ZMQVan::RecvMsg (both virtual, so never inlined into their callers).
VAN_FUNCTIONS = ("ps::ZMQVan::SendMsg", "ps::ZMQVan::RecvMsg")


def venv_python(venv: Path = VENV_DIR) -> Path:
    return venvs.venv_python(venv)


def venv_ready(venv: Path = VENV_DIR) -> bool:
    return venvs.venv_ready(venv, STAMP)


def ensure_venv(venv: Path = VENV_DIR, create: bool = True) -> Path:
    """The MXNet venv's python; creates the venv first if it is missing and create is true."""
    return venvs.ensure_venv(venv, STAMP, PACKAGES, "the MXNet venv", create, sys_python=SYS_PYTHON)


def libmxnet_path(venv: Path = VENV_DIR) -> Path:
    """libmxnet.so inside the MXNet venv (the file uprobes attach to)."""
    found = sorted(venv.glob("lib/python3*/site-packages/mxnet/libmxnet.so"))
    if not found:
        raise UserError(f"no libmxnet.so under {venv}; run `make setup` to (re)create the MXNet venv")
    return found[0]


@functools.lru_cache(maxsize=4)
def van_uprobe_points(lib: Path | None = None) -> dict[str, UprobePoint]:
    """The exported ps::ZMQVan::SendMsg / RecvMsg of libmxnet.so, by demangled function name.

    Raises UserError if either is not exported as a function (T: text, W: weak;
    MXNet 1.9.1 exports both as W, being inline members of a header class).
    """
    lib = lib or libmxnet_path()
    candidates = [(v, t, n) for v, t, n in dynamic_symbols(lib)
                  if t in ("T", "W", "t", "w") and n.startswith("_ZN2ps6ZMQVan7")]
    demangled = demangle([n for _, _, n in candidates])
    points: dict[str, UprobePoint] = {}
    for (value, _type, name), sig in zip(candidates, demangled):
        function = sig.split("(", 1)[0]
        if function in VAN_FUNCTIONS:
            points[function] = UprobePoint(function, name, sig, value)
    missing = [f for f in VAN_FUNCTIONS if f not in points]
    if missing:
        raise UserError(f"{lib} does not export {', '.join(missing)}; the framework-boundary "
                        "uprobes need mxnet==1.9.1 from PyPI: run `make setup`")
    return points


def van_symbols(lib: Path | None = None) -> dict[str, str]:
    """Demangled function name -> mangled symbol, for the uprobes on ps-lite's ZMQVan."""
    return {f: p.symbol for f, p in van_uprobe_points(lib).items()}
