"""Strings from traced data cannot run script in the HTML report and show literally.

Run dirs of a simulated job whose host ids (namespace names, in the virtual cluster) and
thread names are markup: `<svg/onload=x>` as the comm (15 bytes fit), host ids that try to
close tags, open comments and add handlers (written into meta.json's host_id and netns name
and every row, as an agent tracing such a namespace would). Chromium loads the report with a
trap on `x` and alert: nothing may touch them, and the strings must appear as text."""
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reports.dissect import dissect
from reports.html import write_html
from reports.simulate import Sim, simulate
from reports.simulate_views import ViewSim, add_views
from test_html_browser_cdp import ARTIFACTS, Browser, chromium_missing

pytestmark = pytest.mark.privileged

COMM = "<svg/onload=x>"
HOSTS = {"ps0": '<img src=x onerror=x>', "w0": '"><svg onload=x><!--', "ps1": "<script>x()<b>ps1&amp;"}
# (a host id names a directory, so it has no "/": "</script>" itself is tested in
# tests/unit/test_html_report.py, on a string the view model carries)
TRAP = """
window.__xss = 0;
Object.defineProperty(window, "x", {get: function () { window.__xss += 1; return function () {}; },
                                    configurable: false});
window.alert = function () { window.__xss += 1; };
"""


def _rename(out: Path) -> None:
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        new = HOSTS.get(d.name, d.name)
        for shard in d.glob("*.parquet"):
            t = pq.read_table(shard)
            if "host_id" in t.column_names:
                col = pa.array([HOSTS.get(h, h) for h in t.column("host_id").to_pylist()], pa.string())
                t = t.set_column(t.column_names.index("host_id"), "host_id", col)
            pq.write_table(t, shard)
        meta = json.loads((d / "meta.json").read_text())
        meta["host_id"] = new
        meta["netns"] = {"name": new}
        (d / "meta.json").write_text(json.dumps(meta))
        d.rename(out / new)


def test_markup_in_traced_strings_shows_literally(tmp_path):
    why = chromium_missing()
    if why:
        pytest.skip(why)
    out = tmp_path / "run"
    simulate(out, Sim(requests=300, workers=2, servers=2, seed=8, nic=True))
    add_views(out, ViewSim(comm=COMM))
    _rename(out)
    page = tmp_path / "report.html"
    m = write_html(dissect([out]), page, [out])
    assert set(HOSTS.values()) <= set(m["hosts"])
    html = page.read_text()
    for s in [COMM, *HOSTS.values()]:
        assert s not in html
    b = Browser(tmp_path / "chromium")
    try:
        shot = ARTIFACTS / "escaping.png"
        r = b.open(page.resolve().as_uri(), init_script=TRAP, screenshot=shot,
                   texts={"body": "main", "svg": "svg text", "title": "title"},
                   evals={"xss": "window.__xss", "scripts": "document.scripts.length",
                          "svg_handlers": "document.querySelectorAll('svg[onload], img[onerror]').length"})
    finally:
        b.close()
    print(f"\nscreenshot: {shot}")
    assert r.state.get("ready") and r.state["errors"] == [] and r.exceptions == []
    assert r.texts["xss"] == 0                  # nothing touched the trap: no handler, no injected script ran
    assert r.texts["scripts"] == 4 and r.texts["svg_handlers"] == 0   # only the report's own scripts
    assert r.state["plots"] == r.state["expected"] > 0
    for s in HOSTS.values():
        assert s in r.texts["body"], s          # tables and findings: literal text
        assert s in r.texts["svg"], s           # plot labels (plotly reads HTML in text): literal too
    assert COMM in r.texts["body"]              # the traced processes' thread names
    assert HOSTS["ps0"] in r.texts["title"]
