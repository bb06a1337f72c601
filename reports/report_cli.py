"""`pslat report RUN_DIR...`: where each push/pull's latency went, across hosts."""
from __future__ import annotations

import json
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, List, Optional

import typer

from core.errors import UserError
from core.safetext import safe_text

FORMATS = ("term", "json", "parquet", "csv", "html", "trace")
EXTENSIONS = {".json": "json", ".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".txt": "term",
              ".html": "html", ".htm": "html"}
FILE_ONLY = ("parquet", "csv", "html", "trace")  # formats that are not for a terminal


def pick_format(fmt: str | None, output: Path | None) -> str:
    """--format, else the output file's extension, else term (see `pslat report --help`)."""
    if fmt is not None:
        fmt = fmt.lower()
        if fmt not in FORMATS:
            raise UserError(f"--format {fmt}: give one of {', '.join(FORMATS)}")
    elif output is not None:
        # a Chrome/Perfetto trace is JSON too: it is told apart by its name
        fmt = "trace" if output.name.lower().endswith(".trace.json") else EXTENSIONS.get(output.suffix.lower())
        if fmt is None:
            raise UserError(f"-o {output}: cannot tell the format from '{output.suffix or 'no extension'}'; "
                            f"name it .json/.trace.json/.html/.parquet/.csv/.txt or give --format")
    else:
        fmt = "term"
    if fmt in FILE_ONLY and output is None:
        raise UserError(f"--format {fmt} writes a file: give -o FILE")
    return fmt


def request_table(requests):
    """The per-request table as written: ids, op, hosts, keys, bytes, every component in us."""
    import numpy as np
    import pandas as pd

    from reports import components as C

    out = requests.drop(columns=["start_ns"]).copy()
    out.insert(0, "start_ns", requests["start_ns"])          # the worker's CLOCK_MONOTONIC
    ns_cols = C.COMPONENTS + C.SUBS + [f"group_{g}" for g in C.GROUPS] + ["e2e"]
    for c in ns_cols:
        out[f"{c}_us"] = requests[c].to_numpy(dtype=np.float64, na_value=np.nan) / 1e3
    out = out.drop(columns=ns_cols)
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].astype(object)
    return out


def report(
    run_dirs: List[Path] = typer.Argument(None, help="run dirs of one run, one per host (or the dir "
                                          "`pslat agent --out DIR` wrote), and/or capture files (pcap, "
                                          "pcapng), each a capture point named by its file name",
                                          show_default=False),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help="term | json (the summary) | html (self-contained "
                                      "report) | trace (Chrome/Perfetto) | parquet | csv (one row per "
                                      "request); default: from -o's extension, else term",
                                      rich_help_panel="Output", show_default=False),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="write to FILE instead of the screen",
                                          rich_help_panel="Output", show_default=False),
    clocks: str = typer.Option("auto", "--clocks", help="auto: use shared or disciplined clocks when "
                               "meta.json says so, else estimate from the traffic; estimate: always "
                               "from the traffic", rich_help_panel="Clocks"),
    captures: Annotated[Optional[List[str]], typer.Option(
        "--capture", help="NAME=FILE: a capture file (pcap, pcapng) of the capture point NAME (a host, or a "
        "tap); repeat for each", rich_help_panel="Captures", show_default=False)] = None,
    protocols: Annotated[Optional[List[str]], typer.Option(
        "--protocol", help="PORT=NAME: captured connections with an end on PORT speak protocol NAME (else "
        "told from their bytes)", rich_help_panel="Captures", show_default=False)] = None,
    since: Annotated[Optional[str], typer.Option(
        "--since", help="the window starts here: seconds from the run's start (2.5) or a UTC time (12:30:05, "
        "2026-12-04T12:30:05Z)", rich_help_panel="Window", show_default=False)] = None,
    until: Annotated[Optional[str], typer.Option("--until", help="the window ends here (as --since)",
                                                 rich_help_panel="Window", show_default=False)] = None,
    skip_warmup: Annotated[bool, typer.Option(
        "--skip-warmup/--keep-warmup", help="cut the start-up transient the data shows (docs/reports.md says "
        "the rule; the report says what it cut)", rich_help_panel="Window")] = True,
    ops: Annotated[Optional[List[str]], typer.Option("--op", help="only this op (repeat for more)",
                                                     rich_help_panel="Window", show_default=False)] = None,
    hosts: Annotated[Optional[List[str]], typer.Option("--host", help="only requests with an end on this host",
                                                       rich_help_panel="Window", show_default=False)] = None,
    servers: Annotated[Optional[List[str]], typer.Option("--server", help="only requests to this server host",
                                                         rich_help_panel="Window", show_default=False)] = None,
    workers: Annotated[Optional[List[str]], typer.Option("--worker", help="only requests from this worker host",
                                                         rich_help_panel="Window", show_default=False)] = None,
    max_requests: Annotated[int, typer.Option(
        "--max-requests", min=1, help="trace format: at most this many requests, the window's first",
        rich_help_panel="Window")] = 20_000,
    baseline: Annotated[Optional[List[Path]], typer.Option(
        "--baseline", help="run dirs of an earlier run (repeat for each): print and plot each component's "
        "change from it (p50, p99, share), windowed and filtered as this run", rich_help_panel="Compare",
        show_default=False)] = None,
) -> None:
    """Pair both ends of every push/pull across hosts and split its latency into host, NIC and wire."""
    from reports.dissect import dissect
    from reports.window import Choice, select

    if clocks not in ("auto", "estimate"):
        raise UserError(f"--clocks {clocks}: give auto or estimate")
    fmt = pick_format(fmt, output)
    if baseline and fmt in ("trace", "parquet", "csv"):
        raise UserError(f"--baseline compares summaries: give --format term, json or html, not {fmt}")
    choice = Choice(since=since, until=until, skip_warmup=skip_warmup, ops=list(ops or []),
                    hosts=list(hosts or []), servers=list(servers or []), workers=list(workers or []))
    base = None
    if baseline:
        with captured_run_dirs(list(baseline), [], protocols or []) as (bdirs, _):
            base = select(dissect(bdirs, force_estimate=clocks == "estimate"), choice)
    with captured_run_dirs(list(run_dirs or []), captures or [], protocols or []) as (dirs, problems):
        d = dissect(dirs, force_estimate=clocks == "estimate")
        d.problems[:0] = problems
        _render(select(d, choice), dirs, fmt, output, base, max_requests)


@contextmanager
def captured_run_dirs(paths: list[Path], captures: list[str], protocols: list[str]):
    """The run dirs among `paths`, with a run dir for each capture file (among `paths` or
    --capture NAME=FILE) made in a temporary dir that lasts the report (capture/rundir.py),
    and what was wrong with the captures."""
    files = [p for p in paths if p.is_file()]   # anything else is a run dir for reports.load to judge
    if not files and not captures:
        if not paths:
            raise UserError("give run dirs or capture files (see `pslat report --help`)")
        yield paths, []
        return
    from capture.rundir import parse_points, write_run_dirs
    from parsers.registry import parse_forced

    try:
        forced = parse_forced(protocols)
    except ValueError as e:
        raise UserError(str(e)) from None
    points = parse_points(files, captures)
    with tempfile.TemporaryDirectory(prefix="pslat-captures-") as tmp:
        made, problems = write_run_dirs(points, Path(tmp), forced)
        yield [p for p in paths if not p.is_file()] + made, problems


def _render(sel, dirs: list[Path], fmt: str, output: Path | None, base=None, max_requests: int = 20_000) -> None:
    """sel: this run's reports.window.Selection; base: the baseline's (--baseline), or None."""
    from reports.compare import CompareView, comparison
    from reports.summary import document
    from reports.term_report import FullReport, report_console
    from reports.viewmodel import build_model

    d = sel.window
    cmp = comparison(base, sel) if base is not None else None

    def term(console):
        console.print(FullReport(build_model(sel.whole, dirs, sel)))
        if cmp is not None:
            console.print(CompareView(cmp))

    if fmt == "term" and output is None:
        term(report_console())
        return
    for p in d.problems:   # the screen view shows them; a file does not reach the user's eyes
        print(f"pslat report: warning: {safe_text(p)}", file=sys.stderr)   # they name what run dirs hold
    if fmt == "json":
        doc = document(sel)
        if cmp is not None:
            doc["baseline"] = cmp
        text = json.dumps(doc, indent=1) + "\n"
        if output is None:
            sys.stdout.write(text)
            return
        _write(output, lambda f: f.write(text))
    elif fmt == "term":
        _write(output, lambda f: term(report_console(f)))
    elif fmt == "html":
        from reports.html import write_html
        _guard_write(output, lambda: write_html(sel.whole, output, dirs, sel=sel, comparison=cmp))
    elif fmt == "trace":
        from reports.trace import write_trace
        _guard_write(output, lambda: write_trace(d, output, dirs, max_requests))
    else:   # every request of the (filtered) run, marked in the window or not
        table = request_table(sel.whole.requests)
        table["in_window"] = sel.whole.requests.index.isin(d.requests.index)
        if fmt == "csv":
            _write(output, lambda f: table.to_csv(f, index=False))
        else:
            _guard_write(output, lambda: table.to_parquet(output, index=False))
    print(f"pslat report: wrote {output} ({fmt}, {len(d.requests):,} requests)", file=sys.stderr)


def _guard_write(path: Path, write) -> None:
    try:
        write()
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}; check the directory exists and is writable") \
            from None


def _write(path: Path, fill) -> None:
    def write():
        with open(path, "w", newline="") as f:
            fill(f)
    _guard_write(path, write)
