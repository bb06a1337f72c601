"""The full terminal report: golden file at 100 columns without colour, and it fits.

Set PSLAT_UPDATE_GOLDEN=1 to rewrite tests/golden/term_report_small.txt after a
deliberate change (and read the diff)."""
import io
import os
from pathlib import Path

import pytest
from rich.console import Console

from reports.dissect import dissect
from workloads.simulated.job import Sim, simulate
from workloads.simulated.views import ViewSim, add_views
from reports.term_report import FullReport
from reports.viewmodel import build_model

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "term_report_small.txt"


def _render(m: dict) -> str:
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None, force_terminal=False).print(FullReport(m))
    return buf.getvalue()


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    out = tmp_path_factory.mktemp("term")
    simulate(out, Sim(requests=150, workers=2, servers=2, seed=21, nic=True, clocks={"ps1": (1_000_000, 0.0)}))
    add_views(out, ViewSim(keys_per_request=32, key_space=5_000, lost={"w1": {"sockcalls": 3}}))
    return build_model(dissect([out]), [out])


def test_full_report_golden(model):
    text = _render(model)
    if os.environ.get("PSLAT_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text()


def test_fits_100_columns_and_has_every_section(model):
    text = _render(model)
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 100
    for head in ("findings", "pull: 150 requests", "latency by connections in flight", "connection management",
                 "key skew", "clocks and the wire split", "agent health"):
        assert head in text, head
    assert "\x1b[" not in text      # no colour codes: readable as plain text
    assert "w1 sockcalls lost 3" in text
