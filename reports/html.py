"""The self-contained HTML report: `write_html(d, path, run_dirs)`.

One file that works offline: plotly.js, styles and data inline, nothing fetched
(a Content-Security-Policy of default-src 'none' makes sure). It shows the view
model (reports.viewmodel: pre-aggregated, so 1M requests make the same few
hundred KB of data as 1k) in seven sections, findings first.

Escaping: every string that comes from traced data (host ids, namespace names,
thread names, notes quoting them) may hold markup. HTML text and attributes go
through html.escape; plot labels are escaped the same way because plotly reads
a subset of HTML in its text; the data JSON sits in <script type=
"application/json"> with <, >, & and U+2028/9 as \\u escapes, so that no
</script> or <!-- inside a string can end or change the script element.
"""
from __future__ import annotations

import html
import json
import math
import re
from itertools import count
from pathlib import Path
from typing import Any

from core.errors import UserError
from reports import components as C
from reports.findings import NO_AGGREGATION, agent_writers, agents, aggregation_removes_nothing, pct, us
from reports.html_template import PAGE
from reports.viewmodel import GROUP_ORDER, build_model

GROUP_COLORS = {"host": "#4c78a8", "nic": "#f58518", "wire": "#54a24b", C.NETWORK_AND_REMOTE: "#b279a2",
                C.UNSPLIT: "#9d9d9d"}
_SHADES = {"host": ["#1f4e79", "#2e6da4", "#4c78a8", "#6f94c0", "#93b1d4", "#b6cde6", "#3a5f8a"],
           "nic": ["#c45a00", "#f58518", "#ffa64d", "#ffc285"], "wire": ["#2d7a2d", "#54a24b"]}
TITLE_HOSTS_MAX = 4
LEGEND_SIDE_MAX = 8        # legend entries that fit beside a plot of the grid without scrolling
LEGEND_ROW_ENTRIES = 3     # entries per row of a legend below a plot
LEGEND_ROW_PX = 20
_PLACEHOLDER = re.compile(r"@@(TITLE|SUBTITLE|NAV|BODY|DATA|PLOTLYJS)@@")
SECTIONS = [("findings", "Findings"), ("breakdown", "1 Breakdown"), ("distributions", "2 Distributions & time"),
            ("concurrency", "3 Concurrency"), ("connections", "4 Connections"), ("skew", "5 Key skew"),
            ("clocks", "6 Clocks"), ("health", "7 Agent health")]


def esc(s: Any) -> str:
    return html.escape(str(s), quote=True)


def script_json(obj: Any) -> str:
    """JSON that is safe inside a <script> element, whatever its strings hold."""
    text = json.dumps(obj, separators=(",", ":"), allow_nan=False, default=_json_default)
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _json_default(o):
    import numpy as np
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return None if not np.isfinite(o) else float(o)
    raise TypeError(f"not JSON: {type(o).__name__}")


def _clean(obj):
    """NaN/inf -> None (JSON has neither; plotly reads null as a gap)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def _component_colors() -> dict[str, str]:
    out = {}
    for g, members in C.GROUPS.items():
        shades = _SHADES.get(g, [GROUP_COLORS[g]])
        for k, m in enumerate(members):
            out[m] = shades[k % len(shades)]
    return out


COMPONENT_COLORS = _component_colors()


class Page:
    """Collects HTML pieces and the figures that go with them."""

    def __init__(self):
        self.parts: list[str] = []
        self.figures: list[dict] = []
        self._ids = count()

    def add(self, text: str) -> None:
        self.parts.append(text)

    def figure(self, data: list[dict], layout: dict, height: int = 340) -> str:
        div = f"fig{next(self._ids)}"
        base = {"height": height, "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "paper_bgcolor": "#fff",
                "legend": {"font": {"size": 11}, "traceorder": "normal"},
                "plot_bgcolor": "#fff", "font": {"family": "DejaVu Sans, sans-serif", "size": 12}}
        base.update(layout)
        if "yaxis2" in layout:   # the right axis' labels sit where the legend would: it goes below
            base["legend"] = {**base["legend"], "orientation": "h", "x": 0, "y": -0.3, "yanchor": "top"}
            base["margin"] = {**base["margin"], "r": 60, "b": 110}
            base["height"] = height + 60
            # its own round ticks (plotly's default aligns them to the left axis' grid: 30.1, 54.1)
            base["yaxis2"] = {"tickmode": "auto", **layout["yaxis2"]}
        named = sum(1 for d in data if d.get("name") and d.get("showlegend", True))
        if named > LEGEND_SIDE_MAX and "yaxis2" not in layout:
            # a long legend on the side scrolls (entries hidden): below the plot, in rows, all shown
            rows = -(-named // LEGEND_ROW_ENTRIES)
            base["height"] = base["height"] + LEGEND_ROW_PX * rows + 30
            axis_px = base["margin"]["b"]      # the x axis' ticks and title, above the legend
            base["margin"] = {**base["margin"], "b": axis_px + LEGEND_ROW_PX * rows + 30}
            plot_px = base["height"] - base["margin"]["t"] - base["margin"]["b"]
            base["legend"] = {**base["legend"], "orientation": "h", "x": 0, "y": -(axis_px + 5) / plot_px,
                              "yanchor": "top"}
        if "title" in base:   # left, clear of the mode bar on the right
            base["title"] = {"x": 0.01, "xanchor": "left", "font": {"size": 13}, **base["title"]}
        self.figures.append({"div": div, "data": data, "layout": base})
        return f'<div class="plot" id="{div}"></div>'


def _t(s: Any) -> str:
    """Text for plotly (which reads a subset of HTML): escaped to show literally."""
    return html.escape(str(s), quote=False)


def _table(head: list[str], rows: list[list[Any]], left: int = 1, classes: list[str] | None = None) -> str:
    h = "".join(f'<th class="l">{esc(c)}</th>' if i < left else f"<th>{esc(c)}</th>" for i, c in enumerate(head))
    body = []
    for r_i, r in enumerate(rows):
        cls = f' class="{esc(classes[r_i])}"' if classes and classes[r_i] else ""
        body.append(f"<tr{cls}>" + "".join(f'<td class="l">{esc(c)}</td>' if i < left else f"<td>{esc(c)}</td>"
                                           for i, c in enumerate(r)) + "</tr>")
    return f"<table><thead><tr>{h}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _help(text: str) -> str:
    return f'<p class="help">{esc(text)}</p>'


# ---------------------------------------------------------------- sections

def sec_findings(p: Page, m: dict) -> None:
    from reports.runfacts import lines

    facts = "".join(f'<p class="muted">{esc(x)}</p>' for x in (lines(m["run"]) if m.get("run") else []))
    window = f'<p><b>{esc(m["window"]["text"])}</b></p>' if m.get("window") else ""
    items = "".join(f"<li>{esc(f)}</li>" for f in m["findings"])
    p.add(f'<section id="findings"><h2>Findings</h2>{facts}{window}<ul class="findings">{items}</ul></section>')


def _stat_row(label: str, st: dict | None, contrib: float | None, mean: float | None) -> list:
    share = pct(contrib / mean) if contrib is not None and mean else ""
    if st is None:
        return [label, "-", "-", "-", "-", share]
    return [label, us(contrib) if contrib is not None else "-", us(st["p50"]), us(st["p99"]), us(st["mean"]), share]


def sec_breakdown(p: Page, m: dict) -> None:
    p.add('<section id="breakdown"><h2>1 Where the latency goes, per op</h2>')
    p.add(_help("Each request's components add up exactly to its end-to-end latency, so their mean contributions "
                "add up to the mean end-to-end: the bars stack them (host = user space and kernel on both ends; "
                "nic; wire). p50/p99 are of each component alone. Folded components (a stage the device lacks) "
                "appear under the name they were folded into; see the notes."))
    b = m["breakdown"]
    ops = list(b)
    if not ops:
        p.add("<p>No request with both its ends measured on the worker.</p></section>")
        return
    figs = []
    data = [{"type": "bar", "orientation": "h", "name": _t(g), "y": ops, "x": [b[o]["groups_us"].get(f"group_{g}")
             for o in ops], "marker": {"color": GROUP_COLORS[g]}} for g in GROUP_ORDER
            if any(b[o]["groups_us"].get(f"group_{g}") for o in ops)]
    figs.append(p.figure(data, {"title": {"text": "host / NIC / wire (mean contribution, us)"}, "barmode": "stack",
                                "xaxis": {"title": {"text": "us"}}, "yaxis": {"title": {"text": "op"}}},
                         height=110 + 60 * len(ops)))
    comps = [c for c in C.COMPONENTS if any(c in b[o]["components_us"] for o in ops)]
    data = [{"type": "bar", "orientation": "h", "name": _t(c), "y": ops, "x": [b[o]["components_us"].get(c) for o in ops],
             "marker": {"color": COMPONENT_COLORS.get(c, "#999")}} for c in comps]
    figs.append(p.figure(data, {"title": {"text": "components in chain order (mean contribution, us)"},
                                "barmode": "stack", "xaxis": {"title": {"text": "us"}}, "yaxis": {"title": {"text": "op"}}},
                         height=140 + 60 * len(ops)))
    p.add(f'<div class="grid">{"".join(figs)}</div>')
    s = m["summary"]["by_op"]
    for op in ops:
        o, bo = s.get(op, {}), b[op]
        mean = bo["e2e_mean_us"]
        rows, cls = [], []
        rows.append(["end-to-end", us(mean), us(bo["e2e_p50_us"]), us(bo["e2e_p99_us"]), us(mean), ""])
        cls.append("")
        for c in C.COMPONENTS:
            if c not in o.get("components_us", {}):
                continue
            rows.append(_stat_row(c, o["components_us"][c], bo["components_us"].get(c), mean))
            cls.append("")
            for sub in C.SUBCOMPONENTS.get(c, []):
                if sub in o.get("subcomponents_us", {}):
                    rows.append(_stat_row("  " + sub, o["subcomponents_us"][sub], bo["subcomponents_us"].get(sub), mean))
                    cls.append("sub")
        p.add(f"<h3>{esc(op)}: {bo['count']:,} requests</h3>")
        p.add(_table(["", "contribution", "p50", "p99", "mean", "of e2e"], rows, classes=cls))
        grid = []
        for side, key in (("server", "by_server"), ("worker", "by_worker")):
            part = bo[key]
            hosts = list(part["hosts"])
            if not hosts:
                continue
            # by component, in their group's shades: what is slow on that host, not only on which side
            comps = [c for c in C.COMPONENTS if any(part["hosts"][h]["components_us"].get(c) for h in hosts)]
            data = [{"type": "bar", "name": _t(c), "x": [_t(h) for h in hosts],
                     "y": [part["hosts"][h]["components_us"].get(c) for h in hosts],
                     "marker": {"color": COMPONENT_COLORS.get(c, "#999")}} for c in comps]
            # p50/p99 as labels over the bars, not as points on their axis: a p99 tens of times the
            # mean (a run's start-up) squashed the bars to a few pixels
            tops = [sum(part["hosts"][h]["components_us"].get(c) or 0 for c in comps) for h in hosts]
            notes = [{"x": _t(h), "y": top, "yanchor": "bottom", "showarrow": False, "font": {"size": 10},
                      "text": _t(f"p50 {us(part['hosts'][h]['e2e_p50_us'])}") + "<br>"
                      + _t(f"p99 {us(part['hosts'][h]['e2e_p99_us'])}")} for h, top in zip(hosts, tops)]
            extra = f" ({part['left_out']} more hosts not shown)" if part["left_out"] else ""
            grid.append(p.figure(data, {"title": {"text": _t(f"{op} per {side}: mean contribution, us{extra}")},
                                        "barmode": "stack", "annotations": notes,
                                        "xaxis": {"type": "category", "title": {"text": side}},
                                        "yaxis": {"title": {"text": "us"}, "range": [0, 1.3 * max(tops + [1])]}}))
        p.add(f'<div class="grid">{"".join(grid)}</div>')
    p.add("</section>")


# a CDF plot per part of the chain, so no plot has more than 9 lines
_CDF_PLOTS = (("end-to-end and host components", ["e2e"] + C.GROUPS["host"]),
              ("end-to-end, NIC and wire", ["e2e"] + C.GROUPS["nic"] + C.GROUPS["wire"]
               + [C.NETWORK_AND_REMOTE, C.UNSPLIT]),
              ("client sub-components", [x for x in C.SUBS if x.startswith("client_")]),
              ("server sub-components", [x for x in C.SUBS if x.startswith("server_")]))
_UNITS = ((1e6, "s"), (1e3, "ms"), (1, "us"), (1e-3, "ns"))


def _finite(x) -> float:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else 0.0


def _decade_ticks(xs_us: list) -> dict:
    """A tick at every decade the data spans, labelled in its unit (1 us, 10 us, ..., 1 ms, ...)."""
    if not xs_us:
        return {}
    lo, hi = math.floor(math.log10(min(xs_us))), math.ceil(math.log10(max(xs_us)))
    vals = [10.0 ** k for k in range(lo, hi + 1)]
    text = []
    for v in vals:
        scale, unit = next(((f, u) for f, u in _UNITS if v >= f * 0.999), _UNITS[-1])
        text.append(f"{v / scale:g} {unit}")
    return {"tickvals": vals, "ticktext": text}


def sec_distributions(p: Page, m: dict) -> None:
    p.add('<section id="distributions"><h2>2 Distributions per component, and over time</h2>')
    p.add(_help("Cumulative distributions from quantile sketches (every percent, then the tail to p99.99). "
                "Log axis: non-positive values (a negative component is a clock error, kept and counted) are "
                "not drawn; their number is in the legend. Over time: the mean contribution of host/NIC/wire per "
                "time bin on the reference host's clock, with the e2e p50 and p99; where a warm-up was detected it "
                "is shaded and the axis is scaled to the steady state (the warm-up's values run off it)."))
    grid = []
    for op, c in m["cdf"].items():
        for title, names in _CDF_PLOTS:
            data = []
            for name in names:
                sr = c["series"].get(name)
                if not sr:
                    continue
                label = name + (f" ({sr['negative']} < 0)" if sr["negative"] else "")
                data.append({"type": "scatter", "mode": "lines", "name": _t(label), "x": sr["us"], "y": c["q"],
                             "line": {"color": "#000" if name == "e2e" else COMPONENT_COLORS.get(name),
                                      "width": 3 if name == "e2e" else 1.5}})
            if len(data) > (1 if names[0] == "e2e" else 0):
                xs = [x for d in data for x in d["x"] if x and x > 0]
                grid.append(p.figure(data, {"title": {"text": _t(f"{op}: CDF of {title}")},
                                            "xaxis": {"type": "log", "title": {"text": "time"}, **_decade_ticks(xs)},
                                            "yaxis": {"title": {"text": "fraction of requests"}, "range": [0, 1]}}))
    ot = m["over_time"]
    warm_end_s = ((m.get("window") or {}).get("warmup") or {}).get("end_s")
    for op, rec in (ot.get("ops") or {}).items():
        data = [{"type": "scatter", "mode": "lines", "stackgroup": "one", "name": _t(g), "x": ot["t_s"], "y": v,
                 "line": {"color": GROUP_COLORS.get(g)}} for g, v in rec["groups_us"].items()]
        data += [{"type": "scatter", "mode": "lines", "name": f"e2e {q}", "x": ot["t_s"], "y": rec[f"e2e_{q}_us"],
                  "line": {"color": "#000", "dash": "dot" if q == "p99" else "solid", "width": 1}} for q in ("p50", "p99")]
        layout = {"title": {"text": _t(f"{op} over time (mean contribution, us)")},
                  "xaxis": {"title": {"text": "s since the first request"}}, "yaxis": {"title": {"text": "us"}}}
        if warm_end_s:
            # the steady state's scale: the warm-up's burst would flatten it to a line at zero
            steady = [i for i, t in enumerate(ot["t_s"]) if t >= warm_end_s]
            top = max([sum(_finite(v[i]) for v in rec["groups_us"].values()) for i in steady]
                      + [_finite(rec["e2e_p99_us"][i]) for i in steady] + [1])
            layout["yaxis"]["range"] = [0, 1.15 * top]
            layout["shapes"] = [{"type": "rect", "xref": "x", "yref": "paper", "x0": 0, "x1": warm_end_s,
                                 "y0": 0, "y1": 1, "fillcolor": "#999", "opacity": 0.15, "line": {"width": 0}}]
            layout["annotations"] = [{"xref": "x", "yref": "paper", "x": warm_end_s / 2, "y": 1, "yanchor": "bottom",
                                      "text": "warm-up (off scale)", "showarrow": False, "font": {"size": 10}}]
        grid.append(p.figure(data, layout))
    p.add(f'<div class="grid">{"".join(grid)}</div></section>')


def sec_concurrency(p: Page, m: dict) -> None:
    p.add('<section id="concurrency"><h2>3 Concurrency across connections</h2>')
    p.add(_help("For each request: how many connections its server process had in flight when it arrived "
                "(requests between arrival and reply, merged per connection; its own counts, so 1 = alone), and "
                "the same for the worker process when it started. The socket wait (data ready in the socket until "
                "the application's recv took it) splits into run-queue wait (the reading thread was runnable, "
                "not running) and busy-elsewhere (it was running something else: other connections)."))
    grid = []
    for op, per in m["concurrency"].items():
        rows = per["server"]["by_conns"]
        if not rows:
            continue
        x = [f"{r['conns']}{'+' if r['pooled'] else ''}" for r in rows]
        data = [{"type": "scatter", "mode": "lines+markers", "name": f"e2e {q}", "x": x,
                 "y": [r[f"e2e_{q}_us"] for r in rows]} for q in ("p50", "p99")]
        data.append({"type": "bar", "name": "requests", "x": x, "y": [r["requests"] for r in rows], "yaxis": "y2",
                     "opacity": 0.25, "marker": {"color": "#888"}})
        grid.append(p.figure(data, {"title": {"text": _t(f"{op}: latency vs connections in flight (server process)")},
                                    "xaxis": {"type": "category", "title": {"text": "connections in flight"}},
                                    "yaxis": {"title": {"text": "us"}, "rangemode": "tozero"},
                                    "yaxis2": {"overlaying": "y", "side": "right", "showgrid": False,
                                               "rangemode": "tozero", "title": {"text": "requests"}}}))
        data = [{"type": "bar", "name": name, "x": x, "y": [r[f"{k}_us"] for r in rows], "marker": {"color": col}}
                for name, k, col in (("run-queue wait", "runq_wait", "#e45756"), ("busy elsewhere", "busy_wait", "#72b7b2"))]
        grid.append(p.figure(data, {"title": {"text": _t(f"{op}: server socket wait split (mean, us)")},
                                    "barmode": "stack", "xaxis": {"type": "category",
                                                                   "title": {"text": "connections in flight"}},
                                    "yaxis": {"title": {"text": "us"}}}))
    p.add(f'<div class="grid">{"".join(grid)}</div>')
    rows, untraced = [], set()
    for op, per in m["concurrency"].items():
        for side in ("server", "worker"):
            if not per[side]["requests_counted"]:   # that side's host was not traced
                untraced.add(side)
                continue
            sw = per[side]["sock_wait"]
            rows.append([op, side, f"{per[side]['requests_counted']:,}",
                         max((r["conns"] for r in per[side]["by_conns"]), default="-"),
                         us(sw["sock_wait_mean_us"]), pct(sw["sock_wait_share_of_e2e"]), pct(sw["runq_share"]),
                         pct(sw["busy_share"])])
    if rows:
        p.add(_table(["op", "side", "requests counted", "max in flight", "sock wait mean", "of e2e",
                      "run-queue", "busy elsewhere"], rows, left=2))
    if untraced:
        p.add(f"<p>No {' or '.join(sorted(untraced))} side counted: no request has that host's "
              "connections traced.</p>")
    procs = m.get("processes") or []
    if procs:
        p.add("<h3>Traced processes</h3>")
        p.add(_table(["host", "pid", "threads", "thread names"],
                     [[x["host"], x["pid"], x["threads"], ", ".join(x["comms"])] for x in procs], left=1))
    p.add("</section>")


def _stat_cells(st: dict | None) -> list[str]:
    return ["-"] * 3 if not st else [us(st["p50"]), us(st["p99"]), f"{st['count']:,}"]


def sec_connections(p: Page, m: dict) -> None:
    c = m["connections"]
    p.add('<section id="connections"><h2>4 Connection management</h2>')
    p.add(_help("Connects, accepts and closes of the traced processes' TCP connections (the agent's connections "
                "table), handshake latency (connect() to ESTABLISHED), accept wait (ESTABLISHED to accept() "
                "returning it), and the time requests waited for their connection (client_connect_wait)."))
    cw = c["connect_wait"]
    p.add(f"<p>Requests that waited for their connection: {cw['waited']:,} of {cw['requests']:,} "
          f"({cw['measured']:,} measured); share of all request time: {esc(pct(cw['share_of_request_time']))}"
          + (f"; p50 {esc(us(cw['stat_us']['p50']))}, p99 {esc(us(cw['stat_us']['p99']))}" if cw["stat_us"] else "")
          + "</p>")
    if not c.get("traced"):
        p.add(f'<p class="warn">{esc(c["why"])}</p></section>')
        return
    rows = [[h["host"], h["connects"], h["accepts"], h["other"], h["closes"], h["connect_failures"], h["retransmits"],
             *_stat_cells(h["handshake_us"]), *_stat_cells(h["accept_wait_us"])[:2]] for h in c["hosts"]]
    p.add(_table(["host", "connects", "accepts", "other", "closes", "failed", "retrans", "handshake p50", "p99", "n",
                  "accept wait p50", "p99"], rows))
    lt = c.get("lifetime_us")
    if lt:
        p.add(f"<p>Connection lifetime: p50 {esc(us(lt['p50']))}, max {esc(us(lt['max']))} over {lt['count']:,} "
              "connections that opened and closed while traced.</p>")
    ot = c.get("over_time") or {}
    if ot:
        data = [{"type": "bar", "name": "opened", "x": ot["t_s"], "y": ot["opens"], "marker": {"color": "#54a24b"}},
                {"type": "bar", "name": "closed", "x": ot["t_s"], "y": [-x for x in ot["closes"]],
                 "marker": {"color": "#e45756"}},
                {"type": "scatter", "mode": "lines", "name": "open (since tracing began)", "x": ot["t_s"],
                 "y": ot["open"], "yaxis": "y2", "line": {"color": "#000"}}]
        p.add(p.figure(data, {"title": {"text": "connection churn over time"}, "barmode": "relative",
                              "xaxis": {"title": {"text": "s"}}, "yaxis": {"title": {"text": "per bin"}},
                              "yaxis2": {"overlaying": "y", "side": "right", "showgrid": False,
                                         "title": {"text": "open"}}}))
    p.add("</section>")


def sec_skew(p: Page, m: dict) -> None:
    k = m["skew"]
    p.add('<section id="skew"><h2>5 Key skew</h2>')
    p.add(_help("From the agents' key samples: per message, the keys with the smallest hashes (bottom-k, k = 16; "
                "all keys when a message has no more). Hashes do not depend on popularity, so the keys whose hash "
                "falls below a threshold that at least half of the messages cover are a uniform random subset of "
                "the key space with near-exact counts: the rank-frequency curve, top shares and Zipf fit come "
                "from it (rank scaled by the subset's share of the hash space). Each key's updates are estimated "
                "as seen / (share of messages whose sample could show it). In-network aggregation of a key turns "
                "the pushes of its W workers into one per round: saving (1 - 1/W) of its bytes, an upper bound "
                "reached when the pushes of a round meet at the switch."))
    ops = [o for o in ("push", "pull") if isinstance(k.get(o), dict) and k[o].get("messages_sampled")]
    if not ops:
        p.add(f'<p class="warn">{esc(k.get("why_none", "no key samples"))}</p></section>')
        return
    data = [{"type": "scatter", "mode": "lines+markers", "marker": {"size": 4}, "name": op,
             "x": k[op]["rank_freq"]["rank"], "y": k[op]["rank_freq"]["updates"]} for op in ops]
    grid = [p.figure(data, {"title": {"text": "rank-frequency of keys (estimated updates per key)"},
                            "xaxis": {"type": "log", "title": {"text": "rank"}},
                            "yaxis": {"type": "log", "title": {"text": "updates"}}})]
    agg = k.get("push", {}).get("aggregation") if "push" in ops else None
    single = agg and aggregation_removes_nothing(agg)
    if agg and not single:
        grid.append(p.figure([{"type": "bar", "x": [f"top {a['k']:,}" for a in agg],
                               "y": [100 * a["share_removed"] for a in agg], "marker": {"color": "#54a24b"}}],
                             {"title": {"text": "push bytes removed by aggregating the top-k keys (%)"},
                              "xaxis": {"type": "category", "title": {"text": "keys aggregated"}},
                              "yaxis": {"title": {"text": "% of push bytes"}}}))
    p.add(f'<div class="grid">{"".join(grid)}</div>')
    if single:
        p.add(f"<p>{esc(NO_AGGREGATION)}</p>")
    rows = []
    for op in ops:
        o = k[op]
        rows.append([op, f"{o['messages']:,}", f"{o['messages_sampled']:,}", f"{o['keys_per_message']:.1f}",
                     "exact" if o.get("exact") else pct(o.get("subset_fraction")),
                     f"{o['distinct_keys_est']:,.0f}" if o.get("distinct_keys_est") else "-",
                     pct(o.get("top1_share")), pct(o.get("top10_share")),
                     f"{o['zipf_s']:.2f}" if o.get("zipf_s") is not None else "-"])
    p.add(_table(["op", "messages", "with samples", "keys/msg", "hash subset", "distinct keys", "top 1%",
                  "top 10%", "Zipf s"], rows))
    for op in ops:
        hot = k[op].get("hot_keys") or []
        if hot:
            p.add(f"<h3>hottest {esc(op)} keys (of {k[op].get('hot_keys_reliable', 0):,} estimable)</h3>")
            p.add(_table(["key", "updates (est.)", "workers"],
                         [[h["key"], f"{h['updates']:,.0f}", h["workers"]] for h in hot]))
    p.add("</section>")


def sec_clocks(p: Page, m: dict) -> None:
    p.add('<section id="clocks"><h2>6 Clocks per host pair</h2>')
    p.add(_help("offset: add to B's times to get A's. shared: one kernel's clock (exact); disciplined: both hosts' "
                "realtime clocks synced (PTP/chrony); estimated: from messages seen at both ends. No method tells "
                "an asymmetric path from an offset: the round trip on the wire is exact, its split between the "
                "two directions is known within the uncertainty."))
    rows = [[r["pair"], r["source"], us(r["offset_us"]), "-" if r["drift_ppm"] is None else f"{r['drift_ppm']:.2f}",
             us(r["uncertainty_us"]), f"{r.get('samples', 0):,}", r["meaning"]] for r in m["clocks"]]
    if rows:
        p.add(_table(["A~B", "source", "offset", "drift ppm", "+-", "samples", "what it means"], rows, left=2))
        notes = [r["note"] for r in m["clocks"] if r.get("note")]
        for n in notes:
            p.add(f'<p class="muted">{esc(n)}</p>')
    else:
        p.add("<p>One host only: no clock to relate.</p>")
    t = m["timeline"]
    if t.get("ref"):
        p.add(f'<p class="muted">Times over the run are on {esc(t["ref"])}\'s clock'
              + (f"; not aligned: {esc(', '.join(t['unaligned']))}" if t["unaligned"] else "") + ".</p>")
    p.add("</section>")


def sec_health(p: Page, m: dict) -> None:
    p.add('<section id="health"><h2>7 Agent health, notes and problems</h2>')
    probes = sorted({pr for h in m["health"] for pr in h["probes"]})
    rows = []
    for a in agents(m["health"]):   # probe counters and CPU are agent-wide: a row per agent
        hr = a["rows"]
        cells = [", ".join(a["hosts"])]
        for pr in probes:
            c = a["probes"].get(pr)
            cells.append("-" if c is None else f"{c['seen']:,} / {c['lost']:,}")
        msgs = [h["messages"] for h in hr if isinstance(h["messages"], int)]
        cpu = [h["consumer_cpu_s"] for h in hr if h["consumer_cpu_s"] is not None]
        dropped, sampling = agent_writers(a)
        cells += [f"{sum(msgs):,}" if msgs else "-", f"{dropped:,}",
                  f"{max(cpu):.1f}" if cpu else "-", sampling, "yes" if all(h["closed"] for h in hr) else "no"]
        rows.append(cells)
    p.add(_table(["agent's hosts"] + [f"{pr} seen / lost" for pr in probes]
                 + ["messages", "rows dropped", "agent CPU s", "sampling", "closed"], rows))
    s = m["summary"]
    u = s["unmatched"]
    p.add(f"<p>{s['requests']:,} requests paired; requests without response {u['requests_without_response']:,}, "
          f"responses without request {u['messages_without_request']:,}, messages without ids "
          f"{u['messages_unparsed']:,}.</p>")
    neg = s.get("negative_components") or {}
    if neg:
        p.add("<p>Negative components (kept, not clamped): " + esc(", ".join(f"{k} {v:,}" for k, v in neg.items()))
              + "</p>")
    for title, lines in (("Notes", s.get("notes") or []), ("Problems with the input", s.get("problems") or [])):
        if lines:
            p.add(f"<h3>{esc(title)}</h3><ul>" + "".join(f"<li>{esc(x)}</li>" for x in lines) + "</ul>")
    p.add("</section>")


def render(m: dict) -> str:
    from plotly.offline import get_plotlyjs

    m = _clean(m)
    p = Page()
    for fn in (sec_findings, sec_breakdown, sec_distributions, sec_concurrency, sec_connections, sec_skew,
               sec_clocks, sec_health):
        fn(p, m)
    s = m["summary"]
    subtitle = (f"{len(s['hosts'])} hosts ({', '.join(s['hosts'])}); {s['requests']:,} requests paired; ops: "
                f"{', '.join(s['by_op']) or 'none'}")
    nav = "".join(f'<a href="#{a}">{esc(t)}</a>' for a, t in SECTIONS)
    run = m.get("run") or {}
    when = f", {run['start_utc'].replace('T', ' ')[:19]} UTC" if run.get("start_utc") else ""
    dur = f", {run['duration_s']:,.1f} s" if run.get("duration_s") else ""
    n = len(s["hosts"])
    # a browser tab tells apart runs of a few named hosts by their names
    names = f" ({', '.join(s['hosts'])})" if 0 < n <= TITLE_HOSTS_MAX else ""
    title = (f"pslat report: {'/'.join(s['by_op']) or 'no requests'} on {n} host{'s' if n != 1 else ''}{names}"
             f"{when}{dur}")
    if m.get("window"):
        subtitle = f"{subtitle}; {m['window']['text']}"
    values = {"TITLE": esc(title), "SUBTITLE": esc(subtitle), "NAV": nav,
              "BODY": "\n".join(p.parts), "DATA": script_json({"figures": p.figures}),
              "PLOTLYJS": get_plotlyjs().replace("</script", "<\\/script")}
    # one pass: text put in is never scanned again (a host may be named "@@DATA@@")
    return _PLACEHOLDER.sub(lambda mo: values[mo.group(1)], PAGE)


def write_html(d, path: Path, run_dirs: list[Path] | None = None, sel=None, comparison=None) -> dict:
    """Write the HTML report of dissection `d` (run_dirs: the ones it came from, for key
    samples, connections and agent counters; sel: its reports.window.Selection, default its
    steady state; comparison: reports.compare's, for --baseline) to `path`; returns the view model."""
    m = build_model(d, run_dirs, sel)
    if comparison is not None:
        m["comparison"] = comparison
    text = render(m)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}; check the directory exists and is writable") \
            from None
    return m
