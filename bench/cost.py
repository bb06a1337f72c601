"""What tracing costs, as CPU per message in cgroups, against the counting
floor (bench.floor), instead of throughput on a saturated box. Root.

    python -m bench.cost [--pairs 20] [--windows 5] [--duration-s 3] [--closed-pairs 12] [--rate R]
    python -m bench.cost --record FILE.gz [--record-s 30] [--rate R]

psbench (2 servers x 4 workers, one host each) in the virtual cluster with a
1 ms wire and 1 ms server delay. The job, the tracer (`pslat agent` with its
default settings, or bench.floor) and the wire forwarder each sit in a cgroup
of their own (cgroup v1, bench/cgroups.py: `cpuacct.usage` for CPU, `cpuset`
for pinning). Conditions: untraced, untraced2 (A/A: the noise, with the same
structure as with/without), floor, agent.

The job runs on for a whole phase and the conditions take turns on it: a
tracer is started (in its cgroup) once the job runs, and a condition is a
block of --windows back-to-back measurement windows of --duration-s each,
after the tracer is ready and the job has caught up (an open-loop job falls
behind while the agent compiles beside it). Starting the agent took 54-142 s
on these shared cores at load 10-15 (22-24 minutes for a default run there;
--pairs, --closed-pairs, --windows and --duration-s make it shorter), so a
block holds several windows; rounds order the blocks in a Williams design. Window k of a condition is paired with window k of
untraced in the same round; confidence intervals (95%) come from resampling
whole rounds (bootstrap), because windows of one block are not independent.

1. closed loop (2 rounds, --closed-pairs windows per placement split
   between them), each block in two placements: shared (the job, tracer and wire on both CPUs: the old
   bench.overhead closed-loop figure, kept for continuity) and pinned (the
   job on CPU 0, tracer + forwarder on CPU 1: the throughput lost to what the
   tracer does in the job's own threads, against the floor's).
2. the open-loop rate: --rate, or half the untraced closed loop's requests/s
   per worker (the job's saturation rate, measured in phase 1).
3. open loop (--pairs / --windows rounds): the job's extra CPU per message
   (agent or floor minus untraced, same round; BPF in the job's threads,
   uprobe traps, interference), the agent's own CPU per message, each also as
   a share of the untraced job's CPU per message; p99 slice latency from each
   request's due time, agent / untraced per pair.

A message is one request or response on the wire (a ps-lite slice: psbench's
truth rows issued in the window and their responses). In-kernel BPF time per
program comes from the kernel's BPF stats (bpf(BPF_ENABLE_STATS), the same as
sysctl kernel.bpf_stats_enabled) via `bpftool prog show`; the runs that the
wire forwarder's namespace causes (each frame crosses pslat-wire's veth ends
once in and once out, and the forwarder sends each with one send()) are
taken out at the floor's measured cost per run on those hooks.

Prints a line per window and the figures, then one JSON line (last):
{"cost": {"agent_cpu_us_per_message", "job_extra_cpu_us_per_message",
"floor_job_extra_cpu_us_per_message", "pinned_throughput_loss",
"floor_pinned_throughput_loss", "open_p99_ratio", "aa_p99_noise",
"lost_events", "agent_rss_mb", "closed_throughput_ratio", ...}, ...}

--record FILE.gz: instead, a steady-state recording for bench/consumer: the
agent with --record started, then an open-loop job of --record-s at the rate,
on the same cluster; gzip-compressed.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.common import (BpfStats, Tracer, aa_noise, agent_counters, agent_tracer, at_least, bpf_prog_fdinfo,
                          floor_hits, floor_tracer, job_figures, json_line, median, positive, ratio, spread)
from bench.floor import Hook, agent_hooks

SERVERS, WORKERS = 2, 4
HOSTS = SERVERS + WORKERS
WIRE_DELAY_MS = 1.0
SERVER_DELAY_MS = 1.0
CLUSTER_WAIT_S = 900        # one cluster per machine: wait for another bench's or test's
JOB_MAX_S = 7200            # a phase's job runs until stopped; this only bounds an orphan
CONDITIONS = ("untraced", "agent", "untraced2", "floor")
GROUPS = ("job", "tracer", "wire")
JOB_CPUS, TRACER_CPUS = "0", "1"
SHARED, PINNED = "shared", "pinned"
PLACE_SETTLE_S = 0.5        # after a cpuset change: migrated threads, cold caches
CATCH_UP_LAG_MS = 50.0      # caught up: issues this close to due (p99; a backlog is seconds behind, and
                            # on these loaded cores an on-time job still issues a few ms late)
CATCH_UP_MAX_S = 60.0
BOOTSTRAP_N = 2000
CLOSED_ROUNDS = 2           # each round starts the agent once: 10-90 s on these shared cores
BPF_NAME_LEN = 15           # BPF_OBJ_NAME_LEN - 1: the kernel keeps this much of a program's name


# ---------------------------------------------------------------- statistics (pure)

def balanced_order(round_index: int, conditions) -> list:
    """The conditions of one round in a Williams design: over len(conditions) rounds
    each condition runs first once and follows every other one once (for an even
    count), so no condition always follows the agent (a plain rotation would put
    untraced2 after the agent every time, and with it whatever the agent leaves behind)."""
    n = len(conditions)
    offsets, lo, hi = [0], 1, n - 1
    while len(offsets) < n:
        offsets.append(lo)
        lo += 1
        if len(offsets) < n:
            offsets.append(hi)
            hi -= 1
    return [conditions[(round_index + o) % n] for o in offsets]


def bootstrap_ci(pairs: list[tuple[int, float | None]], level: float = 0.95, n: int = BOOTSTRAP_N,
                 seed: int = 0) -> list[float] | None:
    """Percentile interval of the median of values given as (round, value), resampling
    whole rounds with replacement (values of one round are not independent). None with
    fewer than 2 rounds."""
    by: dict[int, list[float]] = {}
    for rnd, v in pairs:
        if v is not None and math.isfinite(v):
            by.setdefault(rnd, []).append(v)
    if len(by) < 2:
        return None
    vals = np.concatenate([np.asarray(v, dtype=np.float64) for v in by.values()])
    grp = np.concatenate([np.full(len(v), g) for g, v in enumerate(by.values())])
    order = np.argsort(vals, kind="stable")
    vals, grp = vals[order], grp[order]
    rng = np.random.default_rng(seed)
    # each resample: how often each round was drawn; the median of the pooled values,
    # weighted by those counts (all resamples at once: ranks against cumulative weights)
    counts = rng.multinomial(len(by), [1 / len(by)] * len(by), size=n)
    cum = np.cumsum(counts[:, grp], axis=1)
    total = cum[:, -1]
    lo_rank, hi_rank = (total - 1) // 2, total // 2
    lo_v = vals[(cum > lo_rank[:, None]).argmax(axis=1)]
    hi_v = vals[(cum > hi_rank[:, None]).argmax(axis=1)]
    stats = (lo_v + hi_v) / 2
    lo, hi = np.percentile(stats, [50 * (1 - level), 50 * (1 + level)])
    return [float(lo), float(hi)]


@dataclass
class Window:
    """One measurement window: CPU per group, wire frames and tracer BPF deltas,
    then (after the phase's job ended) the job's figures from its truth."""
    phase: str                   # "closed" or "open"
    placement: str               # SHARED or PINNED
    round: int
    condition: str
    index: int                   # k-th window of its block
    t0_ns: int
    t1_ns: int
    cpu_ns: dict = field(default_factory=dict)       # group -> ns
    wire_frames: dict = field(default_factory=dict)  # "in", "out"
    bpf: dict = field(default_factory=dict)          # program name -> {"run_time_ns", "run_cnt"}
    loadavg_1m: float | None = None
    job: dict = field(default_factory=dict)
    error: str | None = None

    def per_message_us(self, group: str) -> float | None:
        msgs = self.job.get("messages_all")
        v = self.cpu_ns.get(group)
        return None if v is None or not msgs else v / 1e3 / msgs


def window_truth(truth, t0_ns: int, t1_ns: int):
    """The truth rows of the slices issued in [t0, t1) (workers' and servers')."""
    w = truth[(truth["t_issued_ns"] >= t0_ns) & (truth["t_issued_ns"] < t1_ns)] if "t_issued_ns" in truth else truth
    return w


def fill_job(windows: list[Window], truth, open_loop: bool) -> None:
    """Each window's job figures from the phase's truth: its slices, messages
    (requests issued in it and their responses), throughput and latency."""
    workers = truth[truth["role"] == "worker"]
    for w in windows:
        if w.error:
            continue
        part = window_truth(workers, w.t0_ns, w.t1_ns)
        try:
            w.job = job_figures(part, 0.0, open_loop)
        except Exception as e:   # no slice completed in it: say so, keep the others
            w.error = f"{type(e).__name__}: {e}"
            continue
        # throughput over the window itself, not the span of its slices
        w.job["slices_per_s_window"] = w.job["slices"] / ((w.t1_ns - w.t0_ns) / 1e9)


def _by(windows: list[Window], phase: str, placement: str) -> dict[tuple[int, str, int], Window]:
    return {(w.round, w.condition, w.index): w for w in windows
            if w.phase == phase and w.placement == placement and not w.error and w.job}


def paired(windows: list[Window], phase: str, placement: str, condition: str, value, how: str,
           base: str = "untraced") -> list[tuple[int, float | None]]:
    """(round, condition's value against base's in the same round and window index):
    how = "ratio" or "diff"; value(window) -> float or None."""
    by = _by(windows, phase, placement)
    out = []
    for (rnd, cond, k), w in sorted(by.items()):
        if cond != condition or (rnd, base, k) not in by:
            continue
        a, b = value(w), value(by[(rnd, base, k)])
        if how == "ratio":
            out.append((rnd, ratio(a, b)))
        else:
            out.append((rnd, None if a is None or b is None else a - b))
    return out


def values(windows: list[Window], phase: str, placement: str, condition: str, value) -> list[tuple[int, float | None]]:
    return [(rnd, value(w)) for (rnd, cond, _), w in sorted(_by(windows, phase, placement).items())
            if cond == condition]


def figure(pairs: list[tuple[int, float | None]]) -> dict:
    """Median over pairs, its 95% interval (rounds resampled) and the spread."""
    v = [x for _, x in pairs]
    return {"median": median(v), "ci95": bootstrap_ci(pairs), "spread": spread(v)}


# ---------------------------------------------------------------- BPF per program (pure)

def bpf_name(fn: str) -> str:
    return fn[:BPF_NAME_LEN]


def program_hooks(hooks: list[Hook] | None = None) -> dict[str, list[Hook]]:
    """BPF program name (as the kernel keeps it) -> the hooks it runs on: the agent's
    declared functions and the floor's floor_i (one per agent hook, in agent_hooks order)."""
    from agent.sources import kernel_probes
    from probes.framework import POINTS

    out: dict[str, list[Hook]] = {}
    for p in kernel_probes(True):
        for a in p.attach:
            out.setdefault(bpf_name(a.fn), []).append(Hook(a.kind, a.target))
    for point in POINTS["zmq"]:
        out.setdefault(bpf_name(point.entry_fn), []).append(Hook("uprobe", point.symbol))
        if point.return_fn is not None:
            out.setdefault(bpf_name(point.return_fn), []).append(Hook("uretprobe", point.symbol))
    for i, h in enumerate(agent_hooks() if hooks is None else hooks):
        out[bpf_name(f"floor_{i}")] = [h]
    return out


# Runs per wire frame that pslat-wire's side of the wire causes on a hook: a frame
# is received on one wire port (netif_rx: veth without GRO) and sent on another
# (net_dev_queue, net_dev_start_xmit), and the forwarder sends it with one send()
# (sendto enter and exit). "in": frames received by the forwarder, "out": sent.
WIRE_RUNS = {Hook("raw_tracepoint", "netif_rx"): "in",
             Hook("raw_tracepoint", "net_dev_queue"): "out",
             Hook("raw_tracepoint", "net_dev_start_xmit"): "out",
             Hook("tracepoint", "syscalls:sys_enter_sendto"): "out",
             Hook("tracepoint", "syscalls:sys_exit_sendto"): "out"}


def bpf_delta(before: dict, after: dict) -> dict[str, dict[str, int]]:
    """Per program name: run_time_ns and run_cnt added between two snapshots
    ({prog id: {"name", "run_time_ns", "run_cnt"}}; programs of one name summed)."""
    out: dict[str, dict[str, int]] = {}
    for pid_, a in after.items():
        b = before.get(pid_, {"run_time_ns": 0, "run_cnt": 0})
        cur = out.setdefault(a["name"], {"run_time_ns": 0, "run_cnt": 0})
        cur["run_time_ns"] += int(a["run_time_ns"]) - int(b["run_time_ns"])
        cur["run_cnt"] += int(a["run_cnt"]) - int(b["run_cnt"])
    return out


def bpf_summary(windows: list[Window], condition: str, floor_windows: list[Window],
                prog_hooks: dict[str, list[Hook]]) -> dict:
    """BPF of a condition over its windows: per program ns and runs per message, the
    runs the wire's namespace caused (wire frames x WIRE_RUNS), priced at the floor's
    own ns per run on that hook, and the totals with them taken out."""
    ws = [w for w in windows if w.condition == condition and not w.error and w.job and w.bpf]
    if not ws:
        return {}
    msgs = sum(w.job["messages_all"] for w in ws)
    frames = {k: sum(w.wire_frames.get(k, 0) for w in ws) for k in ("in", "out")}
    # the floor's cost per run, per hook, over all its windows of the phase
    per_hook: dict[Hook, list[int]] = {}
    for w in floor_windows:
        for name, d in w.bpf.items():
            hooks = prog_hooks.get(name, [])
            if len(hooks) == 1:
                acc = per_hook.setdefault(hooks[0], [0, 0])
                acc[0] += d["run_time_ns"]
                acc[1] += d["run_cnt"]
    floor_ns_per_run = {h: ns / runs for h, (ns, runs) in per_hook.items() if runs > 0}
    progs: dict[str, dict] = {}
    for w in ws:
        for name, d in w.bpf.items():
            cur = progs.setdefault(name, {"run_time_ns": 0, "run_cnt": 0})
            cur["run_time_ns"] += d["run_time_ns"]
            cur["run_cnt"] += d["run_cnt"]
    total_ns = total_wire_ns = 0.0
    out_progs = {}
    for name, d in sorted(progs.items()):
        wire_runs = wire_ns = 0.0
        for h in prog_hooks.get(name, []):
            if h in WIRE_RUNS:
                runs = frames[WIRE_RUNS[h]]
                wire_runs += runs
                wire_ns += runs * floor_ns_per_run.get(h, 0.0)
        wire_ns = min(wire_ns, d["run_time_ns"])
        total_ns += d["run_time_ns"]
        total_wire_ns += wire_ns
        hooks = prog_hooks.get(name, [])
        out_progs[name] = {"hooks": [f"{h.kind}:{h.target}" for h in hooks],
                           "runs_per_message": ratio(d["run_cnt"], msgs),
                           "ns_per_run": ratio(d["run_time_ns"], d["run_cnt"]),
                           "ns_per_message": ratio(d["run_time_ns"], msgs),
                           "wire_runs_per_message": ratio(wire_runs, msgs),
                           "ns_per_message_without_wire": ratio(d["run_time_ns"] - wire_ns, msgs)}
    return {"messages": msgs, "wire_frames": frames,
            "ns_per_message": ratio(total_ns, msgs),
            "ns_per_message_without_wire": ratio(total_ns - total_wire_ns, msgs),
            "programs": out_progs}


# ---------------------------------------------------------------- the figures (pure)

def _tracer_us(w: Window) -> float | None:
    return w.per_message_us("tracer")


def _job_us(w: Window) -> float | None:
    return w.per_message_us("job")


def _wire_us(w: Window) -> float | None:
    return w.per_message_us("wire")


def _p99(w: Window) -> float | None:
    return w.job.get("p99_us")


def _tput(w: Window) -> float | None:
    return w.job.get("slices_per_s_window")


def summarize(windows: list[Window], prog_hooks: dict[str, list[Hook]], tracers: dict) -> dict:
    """Every figure of the run from its windows; tracers: per condition, what each
    tracer session reported (lost events, RSS)."""
    out: dict = {}
    o = "open"
    base_job = values(windows, o, SHARED, "untraced", _job_us)
    job_us = median(v for _, v in base_job)
    extra = {c: paired(windows, o, SHARED, c, _job_us, "diff") for c in ("agent", "floor", "untraced2")}
    wire_extra = {c: paired(windows, o, SHARED, c, _wire_us, "diff") for c in ("agent", "floor", "untraced2")}
    own = {c: values(windows, o, SHARED, c, _tracer_us) for c in ("agent", "floor")}
    p99 = {c: paired(windows, o, SHARED, c, _p99, "ratio") for c in ("agent", "floor", "untraced2")}
    open_fig = {
        "job_cpu_us_per_message": figure(base_job),
        "job_extra_cpu_us_per_message": {c: figure(v) for c, v in extra.items()},
        "wire_extra_cpu_us_per_message": {c: figure(v) for c, v in wire_extra.items()},
        "tracer_cpu_us_per_message": {c: figure(v) for c, v in own.items()},
        "p99_ratio": {c: figure(v) for c, v in p99.items()},
        "p99_us": {c: figure(values(windows, o, SHARED, c, _p99)) for c in CONDITIONS},
        "pairs": len(p99["agent"]), "aa_pairs": len(p99["untraced2"]),
    }
    out["open"] = open_fig
    c = "closed"
    closed_fig = {}
    for pl in (SHARED, PINNED):
        r = {cond: paired(windows, c, pl, cond, _tput, "ratio") for cond in ("agent", "floor", "untraced2")}
        closed_fig[pl] = {"throughput_ratio": {cond: figure(v) for cond, v in r.items()},
                          "untraced_slices_per_s": figure(values(windows, c, pl, "untraced", _tput)),
                          "job_extra_cpu_us_per_message": {
                              cond: figure(paired(windows, c, pl, cond, _job_us, "diff"))
                              for cond in ("agent", "floor", "untraced2")}}
    out["closed"] = closed_fig
    out["bpf"] = {ph: {cond: bpf_summary([w for w in windows if w.phase == ph and w.placement == SHARED], cond,
                                         [w for w in windows if w.phase == ph and w.placement == SHARED
                                          and w.condition == "floor" and not w.error and w.bpf], prog_hooks)
                       for cond in ("agent", "floor")} for ph in ("open", "closed")}

    def med(fig):
        return fig["median"]

    def loss(fig):
        return None if fig["median"] is None else 1.0 - fig["median"]

    def loss_ci(fig):
        return None if fig["ci95"] is None else [1.0 - fig["ci95"][1], 1.0 - fig["ci95"][0]]

    agent_us = med(open_fig["tracer_cpu_us_per_message"]["agent"])
    job_extra = med(open_fig["job_extra_cpu_us_per_message"]["agent"])
    floor_extra = med(open_fig["job_extra_cpu_us_per_message"]["floor"])
    pinned = closed_fig[PINNED]["throughput_ratio"]
    shared = closed_fig[SHARED]["throughput_ratio"]
    agent_sessions = tracers.get("agent", [])
    cost = {
        "agent_cpu_us_per_message": agent_us,
        "agent_cpu_us_per_message_ci95": open_fig["tracer_cpu_us_per_message"]["agent"]["ci95"],
        "agent_cpu_share_of_job": ratio(agent_us, job_us),
        "job_cpu_us_per_message": job_us,
        "job_extra_cpu_us_per_message": job_extra,
        "job_extra_cpu_us_per_message_ci95": open_fig["job_extra_cpu_us_per_message"]["agent"]["ci95"],
        "job_extra_share": ratio(job_extra, job_us),
        "floor_job_extra_cpu_us_per_message": floor_extra,
        "floor_job_extra_cpu_us_per_message_ci95": open_fig["job_extra_cpu_us_per_message"]["floor"]["ci95"],
        "floor_job_extra_share": ratio(floor_extra, job_us),
        "aa_job_cpu_us_per_message_noise": aa_noise_abs(extra["untraced2"]),
        "wire_extra_cpu_us_per_message": med(open_fig["wire_extra_cpu_us_per_message"]["agent"]),
        "floor_wire_extra_cpu_us_per_message": med(open_fig["wire_extra_cpu_us_per_message"]["floor"]),
        "floor_cpu_us_per_message": med(open_fig["tracer_cpu_us_per_message"]["floor"]),
        "pinned_throughput_loss": loss(pinned["agent"]),
        "pinned_throughput_loss_ci95": loss_ci(pinned["agent"]),
        "floor_pinned_throughput_loss": loss(pinned["floor"]),
        "floor_pinned_throughput_loss_ci95": loss_ci(pinned["floor"]),
        "aa_pinned_throughput_noise": aa_noise([v for _, v in paired(windows, c, PINNED, "untraced2", _tput,
                                                                     "ratio")]),
        "open_p99_ratio": med(open_fig["p99_ratio"]["agent"]),
        "open_p99_ratio_ci95": open_fig["p99_ratio"]["agent"]["ci95"],
        "floor_open_p99_ratio": med(open_fig["p99_ratio"]["floor"]),
        "aa_p99_ratio": med(open_fig["p99_ratio"]["untraced2"]),
        "aa_p99_ratio_ci95": open_fig["p99_ratio"]["untraced2"]["ci95"],
        "aa_p99_noise": aa_noise([v for _, v in p99["untraced2"]]),
        "lost_events": sum(int(s.get("lost") or 0) for s in agent_sessions) if agent_sessions else None,
        "agent_rss_mb": max((s["rss_mb"] for s in agent_sessions if s.get("rss_mb")), default=None),
        # below 1 the agent shed host pairs (it could not keep up): it then did less work per message
        "agent_sampling": median(s.get("sampling") for s in agent_sessions),
        "agent_start_s": median(s.get("start_s") for s in agent_sessions),
        "agent_bpf_ns_per_message": out["bpf"]["open"]["agent"].get("ns_per_message_without_wire"),
        "floor_bpf_ns_per_message": out["bpf"]["open"]["floor"].get("ns_per_message_without_wire"),
        # the old bench.overhead figure (closed loop, nothing pinned), for continuity
        "closed_throughput_ratio": med(shared["agent"]),
        "closed_throughput_ratio_ci95": shared["agent"]["ci95"],
        "floor_closed_throughput_ratio": med(shared["floor"]),
        "aa_closed_throughput_noise": aa_noise([v for _, v in paired(windows, c, SHARED, "untraced2", _tput,
                                                                     "ratio")]),
    }
    # how many rounds the intervals resample: with 2, an interval only spans the two rounds' medians
    cost["open_rounds"] = len({w.round for w in windows if w.phase == o})
    cost["closed_rounds"] = len({w.round for w in windows if w.phase == c})
    out["cost"] = cost
    return out


def aa_noise_abs(diffs: list[tuple[int, float | None]]) -> float | None:
    """Median |A/A difference|: a with/without difference smaller than this is noise."""
    v = [abs(x) for _, x in diffs if x is not None]
    return float(np.median(v)) if v else None


# ---------------------------------------------------------------- measuring (root)

def prog_stats(pid: int) -> dict[int, dict]:
    """{prog id: {"name", "run_time_ns", "run_cnt"}} of the BPF programs process pid holds
    (its fds' fdinfo), from `bpftool prog show` (counted while BPF stats are on)."""
    ids = {int(kv["prog_id"]) for kv in bpf_prog_fdinfo(pid) or [] if kv.get("prog_id", "").isdigit()}
    if not ids:
        return {}
    got = subprocess.run(["bpftool", "prog", "show", "--json"], capture_output=True, text=True, timeout=30)
    if got.returncode != 0:
        raise RuntimeError(f"bpftool prog show failed: {got.stderr.strip()[:300]}")
    return {p["id"]: {"name": p.get("name", f"id{p['id']}"), "run_time_ns": int(p.get("run_time_ns", 0)),
                      "run_cnt": int(p.get("run_cnt", 0))}
            for p in json.loads(got.stdout) if p.get("id") in ids}


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


@dataclass
class Ctx:
    cluster: object
    groups: object
    tmp: Path
    window_s: float
    settle_s: float
    log: object
    sessions: dict = field(default_factory=dict)   # condition -> [tracer session reports]


def place(groups, placement: str) -> None:
    if placement == PINNED:
        groups["job"].set_cpus(JOB_CPUS)
        groups["tracer"].set_cpus(TRACER_CPUS)
        groups["wire"].set_cpus(TRACER_CPUS)
    else:
        for g in GROUPS:
            groups[g].set_cpus(groups.all_cpus())


def measure(ctx: Ctx, tracer: Tracer | None, w: Window) -> Window:
    b0 = prog_stats(tracer.pid) if tracer else {}
    f0 = ctx.cluster.forwarder_stats()
    c0 = {g: ctx.groups[g].usage_ns() for g in GROUPS}
    w.t0_ns = time.monotonic_ns()
    time.sleep(ctx.window_s)
    w.t1_ns = time.monotonic_ns()
    c1 = {g: ctx.groups[g].usage_ns() for g in GROUPS}
    f1 = ctx.cluster.forwarder_stats()
    b1 = prog_stats(tracer.pid) if tracer else {}
    w.cpu_ns = {g: c1[g] - c0[g] for g in GROUPS}
    w.wire_frames = {"in": f1.get("frames_in", 0) - f0.get("frames_in", 0),
                     "out": f1.get("records_out", 0) - f0.get("records_out", 0)}
    w.bpf = bpf_delta(b0, b1)
    w.loadavg_1m = loadavg()[0]
    return w


def caught_up(ps_out: Path, since_ns: int, lag_ms: float = CATCH_UP_LAG_MS) -> bool:
    """An open-loop job issues on time again: in every worker's newest truth shard
    (written within the last second, after since_ns), p99 of issue - due < lag_ms."""
    import pyarrow.parquet as pq

    newest: dict[str, Path] = {}
    for f in (ps_out / "truth").glob("worker-*.parquet"):
        prefix = f.name.rsplit("-", 1)[0]
        if prefix not in newest or f.name > newest[prefix].name:
            newest[prefix] = f
    if len(newest) < WORKERS:
        return False
    for f in newest.values():
        try:
            t = pq.read_table(f, columns=["t_scheduled_ns", "t_issued_ns"]).to_pandas()
        except Exception:
            return False   # being replaced: look again
        t = t.dropna()
        if t.empty or int(t["t_scheduled_ns"].max()) < since_ns:
            return False
        lag_ms_p99 = float(np.percentile((t["t_issued_ns"] - t["t_scheduled_ns"]).to_numpy(dtype=np.float64), 99)) / 1e6
        if lag_ms_p99 > lag_ms:
            return False
    return True


def wait_caught_up(ps_out: Path, log) -> None:
    t0 = time.monotonic()
    since = time.monotonic_ns()
    while time.monotonic() - t0 < CATCH_UP_MAX_S:
        time.sleep(0.5)
        if caught_up(ps_out, since):
            return
    log(f"  (the open-loop job had not caught up after {CATCH_UP_MAX_S:g} s; measuring anyway)")


def make_tracer(condition: str, out: Path, hosts: list[str]) -> Tracer | None:
    if condition == "agent":
        return agent_tracer(out / "agent", hosts)
    if condition == "floor":
        return floor_tracer()
    return None


def run_block(ctx: Ctx, phase: str, rnd: int, condition: str, windows: int, placements: tuple[str, ...],
              ps_out: Path, open_loop: bool) -> list[Window]:
    out = ctx.tmp / f"{phase}-r{rnd}-{condition}"
    hosts = [h.name for h in ctx.cluster.hosts]
    tracer = make_tracer(condition, out, hosts)
    ws: list[Window] = []
    session: dict = {"phase": phase, "round": rnd}
    try:
        if tracer is not None:
            t0 = time.monotonic()
            with ctx.groups.joined("tracer"):   # the tracer (and its compiler) start in its group
                tracer.start()
            session["start_s"] = round(time.monotonic() - t0, 1)
            session["ready_line"] = next((ln.strip() for ln in tracer.stderr if "ready:" in ln), None)
        time.sleep(ctx.settle_s)
        if open_loop:
            wait_caught_up(ps_out, ctx.log)
        for pl in placements:
            place(ctx.groups, pl)
            time.sleep(PLACE_SETTLE_S)
            for k in range(windows):
                ws.append(measure(ctx, tracer, Window(phase, pl, rnd, condition, k, 0, 0)))
        place(ctx.groups, SHARED)
        if tracer is not None:
            session["rss_mb"] = tracer.rss_mb()
            session["cpu_s"] = tracer.cpu_s()
            tracer.stop()
            if condition == "agent":
                c = agent_counters(out / "agent")
                session.update(lost=c["lost"], lost_by_probe={p: v.get("lost", 0) for p, v in c["probes"].items()},
                               messages=c["messages"], rows_dropped=c["rows_dropped"], sampling=c["sampling_rate"])
            else:
                session["hits"] = floor_hits(tracer).get("hits_total")
    except Exception as e:   # one failed block must not lose the others: counted and said
        session["error"] = f"{type(e).__name__}: {e}"
        ws.append(Window(phase, SHARED, rnd, condition, -1, 0, 0, error=session["error"]))
    finally:
        if tracer is not None:
            tracer.kill()
        place(ctx.groups, SHARED)
    if tracer is not None:
        ctx.sessions.setdefault(condition, []).append(session)
    extra = (f", tracer ready in {session['start_s']} s" if "start_s" in session else "") + \
        (f", {session['lost']:,} events lost {session['lost_by_probe']}" if session.get("lost") is not None else "") + \
        (f" FAILED: {session['error'].splitlines()[0][:300]}" if session.get("error") else "")
    ctx.log(f"{phase:6s} round {rnd} {condition:9s}: {len([w for w in ws if not w.error])} windows{extra}")
    return ws


def run_phase(ctx: Ctx, phase: str, rounds: int, windows_per_block: int, placements: tuple[str, ...],
              job_opts: dict) -> list[Window]:
    from workloads.psbench.launch import launch_in_cluster

    open_loop = "rate" in job_opts
    ps_out = ctx.tmp / f"ps-{phase}"
    with ctx.groups.joined("job"):   # the job's processes are forked in the job's group
        job = launch_in_cluster(ctx.cluster, ps_out, servers=SERVERS, workers=WORKERS, duration_s=JOB_MAX_S,
                                server_delay_ms=SERVER_DELAY_MS, **job_opts)
    windows: list[Window] = []
    with job:
        job.wait_ready()
        for rnd in range(rounds):
            for cond in balanced_order(rnd, CONDITIONS):
                windows += run_block(ctx, phase, rnd, cond, windows_per_block, placements, ps_out, open_loop)
        job.stop()   # SIGTERM: every process flushes its truth
    fill_job(windows, job.truth(), open_loop)
    for w in windows:
        if not w.error and w.index == 0:
            ctx.log(describe_window(w))
    return windows


def describe_window(w: Window) -> str:
    head = f"{w.phase:6s} {w.placement:6s} round {w.round} {w.condition:9s} #{w.index}"
    if w.error:
        return f"{head} FAILED: {w.error.splitlines()[0][:300]}"
    j = w.job

    def us(g):
        v = w.per_message_us(g)
        return "n/a" if v is None else f"{v:.1f}"
    return (f"{head}: {j['slices_per_s_window']:,.0f} slices/s, p99 {j['p99_us'] / 1e3:.2f} ms; CPU us/message "
            f"job {us('job')} tracer {us('tracer')} wire {us('wire')}; load {w.loadavg_1m}")


def _f(x, fmt="{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def _ci(x) -> str:
    return "n/a" if not x else f"[{x[0]:.3g}, {x[1]:.3g}]"


def summary_lines(s: dict, rate: float) -> list[str]:
    c = s["cost"]
    o = s["open"]
    lines = [
        f"open loop at {rate:.1f} requests/s per worker, {o['pairs']} pairs ({o['aa_pairs']} A/A) in "
        f"{c['open_rounds']} rounds; [95% intervals, rounds resampled]:",
        f"  untraced job CPU {_f(c['job_cpu_us_per_message'], '{:.1f}')} us/message",
        f"  agent: own CPU {_f(c['agent_cpu_us_per_message'], '{:.1f}')} us/message "
        f"{_ci(c['agent_cpu_us_per_message_ci95'])} ({_f(c['agent_cpu_share_of_job'], '{:.1%}')} of the job's); "
        f"job's extra CPU {_f(c['job_extra_cpu_us_per_message'], '{:.1f}')} us/message "
        f"{_ci(c['job_extra_cpu_us_per_message_ci95'])} ({_f(c['job_extra_share'], '{:.1%}')}); wire's extra "
        f"{_f(c['wire_extra_cpu_us_per_message'], '{:.1f}')}",
        f"  floor: job's extra CPU {_f(c['floor_job_extra_cpu_us_per_message'], '{:.1f}')} us/message "
        f"{_ci(c['floor_job_extra_cpu_us_per_message_ci95'])} ({_f(c['floor_job_extra_share'], '{:.1%}')}); "
        f"wire's extra {_f(c['floor_wire_extra_cpu_us_per_message'], '{:.1f}')}; A/A |difference| "
        f"{_f(c['aa_job_cpu_us_per_message_noise'], '{:.1f}')} us/message",
        f"  p99 from due: agent/untraced {_f(c['open_p99_ratio'])} {_ci(c['open_p99_ratio_ci95'])}, floor "
        f"{_f(c['floor_open_p99_ratio'])}; A/A {_f(c['aa_p99_ratio'])} {_ci(c['aa_p99_ratio_ci95'])}, noise "
        f"+-{_f(c['aa_p99_noise'])}",
        f"  BPF ns/message (wire namespace taken out): agent {_f(c['agent_bpf_ns_per_message'], '{:,.0f}')}, floor "
        f"{_f(c['floor_bpf_ns_per_message'], '{:,.0f}')}",
        f"closed loop ({c['closed_rounds']} rounds: an interval over 2 rounds spans their medians, no more): pinned "
        f"(job CPU {JOB_CPUS}, tracer + wire CPU {TRACER_CPUS}) throughput loss agent "
        f"{_f(c['pinned_throughput_loss'])} {_ci(c['pinned_throughput_loss_ci95'])}, floor "
        f"{_f(c['floor_pinned_throughput_loss'])} {_ci(c['floor_pinned_throughput_loss_ci95'])}, A/A noise "
        f"+-{_f(c['aa_pinned_throughput_noise'])}",
        f"  shared CPUs (the old bench.overhead figure): throughput ratio agent {_f(c['closed_throughput_ratio'])} "
        f"{_ci(c['closed_throughput_ratio_ci95'])}, floor {_f(c['floor_closed_throughput_ratio'])}, A/A noise "
        f"+-{_f(c['aa_closed_throughput_noise'])}",
        f"agent: {c['lost_events']} events lost in all, RSS up to {_f(c['agent_rss_mb'], '{:.0f}')} MB, host pairs "
        f"sampled {_f(c['agent_sampling'], '{:.2f}')} (median per session; < 1: it shed load), ready "
        f"{_f(c['agent_start_s'], '{:.0f}')} s after its start",
        "  (BPF runs count every process on the machine: on shared cores other jobs' syscalls and packets are "
        "charged to our messages too)",
    ]
    for name, d in sorted(s["bpf"]["open"].get("agent", {}).get("programs", {}).items()):
        lines.append(f"  agent BPF {name:15s} {_f(d['runs_per_message'], '{:6.2f}')} runs/message "
                     f"{_f(d['ns_per_run'], '{:6.0f}')} ns/run {_f(d['ns_per_message_without_wire'], '{:7.0f}')} "
                     f"ns/message without the wire's runs")
    return lines


# ---------------------------------------------------------------- main

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=at_least(1), default=20,
                    help="open loop: agent/untraced window pairs (rounds = pairs / --windows) [%(default)s]")
    ap.add_argument("--closed-pairs", type=at_least(0), default=12,
                    help=f"closed loop: window pairs per placement, over {CLOSED_ROUNDS} rounds (0: skip; then give "
                         "--rate) [%(default)s]")
    ap.add_argument("--windows", type=at_least(1), default=5,
                    help="windows per condition block (each tracer start gives this many) [%(default)s]")
    ap.add_argument("--duration-s", type=positive(float), default=3.0, help="seconds of each window [%(default)s]")
    ap.add_argument("--settle-s", type=float, default=2.0,
                    help="seconds after a tracer is ready before its first window [%(default)s]")
    ap.add_argument("--rate", type=positive(float), default=None,
                    help="open loop: requests/s per worker [half the untraced closed loop's]")
    ap.add_argument("--record", type=Path, default=None, metavar="FILE.gz",
                    help="instead: write a steady-state recording for bench/consumer")
    ap.add_argument("--record-s", type=positive(float), default=30.0, help="seconds of the recording's job "
                                                                           "[%(default)s]")
    a = ap.parse_args(argv)
    if a.settle_s < 0:
        ap.error(f"--settle-s {a.settle_s:g}: give 0 or more seconds")
    if a.closed_pairs == 0 and a.rate is None:
        ap.error("--closed-pairs 0 skips the closed loop that measures the open-loop rate: give --rate too")
    if a.record is not None and a.record.suffix != ".gz":
        ap.error(f"--record {a.record}: give a .gz path (the recording is compressed)")
    a.rounds = math.ceil(a.pairs / a.windows)
    # closed loop: two rounds (the fewest an interval can come from), the pairs split between them
    a.closed_rounds = min(CLOSED_ROUNDS, a.closed_pairs)
    a.closed_windows = math.ceil(a.closed_pairs / a.closed_rounds) if a.closed_rounds else 0
    return a


def open_rate(windows: list[Window]) -> float | None:
    """Half the untraced closed loop's requests/s per worker (shared CPUs)."""
    r = median(w.job.get("requests_per_s") for w in windows
               if w.phase == "closed" and w.placement == SHARED and w.condition == "untraced" and not w.error and w.job)
    return None if r is None else r / WORKERS / 2


def record(ctx: Ctx, path: Path, rate: float, seconds: float) -> dict:
    """The agent with --record, then an open-loop job of `seconds`; the file gzip-compressed."""
    from workloads.psbench.launch import launch_in_cluster

    raw = ctx.tmp / "recording.rec"
    hosts = [h.name for h in ctx.cluster.hosts]
    # every host pair kept (a recording of a shedding agent would hold half the job), and
    # the agent ahead of other work on these shared cores: a recording is for its events,
    # not for what it costs, and one that lost events replays a different job
    tracer = agent_tracer(ctx.tmp / "rec-agent", hosts, ["--record", str(raw), "--sample-rate", "1", "--nice", "-10"])
    with ctx.groups.joined("tracer"):
        tracer.start()
    try:
        with ctx.groups.joined("job"):
            job = launch_in_cluster(ctx.cluster, ctx.tmp / "ps-rec", servers=SERVERS, workers=WORKERS,
                                    duration_s=seconds, server_delay_ms=SERVER_DELAY_MS, rate=rate)
        with job:
            job.wait()
        tracer.stop()
    finally:
        tracer.kill()
    c = agent_counters(ctx.tmp / "rec-agent")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
    figs = job_figures(job.truth(), 1.0, open_loop=True)
    return {"recording": str(path), "bytes": path.stat().st_size, "raw_bytes": raw.stat().st_size,
            "rate_per_worker": rate, "seconds": seconds, "job_messages": figs["messages_all"],
            "agent_messages": c["messages"], "lost": c["lost"], "seen": c["seen"],
            "lost_by_probe": {p: v.get("lost", 0) for p, v in c["probes"].items()}}


def main(argv=None) -> int:
    a = parse_args(argv)
    from core.errors import require_root
    from bench.cgroups import Groups
    from workloads.cluster.cluster import Cluster

    require_root("bench.cost")

    def log(line: str) -> None:
        print(line, flush=True)

    t_start = time.monotonic()
    load_start = loadavg()
    log(f"load average at start: {load_start}")
    windows: list[Window] = []
    with tempfile.TemporaryDirectory(prefix="pslat-bench-cost-") as tmp_s, BpfStats() as stats, \
            Groups("cost", GROUPS) as groups:
        tmp = Path(tmp_s)
        if stats.error:
            log(f"(no in-kernel BPF times: {stats.error})")
        with Cluster(HOSTS, wire_delay_ms=WIRE_DELAY_MS, wait_s=CLUSTER_WAIT_S, log_dir=tmp / "wire") as cluster:
            groups["wire"].add(cluster.describe()["forwarder_pid"])
            ctx = Ctx(cluster, groups, tmp, a.duration_s, a.settle_s, log)
            rate = a.rate
            if a.closed_pairs and not (a.record is not None and a.rate):   # a recording at a given rate needs none
                windows += run_phase(ctx, "closed", a.closed_rounds, a.closed_windows, (SHARED, PINNED), {})
                rate = rate or open_rate(windows)
                if rate is None:
                    raise SystemExit("bench.cost: no untraced closed-loop window to take the open-loop rate from; "
                                     "see the lines above, or give --rate")
            if a.record is not None:
                rec = record(ctx, a.record, rate, a.record_s)
                log(f"recording: {rec['bytes'] / 1e6:.1f} MB ({rec['raw_bytes'] / 1e6:.1f} MB raw), "
                    f"{rec['agent_messages']:,} messages, {rec['lost']} events lost")
                print(json_line(rec | {"loadavg": [load_start, loadavg()]}), flush=True)
                return 0 if not rec["lost"] else 1
            log(f"open loop at {rate:.1f} requests/s per worker")
            windows += run_phase(ctx, "open", a.rounds, a.windows, (SHARED,), {"rate": rate})
    s = summarize(windows, program_hooks(), ctx.sessions)
    for line in summary_lines(s, rate):
        log(line)
    load_end = loadavg()
    log(f"load average at end: {load_end}")
    s["cost"]["loadavg_1m"] = median([load_start[0], load_end[0]] + [w.loadavg_1m for w in windows])
    s["config"] = {"servers": SERVERS, "workers": WORKERS, "wire_delay_ms": WIRE_DELAY_MS,
                   "server_delay_ms": SERVER_DELAY_MS, "rate_per_worker": rate, "pairs": a.pairs,
                   "closed_pairs": a.closed_pairs, "windows_per_block": a.windows, "window_s": a.duration_s,
                   "settle_s": a.settle_s, "cgroups": "v1 cpuacct.usage + cpuset", "bpf_stats": stats.error or "on",
                   "loadavg_start": load_start, "loadavg_end": load_end,
                   "elapsed_s": round(time.monotonic() - t_start, 1)}
    s["sessions"] = ctx.sessions
    s["windows"] = [{"phase": w.phase, "placement": w.placement, "round": w.round, "condition": w.condition,
                     "index": w.index, "cpu_ns": w.cpu_ns, "wire_frames": w.wire_frames, "loadavg_1m": w.loadavg_1m,
                     "job": {k: w.job.get(k) for k in ("messages_all", "slices", "slices_per_s_window", "p99_us",
                                                       "p50_us")},
                     "error": w.error} for w in windows]
    print(json_line(s), flush=True)
    return 1 if any(w.error for w in windows) else 0


if __name__ == "__main__":
    from core.errors import run_main

    sys.exit(run_main("bench.cost", main))
