"""Chrome trace-event JSON of the requests, for Perfetto (ui.perfetto.dev) or chrome://tracing.

    write_trace(d, "run.trace.json", run_dirs)

Layout: a process per host ("host w0"), a thread track per traced thread
("ZMQbg/IO/0 (tid 812)": the thread that sent the request on the worker, the
one that received it on the server), split into lanes "#2, #3..." where
requests of one thread overlap (a track's slices must nest). On the worker's
track, a slice per request ("pull -> ps0") with its components as child slices
in chain order and the sequential sub-components below them (stack_rx then
sock_wait; framework_rx, app, framework_tx); on the server's track, a slice for
the server's part of the request with the server's components. Flow events
(arrows in Perfetto) go from each request slice to the server's slice of it and
back from the server's slice to the request's.

Clock: every time is put on one host's CLOCK_MONOTONIC through the dissection's
clock models (reports.extra.Timeline), then on realtime through that host's
monotonic->realtime mapping (meta.json) when it has one. `ts` is microseconds
since `baseTimeNanoseconds` (a whole second of realtime, written at the top
level), with three decimals: exact to the nanosecond in a double.

Beside a PyTorch profiler trace: Kineto writes the same two things, ts in us
and baseTimeNanoseconds of realtime, so an event's realtime is
baseTimeNanoseconds + 1000 * ts in both. `python -m reports.trace merge
pslat.json torch.pt.trace.json -o both.json` rebases ours onto theirs and
concatenates the events (our pids are made distinct from theirs); the two then
line up to within the hosts' realtime agreement (NTP/PTP) plus our clock
uncertainty, written in otherData.

A trace is for looking at a stretch of time: above `max_requests` (default
20,000) the earliest requests of the run are written, and otherData says so.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from core.errors import UserError
from reports import components as C
from reports.extra import RunContext
from reports.load import nullable

MAX_REQUESTS = 20_000
# sub-components that follow each other in time (the others split a wait: args only)
SEQUENTIAL_SUBS = {"server_kernel_rx": ["server_stack_rx", "server_sock_wait"],
                   "client_kernel_rx": ["client_stack_rx", "client_sock_wait"],
                   "server_user": ["server_framework_rx", "server_app", "server_framework_tx"]}
SERVER_PART = {"server_nic_rx", "server_kernel_rx", "server_user", "server_kernel_tx", "server_nic_tx"}
ARG_SUBS = [s for s in C.SUBS if not any(s in v for v in SEQUENTIAL_SUBS.values())]
PHASES = {"X", "M", "B", "E", "i", "I", "C", "b", "e", "n", "s", "t", "f"}
FLOW_INSIDE_NS = 1     # a flow's end this far inside its slice, so it binds to that slice, not the next


def span_sequence(folded: str, present: set[str]) -> list[str]:
    """The names of a request's consecutive intervals, in chain order, from its fold text
    (reports.components.describe_pattern: "a+b>name;...") and its present components."""
    member_of = {}
    for part in filter(None, (folded or "").split(";")):
        gone, _, name = part.partition(">")
        for g in gone.split("+"):
            member_of[g] = name
    seq: list[str] = []
    for c in C.BASE:
        name = member_of.get(c, c if c in present else None)
        if name is None or (seq and seq[-1] == name):
            continue
        seq.append(name)
    return seq


def _thread_ids(ctx: RunContext, req: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(worker tid, comm) and (server tid, comm) per request, from the message rows."""
    cols = ["host_id", "direction", "local_port", "remote_port", "seq_end", "tid", "comm"]
    # only the rows that can be these requests' (their last seq): a trace writes a stretch of
    # the run, and the messages of a long run are millions of rows
    seqs = pa.array(req["req_seq_end"].dropna().astype("int64").unique())
    null_too = bool(req["req_seq_end"].isna().any())   # the join pairs null with null

    def wanted(t: pa.Table) -> pa.Array:
        seq = t["seq_end"].cast(pa.int64())
        keep = pc.fill_null(pc.is_in(seq, value_set=seqs), False)
        return pc.or_(keep, pc.is_null(seq)) if null_too else keep

    parts = [t.filter(wanted(t)) for t in ctx.shards("messages", cols)]
    m = (pa.concat_tables(parts, promote_options="permissive") if parts
         else pa.table({c: pa.nulls(0) for c in cols})).to_pandas(types_mapper=nullable)
    m = m.astype({"host_id": str, "direction": str})
    for c in ("local_port", "remote_port", "seq_end"):
        m[c] = m[c].astype("Int64")
    m = m.drop_duplicates(["host_id", "direction", "local_port", "remote_port", "seq_end"])
    key = pd.DataFrame({"sport": req["req_sport"].astype("Int64"), "dport": req["req_dport"].astype("Int64"),
                        "seq": req["req_seq_end"].astype("Int64")}, index=req.index)
    out = []
    for side, host_col, direction, lp, rp in (("w", "worker_host", "tx", "sport", "dport"),
                                              ("s", "server_host", "rx", "dport", "sport")):
        k = key.assign(host_id=req[host_col].astype(str).to_numpy(), direction=direction,
                       local_port=key[lp], remote_port=key[rp], seq_end=key["seq"])
        j = k.reset_index().merge(m, how="left", on=["host_id", "direction", "local_port", "remote_port", "seq_end"])
        out.append(j.set_index("index")[["tid", "comm"]].reindex(req.index))
    return out[0], out[1]


class _Tracks:
    """pid per host, tid per (host, thread, lane); lanes so that a track's slices nest."""

    def __init__(self):
        self.pids: dict[str, int] = {}
        self.tids: dict[tuple, int] = {}
        self.names: dict[tuple, str] = {}
        self.lane_ends: dict[tuple, list[float]] = {}

    def pid(self, host: str) -> int:
        return self.pids.setdefault(host, len(self.pids) + 1)

    def tid(self, host: str, thread: tuple, t0: float, t1: float) -> int:
        ends = self.lane_ends.setdefault((host, thread), [])
        for lane, end in enumerate(ends):
            if end <= t0:
                ends[lane] = t1
                break
        else:
            ends.append(t1)
            lane = len(ends) - 1
        key = (host, thread, lane)
        if key not in self.tids:
            self.tids[key] = len(self.tids) + 1
            tid, comm = thread
            name = f"{comm} (tid {tid})" if tid is not None else "thread unknown"
            self.names[key] = name + (f" #{lane + 1}" if lane else "")
        return self.tids[key]

    def metadata(self) -> list[dict]:
        ev = [{"ph": "M", "name": "process_name", "pid": p, "tid": 0, "args": {"name": f"host {h}"}}
              for h, p in self.pids.items()]
        ev += [{"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0, "args": {"sort_index": p}}
               for p in self.pids.values()]
        ev += [{"ph": "M", "name": "thread_name", "pid": self.pids[k[0]], "tid": t, "args": {"name": self.names[k]}}
               for k, t in self.tids.items()]
        return ev


def _us(ns: int) -> float:
    return round(ns / 1e3, 3)


def build_trace(d, run_dirs: list[Path] | None = None, max_requests: int = MAX_REQUESTS) -> dict[str, Any]:
    ctx = RunContext.open(run_dirs, d)
    tl = ctx.timeline
    req = d.complete
    start = req["start_ns"].to_numpy(dtype=np.int64, na_value=0).copy()
    for host, rows in req.groupby("worker_host", sort=False, observed=True).indices.items():
        start[rows] = tl.to_ref(start[rows], str(host))
    if tl.realtime_offset_ns is not None:
        start = start + tl.realtime_offset_ns
    order = np.argsort(start, kind="stable")
    cut = len(order) > max_requests
    order = order[:max_requests]
    req, start = req.iloc[order], start[order]
    base_ns = int(start.min() // 10**9 * 10**9) if len(start) else 0
    wt, st = _thread_ids(ctx, req) if len(req) else (None, None)
    tracks = _Tracks()
    events: list[dict] = []
    flows: list[int] = []
    skipped_negative = 0
    comp_vals = {c: req[c].to_numpy(dtype=np.float64, na_value=np.nan).tolist() for c in C.COMPONENTS + C.SUBS}
    folded = req["folded"].astype(object).to_numpy()
    cols = {c: req[c].astype(object).where(req[c].notna(), None).tolist()
            for c in ("op", "op_name", "protocol", "worker_host", "server_host", "call_space", "call_id", "worker",
                      "server", "num_keys",
                      "req_bytes", "resp_bytes", "e2e")}
    threads = {k: (f["tid"].astype(object).where(f["tid"].notna(), None).tolist(),
                   f["comm"].astype(object).where(f["comm"].notna(), None).tolist()) for k, f in (("w", wt), ("s", st))} \
        if len(req) else {}
    for i in range(len(req)):
        r = {c: v[i] for c, v in cols.items()}
        t0 = int(start[i]) - base_ns
        e2e = int(r["e2e"])
        present = {c for c in C.COMPONENTS if not _nan(comp_vals[c][i])}
        seq = span_sequence(folded[i], present)
        vals = {c: int(comp_vals[c][i]) for c in present}
        op, wh, sh = str(r["op"]), str(r["worker_host"]), str(r["server_host"])
        args = {"protocol": _str(r["protocol"]), "op_name": _str(r["op_name"]), "call_space": _int(r["call_space"]),
                "call_id": _int(r["call_id"]), "worker_node": _int(r["worker"]),
                "server_node": _int(r["server"]), "num_keys": _int(r["num_keys"]),
                "req_bytes": _int(r["req_bytes"]), "resp_bytes": _int(r["resp_bytes"]), "e2e_us": _us(e2e)}
        args.update({f"{s}_us": _us(int(comp_vals[s][i])) for s in ARG_SUBS if not _nan(comp_vals[s][i])})
        if e2e < 0 or any(v < 0 for v in vals.values()):
            skipped_negative += 1
            continue
        w_thread = (_int(threads["w"][0][i]), _str(threads["w"][1][i]))
        pid = tracks.pid(wh)
        tid = tracks.tid(wh, w_thread, t0, t0 + e2e)
        events.append(_x(f"{op} -> {sh}", "request", t0, e2e, pid, tid, args))
        spans = _place(seq, vals, t0, e2e)
        server = []
        for name, s0, dur in spans:
            events.append(_x(name, "component", s0, dur, pid, tid, {}))
            events.extend(_subs(name, s0, dur, comp_vals, i, pid, tid))
            if name in SERVER_PART:
                server.append((name, s0, dur))
        if server:
            s0 = server[0][1]
            s1 = server[-1][1] + server[-1][2]
            s_thread = (_int(threads["s"][0][i]), _str(threads["s"][1][i]))
            spid = tracks.pid(sh)
            stid = tracks.tid(sh, s_thread, s0, s1)
            events.append(_x(f"serve {op} from {wh}", "request", s0, s1 - s0, spid, stid, args))
            # arrows in Perfetto: the worker's request to the server's handling of it, and back
            fid = 2 * len(flows)
            flows.append(fid)
            events += [_flow("s", fid, "request", t0, pid, tid), _flow("f", fid, "request", s0, spid, stid),
                       _flow("s", fid + 1, "response", s1 - FLOW_INSIDE_NS, spid, stid),
                       _flow("f", fid + 1, "response", min(t0 + e2e, s1 + FLOW_INSIDE_NS), pid, tid)]
            for name, a, dur in server:
                events.append(_x(name, "component", a, dur, spid, stid, {}))
                events.extend(_subs(name, a, dur, comp_vals, i, spid, stid))
    other = {"producer": "pslat report --format trace",
             "clock": ("realtime of " if tl.realtime_offset_ns is not None else "CLOCK_MONOTONIC of ") + str(tl.ref),
             "clock_uncertainty_us": {h: round(u / 1e3, 3) for h, u in tl.uncertainty_ns.items()},
             "hosts_not_aligned": tl.unaligned, "requests_written": len(req) - skipped_negative,
             "requests_in_run": int(len(d.complete)),
             "requests_left_out_negative_component": skipped_negative}
    if cut:
        other["note"] = f"the first {max_requests:,} requests of the run by start time (of {len(d.complete):,})"
    return {"traceEvents": tracks.metadata() + events, "displayTimeUnit": "ns", "baseTimeNanoseconds": base_ns,
            "otherData": other}


def _int(x) -> int | None:
    return None if x is None or pd.isna(x) else int(x)


def _nan(x: float) -> bool:
    return x != x


def _str(x) -> str:
    return "?" if x is None or (not isinstance(x, str) and pd.isna(x)) else str(x)


def _flow(ph: str, fid: int, name: str, t_ns: int, pid: int, tid: int) -> dict:
    """A flow event (trace event format, v1): "s" inside its source slice, "f" bound to the slice
    enclosing its time on the destination track ("bp": "e")."""
    e = {"ph": ph, "id": fid, "name": name, "cat": "flow", "ts": _us(t_ns), "pid": pid, "tid": tid}
    if ph == "f":
        e["bp"] = "e"
    return e


def _x(name: str, cat: str, t0_ns: int, dur_ns: int, pid: int, tid: int, args: dict) -> dict:
    return {"name": name, "cat": cat, "ph": "X", "ts": _us(t0_ns), "dur": _us(dur_ns), "pid": pid, "tid": tid,
            "args": args}


def _place(seq: list[str], vals: dict[str, int], t0: int, e2e: int) -> list[tuple[str, int, int]]:
    """(name, start, dur) of each interval. A name that occurs twice (two unsplit stretches)
    has only their sum: intervals are placed from the start and from the end up to it, and
    what lies between is one slice named after what it covers."""
    once = [n for n in seq if seq.count(n) == 1]
    k = 0
    fwd, t = [], t0
    while k < len(seq) and seq[k] in once:
        fwd.append((seq[k], t, vals[seq[k]]))
        t += vals[seq[k]]
        k += 1
    if k == len(seq):
        return fwd
    j = len(seq)
    bwd, e = [], t0 + e2e
    while j > k and seq[j - 1] in once:
        e -= vals[seq[j - 1]]
        bwd.insert(0, (seq[j - 1], e, vals[seq[j - 1]]))
        j -= 1
    middle = "+".join(dict.fromkeys(seq[k:j]))
    return fwd + [(middle, t, e - t)] + bwd


def _subs(name: str, t0: int, dur: int, comp_vals: dict, i: int, pid: int, tid: int) -> list[dict]:
    parts = SEQUENTIAL_SUBS.get(name)
    if not parts or any(_nan(comp_vals[p][i]) for p in parts):
        return []
    vals = [int(comp_vals[p][i]) for p in parts]
    if any(v < 0 for v in vals) or sum(vals) != dur:
        return []      # only parts that tile their parent exactly nest as slices
    out, t = [], t0
    for p, v in zip(parts, vals):
        out.append(_x(p, "subcomponent", t, v, pid, tid, {}))
        t += v
    return out


# ---------------------------------------------------------------- validation

def validate(trace: Any) -> list[str]:
    """What a trace-event JSON object gets wrong for Perfetto's JSON importer and
    chrome://tracing (the trace event format): the container, required fields per
    phase, numeric ts/dur >= 0, metadata names, and slices that nest on each track."""
    errs: list[str] = []
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["top level must be an object with a traceEvents array"]
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        errs.append("displayTimeUnit must be ms or ns")
    tracks: dict[tuple, list[tuple[float, float, str]]] = {}
    flows: dict = {}
    for k, e in enumerate(trace["traceEvents"]):
        where = f"event {k}"
        if not isinstance(e, dict):
            errs.append(f"{where}: not an object")
            continue
        ph = e.get("ph")
        if ph not in PHASES:
            errs.append(f"{where}: ph {ph!r} unknown")
            continue
        for f in ("pid", "tid"):
            if f in e and not isinstance(e[f], int):
                errs.append(f"{where}: {f} must be an integer")
        if not isinstance(e.get("name"), str):
            errs.append(f"{where}: name must be a string")
        if ph == "M":
            if e.get("name") in ("process_name", "thread_name") and not isinstance((e.get("args") or {}).get("name"), str):
                errs.append(f"{where}: {e.get('name')} needs args.name")
            continue
        if not isinstance(e.get("ts"), (int, float)) or isinstance(e.get("ts"), bool):
            errs.append(f"{where}: ts must be a number (us)")
            continue
        if "pid" not in e or "tid" not in e:
            errs.append(f"{where}: pid and tid are required")
            continue
        if ph == "X":
            if not isinstance(e.get("dur"), (int, float)) or e["dur"] < 0:
                errs.append(f"{where}: X needs dur >= 0")
                continue
            tracks.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"], e["name"]))
        if ph in ("s", "t", "f"):
            if not isinstance(e.get("id"), (int, str)):
                errs.append(f"{where}: a flow event needs an id")
            flows.setdefault(e.get("id"), []).append(ph)
        if "args" in e and not isinstance(e["args"], dict):
            errs.append(f"{where}: args must be an object")
    for fid, phs in flows.items():
        if phs.count("s") != 1 or phs.count("f") != 1:
            errs.append(f"flow {fid!r}: needs one start (s) and one finish (f), has {''.join(phs)}")
    eps = 0.0015   # three decimals of us on both ends
    for key, sl in tracks.items():
        sl.sort(key=lambda s: (s[0], -(s[1] - s[0])))
        stack: list[tuple[float, float, str]] = []
        for s in sl:
            while stack and stack[-1][1] <= s[0] + eps:
                stack.pop()
            if stack and s[1] > stack[-1][1] + eps:
                errs.append(f"track pid={key[0]} tid={key[1]}: {s[2]!r} [{s[0]}, {s[1]}] overlaps "
                            f"{stack[-1][2]!r} [{stack[-1][0]}, {stack[-1][1]}] without nesting")
                break
            stack.append(s)
    return errs


def write_trace(d, path: Path, run_dirs: list[Path] | None = None, max_requests: int = MAX_REQUESTS) -> dict:
    """Write the trace of dissection `d` to `path`; returns its otherData (what was written)."""
    t = build_trace(d, run_dirs, max_requests)
    try:
        with open(path, "w") as f:
            json.dump(t, f, separators=(",", ":"))
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}; check the directory exists and is writable") \
            from None
    return t["otherData"]


def merge(ours: dict, theirs: dict) -> dict:
    """Our events on their baseTimeNanoseconds (a Kineto/PyTorch profiler trace), pids made
    distinct, appended to their events."""
    base = theirs.get("baseTimeNanoseconds")
    if not isinstance(base, int):
        raise UserError("the other trace has no baseTimeNanoseconds (PyTorch >= 2.1's profiler writes it); "
                        "without it its ts cannot be put on realtime")
    shift_us = (ours.get("baseTimeNanoseconds", 0) - base) / 1e3
    used = {e.get("pid") for e in theirs.get("traceEvents", []) if isinstance(e, dict)}
    offset = max([p for p in used if isinstance(p, int)] + [0]) + 1_000_000
    out = []
    for e in ours["traceEvents"]:
        e = dict(e, pid=e["pid"] + offset)
        if e.get("ph") in ("s", "t", "f"):   # flow ids of our own, apart from the profiler's
            e["id"] = f"pslat-{e['id']}"
        if "ts" in e:
            e["ts"] = round(e["ts"] + shift_us, 3)
        out.append(e)
    return {**theirs, "traceEvents": list(theirs.get("traceEvents", [])) + out}


def _main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m reports.trace", description="merge a pslat trace into a "
                                 "PyTorch profiler trace (both: ts in us since baseTimeNanoseconds of realtime)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("merge")
    m.add_argument("pslat_trace", type=Path)
    m.add_argument("torch_trace", type=Path)
    m.add_argument("-o", "--output", type=Path, required=True)
    a = ap.parse_args(argv)
    import gzip
    load = lambda p: json.load(gzip.open(p, "rt") if p.suffix == ".gz" else open(p))  # noqa: E731
    merged = merge(load(a.pslat_trace), load(a.torch_trace))
    with open(a.output, "w") as f:
        json.dump(merged, f)
    print(f"wrote {a.output} ({len(merged['traceEvents']):,} events)", file=sys.stderr)


if __name__ == "__main__":
    from core.errors import run_main
    run_main("python -m reports.trace", _main, sys.argv[1:])
