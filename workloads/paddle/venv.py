"""The PaddlePaddle venv (paddlepaddle==3.0.0, protobuf<6): where the real brpc parameter
server comes from.

Paddle lives in a venv of its own (its numpy and protobuf pins are not pslat's), made by
scripts/setup_paddle.sh; `ensure_venv` makes it on first use with the same commands if
it is missing. Why these pins: see scripts/setup_paddle.sh.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path

from core.errors import UserError
from workloads import venvs
from workloads.symbols import UprobePoint, demangle, dynamic_symbols

ROOT = Path(__file__).resolve().parents[2]
# Same default and override as scripts/setup_paddle.sh.
VENV_DIR = Path(os.environ.get("PSLAT_PADDLE_VENV", ROOT / ".venv-paddle"))
PACKAGES = ("paddlepaddle==3.0.0", "protobuf<6")
# setup_paddle.sh writes this line into the venv's .pslat-stamp once pip succeeded.
STAMP = " ".join(PACKAGES)


def venv_python(venv: Path = VENV_DIR) -> Path:
    return venvs.venv_python(venv)


def venv_ready(venv: Path = VENV_DIR) -> bool:
    return venvs.venv_ready(venv, STAMP)


def ensure_venv(venv: Path = VENV_DIR, create: bool = True) -> Path:
    """The Paddle venv's python; creates the venv first if it is missing and create is true."""
    return venvs.ensure_venv(venv, STAMP, PACKAGES, "the Paddle venv", create, pip_args=("--only-binary=:all:",),
                             missing_hint="run `make setup` (or scripts/setup_paddle.sh)")


def paddle_libraries(venv: Path = VENV_DIR) -> list[Path]:
    """Paddle's own shared libraries in the venv (libpaddle.so, where brpc is linked in,
    and libs/*.so): the files a framework-boundary uprobe would attach to."""
    site = sorted(venv.glob("lib/python3*/site-packages/paddle"))
    if not site:
        raise UserError(f"no paddle package under {venv}; run `make setup`")
    libs = sorted(site[0].glob("base/*.so")) + sorted(site[0].glob("libs/*.so*"))
    if not libs:
        raise UserError(f"no shared library under {site[0]}; reinstall with `make setup`")
    return libs


def libpaddle_path(venv: Path = VENV_DIR) -> Path:
    """libpaddle.so inside the Paddle venv: brpc is linked into it (the uprobes' file)."""
    found = [p for p in paddle_libraries(venv) if p.name == "libpaddle.so"]
    if not found:
        raise UserError(f"no libpaddle.so under {venv}; run `make setup` to (re)create it")
    return found[0]


# The baidu_std layer of brpc inside libpaddle.so, one call per message, each with the
# wire's correlation id in reach (docs/paddle.md, "The framework boundary").
BRPC_FUNCTIONS = ("brpc::policy::PackRpcRequest", "brpc::Controller::OnVersionedRPCReturned",
                  "brpc::policy::ProcessRpcRequest", "brpc::policy::SendRpcResponse")


@functools.lru_cache(maxsize=4)
def brpc_uprobe_points(lib: Path | None = None) -> dict[str, UprobePoint]:
    """The exported BRPC_FUNCTIONS of libpaddle.so, by demangled function name (nm -D:
    the library is read, never loaded). UserError if one is not exported."""
    lib = lib or libpaddle_path()
    candidates = [(v, t, n) for v, t, n in dynamic_symbols(lib)
                  if t in ("T", "W") and n.startswith(("_ZN4brpc6policy", "_ZN4brpc10Controller"))]
    points: dict[str, UprobePoint] = {}
    for (value, _type, name), sig in zip(candidates, demangle([n for _, _, n in candidates])):
        function = sig.split("(", 1)[0]
        if function in BRPC_FUNCTIONS:
            points[function] = UprobePoint(function, name, sig, value)
    missing = [f for f in BRPC_FUNCTIONS if f not in points]
    if missing:
        raise UserError(f"{lib} does not export {', '.join(missing)}; the brpc uprobes need "
                        "paddlepaddle==3.0.0 from PyPI: run `make setup`")
    return points
