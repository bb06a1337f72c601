"""The registry of fuzz targets: name -> module (see fuzz/__init__.py)."""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

# Every protocol parser and every reader of outside data adds its target here.
TARGETS: dict[str, str] = {
    "pslite_stream": "fuzz.pslite_stream",
    "brpc_stream": "fuzz.brpc_stream",
    "ring_records": "fuzz.ring_records",
    "pipeline_replay": "fuzz.pipeline_replay",
    "rundir_reader": "fuzz.rundir_reader",
    "snapshot_reader": "fuzz.snapshot_reader",
}

CORPUS_ROOT = Path(__file__).resolve().parents[1] / "tests" / "data" / "fuzz"


def target(name: str) -> ModuleType:
    if name not in TARGETS:
        raise KeyError(f"no fuzz target {name!r}; targets: {', '.join(sorted(TARGETS))}")
    return importlib.import_module(TARGETS[name])


def crashers(name: str) -> list[Path]:
    """Inputs that once crashed this target, kept as regression tests."""
    d = CORPUS_ROOT / name
    return sorted(p for p in d.iterdir() if p.is_file() and not p.name.startswith(".")) \
        if d.is_dir() else []
