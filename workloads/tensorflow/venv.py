"""The TensorFlow venv (.venv-tf): where it is and whether scripts/setup_tf.sh made it.

tensorflow-cpu 2.21.0 and its grpcio (gRPC's C core, the HTTP/2 stack TensorFlow's
parameter-server training talks) beside pslat's own venv: pslat never imports either,
the job's processes do.
"""
from __future__ import annotations

import os
from pathlib import Path

from core.errors import UserError
from workloads import venvs

ROOT = Path(__file__).resolve().parents[2]
# Same default and override as scripts/setup_tf.sh.
VENV_DIR = Path(os.environ.get("PSLAT_TF_VENV", ROOT / ".venv-tf"))
# setup_tf.sh writes this line into the venv's .pslat-stamp once pip succeeded.
STAMP = "tensorflow-cpu==2.21.0"


def require_venv(venv: Path = VENV_DIR) -> Path:
    """The TensorFlow venv's python; UserError saying how to make it when it is missing."""
    if not venvs.venv_ready(venv, STAMP):
        raise UserError(f"the TensorFlow venv {venv} is missing or incomplete; run `make setup` "
                        "(or `bash scripts/setup_tf.sh`)")
    return venvs.venv_python(venv)
