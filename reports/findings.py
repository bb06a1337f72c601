"""Findings in plain words, computed from the view model (reports.viewmodel).

Each finding answers one of PAPER.md's questions for this run, or says why it
cannot: where each op's latency goes and the cause below the largest part (1),
what concurrency across connections adds (2), what connection management costs
(3), how skewed the keys are and what in-network aggregation would save (4),
how far the clocks let the wire split be trusted, and whether the agents saw
everything (health). Sentences carry their numbers; nothing is hard-coded.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from agent.units import fmt_bytes
from reports import components as C

MIN_BUCKET = 30          # requests an in-flight bucket needs before it is compared

WHY = {  # what a sub-component means for the user (DESIGN.md)
    "server_busy_wait": "the reading thread was running but busy elsewhere (other connections)",
    "client_busy_wait": "the reading thread was running but busy elsewhere (other connections)",
    "server_runq_wait": "the reading thread was runnable but waiting for a CPU",
    "client_runq_wait": "the reading thread was runnable but waiting for a CPU",
    "server_stack_rx": "the kernel's receive path",
    "client_stack_rx": "the kernel's receive path",
    "server_app": "the server application's own work",
    "server_framework_rx": "the framework handing the request to the application (I/O thread to app thread)",
    "server_framework_tx": "the framework handing the response to the socket",
    "server_cwnd_wait": "held by the congestion window (the network)",
    "client_cwnd_wait": "held by the congestion window (the network)",
    "server_rwnd_wait": "held by the peer's receive window (a slow reader on the other host)",
    "client_rwnd_wait": "held by the peer's receive window (a slow reader on the other host)",
    "server_qdisc_wait": "queued by this host's qdisc",
    "client_qdisc_wait": "queued by this host's qdisc",
    "server_stack_tx": "the kernel's send path",
    "client_stack_tx": "the kernel's send path",
    "client_connect_wait": "waiting for its connection to be set up",
}
GROUP_WORDS = {"host": "host-side (user + kernel)", "nic": "in the NICs", "wire": "on the wire",
               C.NETWORK_AND_REMOTE: "network and remote (server not split)", C.UNSPLIT: "unsplit"}


def us(x: float | None) -> str:
    if x is None:
        return "-"
    if abs(x) >= 10_000:
        return f"{x / 1e3:,.1f} ms"
    if abs(x) >= 100:
        return f"{x:,.0f} us"
    return f"{x:,.1f} us"


NO_AGGREGATION = ("In-network aggregation would remove no push bytes here: each key's pushes come from "
                  "one worker, and aggregation merges the pushes of several.")


def aggregation_removes_nothing(aggregation: list[dict]) -> bool:
    """Every top-k share is 0: one worker per key (a chart or list of zeros says less than a line)."""
    return not any(a["share_removed"] for a in aggregation)


def pct(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.1f}%" if abs(x) < 0.095 and x != 0 else f"{100 * x:.0f}%"


def _side_host(comp: str, b: dict) -> tuple[str, str] | None:
    """The host where a component is largest (server components by server, client by worker)."""
    part = b["by_server"] if comp.startswith("server_") else b["by_worker"] if comp.startswith("client_") else None
    if part is None or len(part["hosts"]) < 2:
        return None
    per = {h: v["components_us"].get(comp, 0.0) * v["count"] for h, v in part["hosts"].items()}
    tot = sum(per.values())
    h = max(per, key=per.get)
    # worth naming only when one host holds clearly more than its even share
    if tot <= 0 or per[h] / tot < 1 / len(per) + 0.1:
        return None
    return h, f"{pct(per[h] / tot)} of it on {h}"


def _below(comp: str, b: dict) -> str:
    """The largest sub-component of a component and, for socket waits, their split."""
    subs = [s for s in C.SUBCOMPONENTS.get(comp, []) if s in b["subcomponents_us"]]
    if comp.endswith("kernel_rx"):   # runq/busy split sock_wait, not kernel_rx
        subs = [s for s in subs if not s.endswith(("runq_wait", "busy_wait"))]
    total = b["components_us"].get(comp, 0.0)
    if not subs or total <= 0:
        return ""
    top = max(subs, key=lambda s: b["subcomponents_us"][s])
    share = b["subcomponents_us"][top] / total
    text = f"; mostly {top} ({pct(share)}): {WHY.get(top, top)}" if share >= 0.5 else \
        f"; its largest part is {top} ({pct(share)}): {WHY.get(top, top)}"
    if top.endswith("sock_wait"):
        side = top.split("_")[0]
        rq, bz = (b["subcomponents_us"].get(f"{side}_{k}") for k in ("runq_wait", "busy_wait"))
        if rq is not None and bz is not None and rq + bz > 0:
            main = "busy_wait" if bz >= rq else "runq_wait"
            text += (f"; of the socket wait {pct(max(rq, bz) / (rq + bz))} is {main}: "
                     f"{WHY[f'{side}_{main}']}")
    return text


def breakdown_findings(m: dict) -> list[str]:
    out = []
    for op, b in m["breakdown"].items():
        mean = b["e2e_mean_us"]
        if not mean:
            continue
        groups = [(g.removeprefix("group_"), v / mean) for g, v in b["groups_us"].items() if v]
        groups.sort(key=lambda x: -x[1])
        parts = ", ".join(f"{pct(s)} {GROUP_WORDS.get(g, g)}" for g, s in groups)
        s = f"{op}: {parts} (mean end-to-end {us(mean)}, p99 {us(b['e2e_p99_us'])}, {b['count']:,} requests)."
        comps = {c: v for c, v in b["components_us"].items() if c not in (C.UNSPLIT, C.NETWORK_AND_REMOTE)}
        if comps:
            top = max(comps, key=comps.get)
            where = _side_host(top, b)
            # when an unsplit group holds more than any split component, the latter is not "the largest part"
            opaque = max(((g, v) for g, v in b["groups_us"].items()
                          if g.removeprefix("group_") in (C.UNSPLIT, C.NETWORK_AND_REMOTE)),
                         key=lambda x: x[1], default=(None, 0.0))
            lead = (" Of the time that is split, the largest part is" if opaque[1] > comps[top] else
                    " The largest part is")
            s += (f"{lead} {top} ({pct(comps[top] / mean)} of the latency"
                  f"{', ' + where[1] if where else ''}){_below(top, b)}.")
        out.append(s)
    return out


def concurrency_findings(m: dict) -> list[str]:
    out = []
    for op, per in m["concurrency"].items():
        rows = [r for r in per["server"]["by_conns"] if r["requests"] >= MIN_BUCKET and r["e2e_p50_us"]]
        if len(rows) >= 2:
            lo, hi = rows[0], rows[-1]
            ratio = hi["e2e_p50_us"] / lo["e2e_p50_us"]
            more = f"{hi['conns']}{'+' if hi['pooled'] else ''}"
            out.append(f"{op}: requests that reached their server process while it had {more} connections "
                       f"in flight took {ratio:.2f}x the p50 latency of those with {lo['conns']} "
                       f"({us(hi['e2e_p50_us'])} vs {us(lo['e2e_p50_us'])}; {hi['requests']:,} and "
                       f"{lo['requests']:,} requests).")
        sw = per["server"]["sock_wait"]
        if sw["sock_wait_share_of_e2e"] is not None and sw["busy_share"] is not None:
            out.append(f"{op}: waiting in the server's socket took {pct(sw['sock_wait_share_of_e2e'])} of the "
                       f"request time; {pct(sw['busy_share'])} of that wait the reading thread was busy "
                       f"elsewhere, {pct(sw['runq_share'])} it waited for a CPU.")
    return out


def connection_findings(m: dict) -> list[str]:
    c = m["connections"]
    cw = c["connect_wait"]
    wait = ""
    if cw["share_of_request_time"] is not None:
        wait = (f" {cw['waited']:,} of {cw['requests']:,} requests waited for their connection to be set up: "
                f"{pct(cw['share_of_request_time'])} of all request time.")
    if not c.get("traced"):
        return [f"Connection set-up and teardown: {c['why']}.{wait}"]
    t = c["total"]
    hs = c.get("handshake_us")
    s = (f"Connections: {t['connects']:,} connects, {t['accepts']:,} accepts and {t['closes']:,} closes traced"
         + (f"; handshake p50 {us(hs['p50'])}, p99 {us(hs['p99'])}" if hs else "")
         + (f"; {t['connect_failures']:,} connects failed" if t["connect_failures"] else "") + ".")
    return [s + wait]


def skew_findings(m: dict) -> list[str]:
    k = m["skew"]
    if "push" not in k and "pull" not in k:
        return [f"Key skew: {k.get('why_none', 'no key samples')}."]
    out = []
    for op in ("push", "pull"):
        o = k.get(op)
        if not o or not o.get("messages_sampled"):
            continue
        how = "exact (every message's keys were sampled)" if o.get("exact") else \
            f"estimated from the keys whose hash falls in {pct(o['subset_fraction'])} of the hash space"
        s = f"{op} keys: "
        acts = "updates" if op == "push" else "reads"   # a pull reads a key; only a push updates it
        if o.get("top1_share") is not None:
            s += f"the top 1% of keys take {pct(o['top1_share'])} of {acts}"
            if o.get("top10_share") is not None:
                s += f" (top 10%: {pct(o['top10_share'])})"
        elif o.get("top10_share") is not None:
            s += f"the top 10% of keys take {pct(o['top10_share'])} of {acts}"
        else:
            s += "too few distinct keys sampled for top-share estimates"
        if o.get("zipf_s") is not None:
            s += f"; Zipf exponent ~{o['zipf_s']:.2f}"
        s += f"; {how}."
        if op == "push" and o.get("aggregation"):
            agg = {a["k"]: a["share_removed"] for a in o["aggregation"]}
            pick = [k_ for k_ in (10, 100, 1000) if k_ in agg] or list(agg)[:1]
            s += (" " + NO_AGGREGATION if aggregation_removes_nothing(o["aggregation"]) else
                  " Aggregating the hottest " + ", ".join(f"{k_:,}" for k_ in pick) + " keys in the network "
                  "would remove up to " + ", ".join(pct(agg[k_]) for k_ in pick) + " of push bytes "
                  "(if each round's pushes of a key meet at the switch).")
        out.append(s)
    if not out:
        why = "; ".join(f"{op}: {k[op].get('why_none')}" for op in ("push", "pull")
                        if isinstance(k.get(op), dict) and k[op].get("why_none"))
        out.append(f"Key skew: no request message carried a key sample ({why or 'none seen'}).")
    return out


def clock_findings(m: dict) -> list[str]:
    rows = m["clocks"]
    if not rows:
        return []
    est = [r for r in rows if r["source"] in ("estimated", "disciplined")]
    none = [r for r in rows if r["source"] == "none"]
    out = []
    if est:
        worst = max(est, key=lambda r: r["uncertainty_us"] or 0)
        out.append(f"Clocks: {len(est)} host pair(s) aligned by {'/'.join(sorted({r['source'] for r in est}))} "
                   f"clocks; the widest uncertainty is +-{us(worst['uncertainty_us'])} ({worst['pair']}): the "
                   "split of wire time between directions is known within that, the round trip exactly.")
    elif not none:
        out.append("Clocks: every host pair shares one clock, so the wire split is exact.")
    if none:
        out.append(f"Clocks: {len(none)} host pair(s) could not be aligned ({', '.join(r['pair'] for r in none)}): "
                   "their requests keep the server side as network_and_remote.")
    return out


def agents(health: list[dict]) -> list[dict[str, Any]]:
    """The agents behind the run dirs: one agent tracing several namespaces writes a run dir
    per host, each meta.json carrying the same agent-wide probe counters. Run dirs are one
    agent's when they share meta.json's run_id; without one (older agents), when their probe
    counters are identical and not empty. Per agent: its hosts and its probe counters, the
    largest of its run dirs' (each meta.json is rewritten at its own flush; counters only grow),
    and its hosts' health rows (what each host's run dir writer counted: rows, messages)."""
    groups: dict[Any, dict[str, Any]] = {}
    for h in health:
        if h.get("run_id"):
            key = ("run", str(h["run_id"]))
        elif h["probes"]:
            key = ("counters", tuple(sorted((p, c["seen"], c["lost"]) for p, c in h["probes"].items())))
        else:
            key = ("host", h["host"])
        a = groups.setdefault(key, {"hosts": [], "probes": {}, "rows": []})
        a["hosts"].append(h["host"])
        a["rows"].append(h)
        for p, c in h["probes"].items():
            have = a["probes"].setdefault(p, {"seen": 0, "lost": 0})
            have["seen"], have["lost"] = max(have["seen"], c["seen"]), max(have["lost"], c["lost"])
    return list(groups.values())


def agent_writers(a: dict[str, Any]) -> tuple[int, str]:
    """What an agent's hosts' run dir writers counted, for its row in a health table: rows
    dropped (summed) and the sampling rates (the distinct ones, "/"-joined)."""
    return (sum(h["rows_dropped"] for h in a["rows"]),
            "/".join(sorted({f"{h['sampling_rate']:g}" for h in a["rows"]})))


def _agent_name(hosts: list[str]) -> str:
    return hosts[0] if len(hosts) == 1 else f"the agent of {', '.join(hosts)}"


def agent_hosts(hosts: list[str], width: int = 24) -> str:
    """An agent's hosts for a table cell: all of them when they fit."""
    text = ", ".join(hosts)
    return text if len(text) <= width else f"{hosts[0]} .. {hosts[-1]} ({len(hosts)} hosts)"


def health_findings(m: dict) -> list[str]:
    out = []
    lost_parts = []
    seen_total = 0
    found = agents(m["health"])
    for a in found:   # probe counters are the agent's: once per agent, not per host it wrote
        for p, c in a["probes"].items():
            seen_total += c["seen"]
            if c["lost"]:
                lost_parts.append(f"{_agent_name(a['hosts'])} {p} lost {c['lost']:,} of "
                                  f"{c['seen'] + c['lost']:,} events")
        unsettled = max(h.get("unsettled_at_stop", 0) for h in a["rows"])
        if unsettled:
            lost_parts.append(f"{_agent_name(a['hosts'])} left {unsettled:,} decoded messages unmatched "
                              "when its stop's time ran out (SIGTERM)")
    for h in m["health"]:   # rows are dropped by each host's run dir writer
        if h["rows_dropped"]:
            lost_parts.append(f"{h['host']} dropped {h['rows_dropped']:,} rows")
    if lost_parts:
        out.append("Agent health: " + "; ".join(lost_parts) + " (ring buffer full or disk too slow): "
                   "requests touched by lost events lack stages or are missing.")
    elif seen_total:
        n = sum(1 for a in found if a["probes"])
        out.append(f"Agent health: no events lost ({seen_total:,} events seen by the probes"
                   + (f" of {n} agents" if n > 1 else "") + ").")
    else:
        out.append("Agent health: the run dirs carry no probe counters.")
    unparsed = [f"{h['host']} {h['unparsed_bytes']:,} unparsed, {h.get('lost_bytes', 0):,} unread"
                for h in m["health"] if h.get("unparsed_bytes") or h.get("lost_bytes")]
    if unparsed:
        out.append("Bytes on traced connections that were no protocol's messages: " + ", ".join(unparsed)
                   + " (unparsed: seen and not understood, e.g. another protocol or damaged; unread: never "
                   "copied up, as after lost events or where the in-kernel walker lost the frames).")
    if m.get("sampling_rate"):
        out.append(f"sampled: {100 * m['sampling_rate']:.3g}% of host pairs; counts scaled in the summary "
                   "(latency distributions are those of the sampled pairs).")
    unal = m["timeline"]["unaligned"]
    if unal:
        out.append(f"Hosts {', '.join(unal)} have no clock relation to {m['timeline']['ref']}: their times "
                   "over time and in flight are on their own clocks.")
    return out


# A traffic gap: a span without a single message on a host, at least GAP_MIN_S long and
# GAP_FACTOR times the host's usual longest pause: the median, over GAP_WINDOWS windows
# of the run (of GAP_WINDOW_MIN_S at least), of each window's longest pause. A job's own
# regular pauses (a slow rate, compute phases) recur in most windows and set the bar; a
# restart or a stall is in one or two.
GAP_MIN_S = 0.5
GAP_FACTOR = 3
GAP_WINDOWS = 20
GAP_WINDOW_MIN_S = 1.0
GAPS_NAMED = 3           # per host; the rest are counted
# the time of a message on its host: the first stage every send or receive row has
MESSAGE_TIME_COLS = ("ts_send_first_enter_ns", "ts_recv_last_exit_ns", "ts_framework_ns")


def traffic_gaps(times_ns: dict[str, np.ndarray], start_ns: dict[str, int | None]) -> list[dict[str, Any]]:
    """Per host, the spans between two consecutive messages that are gaps (see GAP_MIN_S),
    longest first; `from_s`/`to_s` count from the host's agent start (else its first
    message). times_ns: host -> message times (CLOCK_MONOTONIC ns of that host)."""
    out = []
    for host in sorted(times_ns):
        t = np.sort(np.asarray(times_ns[host], dtype=np.int64))
        if len(t) < 3:
            continue
        d = np.diff(t)
        window_ns = max(GAP_WINDOW_MIN_S * 1e9, (t[-1] - t[0]) / GAP_WINDOWS)
        win = ((t[:-1] - t[0]) // window_ns).astype(np.int64)
        longest = np.full(int(win[-1]) + 1, -1, dtype=np.int64)
        np.maximum.at(longest, win, d)
        usual = float(np.median(longest[longest >= 0]))
        limit = max(GAP_MIN_S * 1e9, GAP_FACTOR * usual)
        origin = start_ns.get(host)
        origin = int(t[0]) if origin is None or origin > t[0] else int(origin)
        for i in np.flatnonzero(d >= limit):
            out.append({"host": host, "from_ns": int(t[i]), "to_ns": int(t[i + 1]),
                        "from_s": (int(t[i]) - origin) / 1e9, "to_s": (int(t[i + 1]) - origin) / 1e9,
                        "seconds": float(d[i]) / 1e9})
    return sorted(out, key=lambda g: (g["host"], -g["seconds"]))


def run_traffic_gaps(ctx) -> list[dict[str, Any]]:
    """traffic_gaps() of a report's run dirs (ctx: reports.extra.RunContext)."""
    df = ctx.table("messages", ["host_id", *MESSAGE_TIME_COLS])
    if len(df) == 0:
        return []
    t = df[MESSAGE_TIME_COLS[0]]
    for c in MESSAGE_TIME_COLS[1:]:
        t = t.fillna(df[c])
    df = df.assign(t=t).dropna(subset=["t"])
    times = {str(h): g["t"].to_numpy(dtype=np.int64) for h, g in df.groupby("host_id", observed=True)}
    starts = {}
    for h, meta in ctx.metas.items():
        real, off = meta.get("started_realtime_ns"), (meta.get("clock") or {}).get("offset_ns")
        starts[h] = int(real) - int(off) if isinstance(real, int) and isinstance(off, int) else None
    return traffic_gaps(times, starts)


def gap_findings(m: dict) -> list[str]:
    by_host: dict[str, list[dict]] = {}
    for g in m.get("traffic_gaps") or []:
        by_host.setdefault(g["host"], []).append(g)
    out = []
    for host, gaps in by_host.items():
        spans = ", ".join(f"from {g['from_s']:.1f} s to {g['to_s']:.1f} s" for g in gaps[:GAPS_NAMED])
        more = f" and {len(gaps) - GAPS_NAMED} shorter gap(s)" if len(gaps) > GAPS_NAMED else ""
        out.append(f"Traffic gap: no messages on {host} {spans} of the run{more} (the traced processes "
                   "stopped, restarted or stalled, or the agent could not see them).")
    return out


def unrecognised_findings(m: dict[str, Any]) -> list[str]:
    """Traced connections that no protocol parser recognised: what they are, by host pair,
    process and port (reports.unrecognised)."""
    u = m.get("unrecognised") or {}
    if not u.get("connections"):
        return []
    parts = [f"{g['connections']:,} connection{'s' if g['connections'] != 1 else ''}, {fmt_bytes(g['bytes'])} "
             f"between {' and '.join(g['hosts'])}"
             + (f" by {', '.join(g['threads'])}" if g["threads"] else "") + f" (port {g['port']})"
             for g in u["groups"][:3]]
    more = len(u["groups"]) - 3 + u.get("groups_left_out", 0)
    return [f"Traffic not recognised: {u['connections']:,} connections, {fmt_bytes(u['bytes'])} that no protocol "
            "parser understood (so no requests from them): " + "; ".join(parts)
            + (f"; and {more} more groups" if more > 0 else "") + "."]


def bypass_findings(m: dict[str, Any]) -> list[str]:
    """Processes whose messages the probes could not see: they went around the kernel's
    sockets (reports.viewmodel.kernel_bypass)."""
    return [f"Traffic invisible to pslat: on {e['host']}, process {e['pid']} ({e['comm']}) moves its "
            f"{e['protocol']} messages over {e['transport']} ({e['setting']}), around the kernel's sockets: "
            "neither socket probes nor packet captures see them, and its requests are not in this report."
            for e in m.get("kernel_bypass") or ()]


def unnamed_op_findings(m: dict[str, Any]) -> list[str]:
    """Requests whose protocol names its operations but whose name was not seen (a gRPC
    method indexed in HPACK before the agent or the capture joined the connection)."""
    out = []
    for proto, (unnamed, total) in sorted((m.get("unnamed_ops") or {}).items()):
        out.append(f"Operation names not seen: {unnamed:,} of {total:,} {proto} requests carry no name of their "
                   f"operation (the connection named it before the tracer joined it, by a reference it cannot "
                   f"resolve): they are counted under their op ({', '.join(m['unnamed_ops_ops'][proto])}), "
                   "not by name.")
    return out


WARMUP_SECOND_SHARE_MIN = 0.05


def warmup_findings(m: dict[str, Any]) -> list[str]:
    """The start-up transient as its own finding (reports.window's rule), and what the
    figures after it describe."""
    w = (m.get("window") or {}).get("warmup") or {}
    if w.get("end_s") is None:
        return []
    comps = [(c, v) for c, v in (w.get("excess_us") or {}).items() if c in C.COMPONENTS and v > 0]
    total = sum(v for _, v in comps)
    spent = ""
    if comps and total > 0:
        # the second only where it took a share worth naming
        top = [cv for k, cv in enumerate(comps[:2]) if k == 0 or cv[1] >= WARMUP_SECOND_SHARE_MIN * total]
        spent = "; the extra time went to " + " and ".join(f"{c} ({pct(v / total)})" for c, v in top)
        subs = [(c, v) for c, v in (w.get("excess_us") or {}).items()
                if c in C.SUBS and v > 0 and c in C.SUBCOMPONENTS.get(top[0][0], ())]
        if subs:
            spent += f", mostly {subs[0][0]}: {WHY.get(subs[0][0], subs[0][0])}"
    where = ("the figures here describe the steady state after it" if w.get("cut") else
             "it is kept in the figures here (--skip-warmup cuts it)")
    return [f"Warm-up: the first {w['end_s']:,.1f} s held {pct(w['share_of_time'])} of all request time with "
            f"{pct(w['share_of_requests'])} of the requests (mean end-to-end {us(w['mean_us'])} against "
            f"{us(w['steady_mean_us'])} after){spent}: the job's start-up (connections, first touches of its "
            f"tables, threads waking); {where}."]


def findings(m: dict[str, Any]) -> list[str]:
    main = breakdown_findings(m)
    if not main:
        main.append("No request had both its ends measured on the worker: nothing to break down.")
    return (warmup_findings(m) + main + concurrency_findings(m) + connection_findings(m) + skew_findings(m) + clock_findings(m)
            + health_findings(m) + bypass_findings(m) + unrecognised_findings(m) + unnamed_op_findings(m)
            + gap_findings(m))
