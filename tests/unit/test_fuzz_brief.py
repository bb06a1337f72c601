"""Every fuzz target, briefly, with fixed seeds; and every input that ever crashed one.

`make fuzz` runs the same targets coverage-guided for longer (fuzz/__main__.py)."""
from __future__ import annotations

import pytest

from fuzz import brief
from fuzz.targets import TARGETS, crashers, target

BRIEF_INPUTS = 3000
BRIEF_SECONDS = 4.0


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_brief_fuzz(name):
    t = target(name)
    assert t.KIND in ("parser", "reader")
    assert t.seeds(), f"{name} has no seeds"
    r = brief.run(t, seed=20261201, max_inputs=BRIEF_INPUTS, max_seconds=BRIEF_SECONDS)
    assert r.inputs >= min(BRIEF_INPUTS, getattr(t, "BRIEF_INPUTS_MIN", 50))


@pytest.mark.parametrize("name,path", [(n, p) for n in sorted(TARGETS) for p in crashers(n)]
                         or [pytest.param(None, None, marks=pytest.mark.skip(reason="no crashers kept yet"))])
def test_kept_crashers(name, path):
    brief.one(target(name), path.read_bytes())
