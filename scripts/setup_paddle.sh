#!/usr/bin/env bash
# The PaddlePaddle venv (real brpc parameter server), in the style of
# scripts/setup.sh's MXNet step: idempotent through a stamp file, so a second
# run checks one file and changes nothing.
#
# paddlepaddle==3.0.0 because 3.1.1 and later wheels are built without the
# parameter server and 3.1.0 lacks the distributed lookup-table op; protobuf<6
# because protobuf 7 breaks Paddle's DistributedStrategy.
# workloads/paddle/venv.py holds the same stamp and commands (ensure_venv).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PADDLE_VENV=${PSLAT_PADDLE_VENV:-$ROOT/.venv-paddle}
SYS_PYTHON=/usr/bin/python3   # the distro's Python 3.11: paddlepaddle 3.0.0 has cp311 wheels

say() { printf 'setup: %s\n' "$*"; }

PADDLE_STAMP="paddlepaddle==3.0.0 protobuf<6"
if [ "$(cat "$PADDLE_VENV/.pslat-stamp" 2>/dev/null)" != "$PADDLE_STAMP" ]; then
  say "creating $PADDLE_VENV with $PADDLE_STAMP"
  "$SYS_PYTHON" -m venv "$PADDLE_VENV"
  "$PADDLE_VENV/bin/pip" install -q --disable-pip-version-check --only-binary=:all: \
    "paddlepaddle==3.0.0" "protobuf<6"
  echo "$PADDLE_STAMP" > "$PADDLE_VENV/.pslat-stamp"
fi
