"""Test-suite rules.

- `privileged` tests need root and BPF. Outside CI they skip (with the reason)
  when those are missing; in CI (CI=true) a skipped privileged test FAILS,
  because CI must run them.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _privileged_missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if not Path("/sys/kernel/btf/vmlinux").exists():
        return "needs BTF (/sys/kernel/btf/vmlinux)"
    return None


def pytest_collection_modifyitems(config, items):
    missing = _privileged_missing()
    if not missing:
        return
    for item in items:
        if item.get_closest_marker("privileged"):
            item.add_marker(pytest.mark.skip(reason=f"privileged test: {missing}"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if IN_CI and rep.skipped and item.get_closest_marker("privileged"):
        rep.outcome = "failed"
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.longrepr = f"privileged test skipped in CI, which must run it: {reason}"


@pytest.fixture(scope="session")
def venv_python() -> str:
    return sys.executable
