"""The PyTorch venv (.venv-torch): where it is and whether scripts/setup_torch.sh made it.

torch 2.13.0's CPU build (about 190 MB; the machines keep that wheel on disk, where pip
finds it) beside pslat's own venv: pslat never imports torch, the job's processes do.
"""
from __future__ import annotations

import os
from pathlib import Path

from core.errors import UserError
from workloads import venvs

ROOT = Path(__file__).resolve().parents[2]
# Same default and override as scripts/setup_torch.sh.
VENV_DIR = Path(os.environ.get("PSLAT_TORCH_VENV", ROOT / ".venv-torch"))
# setup_torch.sh writes this line into the venv's .pslat-stamp once pip succeeded.
STAMP = "torch==2.13.0 numpy<3"


def venv_python(venv: Path = VENV_DIR) -> Path:
    return venvs.venv_python(venv)


def venv_ready(venv: Path = VENV_DIR) -> bool:
    return venvs.venv_ready(venv, STAMP)


def require_venv(venv: Path = VENV_DIR) -> Path:
    """The PyTorch venv's python; UserError saying how to make it when it is missing."""
    if not venv_ready(venv):
        raise UserError(f"the PyTorch venv {venv} is missing or incomplete; run `make setup` "
                        "(or `bash scripts/setup_torch.sh`)")
    return venv_python(venv)
