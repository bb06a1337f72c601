"""What building the report costs: time and peak memory to turn synthetic run
dirs of 10k, 100k and 1M requests into the JSON summary and the HTML report.

    python -m bench.report [--sizes 10000,100000,1000000] [--workers 32] [--servers 8]

Run dirs come from workloads.simulated.job (shaped like the agent's: each request
slice is a request and a response message, each seen on both its hosts, with
realistic per-component delays, control messages, connections, key samples
and counters added by workloads.simulated.views) on many hosts (--workers +
--servers). Each size is generated in one child process and measured in a
fresh one, so that neither the generator's memory nor another size's counts:
the child times each stage (read + dissect, summary + JSON, HTML) and reads
its peak RSS (VmHWM: Linux carries ru_maxrss over exec from the process that
spawned the child, so the child's own high-water mark is the honest one).

Each size's HTML is then loaded in headless Chromium (bench/browser.py), timed
from navigation to every plot drawn, with console errors counted (--no-browser
skips it).

Prints one line per size, the per-request cost at each size and how it grows
(the exponent k of time ~ requests^k: 1 is linear), then one JSON line (last).
Targets: 1M requests to JSON + HTML in under 30 s, growth close to linear
(issue 6); the HTML of 1M requests under 20 MB, loaded in Chromium in under 5 s
(issue 5).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import at_least, json_line, linear_fit

TARGET_1M_S = 30.0
TARGET_HTML_MB = 20.0
TARGET_LOAD_S = 5.0
STAGES = ("dissect_s", "summary_json_s", "html_s")


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: give comma-separated integers") from None
    if not sizes or any(n < 100 for n in sizes) or sizes != sorted(set(sizes)):
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: give request counts >= 100, ascending, each once")
    return sizes


def growth_exponent(sizes: list[int], seconds: list[float]) -> float | None:
    """k in seconds ~ sizes^k (least squares in log-log); None with fewer than 3 sizes."""
    pts = [(math.log(n), math.log(t)) for n, t in zip(sizes, seconds) if n > 0 and t and t > 0]
    fit = linear_fit([x for x, _ in pts], [y for _, y in pts])
    return None if fit is None else fit[1]


def last_step_exponent(sizes: list[int], seconds: list[float]) -> float | None:
    """k between the two largest sizes (where a fixed start-up cost no longer hides the growth)."""
    if len(sizes) < 2 or not seconds[-1] or not seconds[-2] or seconds[-1] <= 0 or seconds[-2] <= 0:
        return None
    return math.log(seconds[-1] / seconds[-2]) / math.log(sizes[-1] / sizes[-2])


def fixed_and_marginal(sizes: list[int], seconds: list[float]) -> dict | None:
    """seconds = fixed + per_request * size, least squares: start-up cost vs cost per request."""
    fit = linear_fit(sizes, seconds)
    return None if fit is None else {"fixed_s": fit[0], "us_per_request": fit[1] * 1e6}


def per_request_us(seconds: float | None, requests: int) -> float | None:
    return None if seconds is None or not requests else seconds * 1e6 / requests


# ---------------------------------------------------------------- children

def generate(out: Path, requests: int, workers: int, servers: int, seed: int) -> dict:
    """Run dirs for `requests` request slices over workers x servers hosts."""
    from workloads.simulated.job import Sim, simulate
    from workloads.simulated.views import ViewSim, add_views

    per_worker = max(1, requests // workers)
    sim = Sim(workers=workers, servers=servers, requests=per_worker, wire_req_ns=1_000_000,
              wire_resp_ns=1_000_000, server_user_ns=1_000_000, clocks={"ps1": (5_000_000, 50.0)}, seed=seed)
    t0 = time.perf_counter()
    simulate(out, sim)
    add_views(out, ViewSim(seed=seed))
    return {"requests": per_worker * workers, "hosts": workers + servers, "generate_s": time.perf_counter() - t0,
            "run_dir_bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file())}


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(run_root: Path, html_out: Path) -> dict:
    """In a fresh process: read + dissect, summary as JSON text, HTML file; times and peaks."""
    r = {"hwm_after_imports_mb": None}
    from reports.dissect import dissect
    from reports.html import write_html
    from reports.summary import summary

    r["hwm_after_imports_mb"] = _hwm_mb()
    dirs = sorted(p for p in run_root.iterdir() if p.is_dir())
    c0, t0 = time.process_time(), time.perf_counter()
    d = dissect(dirs)
    t1 = time.perf_counter()
    r["dissect_s"], r["hwm_after_dissect_mb"] = t1 - t0, _hwm_mb()
    text = json.dumps(summary(d))
    t2 = time.perf_counter()
    r["summary_json_s"], r["hwm_after_json_mb"], r["json_bytes"] = t2 - t1, _hwm_mb(), len(text)
    write_html(d, html_out, dirs)
    t3 = time.perf_counter()
    r["html_s"], r["hwm_mb"], r["html_bytes"] = t3 - t2, _hwm_mb(), html_out.stat().st_size
    r["total_s"], r["cpu_s"], r["requests"] = t3 - t0, time.process_time() - c0, len(d.requests)
    # on a shared machine wall time is CPU time plus waiting for a CPU: both are printed
    r["load_avg_1m"] = os.getloadavg()[0]
    return r


def _child(argv: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-m", "bench.report", *argv], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"bench.report {argv[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def load_in_browser(page: Path, tmp: Path) -> dict:
    """Navigation to every plot drawn in headless Chromium, and what went wrong on the way."""
    from bench.browser import Browser, chromium_missing

    why = chromium_missing()
    if why:
        return {"skipped": why}
    b = Browser(tmp / "chromium")
    try:
        r = b.open(page.resolve().as_uri(), timeout_s=120)
    finally:
        b.close()
    return {"load_s": r.load_s, "ready": bool(r.state.get("ready")), "plots": r.state.get("plots"),
            "plots_expected": r.state.get("expected"),
            "errors": len(r.exceptions) + len(r.console_errors) + len(r.state.get("errors") or [])}


def run_size(n: int, workers: int, servers: int, seed: int, browser: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix=f"pslat-bench-report-{n}-") as tmp:
        root = Path(tmp) / "run"
        root.mkdir()
        gen = _child(["generate", str(root), str(n), str(workers), str(servers), str(seed)])
        m = _child(["measure", str(root), str(Path(tmp) / "report.html")])
        if browser:
            m["browser"] = load_in_browser(Path(tmp) / "report.html", Path(tmp))
    m.update(generated=gen, size=n)
    m["us_per_request"] = per_request_us(m["total_s"], m["requests"])
    for s in STAGES:
        m[f"{s[:-2]}_us_per_request"] = per_request_us(m[s], m["requests"])
    return m


def describe(m: dict) -> str:
    return (f"{m['requests']:>9,} requests ({m['generated']['hosts']} hosts, run dirs "
            f"{m['generated']['run_dir_bytes'] / 2**20:,.0f} MiB): read+dissect {m['dissect_s']:.2f} s, "
            f"summary JSON {m['summary_json_s']:.2f} s, HTML {m['html_s']:.2f} s ({m['html_bytes'] / 2**20:.1f} MiB); "
            f"total {m['total_s']:.2f} s = {m['us_per_request']:.1f} us/request ({m['cpu_s']:.2f} s CPU, load "
            f"{m['load_avg_1m']:.1f}); peak RSS {m['hwm_after_json_mb']:,.0f} "
            f"MB for JSON, {m['hwm_mb']:,.0f} MB with HTML ({m['hwm_after_imports_mb']:.0f} MB after imports)"
            + _browser_text(m.get("browser")))


def _browser_text(b: dict | None) -> str:
    if b is None:
        return ""
    if "skipped" in b:
        return f"; Chromium: not loaded ({b['skipped']})"
    if not b["ready"]:
        return f"; Chromium: NOT every plot drawn ({b['plots']} of {b['plots_expected']}), {b['errors']} errors"
    return f"; Chromium: {b['plots']} plots drawn in {b['load_s']:.2f} s, {b['errors']} errors"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["generate"]:   # internal: one child per step (see the docstring)
        root, n, w, s, seed = argv[1:6]
        print(json.dumps(generate(Path(root), int(n), int(w), int(s), int(seed))))
        return 0
    if argv[:1] == ["measure"]:
        print(json.dumps(measure(Path(argv[1]), Path(argv[2]))))
        return 0
    ap = argparse.ArgumentParser(description="Time and peak memory of the JSON summary and the HTML report "
                                             "for synthetic runs of growing size.")
    ap.add_argument("--sizes", type=parse_sizes, default=parse_sizes("10000,100000,1000000"),
                    help="request counts, ascending [10000,100000,1000000]")
    ap.add_argument("--workers", type=at_least(1), default=32, help="worker hosts [%(default)s]")
    ap.add_argument("--servers", type=at_least(1), default=8, help="server hosts [%(default)s]")
    ap.add_argument("--seed", type=at_least(0), default=1, help="simulation seed [%(default)s]")
    ap.add_argument("--no-browser", action="store_true", help="do not load the HTML in Chromium")
    a = ap.parse_args(argv)
    if any(n < a.workers for n in a.sizes):
        ap.error(f"--sizes: each size needs at least one request per worker ({a.workers})")
    t_start = time.monotonic()
    rows = []
    for n in a.sizes:
        m = run_size(n, a.workers, a.servers, a.seed, browser=not a.no_browser)
        print(describe(m), flush=True)
        rows.append(m)
    sizes = [m["requests"] for m in rows]
    totals = [m["total_s"] for m in rows]
    k, k_last, lin = growth_exponent(sizes, totals), last_step_exponent(sizes, totals), fixed_and_marginal(sizes, totals)
    out = {"sizes": rows, "growth_exponent": k, "growth_exponent_largest_step": k_last, "fixed_and_marginal": lin,
           "growth_exponent_by_stage": {s: growth_exponent(sizes, [m[s] for m in rows]) for s in STAGES},
           "us_per_request": {str(m["requests"]): m["us_per_request"] for m in rows},
           "target_1m_s": TARGET_1M_S}
    big = next((m for m in rows if m["requests"] >= 1_000_000), None)
    out["total_1m_s"] = big["total_s"] if big else None
    out["meets_1m_target"] = None if big is None else big["total_s"] < TARGET_1M_S
    loaded = (big or {}).get("browser") or {}
    out["html_1m_mb"] = big["html_bytes"] / 2**20 if big else None
    out["load_1m_s"] = loaded.get("load_s") if loaded.get("ready") and not loaded.get("errors") else None
    out["meets_html_1m_target"] = None if out["html_1m_mb"] is None or "skipped" in loaded else \
        out["html_1m_mb"] < TARGET_HTML_MB and out["load_1m_s"] is not None and out["load_1m_s"] < TARGET_LOAD_S
    print("per-request cost: " + ", ".join(f"{m['requests']:,}: {m['us_per_request']:.1f} us" for m in rows) +
          (f"; time ~ requests^{k:.2f} overall" if k is not None else "") +
          (f", ^{k_last:.2f} from {sizes[-2]:,} to {sizes[-1]:,} (1 = linear)" if k_last is not None else ""),
          flush=True)
    if lin:
        print(f"fit: {lin['fixed_s']:.2f} s fixed (imports excluded) + {lin['us_per_request']:.1f} us per request",
              flush=True)
    if big:
        print(f"1M requests to JSON + HTML: {big['total_s']:.1f} s (target < {TARGET_1M_S:g} s: "
              f"{'meets' if out['meets_1m_target'] else 'misses'})", flush=True)
    if big and out["meets_html_1m_target"] is not None:
        print(f"1M requests' HTML: {out['html_1m_mb']:.1f} MB, "
              + (f"every plot drawn in Chromium in {out['load_1m_s']:.2f} s" if out["load_1m_s"] is not None
                 else "NOT loaded cleanly in Chromium")
              + f" (target < {TARGET_HTML_MB:g} MB and < {TARGET_LOAD_S:g} s: "
              f"{'meets' if out['meets_html_1m_target'] else 'misses'})", flush=True)
    out["config"] = {"workers": a.workers, "servers": a.servers, "seed": a.seed,
                     "elapsed_s": round(time.monotonic() - t_start, 1)}
    print(json_line(out), flush=True)
    return 0


if __name__ == "__main__":
    from core.errors import run_main

    sys.exit(run_main("bench.report", main))
