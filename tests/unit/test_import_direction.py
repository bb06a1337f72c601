"""Imports follow the data (DESIGN.md, "Layout"): no package imports one downstream of
it. Read from the sources (every import statement, at any depth, also inside
functions), not from what happens to be loaded."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# package -> the packages it must not import (the stages after it)
DOWNSTREAM = {
    "core": {"probes", "parsers", "agent", "reports", "workloads", "bench", "pslat"},
    "probes": {"parsers", "agent", "reports", "workloads", "bench", "pslat"},
    "parsers": {"agent", "reports", "workloads", "bench", "pslat"},
    "agent": {"reports", "workloads", "bench", "pslat"},
}


def imported_packages(path: Path) -> set[tuple[str, int]]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {(a.name.split(".")[0], node.lineno) for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add((node.module.split(".")[0], node.lineno))
    return out


def test_no_package_imports_a_stage_downstream_of_it():
    wrong = []
    for pkg, banned in DOWNSTREAM.items():
        for path in sorted((ROOT / pkg).rglob("*.py")):
            wrong += [f"{path.relative_to(ROOT)}:{line} imports {name}"
                      for name, line in sorted(imported_packages(path)) if name in banned]
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_imports_inside_functions(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from agent.daemon import Daemon\n    import reports.html\n")
    assert imported_packages(f) == {("agent", 2), ("reports", 3)}
