#!/usr/bin/env bash
# Installs everything pslat needs on a fresh Debian/Ubuntu machine, as root.
# Idempotent: each step checks first, so a second run changes nothing and
# finishes in seconds.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
VENV=${PSLAT_VENV:-$ROOT/.venv}
MXNET_VENV=${PSLAT_MXNET_VENV:-$ROOT/.venv-mxnet}
SYS_PYTHON=/usr/bin/python3   # the distro's Python: the one python3-bpfcc is built for

say()  { printf 'setup: %s\n' "$*"; }
warn() { printf 'setup: WARNING: %s\n' "$*" >&2; }
die()  { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs distro packages and mounts tracefs): sudo make setup"
command -v apt-get >/dev/null || die "needs a Debian/Ubuntu machine (apt-get not found)"

# 1. Distro packages ----------------------------------------------------------
PKGS=(bpfcc-tools python3-bpfcc libbpfcc bpftool tshark ethtool iproute2 tcpdump
      python3-venv gcc make libc6-dev tmux procps
      libcap2-bin  # capsh: tests/privileged/test_check_preflight.py runs `pslat check` with capabilities dropped
      chromium fonts-dejavu-core
      prometheus   # promtool check metrics, and the dashboard test's server (tests/privileged/test_prometheus.py)
      g++ libzmq3-dev patch)   # BytePS's ps-lite (scripts/setup_byteps.sh)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing distro packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# 2. Kernel headers (bcc compiles against them) --------------------------------
KREL=$(uname -r)
# bcc needs the generated headers (build/) and the common ones (source/, where
# include/linux/kconfig.h lives in Debian's split packages).
if [ ! -e "/lib/modules/$KREL/build/include/generated/autoconf.h" ] || \
   [ ! -e "/lib/modules/$KREL/source/include/linux/kconfig.h" ]; then
  if apt-cache show "linux-headers-$KREL" >/dev/null 2>&1; then
    say "installing linux-headers-$KREL"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "linux-headers-$KREL" >/dev/null
  else
    arch=$(dpkg --print-architecture)
    # The nearest available: the newest versioned header package of this
    # architecture's generic flavour (no rt/cloud).
    pkg=$(apt-cache search --names-only "^linux-headers-[0-9.]+-[0-9]+-$arch\$" \
          | awk '{print $1}' | sort -V | tail -n 1)
    [ -n "$pkg" ] || die "no linux-headers package for $arch in the apt sources"
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || {
      say "installing $pkg"
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$pkg" >/dev/null
    }
    hdr=/usr/src/${pkg}
    common=/usr/src/${pkg%-"$arch"}-common   # Debian splits arch and common headers
    [ -d "$hdr" ] || die "$pkg installed but $hdr is missing"
    [ -e "$common/include/linux/kconfig.h" ] || common=$hdr
    mkdir -p "/lib/modules/$KREL"
    ln -sfn "$hdr" "/lib/modules/$KREL/build"
    ln -sfn "$common" "/lib/modules/$KREL/source"
    warn "no headers for kernel $KREL in the distro; linked the nearest, $pkg, under /lib/modules/$KREL/{build,source}. pslat reads kernel structs only through BTF offsets, so mismatched headers are safe for it."
  fi
fi

# 3. tracefs -------------------------------------------------------------------
if [ ! -e /sys/kernel/tracing/events ]; then
  say "mounting tracefs at /sys/kernel/tracing"
  mount -t tracefs nodev /sys/kernel/tracing || die "cannot mount tracefs at /sys/kernel/tracing"
fi
[ -e /sys/kernel/btf/vmlinux ] || warn "no BTF at /sys/kernel/btf/vmlinux: the agent will refuse to start"

# 4. Native helpers (the wire forwarder) ---------------------------------------
make -s -C "$ROOT/workloads/cluster" >/dev/null

# 5. The project's venv --------------------------------------------------------
stamp_of() { cat "$ROOT/pyproject.toml" | sha256sum | cut -c1-16; }
if [ ! -x "$VENV/bin/python" ]; then
  say "creating $VENV (distro Python, with system site-packages for bcc)"
  "$SYS_PYTHON" -m venv --system-site-packages "$VENV"
fi
if [ "$(cat "$VENV/.pslat-stamp" 2>/dev/null)" != "$(stamp_of)" ]; then
  say "installing pslat and its Python dependencies into $VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check -e "$ROOT[test]"
  stamp_of > "$VENV/.pslat-stamp"
fi
"$VENV/bin/python" -c "import bcc" 2>/dev/null || die "$VENV cannot import the distro's bcc (python3-bpfcc)"

# 6. MXNet (real ps-lite) in a venv of its own ----------------------------------
MX_STAMP="mxnet==1.9.1 numpy<1.24"
if [ "$(cat "$MXNET_VENV/.pslat-stamp" 2>/dev/null)" != "$MX_STAMP" ]; then
  say "creating $MXNET_VENV with $MX_STAMP"
  "$SYS_PYTHON" -m venv "$MXNET_VENV"
  "$MXNET_VENV/bin/pip" install -q --disable-pip-version-check "mxnet==1.9.1" "numpy<1.24"
  echo "$MX_STAMP" > "$MXNET_VENV/.pslat-stamp"
fi

# 7. PaddlePaddle (brpc's parameter server), PyTorch (RPC over TensorPipe), TensorFlow and
#    BytePS's ps-lite (RawMeta; built from its sdist) ------------------------------
bash "$ROOT/scripts/setup_paddle.sh"
bash "$ROOT/scripts/setup_torch.sh"
bash "$ROOT/scripts/setup_tf.sh"      # TensorFlow's ParameterServerStrategy (gRPC)
PSLAT_VENV=$VENV bash "$ROOT/scripts/setup_byteps.sh"

say "ready: $VENV/bin/pslat"
