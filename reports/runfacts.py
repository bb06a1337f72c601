"""The run's facts, said by every report: when, how long, at what rate, traced by what.

    facts = run_facts(sel)          # sel: reports.window.Selection
    facts["start_utc"], facts["rate_per_s"]["pull"], lines(facts)

From the requests (their span on the reference host's clock, put on realtime
through its meta.json mapping) and the run dirs' meta.json as reports.load
checked it; a value no run dir gives is None ("-" on screen). The summary's
"run" object is the contract's part of it (RUN_KEYS); the rest is shown beside.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import numpy as np

RUN_KEYS = ("start_utc", "end_utc", "duration_s", "rate_per_s", "agent_version", "kernel")


def _utc(ns: float | None) -> str | None:
    if ns is None:
        return None
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _distinct(values) -> str | None:
    vals = sorted({str(v) for v in values if isinstance(v, str) and v})
    return ", ".join(vals) if vals else None


def _options(metas: dict[str, dict]) -> str | None:
    """The agents' options that change what a report holds: probes, selection, sampling."""
    parts = set()
    for m in metas.values():
        cfg = m.get("config") if isinstance(m.get("config"), dict) else {}
        probes = cfg.get("probes")
        bits = []
        if isinstance(probes, list) and all(isinstance(p, str) for p in probes):
            bits.append("probes " + "+".join(probes))
        sel = m.get("selection") if isinstance(m.get("selection"), dict) else {}
        for k, word in (("pids", "--pid"), ("comms", "--comm"), ("netns_inos", "--netns"), ("ports", "--port"),
                        ("libs", "--lib")):
            v = sel.get(k)
            if isinstance(v, list) and v:
                bits.append(f"{word} x{len(v)}")
        smp = m.get("sampling") if isinstance(m.get("sampling"), dict) else {}
        if isinstance(smp.get("mode"), str):
            bits.append(f"sampling {smp['mode']}" + (f" (cpu budget {smp['cpu_budget']:g})"
                                                     if isinstance(smp.get("cpu_budget"), (int, float)) else ""))
        if m.get("replayed_from"):
            bits.append("replayed")
        if bits:
            parts.add(", ".join(bits))
    return "; ".join(sorted(parts)) if parts else None


def run_facts(sel) -> dict[str, Any]:
    d, tl = sel.whole, sel.timeline
    done = d.complete
    metas = d.metas
    start = end = None
    if sel.t0_ref_ns is not None and tl.realtime_offset_ns is not None:
        from reports.window import start_ref_ns
        s = start_ref_ns(done, tl)
        e = s + done["e2e"].to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isfinite(s).any():
            start = float(np.nanmin(s)) + tl.realtime_offset_ns
            end = float(np.nanmax(e)) + tl.realtime_offset_ns
    if start is None:   # no request on realtime: the agents' own start and last write
        st = [m["started_realtime_ns"] for m in metas.values() if isinstance(m.get("started_realtime_ns"), int)]
        up = [m["updated_realtime_ns"] for m in metas.values() if isinstance(m.get("updated_realtime_ns"), int)]
        start, end = (min(st) if st else None), (max(up) if up else None)
    duration = (end - start) / 1e9 if start is not None and end is not None and end > start else None
    scale = 1.0 / d.sampling_rate if d.sampling_rate else 1.0
    rate = {}
    if duration:
        for op, n in done["op"].astype(object).astype(str).value_counts().sort_index().items():
            rate[op] = round(n * scale / duration, 3)
    kernels = [(m.get("kernel") or {}).get("release") for m in metas.values() if isinstance(m.get("kernel"), dict)]
    sources = sorted({m.source for m in d.clocks.values()})
    return {
        "start_utc": _utc(start), "end_utc": _utc(end),
        "duration_s": round(duration, 3) if duration else None,
        "rate_per_s": rate,
        "agent_version": _distinct(m.get("agent_version") for m in metas.values()),
        "kernel": _distinct(kernels),
        # beyond the contract
        "hosts": list(d.hosts),
        "options": _options(metas),
        "sampling_rate": d.sampling_rate or 1.0,
        "clock_sources": sources,
    }


def lines(f: dict[str, Any]) -> list[str]:
    """The facts as a report's opening lines."""
    when = "-" if f["start_utc"] is None else \
        f"{f['start_utc'].replace('T', ' ')} to {(f['end_utc'] or '-').split('T')[-1]}"
    rate = ", ".join(f"{op} {r:,.1f}/s" for op, r in f["rate_per_s"].items()) or "-"
    dur = "-" if f["duration_s"] is None else f"{f['duration_s']:,.1f} s"
    n = len(f["hosts"])
    return [
        f"run: {when} ({dur}); {rate}; {n} host{'s' if n != 1 else ''} ({', '.join(f['hosts'])})",
        f"traced by: agent {f['agent_version'] or '-'}, kernel {f['kernel'] or '-'}; {f['options'] or 'options -'}; "
        f"sampling {100 * f['sampling_rate']:.3g}% of host pairs; clocks "
        f"{'/'.join(f['clock_sources']) or 'one host'}",
    ]
