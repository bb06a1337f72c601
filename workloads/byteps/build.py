"""Where `make setup` put BytePS's ps-lite (scripts/setup_byteps.sh): the benchmark at
.byteps/bin/test_benchmark, PSLAT_BYTEPS_DIR overriding the place as in the script."""
from __future__ import annotations

import os
from pathlib import Path

from core.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.2.5.post15"
BUILD_DIR = Path(os.environ.get("PSLAT_BYTEPS_DIR") or ROOT / ".byteps")
# setup_byteps.sh writes a stamp starting so once the build succeeded
STAMP_PREFIX = f"byteps=={VERSION} "


def benchmark_file(build_dir: Path = BUILD_DIR) -> Path:
    return build_dir / "bin" / "test_benchmark"


def build_ready(build_dir: Path = BUILD_DIR) -> bool:
    """The benchmark is there, from a build that finished."""
    try:
        stamp = (build_dir / ".pslat-stamp").read_text()
    except OSError:
        return False
    b = benchmark_file(build_dir)
    return stamp.startswith(STAMP_PREFIX) and b.is_file() and os.access(b, os.X_OK)


def benchmark_path(build_dir: Path = BUILD_DIR) -> Path:
    """BytePS's ps-lite benchmark; UserError when it has not been built."""
    if not build_ready(build_dir):
        raise UserError(f"BytePS {VERSION}'s ps-lite benchmark is not built at "
                        f"{benchmark_file(build_dir)}; run `make setup` (scripts/setup_byteps.sh)")
    return benchmark_file(build_dir)
