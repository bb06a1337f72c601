"""The report on a terminal: a compact table per op, from the JSON summary.

    console.print(SummaryView(summary_dict))

Drawn from the summary (reports.summary), so what the screen shows is what the
JSON says. Fits 100 columns and reads the same without colour (emphasis is
bold/dim only, never colour alone).

Host ids, ops, addresses, file names and problem sentences come from run dirs that
other hosts wrote: a renderer takes its dict through shown() (control characters
replaced) and draws every string as a rich Text (row(), headers, titles), never as
markup, so `ps1[/bold]` is shown as written and `ESC[2J` cannot reach the terminal,
on a screen or in a file.
"""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text

from core.safetext import safe_text
from reports import components as C

GROUP_LABELS = {"host": "host (user + kernel)", "nic": "nic", "wire": "wire",
                C.NETWORK_AND_REMOTE: C.NETWORK_AND_REMOTE, C.UNSPLIT: C.UNSPLIT}


def shown(value: Any) -> Any:
    """A view model made safe for a terminal: every string in it, keys too, through
    core.safetext.safe_text (numbers and the structure as they are)."""
    if isinstance(value, str):
        return safe_text(value)
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown(v) for v in value]
    return value


def row(t: Table, *cells: Any, style: str | None = None) -> None:
    """A table row whose strings are Text: a str cell would be parsed as rich markup."""
    t.add_row(*(Text(c) if isinstance(c, str) else c for c in cells), style=style)


def column_unit(values_us) -> str:
    """One unit for a column, chosen for its largest value: ms from 10 ms up, else us."""
    top = max((abs(v) for v in values_us if v is not None), default=0.0)
    return "ms" if top >= 10_000 else "us"


def in_unit(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    return f"{x / 1e3:,.2f}" if unit == "ms" else f"{x:,.1f}"


def _row(t: Table, label: str, st: dict | None, e2e_mean: float | None, n: int | None, total: int,
         style: str = "", unit: str = "us") -> None:
    if st is None:
        row(t, Text(label, style=style), "-", "-", "-", "", style="dim")
        return
    if n is not None and n < total:
        share = f"n={n:,}"   # a share of the e2e would mislead: other requests lack this one
    else:
        share = "" if not e2e_mean else f"{100 * st['mean'] / e2e_mean:.0f}%"
    row(t, Text(label, style=style), *(in_unit(st[k], unit) for k in ("mean", "p50", "p99")), share)


def op_table(op: str, s: dict[str, Any]) -> Table:
    t = Table(title=Text(f"{op}: {s['count']:,} requests", style="bold"), title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
    e2e = s.get("e2e_us")
    unit = column_unit([e2e["p99"]] if e2e else [])   # the e2e p99 is the table's largest value
    t.add_column(unit, min_width=28)
    for h in ("mean", "p50", "p99"):
        t.add_column(h, justify="right", min_width=9)
    t.add_column("of e2e", justify="right", min_width=6)
    mean = e2e["mean"] if e2e else None
    total, counts = s["count"], s.get("counts", {})
    _row(t, "end-to-end", e2e, None, None, total, "bold", unit)
    for g, st in s["groups_us"].items():
        _row(t, GROUP_LABELS.get(g, g), st, mean, counts.get(f"group_{g}"), total, "bold", unit)
    t.add_section()
    comps, subs = s["components_us"], s["subcomponents_us"]
    for c in C.COMPONENTS:
        if c not in comps:
            continue
        _row(t, c, comps[c], mean, counts.get(c), total, unit=unit)
        for sub in C.SUBCOMPONENTS.get(c, ()):
            if sub in subs:
                _row(t, f"  {sub}", subs[sub], mean, counts.get(sub), total, "dim", unit)
    return t


def clock_table(clock: dict[str, Any]) -> Table:
    t = Table(title=Text("clocks (offset: add to B's times to get A's)", style="bold"), title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
    for h, j in (("A~B", "left"), ("source", "left"), ("offset us", "right"), ("drift ppm", "right"),
                 ("+- us", "right"), ("samples", "right")):
        t.add_column(h, justify=j)
    for key, c in clock.items():
        row(t, key, c["source"], in_unit(c["offset_us"], "us"),
                  "-" if c["drift_ppm"] is None else f"{c['drift_ppm']:.2f}",
                  in_unit(c["uncertainty_us"], "us"), f"{c.get('samples', 0):,}")
    return t


def _by_host(title: str, by: dict[str, Any]) -> Table:
    t = Table(title=Text(title, style="bold"), title_justify="left", box=box.SIMPLE_HEAD,
              pad_edge=False, show_edge=False, padding=(0, 1))
    unit = column_unit([(b["e2e_us"] or {}).get("p99") for b in by.values()])
    t.add_column("host")
    for h in ("count", f"e2e p50 {unit}", f"e2e p99 {unit}", f"host p50 {unit}", f"nic p50 {unit}",
              f"wire p50 {unit}"):
        t.add_column(h, justify="right")
    for host, b in by.items():
        e2e, g = b["e2e_us"] or {}, b["groups_us"]
        row(t, host, f"{b['count']:,}", in_unit(e2e.get("p50"), unit), in_unit(e2e.get("p99"), unit),
                  *(in_unit((g.get(k) or {}).get("p50"), unit) for k in ("host", "nic", "wire")))
    return t


class SummaryView:
    """A rich renderable of reports.summary.summary()'s dict."""

    def __init__(self, summary: dict[str, Any], per_host: bool = True):
        self.s = shown(summary)
        self.per_host = per_host

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        s = self.s
        u = s["unmatched"]
        n = len(s["hosts"])
        w = s.get("windowed") or {}
        # the tables below describe the window: its count beside the run's
        in_window = f" ({w['requests']:,} in the window)" if w.get("requests", s["requests"]) != s["requests"] else ""
        yield Text.assemble(("pslat report", "bold"), f": {n} host{'s' if n != 1 else ''} ({', '.join(s['hosts'])}); "
                            f"{s['requests']:,} requests paired in the run{in_window}; without response "
                            f"{u['requests_without_response']:,}, responses without request "
                            f"{u['messages_without_request']:,}, messages without ids "
                            f"{u['messages_unparsed']:,}")
        smp = s.get("sampling") or {}
        if smp.get("scaled"):
            yield Text(f"sampled: {100 * smp['rate']:.3g}% of host pairs; counts scaled "
                       f"(x{1 / smp['rate']:.3g}; {s['sampled_requests']:,} requests recorded)", style="bold")
        if s["clock"]:
            yield clock_table(s["clock"])
        for op, o in s["by_op"].items():
            yield op_table(op, o)
            if self.per_host and (len(o["by_server"]) > 1 or len(o["by_worker"]) > 1):
                yield Group(_by_host(f"{op} by server", o["by_server"]),
                            _by_host(f"{op} by worker", o["by_worker"]))
        if not s["by_op"]:
            yield Text("no request with both its ends measured on the worker", style="bold")
        neg = s.get("negative_components") or {}
        if neg:
            yield Text("negative components (kept, not clamped: clock error or non-causal stage times): "
                       + ", ".join(f"{k} {v:,}" for k, v in neg.items()))
        for title, lines in (("notes", s.get("notes") or []), ("problems with the input", s.get("problems") or [])):
            if lines:
                yield Text(title, style="bold")
                for line in lines:
                    yield Text(f"- {line}")
