"""The full terminal report: findings first, then the sections of the HTML report as tables.

    report_console().print(FullReport(build_model(d, run_dirs)))

The breakdown per op is the dissection's compact view (reports.render_term,
drawn from the JSON summary); this adds what the study asks beyond it:
concurrency, connection management, key skew, what the clocks mean, agent
health. Fits 100 columns and reads the same without colour (emphasis is
bold/dim, never colour alone). Strings from run dirs are drawn as text only, as
reports.render_term says.
"""
from __future__ import annotations

import sys
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from reports.findings import pct
from reports.render_term import SummaryView, column_unit, in_unit, row, shown

MAX_CLOCK_ROWS = 12
WIDTH_COLUMNS = 100   # what the report is laid out for


def report_console(file=None) -> Console:
    """A terminal's own width; WIDTH_COLUMNS and no colour for a file or pipe, where rich would
    take 80 columns and wrap cells across lines (a log, `| less`, the demo's output)."""
    out = file if file is not None else sys.stdout
    if out.isatty():
        return Console(file=file, highlight=False)
    return Console(file=file, width=WIDTH_COLUMNS, color_system=None, highlight=False)


def _table(title: str, cols: list[tuple[str, str]]) -> Table:
    t = Table(title=Text(title, style="bold"), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
              show_edge=False, padding=(0, 1))
    for name, justify in cols:
        t.add_column(Text(name), justify=justify)   # a probe's name comes from meta.json
    return t


def bullets(lines: list[str]) -> Table:
    """A list with a hanging indent (wrapped lines start under the text, not the dash)."""
    g = Table.grid(padding=(0, 1))
    g.add_column(width=1)
    g.add_column()
    for line in lines:
        g.add_row("-", Text(line))
    return g


def facts_view(m: dict) -> list:
    """What the report covers: the run's facts and the window, before anything else."""
    from reports.runfacts import lines

    out = [Text(line) for line in lines(m["run"])] if m.get("run") else []
    if m.get("window"):
        out.append(Text(m["window"]["text"], style="bold"))
        w = m["window"]["warmup"]
        out.append(Text(f"warm-up rule: {m['window']['rule']}; here: {w['why']}", style="dim"))
    return out


def findings_view(m: dict) -> list:
    return [Text("findings", style="bold"), bullets(m["findings"])]


def concurrency_view(m: dict) -> list:
    out = []
    for op, per in m["concurrency"].items():
        rows = per["server"]["by_conns"]
        keys = ("e2e_p50_us", "e2e_p99_us", "sock_wait_us", "runq_wait_us", "busy_wait_us")
        units = {k: column_unit([r[k] for r in rows]) for k in keys}   # one unit per column
        t = _table(f"{op}: latency by connections in flight in the server process (1 = alone)",
                   [("in flight", "right"), ("requests", "right")]
                   + [(f"{name} {units[k]}", "right") for name, k in
                      zip(("e2e p50", "e2e p99", "sock wait", "run-queue", "busy elsewhere"), keys)])
        for r in rows:
            row(t, f"{r['conns']}{'+' if r['pooled'] else ''}", f"{r['requests']:,}",
                *(in_unit(r[k], units[k]) for k in keys))
        if t.row_count:
            out.append(t)
        w = per["worker"]["by_conns"]
        if w:
            out.append(Text(f"{op}: the worker processes had up to {max(r['conns'] for r in w)} connection(s) in "
                            f"flight when a request started ({per['worker']['requests_counted']:,} requests)."))
    return out


def connections_view(m: dict) -> list:
    c = m["connections"]
    cw = c["connect_wait"]
    line = Text(f"requests that waited for their connection: {cw['waited']:,} of {cw['requests']:,}, "
                f"{pct(cw['share_of_request_time'])} of request time")
    if not c.get("traced"):
        return [Text("connection management", style="bold"), line, Text(c["why"])]
    vals = {k: [(h[src] or {}).get(q) for h in c["hosts"]] for k, src, q in
            (("hs50", "handshake_us", "p50"), ("hs99", "handshake_us", "p99"), ("aw50", "accept_wait_us", "p50"))}
    u = {k: column_unit(v) for k, v in vals.items()}
    t = _table("connection management (the agents' connections table)",
               [("host", "left"), ("connects", "right"), ("accepts", "right"), ("closes", "right"),
                ("failed", "right"), ("retrans", "right"), (f"handshake p50 {u['hs50']}", "right"),
                (f"p99 {u['hs99']}", "right"), (f"accept wait p50 {u['aw50']}", "right")])
    for i, h in enumerate(c["hosts"]):
        row(t, h["host"], f"{h['connects']:,}", f"{h['accepts']:,}", f"{h['closes']:,}",
                  f"{h['connect_failures']:,}", f"{h['retransmits']:,}",
                  *(in_unit(vals[k][i], u[k]) for k in ("hs50", "hs99", "aw50")))
    return [t, line]


def skew_view(m: dict) -> list:
    k = m["skew"]
    ops = [o for o in ("push", "pull") if isinstance(k.get(o), dict) and k[o].get("messages_sampled")]
    if not ops:
        return [Text("key skew", style="bold"), Text(k.get("why_none", "no key samples"))]
    t = _table("key skew (from hash-chosen key samples)",
               [("op", "left"), ("messages", "right"), ("keys/msg", "right"), ("hash subset", "right"),
                ("distinct keys", "right"), ("top 1%", "right"), ("top 10%", "right"), ("Zipf s", "right")])
    for op in ops:
        o = k[op]
        row(t, op, f"{o['messages']:,}", f"{o['keys_per_message']:.1f}",
                  "exact" if o.get("exact") else pct(o.get("subset_fraction")),
                  f"{o['distinct_keys_est']:,.0f}" if o.get("distinct_keys_est") else "-",
                  pct(o.get("top1_share")), pct(o.get("top10_share")),
                  f"{o['zipf_s']:.2f}" if o.get("zipf_s") is not None else "-")
    out: list = [t]
    agg = (k.get("push") or {}).get("aggregation") or []
    if agg:
        out.append(Text("push bytes removed by aggregating the top-k keys in the network (upper bound): "
                        + ", ".join(f"top {a['k']:,}: {pct(a['share_removed'])}" for a in agg)))
    return out


def clocks_view(m: dict) -> list:
    rows = sorted((r for r in m["clocks"] if r["source"] != "shared"),
                  key=lambda r: -(r["uncertainty_us"] if r["uncertainty_us"] is not None else float("inf")))
    if not m["clocks"]:
        return []
    if not rows:
        return [Text("clocks: every host pair shares one clock: the wire split is exact")]
    shown_rows = rows[:MAX_CLOCK_ROWS]
    ua = column_unit([r["uncertainty_us"] for r in shown_rows])
    ub = column_unit([r.get("wire_req_mean_us") for r in shown_rows])
    t = _table("clocks and the wire split (widest uncertainty first)",
               [("A~B", "left"), ("source", "left"), (f"wire_req/resp each +- {ua}", "right"),
                (f"mean wire_req {ub}", "right")])
    for r in shown_rows:
        row(t, r["pair"], r["source"], in_unit(r["uncertainty_us"], ua), in_unit(r.get("wire_req_mean_us"), ub))
    out: list = [t]
    if len(rows) > MAX_CLOCK_ROWS:
        out.append(Text(f"({len(rows) - MAX_CLOCK_ROWS} more pairs in the JSON/HTML report)"))
    out.append(Text("No method tells an asymmetric path from a clock offset: the round trip on the wire "
                    "(wire_req + wire_resp) is exact; its split between directions is known within +-."))
    return out


def health_view(m: dict) -> list:
    """One row per agent: its probe counters are agent-wide, whatever number of hosts
    (namespaces) it wrote; rows dropped are summed over its hosts' writers."""
    from reports.findings import agent_hosts, agent_writers, agents

    probes = sorted({p for h in m["health"] for p in h["probes"]})
    t = _table("agent health (events seen / lost per probe, per agent)",
               [("agent's hosts", "left")] + [(p, "right") for p in probes]
               + [("rows dropped", "right"), ("sampling", "right")])
    for a in agents(m["health"]):
        cells = [f"{a['probes'][p]['seen']:,} / {a['probes'][p]['lost']:,}" if p in a["probes"] else "-"
                 for p in probes]
        dropped, sampling = agent_writers(a)
        row(t, agent_hosts(a["hosts"]), *cells, f"{dropped:,}", sampling)
    return [t]


class FullReport:
    """A rich renderable of reports.viewmodel.build_model()'s dict."""

    def __init__(self, model: dict[str, Any]):
        self.m = shown(model)   # strings from run dirs: see reports.render_term

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        m = self.m
        facts = facts_view(m)
        if facts:
            yield from facts
            yield Text("")
        yield from findings_view(m)
        yield Text("")
        yield SummaryView(m["summary"])
        for part in (concurrency_view, connections_view, skew_view, clocks_view, health_view):
            items = part(m)
            if items:
                yield Text("")
                yield from items
