"""`pslat report`: formats, files, the terminal view (golden, no colour, 100 columns)."""
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from core.errors import UserError
from reports import components as C
from reports.render_term import SummaryView
from reports.report_cli import pick_format, report
from workloads.simulated.job import Sim, simulate

DATA = Path(__file__).resolve().parents[1] / "data" / "reports"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    simulate(out, Sim(requests=60, clocks={"ps1": (1_000_000, 0.0)}, seed=31))
    return out


def _render(summary: dict) -> str:
    buf = io.StringIO()
    Console(file=buf, width=100, color_system=None, force_terminal=False).print(SummaryView(summary))
    return buf.getvalue()


def test_terminal_view_golden():
    """Set PSLAT_UPDATE_GOLDEN=1 to rewrite the golden file after a deliberate change (and read the diff)."""
    text = _render(json.loads((DATA / "summary_small.json").read_text()))
    golden = DATA / "summary_small.term.txt"
    if os.environ.get("PSLAT_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text()
    assert max(len(line) for line in text.splitlines()) <= 100
    assert "\x1b[" not in text   # no colour codes: readable as plain text


@pytest.mark.parametrize("fmt, out, expect", [
    (None, None, "term"), (None, "x.json", "json"), (None, "x.PARQUET", "parquet"), (None, "x.csv", "csv"),
    (None, "x.txt", "term"), ("json", "x.out", "json"), ("CSV", "x.out", "csv"),
])
def test_format_choice(fmt, out, expect):
    assert pick_format(fmt, Path(out) if out else None) == expect


@pytest.mark.parametrize("fmt, out, msg", [
    (None, "x.dat", "cannot tell the format"), ("xml", None, "give one of"),
    ("parquet", None, "give -o FILE"), ("csv", None, "give -o FILE"),
])
def test_format_errors(fmt, out, msg):
    with pytest.raises(UserError, match=msg):
        pick_format(fmt, Path(out) if out else None)


def test_json_to_stdout(run, capsys):
    report([run], fmt="json", output=None, clocks="auto")
    s = json.loads(capsys.readouterr().out)
    assert s["requests"] == 120 and set(s["by_op"]) == {"pull", "push"}
    assert s["clock"]["ps1~w0"]["source"] == "estimated"


def test_clocks_option(run, capsys):
    with pytest.raises(UserError, match="--clocks"):
        report([run], fmt="json", output=None, clocks="guess")


@pytest.mark.parametrize("name", ["requests.parquet", "requests.csv"])
def test_per_request_table(run, tmp_path, name, capsys):
    out = tmp_path / name
    report([run], fmt=None, output=out, clocks="auto")
    assert f"wrote {out}" in capsys.readouterr().err
    t = pd.read_parquet(out) if name.endswith("parquet") else pd.read_csv(out)
    assert len(t) == 120
    for c in ("protocol", "op", "op_name", "call_space", "call_id", "worker", "server", "worker_host", "server_host",
              "num_keys", "req_bytes", "resp_bytes", "e2e_us", "folded"):
        assert c in t.columns, c
    for c in C.BASE + C.SUBS:
        assert f"{c}_us" in t.columns, c
    comps = t[[f"{c}_us" for c in C.COMPONENTS]].fillna(0).sum(axis=1)
    assert (comps - t["e2e_us"]).abs().max() < 1e-6   # the components add up, in us too
    assert set(t["worker_host"]) == {"w0", "w1"}


def test_term_to_file_is_plain(run, tmp_path, capsys):
    out = tmp_path / "r.txt"
    report([run], fmt=None, output=out, clocks="auto")
    text = out.read_text()
    assert "pull: " in text and "end-to-end" in text and "\x1b[" not in text
    assert max(len(line) for line in text.splitlines()) <= 100


def test_unwritable_output(run, tmp_path):
    with pytest.raises(UserError, match="cannot write"):
        report([run], fmt=None, output=tmp_path / "missing" / "r.json", clocks="auto")


def test_cli_end_to_end(run):
    """Through the installed entry point: screen view (to a pipe: the 100 columns it is laid out
    for, where rich would take 80 and wrap cells, and no colour), and bad input as one line, exit 2."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "report", str(run)], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert "pull: " in r.stdout and "clocks" in r.stdout and "\x1b[" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) == 100
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "report", str(run / "nope")], capture_output=True,
                       text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "nope is not a directory" in r.stderr
