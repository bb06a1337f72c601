"""`pslat report RUN --baseline OTHER_RUN`: what changed, component by component.

    cmp = comparison(base_sel, sel)      # two reports.window.Selection, chosen alike
    console.print(CompareView(cmp))      # the terminal table; reports.html plots the same dict

Both runs are windowed and filtered the same way (each finds its own warm-up),
then each op's end-to-end, groups and components are set side by side: p50 and
p99 of the component alone, and its share (mean contribution over mean
end-to-end; the shares of a run add up to 100%), with the change (ratio for
p50/p99, percentage points for the share). A component one run lacks is shown
with "-" on that side.
"""
from __future__ import annotations

from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from reports import components as C
from reports.render_term import column_unit, in_unit, row, shown
from reports.summary import windowed


def _share(o: dict, name: str, part: str) -> float | None:
    e2e = o.get("e2e_us")
    st = o.get(part, {}).get(name)
    if not e2e or not e2e["mean"] or st is None:
        return None
    n = o["counts"].get(name if part != "groups_us" else f"group_{name}", o["count"])
    return st["mean"] * n / o["count"] / e2e["mean"]


def _rows(o: dict | None) -> dict[str, dict[str, float | None]]:
    """name -> {p50, p99, share} of one op of one run."""
    if not o:
        return {}
    out = {"end-to-end": {"p50": o["e2e_us"]["p50"] if o["e2e_us"] else None,
                          "p99": o["e2e_us"]["p99"] if o["e2e_us"] else None, "share": 1.0}}
    for part, names in (("groups_us", list(C.GROUPS)), ("components_us", C.COMPONENTS)):
        for name in names:
            st = o[part].get(name)
            if st is not None:
                out[name] = {"p50": st["p50"], "p99": st["p99"], "share": _share(o, name, part)}
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or a == 0 else round(b / a, 4)


def comparison(base, sel) -> dict[str, Any]:
    """{"baseline": {window...}, "this": {...}, "by_op": {op: {name: {...}}}}: JSON-able."""
    a = windowed(base.window, None)["by_op"]
    b = windowed(sel.window, None)["by_op"]
    by_op: dict[str, Any] = {}
    for op in [o for o in b if o in a] + [o for o in b if o not in a] + [o for o in a if o not in b]:
        ra, rb = _rows(a.get(op)), _rows(b.get(op))
        names = [n for n in ["end-to-end", *C.GROUPS, *C.COMPONENTS] if n in ra or n in rb]
        by_op[op] = {"count": {"baseline": (a.get(op) or {}).get("count", 0), "this": (b.get(op) or {}).get("count", 0)},
                     "rows": {}}
        for n in names:
            x, y = ra.get(n, {}), rb.get(n, {})
            sa, sb = x.get("share"), y.get("share")
            by_op[op]["rows"][n] = {
                "group": n in C.GROUPS or n == "end-to-end",
                "baseline": x or None, "this": y or None,
                "p50_ratio": _ratio(x.get("p50"), y.get("p50")), "p99_ratio": _ratio(x.get("p99"), y.get("p99")),
                "share_change_pp": None if sa is None or sb is None else round(100 * (sb - sa), 2)}
    return {"baseline": {"hosts": list(base.whole.hosts), "window": base.info.to_json(),
                         "window_text": base.info.describe()},
            "this": {"hosts": list(sel.whole.hosts), "window": sel.info.to_json(), "window_text": sel.info.describe()},
            "by_op": by_op}


def _x(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def _pp(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.0f}%"


class CompareView:
    """The comparison on a terminal: a table per op, one unit per column."""

    def __init__(self, cmp: dict[str, Any]):
        self.c = shown(cmp)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        c = self.c
        yield Text("")
        yield Text("compared with the baseline", style="bold")
        yield Text(f"baseline: {', '.join(c['baseline']['hosts'])}; {c['baseline']['window_text']}")
        yield Text(f"this run: {', '.join(c['this']['hosts'])}; {c['this']['window_text']}")
        for op, o in c["by_op"].items():
            rows = o["rows"]
            get = lambda side, k: [(r[side] or {}).get(k) for r in rows.values()]  # noqa: E731
            u50 = column_unit(get("baseline", "p50") + get("this", "p50"))
            u99 = column_unit(get("baseline", "p99") + get("this", "p99"))
            # the units in the title, so the headers are short and 100 columns hold every cell whole
            t = Table(title=Text(f"{op}: {o['count']['baseline']:,} requests before, {o['count']['this']:,} now "
                                 f"(p50 in {u50}, p99 in {u99})", style="bold"), title_justify="left",
                      box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, padding=(0, 1))
            t.add_column("", no_wrap=True, min_width=18)   # component names are the point: never cut
            for h in ("p50 was", "now", "x", "p99 was", "now", "x", "share was", "now", "pp"):
                t.add_column(h, justify="right", no_wrap=True, min_width=5 if h == "pp" else None)
            for name, r in rows.items():
                x, y = r["baseline"] or {}, r["this"] or {}
                row(t, Text(name, style="bold" if r["group"] else ""),
                    in_unit(x.get("p50"), u50), in_unit(y.get("p50"), u50), _x(r["p50_ratio"]),
                    in_unit(x.get("p99"), u99), in_unit(y.get("p99"), u99), _x(r["p99_ratio"]),
                    _pct(x.get("share")), _pct(y.get("share")), _pp(r["share_change_pp"]))
            yield t
