"""Strings from traced data cannot run script in the HTML report and show literally.

A real job: psbench (scheduler, server, worker) on the loopback of a network namespace
named with markup, every thread named `<svg/onload=x>` (psbench --proc-name; 15 bytes fit
the comm), traced by the real agent (--netns NAME), `pslat report -o report.html`.
And simulated run dirs whose host ids try to close tags, open comments and add handlers
(more strings than one namespace carries). Chromium loads each report with a trap on `x`
and alert: nothing may touch them, and the strings must appear as text."""
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reports.dissect import dissect
from reports.html import write_html
from workloads.simulated.job import Sim, simulate
from workloads.simulated.views import ViewSim, add_views
from agent.child import AgentProcess
from agent.rundir import META_FILE
from probes.zmq_layout import pyzmq_libzmq
from workloads.psbench.launch import launch
from workloads.psbench.options import Workload
from bench.browser import ARTIFACTS, Browser, chromium_missing

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


def _load(b: Browser, page: Path, shot: Path, evals: dict | None = None):
    """The report in Chromium with the trap set before any of its scripts runs (`evals` run
    before the screenshot, so one may scroll)."""
    r = b.open(page.resolve().as_uri(), init_script=TRAP, screenshot=shot,
               texts={"body": "main", "svg": "svg text", "title": "title"},
               evals={"xss": "window.__xss", "scripts": "document.scripts.length",
                      "handlers": "document.querySelectorAll('[onload], [onerror], [onmouseover]').length",
                      **(evals or {})})
    print(f"\nscreenshot: {shot}, loaded in {r.load_s:.2f} s")
    assert r.state.get("ready") and r.state["errors"] == [] and r.exceptions == []
    assert r.texts["xss"] == 0                  # nothing touched the trap: no handler, no injected script ran
    assert r.texts["scripts"] == 4 and r.texts["handlers"] == 0   # only the report's own scripts
    assert r.state["plots"] == r.state["expected"] > 0
    return r


def test_markup_in_simulated_host_ids_shows_literally(tmp_path):
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
        r = _load(b, page, ARTIFACTS / "escaping.png")
    finally:
        b.close()
    for s in HOSTS.values():
        assert s in r.texts["body"], s          # tables and findings: literal text
        assert s in r.texts["svg"], s           # plot labels (plotly reads HTML in text): literal too
    assert COMM in r.texts["body"]              # the traced processes' thread names
    assert HOSTS["ps0"] in r.texts["title"]


# `ip netns` names are file names under /run/netns: anything but "/" (so no closing tag)
NETNS = "<img src=x onerror=x>&amp;"
ROOT = Path(__file__).resolve().parents[2]
PROCESSES = """(() => {
  const h = [...document.querySelectorAll("h3")].find(e => e.textContent === "Traced processes");
  h.scrollIntoView();
  window.scrollBy(0, -120);   // below the sticky navigation bar, with the table's section above
  return [...h.nextElementSibling.querySelectorAll("tbody tr")].map(tr => [...tr.cells].map(c => c.textContent));
})()"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


PAIRED = 100   # requests of each op the agent pairs before the job is stopped


def _wait_paired(port: int, n: int, timeout_s: float = 30.0) -> None:
    """Until the agent's live view has `n` requests of push and of pull, seen at both ends."""
    deadline = time.monotonic() + timeout_s
    while True:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/snapshot.json", timeout=5) as resp:
            snap = json.loads(resp.read())
        seen = {}
        for g in snap.get("groups", []):
            seen[g["op"], g["role"]] = seen.get((g["op"], g["role"]), 0) + g["hists"]["e2e"]["n"]
        if all(seen.get((op, role), 0) >= n for op in ("push", "pull") for role in ("client", "server")):
            return
        assert time.monotonic() < deadline, f"the agent paired {seen} in {timeout_s:g} s, not {n} of each"
        time.sleep(0.2)   # polling the agent's live view for a count, not waiting a guessed time


def test_traced_process_and_namespace_named_with_markup(tmp_path):
    """The real path: a process whose comm is markup, in a namespace whose name is markup,
    through the agent and `pslat report` into the browser."""
    why = chromium_missing() or (None if shutil.which("ip") else "iproute2's ip is missing")
    if why:
        pytest.skip(why)
    t0 = time.monotonic()
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)   # a run killed before its finally
    _ip("netns", "add", NETNS)
    try:
        _ip("-n", NETNS, "link", "set", "lo", "up")
        out = tmp_path / "agent"
        # psbench inside the namespace (`ip netns exec` execs it there: same pid), started while the
        # agent compiles its probes; the agent joins its streams mid-way
        job = launch(tmp_path / "ps", [(r, None, "127.0.0.1") for r in ("scheduler", "server", "worker")],
                     lambda _h, argv, **kw: subprocess.Popen(["ip", "netns", "exec", NETNS, *argv], **kw),
                     ("127.0.0.1", 9091), Workload.from_kwargs(duration_s=60.0, rate=100.0, proc_name=COMM),
                     die_with_parent=True)
        with job, AgentProcess(out, ["--lib", str(pyzmq_libzmq()), "--netns", NETNS, "--no-netstack",
                                     "--sample-rate", "1", "--listen", "127.0.0.1:0"]) as agent:
            t_agent = time.monotonic() - t0
            for n in job.wait_ready().values():
                comms = {p.read_text().strip() for p in Path(f"/proc/{n['pid']}/task").glob("*/comm")}
                assert comms == {COMM}, (n["role"], comms)
            port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", "".join(agent.lines))[1])
            _wait_paired(port, PAIRED)
            job.stop()
            assert agent.stop() == 0, agent.log_tail()
        run_dir = out / NETNS     # the host id is the namespace's name, a safe directory name
        assert [p.name for p in out.iterdir()] == [NETNS]
        meta = json.loads((run_dir / META_FILE).read_text())
        assert meta["host_id"] == NETNS and meta["counters"]["messages"] > 0
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    t_traced = time.monotonic() - t0
    page = tmp_path / "report.html"
    subprocess.run([sys.executable, "-m", "pslat.cli", "report", str(out), "-o", str(page)], cwd=ROOT,
                   check=True, capture_output=True, timeout=60)
    html = page.read_text()
    assert NETNS not in html and COMM not in html      # neither raw in the file, anywhere
    b = Browser(tmp_path / "chromium")
    try:
        r = _load(b, page, ARTIFACTS / "escaping-traced.png")
        assert NETNS in r.texts["body"] and NETNS in r.texts["svg"] and NETNS in r.texts["title"]
        # the second screenshot shows the traced processes' table: the host and the thread names
        r = _load(b, page, ARTIFACTS / "escaping-traced-processes.png", evals={"procs": PROCESSES})
    finally:
        b.close()
    rows = [line for line in r.texts["procs"] if line[0] == NETNS]
    # the server and the worker (the scheduler is quiet once the job formed, unless the agent was
    # ready before: then libzmq's I/O thread may show as ZMQbg/IO/0 for the first messages)
    assert len(rows) >= 2 and all(COMM in line[3].split(", ") for line in rows), r.texts["procs"]
    print(f"agent ready {t_agent:.1f} s, traced and stopped {t_traced:.1f} s, "
          f"report and browser {time.monotonic() - t0 - t_traced:.1f} s")
