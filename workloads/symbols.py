"""A framework library's exported functions, read with binutils (nm -D, c++filt), never
by loading the library: where uprobes can attach (DESIGN.md, "What the agent trusts")."""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError


@dataclass(frozen=True)
class UprobePoint:
    function: str      # demangled qualified name, e.g. "ps::ZMQVan::SendMsg"
    symbol: str        # mangled name, what an uprobe attaches to (bcc: sym=)
    signature: str     # demangled with parameters, for humans
    offset: int        # st_value in .dynsym (the file offset bcc computes from it)


def dynamic_symbols(lib: Path) -> list[tuple[int, str, str]]:
    """(value, type, mangled name) of the defined dynamic symbols of lib."""
    tool = shutil.which("nm")
    if not tool:
        raise UserError("`nm` not found (binutils); install binutils (apt-get install binutils)")
    proc = subprocess.run([tool, "-D", "--defined-only", str(lib)],
                          capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise UserError(f"cannot read the dynamic symbols of {lib}: {proc.stderr.strip()}; "
                        "reinstall its venv with `make setup`")
    out = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            out.append((int(parts[0], 16), parts[1], parts[2]))
    return out


def demangle(names: list[str]) -> list[str]:
    tool = shutil.which("c++filt")
    if not tool:
        raise UserError("`c++filt` not found (binutils); install binutils (apt-get install binutils)")
    proc = subprocess.run([tool], input="\n".join(names) + "\n",
                          capture_output=True, text=True, timeout=30, check=True)
    return proc.stdout.splitlines()
