#!/usr/bin/env bash
# TensorFlow 2.x (ParameterServerStrategy over gRPC, a real workload for pslat's tests)
# in a venv of its own. Idempotent: once the venv's stamp says what it holds it checks
# and changes nothing. tensorflow-cpu: no CUDA libraries (the GPU build is GBs).
# Override the place with PSLAT_TF_VENV (workloads/tensorflow/venv.py reads the same).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TF_VENV=${PSLAT_TF_VENV:-$ROOT/.venv-tf}
SYS_PYTHON=/usr/bin/python3
TF_STAMP="tensorflow-cpu==2.21.0"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

if [ "$(cat "$TF_VENV/.pslat-stamp" 2>/dev/null)" != "$TF_STAMP" ]; then
  say "creating $TF_VENV with $TF_STAMP"
  "$SYS_PYTHON" -m venv "$TF_VENV"
  "$TF_VENV/bin/pip" install -q --disable-pip-version-check "tensorflow-cpu==2.21.0" \
    || die "pip could not install $TF_STAMP into $TF_VENV"
  "$TF_VENV/bin/python" -c 'import tensorflow as tf; tf.distribute.experimental.ParameterServerStrategy' \
    || die "$TF_VENV cannot import tensorflow's ParameterServerStrategy"
  echo "$TF_STAMP" > "$TF_VENV/.pslat-stamp"
fi
