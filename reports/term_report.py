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

from reports.findings import pct, us
from reports.render_term import SummaryView, row, shown

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


def findings_view(m: dict) -> list:
    return [Text("findings", style="bold"), bullets(m["findings"])]


def concurrency_view(m: dict) -> list:
    out = []
    for op, per in m["concurrency"].items():
        t = _table(f"{op}: latency by connections in flight in the server process (1 = alone)",
                   [("in flight", "right"), ("requests", "right"), ("e2e p50", "right"), ("e2e p99", "right"),
                    ("sock wait", "right"), ("run-queue", "right"), ("busy elsewhere", "right")])
        for r in per["server"]["by_conns"]:
            row(t, f"{r['conns']}{'+' if r['pooled'] else ''}", f"{r['requests']:,}", us(r["e2e_p50_us"]),
                      us(r["e2e_p99_us"]), us(r["sock_wait_us"]), us(r["runq_wait_us"]), us(r["busy_wait_us"]))
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
    t = _table("connection management (the agents' connections table)",
               [("host", "left"), ("connects", "right"), ("accepts", "right"), ("closes", "right"),
                ("failed", "right"), ("retrans", "right"), ("handshake p50", "right"), ("p99", "right"),
                ("accept wait p50", "right")])
    for h in c["hosts"]:
        hs, aw = h["handshake_us"] or {}, h["accept_wait_us"] or {}
        row(t, h["host"], f"{h['connects']:,}", f"{h['accepts']:,}", f"{h['closes']:,}",
                  f"{h['connect_failures']:,}", f"{h['retransmits']:,}", us(hs.get("p50")), us(hs.get("p99")),
                  us(aw.get("p50")))
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
    t = _table("clocks and the wire split (widest uncertainty first)",
               [("A~B", "left"), ("source", "left"), ("wire_req/resp each +-", "right"), ("mean wire_req", "right")])
    for r in rows[:MAX_CLOCK_ROWS]:
        row(t, r["pair"], r["source"], us(r["uncertainty_us"]), us(r.get("wire_req_mean_us")))
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
        yield from findings_view(m)
        yield Text("")
        yield SummaryView(m["summary"])
        for part in (concurrency_view, connections_view, skew_view, clocks_view, health_view):
            items = part(m)
            if items:
                yield Text("")
                yield from items
