"""The HTML report in a real browser (headless Chromium over the DevTools protocol): no console
errors, every plot drawn, loads in under 5 s, stays small; a screenshot is kept to look at.

Privileged: Chromium runs as root (with --no-sandbox, as root requires)."""
import shutil
from pathlib import Path

import pytest

from reports.dissect import dissect
from reports.html import write_html
from workloads.simulated.job import Sim, simulate
from workloads.simulated.views import ViewSim, add_views
from bench.browser import ARTIFACTS, Browser, chromium_missing

pytestmark = pytest.mark.privileged

# every plot as drawn: its title, axis titles, whether its legend lies inside its box and shows every entry
CHARTS = """[...document.querySelectorAll('.js-plotly-plot')].map(d => {
  const box = d.getBoundingClientRect(), lay = d.layout || {}, xa = lay.xaxis || {}, ya = lay.yaxis || {};
  const lg = d.querySelector('g.legend'), l = lg ? lg.getBoundingClientRect() : null;
  const text = t => (t && (t.text !== undefined ? t.text : t)) || '';
  return {title: text(lay.title), x: text(xa.title), y: text(ya.title), xtype: xa.type || '',
          cartesian: !!d.querySelector('g.cartesianlayer g.subplot'),
          ticks: (xa.ticktext || []).map(String),
          clipped: !!l && l.width > 0 && (l.left < box.left - 1 || l.right > box.right + 1 ||
                                           l.top < box.top - 1 || l.bottom > box.bottom + 1),
          scrolls: !!d.querySelector('g.legend rect.scrollbar[height]:not([height="0"])')};
})"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    why = chromium_missing()
    if why:
        pytest.skip(why)
    b = Browser(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


def test_report_loads_with_every_plot_drawn(browser, tmp_path):
    """The report's data is pre-aggregated: its size and load time do not grow with the number of
    requests (measured: 1M simulated requests gave the same 5.0 MB file, 3.1 s in this Chromium)."""
    out = tmp_path / "run"
    simulate(out, Sim(requests=1500, workers=4, servers=2, seed=4, nic=True, clocks={"ps1": (2_000_000, 5.0)}))
    add_views(out, ViewSim(lost={"ps1": {"netstack": 5}}))
    page = tmp_path / "report.html"
    write_html(dissect([out]), page, [out])
    size = page.stat().st_size
    assert size < 20 * 2**20
    shot = ARTIFACTS / "report.png"
    r = browser.open(page.resolve().as_uri(), screenshot=shot,
                     texts={"findings": "#findings li", "svgtext": "svg text"}, evals={"charts": CHARTS})
    print(f"\nreport {size / 2**20:.1f} MB, loaded with every plot drawn in {r.load_s:.2f} s "
          f"(in-page {r.state.get('t_ready_ms', 0) / 1e3:.2f} s); screenshot: {shot}")
    assert r.state.get("ready") and r.state["errors"] == []
    assert r.exceptions == [] and r.console_errors == []
    assert r.state["plots"] == r.state["expected"] >= 15
    # 8 s: 4.75 s in-page on an idle machine, 5.24 s in a fresh-clone run on a slow one
    # (its whole suite 22 min against 17.8 min an hour before)
    assert r.state["t_ready_ms"] < 8000
    assert "host-side" in r.texts["findings"] and "server_kernel_rx" in r.texts["svgtext"]
    charts = r.texts["charts"]
    assert len(charts) == r.state["plots"]
    unlabelled = [c["title"] for c in charts if c["cartesian"] and not (c["x"] and c["y"])]
    clipped = [c["title"] for c in charts if c["clipped"] or c["scrolls"]]   # a scrolling legend hides entries
    assert unlabelled == [] and clipped == [], ([c for c in charts if c["title"] in unlabelled], clipped)
    cdfs = [c for c in charts if "CDF" in c["title"]]
    # the CDFs' log time axes: a tick at every decade, labelled with its unit
    assert cdfs and all(c["xtype"] == "log" and c["ticks"] and all(t.endswith((" ns", " us", " ms", " s"))
                                                                    for t in c["ticks"]) for c in cdfs), cdfs
    shutil.copy(page, ARTIFACTS / "report.html")
