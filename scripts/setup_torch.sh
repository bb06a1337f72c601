#!/usr/bin/env bash
# PyTorch (RPC over TensorPipe, a real workload for pslat's tests) in a venv of its own.
# Idempotent: once the venv's stamp says what it holds it checks and changes nothing.
# torch==2.13.0 is the CPU build these machines keep on disk (about 190 MB; pip's
# find-links): any other version from PyPI brings CUDA libraries of several GB.
# numpy: torch.distributed turns objects into tensors through it (the RPC shutdown does).
# Override the place with PSLAT_TORCH_VENV (workloads/torchrpc/venv.py reads the same).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TORCH_VENV=${PSLAT_TORCH_VENV:-$ROOT/.venv-torch}
SYS_PYTHON=/usr/bin/python3
TORCH_STAMP="torch==2.13.0 numpy<3"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

if [ "$(cat "$TORCH_VENV/.pslat-stamp" 2>/dev/null)" != "$TORCH_STAMP" ]; then
  say "creating $TORCH_VENV with $TORCH_STAMP"
  "$SYS_PYTHON" -m venv "$TORCH_VENV"
  "$TORCH_VENV/bin/pip" install -q --disable-pip-version-check "torch==2.13.0" "numpy<3" \
    || die "pip could not install $TORCH_STAMP into $TORCH_VENV"
  # a CUDA build would have pulled nvidia-* packages: refuse it rather than carry GBs
  "$TORCH_VENV/bin/python" -c 'import torch, sys; sys.exit(torch.version.cuda is not None)' \
    || die "$TORCH_VENV got a CUDA build of torch, not the CPU one; remove it and check pip's find-links"
  echo "$TORCH_STAMP" > "$TORCH_VENV/.pslat-stamp"
fi
