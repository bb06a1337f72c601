#!/usr/bin/env bash
# BytePS's own ps-lite (RawMeta on the wire, docs/protocols.md), built from BytePS's
# PyPI sdist against the distro's libzmq3-dev, with its benchmark
# (3rdparty/ps-lite/tests/test_benchmark.cc) at .byteps/bin/test_benchmark.
# Idempotent through a stamp file, in the style of scripts/setup_paddle.sh: a second
# run checks one file and changes nothing.
#
# - The sdist's sha256 is pinned: a different file is refused.
# - Only 3rdparty/ps-lite is extracted. Its Makefile fetches ZeroMQ with wget unless
#   $(DEPS_PATH)/include/zmq.h exists (make/deps.mk's ${ZMQ} target): DEPS_PATH is a
#   dir of two links to the system's zmq.h and libzmq.so, so nothing is downloaded.
# - scripts/byteps_logging.patch makes dmlc's LogMessage write each log line with one
#   fwrite: unpatched, every `<<` piece is a write of its own and the lines of a
#   node's threads interleave, which the job's own log (PS_VERBOSE=2, the tests'
#   oracle, workloads/byteps/oplog.py) cannot be read from. Nothing else is changed.
# workloads/byteps/build.py finds the result (PSLAT_BYTEPS_DIR overrides the place).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${PSLAT_BYTEPS_DIR:-$ROOT/.byteps}
VENV=${PSLAT_VENV:-$ROOT/.venv}
PATCH=$ROOT/scripts/byteps_logging.patch

VERSION=0.2.5.post15
SDIST=byteps-$VERSION.tar.gz
SDIST_SHA256=9d6a3c5be4c4b5a172739744bb32725c433f9a9f63794e1885e7376ff4eea99f
TARGETS="ps tests/test_benchmark"
STAMP="byteps==$VERSION sha256=$SDIST_SHA256 patch=$(sha256sum "$PATCH" | cut -c1-16) make $TARGETS"

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

if [ "$(cat "$OUT/.pslat-stamp" 2>/dev/null)" = "$STAMP" ] && [ -x "$OUT/bin/test_benchmark" ]; then
  exit 0
fi

say "building BytePS $VERSION's ps-lite and its test_benchmark into $OUT"
t0=$(date +%s)
zmq_h=/usr/include/zmq.h
zmq_so=$(dpkg -L libzmq3-dev 2>/dev/null | grep '/libzmq\.so$' | head -n 1 || true)
[ -e "$zmq_h" ] && [ -n "$zmq_so" ] || die "libzmq3-dev is not installed (zmq.h, libzmq.so)"

# the stamp goes last: a build cut short is redone from scratch by the next run
rm -rf "$OUT/.pslat-stamp" "$OUT/dl" "$OUT/ps-lite" "$OUT/deps" "$OUT/bin"
mkdir -p "$OUT/dl" "$OUT/ps-lite" "$OUT/deps/include" "$OUT/deps/lib" "$OUT/bin"

# the sdist, from PyPI through pip (no build, no dependencies)
"$VENV/bin/pip" download -q --disable-pip-version-check --no-deps --no-binary :all: \
  "byteps==$VERSION" -d "$OUT/dl" || die "pip could not download byteps==$VERSION's sdist"
[ -f "$OUT/dl/$SDIST" ] || die "pip downloaded no $SDIST (got: $(ls "$OUT/dl"))"
got=$(sha256sum "$OUT/dl/$SDIST" | cut -d' ' -f1)
[ "$got" = "$SDIST_SHA256" ] || die "$SDIST has sha256 $got, not the pinned $SDIST_SHA256"

tar -xzf "$OUT/dl/$SDIST" -C "$OUT/ps-lite" --strip-components=3 --no-same-owner \
  "byteps-$VERSION/3rdparty/ps-lite"
[ -f "$OUT/ps-lite/Makefile" ] || die "$SDIST holds no 3rdparty/ps-lite/Makefile"
patch -s -p1 --forward -d "$OUT/ps-lite" < "$PATCH" || die "$PATCH does not apply"

ln -s "$zmq_h" "$OUT/deps/include/zmq.h"
ln -s "$zmq_so" "$OUT/deps/lib/libzmq.so"
# shellcheck disable=SC2086  # TARGETS is two words on purpose
nice -n 10 make -C "$OUT/ps-lite" -j2 DEPS_PATH="$OUT/deps" $TARGETS > "$OUT/make.log" 2>&1 \
  || { tail -n 20 "$OUT/make.log" >&2; die "make of ps-lite failed (log: $OUT/make.log)"; }
cp "$OUT/ps-lite/tests/test_benchmark" "$OUT/bin/test_benchmark"
rm -rf "$OUT/dl"
echo "$STAMP" > "$OUT/.pslat-stamp"
say "built $OUT/bin/test_benchmark in $(( $(date +%s) - t0 )) s"
