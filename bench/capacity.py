"""How much traffic the agent follows: psbench (2 servers x 4 workers) in the
virtual cluster traced by `pslat agent` (default settings, one agent for all
hosts), beside bench.floor (a program that only counts hits on the same hooks)
on the same traffic. Root.

    python -m bench.capacity [--rates 10,25,50,100,200,400] [--step-s 8] [--rss-duration-s 600]

1. Steps: open loop at each --rates (requests/s per worker, ascending), then
   closed loop (the highest rate the job reaches). Each step: a fresh agent,
   one job, the agent's counters from the run dirs' meta.json. Stepping stops
   at the first step that loses events (or when the job no longer reaches the
   rate asked for; the closed-loop step still runs). Per step: message rate
   (ps-lite requests + responses per second, from psbench's truth), events
   lost, the agent's CPU seconds per 100k messages (/proc/PID/stat, from ready
   to idle after the job) and the in-kernel time of its BPF programs per
   message (fdinfo run_time_ns, with kernel BPF stats on for the bench). Then
   the floor on the same steps: hits and BPF time per message.
2. Memory: one agent over an open-loop job of --rss-duration-s at --rss-rate;
   its RSS sampled every --rss-interval-s; the least-squares slope over the
   run after the first --rss-warmup-s says whether it is flat.

Prints a line per step and per phase, then one JSON line (last):
{"max_rate_no_loss_msgs_per_s", "cpu_s_per_100k_messages", "rss": {...},
 "floor": {...}, "steps": [...]}
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.common import (BpfStats, Tracer, agent_counters, agent_tracer, floor_hits, floor_tracer, job_figures,
                          json_line, linear_fit, positive, ratio, slope_per_s)

SERVERS, WORKERS = 2, 4
HOSTS = SERVERS + WORKERS
CLUSTER_WAIT_S = 600
RSS_BUDGET_MB = 400.0
SATURATED = 0.9        # a step whose achieved rate is below this share of the asked rate: the job's limit
IDLE_POLL_S = 0.25
IDLE_MAX_S = 15.0
CLOSED = "closed"


def parse_rates(text: str) -> list[float]:
    try:
        rates = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--rates {text!r}: give comma-separated numbers") from None
    if not rates or any(not r > 0 for r in rates) or rates != sorted(set(rates)):
        raise argparse.ArgumentTypeError(f"--rates {text!r}: give positive rates in ascending order, each once")
    return rates


def wait_idle(t: Tracer) -> float | None:
    """Wait until the tracer's CPU time stops growing (it has worked off the job's
    events); returns its CPU seconds then."""
    deadline = time.monotonic() + IDLE_MAX_S
    last = t.cpu_s()
    while time.monotonic() < deadline:
        time.sleep(IDLE_POLL_S)
        now = t.cpu_s()
        if now is None or last is None or now - last < 0.01:   # under 4% of one core: idle
            return now
        last = now
    return last


def _job(cluster, out: Path, rate: float | str, duration_s: float, warmup_s: float) -> dict:
    from workloads.psbench.launch import launch_in_cluster

    opts = {} if rate == CLOSED else {"rate": rate}
    with launch_in_cluster(cluster, out, servers=SERVERS, workers=WORKERS, duration_s=duration_s, **opts) as j:
        j.wait()
    return job_figures(j.truth(), warmup_s, open_loop=rate != CLOSED)


def step(cluster, tracer: Tracer, out: Path, rate, duration_s: float, warmup_s: float) -> dict:
    """One job under a tracer; the tracer's cost per job message."""
    tracer.start()
    try:
        cpu0, bpf0, t0 = tracer.cpu_s(), tracer.bpf(), time.monotonic()
        job = _job(cluster, out / "ps", rate, duration_s, warmup_s)
        cpu1 = wait_idle(tracer)
        bpf1, rss, wall_s = tracer.bpf(), tracer.rss_mb(), time.monotonic() - t0
        tracer.stop()
    finally:
        tracer.kill()
    msgs = job["messages_all"]
    r = {"rate_per_worker": rate, "messages_per_s": 2 * job["slices_per_s"], "achieved_slices_per_s": job["slices_per_s"],
         "job_messages": msgs, "p99_us": job["p99_us"], "rss_mb": rss, "wall_s": wall_s,
         "cpu_s": None if cpu0 is None or cpu1 is None else cpu1 - cpu0}
    r["cpu_s_per_100k_messages"] = ratio(None if r["cpu_s"] is None else r["cpu_s"] * 1e5, msgs)
    if bpf0 and bpf1:
        run_ns, runs = bpf1["run_time_ns"] - bpf0["run_time_ns"], bpf1["run_cnt"] - bpf0["run_cnt"]
        r.update(bpf_ns=run_ns, bpf_ns_per_message=ratio(run_ns, msgs), bpf_runs_per_message=ratio(runs, msgs),
                 bpf_ns_per_run=ratio(run_ns, runs))
    return r


def run_steps(cluster, tmp: Path, rates: list, duration_s: float, warmup_s: float, log) -> list[dict]:
    hosts = [h.name for h in cluster.hosts]

    def one(k: int, rate) -> dict:
        out = tmp / f"step{k}"
        try:
            r = step(cluster, agent_tracer(out / "agent", hosts), out, rate, duration_s, warmup_s)
            c = agent_counters(out / "agent")
            r.update(lost=c["lost"], lost_by_probe={p: v["lost"] for p, v in c["probes"].items()},
                     agent_messages=c["messages"], rows_dropped=c["rows_dropped"], undecodable=c["undecodable"])
        except Exception as e:
            r = {"rate_per_worker": rate, "error": f"{type(e).__name__}: {e}"}
        log(describe_step(r))
        return r

    steps = []
    for k, rate in enumerate(rates):
        r = one(k, rate)
        steps.append(r)
        why = ("failed" if r.get("error") else "events lost" if r["lost"] else
               "job saturated" if r["achieved_slices_per_s"] < SATURATED * asked_slices_per_s(rate) else None)
        if why:   # higher open-loop rates would lose more or not be reached: the job's own max is next
            if rate != rates[-1]:
                log(f"  (stepping stops: {why})")
            break
    steps.append(one(len(rates), CLOSED))
    return steps


# psbench's default requests (16 Zipf keys over 2 servers) nearly always touch both
# servers; "saturated" compares with a slightly lower share so that a request that
# hits one server only does not read as a shortfall.
SLICE_SHARE = 0.95


def asked_slices_per_s(rate: float) -> float:
    """Slices/s an open-loop rate (requests/s per worker) asks for."""
    return rate * WORKERS * SERVERS * SLICE_SHARE


def run_floor(cluster, tmp: Path, rates: list, duration_s: float, warmup_s: float, log) -> list[dict]:
    out = []
    for k, rate in enumerate(rates):
        d = tmp / f"floor{k}"
        try:
            t = floor_tracer()
            r = step(cluster, t, d, rate, duration_s, warmup_s)
            hits = floor_hits(t).get("hits_total")
            r.update(hits=hits, hits_per_message=ratio(hits, r["job_messages"]))
        except Exception as e:
            r = {"rate_per_worker": rate, "error": f"{type(e).__name__}: {e}"}
        out.append(r)
        log(describe_step(r, floor=True))
    return out


def rss_run(cluster, tmp: Path, rate: float, duration_s: float, interval_s: float, warmup_s: float,
            flat_mb: float) -> dict:
    from workloads.psbench.launch import launch_in_cluster

    hosts = [h.name for h in cluster.hosts]
    t = agent_tracer(tmp / "agent", hosts)
    samples: list[tuple[float, float]] = []
    t.start()
    try:
        cpu0 = t.cpu_s()
        t0 = time.monotonic()
        with launch_in_cluster(cluster, tmp / "ps", servers=SERVERS, workers=WORKERS, duration_s=duration_s,
                               rate=rate) as j:
            next_at = t0
            while True:
                done = all(p.popen.poll() is not None for p in j.procs)
                now = time.monotonic()
                if now >= next_at:
                    rss = t.rss_mb()
                    if rss is None:
                        raise RuntimeError(f"the agent exited during the memory run: {''.join(t.stderr)[-2000:]}")
                    samples.append((now - t0, rss))
                    next_at = now + interval_s
                if done:
                    break
                time.sleep(min(0.2, max(0.0, next_at - time.monotonic())))
            j.wait()
        cpu1 = wait_idle(t)
        samples.append((time.monotonic() - t0, t.rss_mb()))
        t.stop()
    finally:
        t.kill()
    job = job_figures(j.truth(), 1.0, open_loop=True)
    c = agent_counters(tmp / "agent")
    first_loss_ns = t.first_line_ns("events lost")   # the agent says so within a second of a loss
    return rss_summary(samples, warmup_s, duration_s, flat_mb) | {
        "rate_per_worker": rate, "messages_per_s": 2 * job["slices_per_s"], "job_messages": job["messages_all"],
        "lost": c["lost"], "lost_by_probe": {p: v["lost"] for p, v in c["probes"].items()},
        "first_loss_s": None if first_loss_ns is None else round((first_loss_ns / 1e9) - t0, 1),
        "cpu_s": cpu1 - cpu0,
        "cpu_s_per_100k_messages": ratio((cpu1 - cpu0) * 1e5, job["messages_all"])}


def rss_summary(samples: list[tuple[float, float]], warmup_s: float, duration_s: float, flat_mb: float = 16.0) -> dict:
    """RSS samples (seconds since start, MB) -> start/half/end/max, the slope after the
    warm-up and over the second half. Flat: the second half's slope, kept up for the
    whole run, would add less than flat_mb (memory that fills up to a bound early and
    then stays is flat; memory that keeps growing is not)."""
    fit = [(t, r) for t, r in samples if t >= warmup_s] or samples
    late = [(t, r) for t, r in samples if t >= duration_s / 2] or fit
    slope = slope_per_s([t for t, _ in fit], [r for _, r in fit])
    slope_late = slope_per_s([t for t, _ in late], [r for _, r in late])
    rss = [r for _, r in samples]
    growth = None if slope_late is None else slope_late * duration_s
    half = next((r for t, r in samples if t >= duration_s / 2), None)
    return {"samples": len(samples), "rss_start_mb": rss[0] if rss else None, "rss_half_mb": half,
            "rss_end_mb": rss[-1] if rss else None, "rss_max_mb": max(rss) if rss else None,
            "slope_mb_per_min": None if slope is None else slope * 60,
            "slope_second_half_mb_per_min": None if slope_late is None else slope_late * 60,
            "extrapolated_growth_mb": growth,
            "flat": None if growth is None else abs(growth) < flat_mb, "flat_threshold_mb": flat_mb,
            "under_budget": None if not rss else max(rss) < RSS_BUDGET_MB, "budget_mb": RSS_BUDGET_MB,
            "series": [[round(t, 1), round(r, 1)] for t, r in samples]}


def _f(x, fmt="{:,.0f}"):
    return "n/a" if x is None else fmt.format(x)


def describe_step(r: dict, floor: bool = False) -> str:
    rate = r["rate_per_worker"]
    head = f"{'floor' if floor else 'agent'} {'closed loop' if rate == CLOSED else f'{rate:g} req/s/worker':>18s}:"
    if r.get("error"):
        return f"{head} FAILED: {r['error'].splitlines()[0][:300]}"
    tail = (f"{_f(r.get('hits'))} hits ({_f(r.get('hits_per_message'), '{:.1f}')}/message)" if floor else
            f"{_f(r['lost'])} events lost {r['lost_by_probe']}, {_f(r['agent_messages'])} messages recorded")
    return (f"{head} {_f(r['messages_per_s'])} messages/s (p99 {_f(r['p99_us'] / 1e3, '{:.1f}')} ms); "
            f"{_f(r['cpu_s_per_100k_messages'], '{:.1f}')} CPU s/100k messages, BPF "
            f"{_f(r.get('bpf_ns_per_message'), '{:,.0f}')} ns/message ({_f(r.get('bpf_ns_per_run'), '{:.0f}')} ns/run), "
            f"RSS {_f(r['rss_mb'])} MB; {tail}")


def marginal(steps: list[dict], key: str) -> dict | None:
    """Cost per message beyond the idle cost: a line through (messages/s, key/s) of
    the steps (a tracer also pays for hook hits of other processes on the machine,
    which per-message figures at low rates would charge to the job)."""
    pts = [(s["job_messages"] / s["wall_s"], s[key] / s["wall_s"]) for s in steps
           if not s.get("error") and s.get(key) is not None and s.get("wall_s")]
    fit = linear_fit([x for x, _ in pts], [y for _, y in pts])
    if fit is None:
        return None
    return {"per_message": fit[1], "per_100k_messages": fit[1] * 1e5, "idle_per_s": fit[0], "steps": len(pts)}


def headline(steps: list[dict], floor: list[dict], rss: dict | None) -> dict:
    ok = [s for s in steps if not s.get("error")]
    clean = [s for s in ok if s["lost"] == 0]
    best = max(clean, key=lambda s: s["messages_per_s"], default=None)
    closed = next((s for s in ok if s["rate_per_worker"] == CLOSED), None)
    out = {"max_rate_no_loss_msgs_per_s": best["messages_per_s"] if best else None,
           "max_rate_no_loss_step": best["rate_per_worker"] if best else None,
           "lowest_rate_with_loss_msgs_per_s": min((s["messages_per_s"] for s in ok if s["lost"] > 0), default=None),
           "closed_loop_lost": closed["lost"] if closed else None,
           "closed_loop_msgs_per_s": closed["messages_per_s"] if closed else None,
           "cpu_s_per_100k_messages": (rss or {}).get("cpu_s_per_100k_messages") or
           (best or {}).get("cpu_s_per_100k_messages"),
           "cpu_s_per_100k_messages_by_step": {str(s["rate_per_worker"]): s["cpu_s_per_100k_messages"] for s in ok},
           "bpf_ns_per_message_by_step": {str(s["rate_per_worker"]): s.get("bpf_ns_per_message") for s in ok},
           # steps that lost events did less work per message: not in the fit
           "cpu_marginal": marginal(clean, "cpu_s"), "bpf_marginal": marginal(clean, "bpf_ns"),
           "rss_max_mb_steps": max((s["rss_mb"] for s in ok if s.get("rss_mb")), default=None)}
    fl = [s for s in floor if not s.get("error")]
    out["floor"] = {"bpf_marginal": marginal(fl, "bpf_ns"),
                    "bpf_ns_per_message_by_step": {str(s["rate_per_worker"]): s.get("bpf_ns_per_message") for s in fl},
                    "hits_per_message_by_step": {str(s["rate_per_worker"]): s.get("hits_per_message") for s in fl},
                    "rss_mb": max((s["rss_mb"] for s in fl if s.get("rss_mb")), default=None),
                    "closed_loop_msgs_per_s": next((s["messages_per_s"] for s in fl if s["rate_per_worker"] == CLOSED),
                                                   None)}
    out["rss"] = rss
    return out


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="The highest message rate the agent follows without losing events, "
                                             "its CPU per message and its memory over a long run, beside the floor.")
    ap.add_argument("--rates", type=parse_rates, default=parse_rates("10,25,50,100,200,400"),
                    help="open-loop steps, requests/s per worker, ascending [10,25,50,100,200,400]")
    ap.add_argument("--step-s", type=positive(float), default=8.0, help="seconds of each step's job [%(default)s]")
    ap.add_argument("--warmup-s", type=float, default=1.0, help="first seconds of a job left out of its rate "
                                                                "[%(default)s]")
    ap.add_argument("--no-floor", action="store_true", help="skip the floor's steps")
    ap.add_argument("--rss-duration-s", type=float, default=600.0,
                    help="seconds of the memory run (0: skip it) [%(default)s]")
    ap.add_argument("--rss-rate", type=positive(float), default=25.0,
                    help="memory run: requests/s per worker [%(default)s]")
    ap.add_argument("--rss-interval-s", type=positive(float), default=5.0, help="RSS sampling period [%(default)s]")
    ap.add_argument("--rss-flat-mb", type=positive(float), default=16.0,
                    help="memory run: flat when the fitted growth over the run stays under this [%(default)s]")
    ap.add_argument("--rss-warmup-s", type=float, default=30.0,
                    help="memory run: seconds before the slope fit starts [%(default)s]")
    a = ap.parse_args(argv)
    if not 0 <= a.warmup_s < a.step_s:
        ap.error(f"--warmup-s {a.warmup_s:g}: give 0 <= warm-up < --step-s ({a.step_s:g})")
    if a.rss_duration_s < 0:
        ap.error(f"--rss-duration-s {a.rss_duration_s:g}: give 0 (skip) or a positive number of seconds")
    if a.rss_duration_s and not 0 <= a.rss_warmup_s < a.rss_duration_s:
        ap.error(f"--rss-warmup-s {a.rss_warmup_s:g}: give 0 <= warm-up < --rss-duration-s")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    from core.errors import require_root
    from workloads.cluster.cluster import Cluster

    require_root("bench.capacity")

    def log(line: str) -> None:
        print(line, flush=True)

    t_start = time.monotonic()
    rss = None
    with tempfile.TemporaryDirectory(prefix="pslat-bench-capacity-") as tmp_s, BpfStats() as stats:
        tmp = Path(tmp_s)
        if stats.error:
            log(f"(no in-kernel BPF times: {stats.error})")
        with Cluster(HOSTS, wait_s=CLUSTER_WAIT_S, log_dir=tmp / "wire") as cluster:
            steps = run_steps(cluster, tmp, list(a.rates), a.step_s, a.warmup_s, log)
            floor = [] if a.no_floor else run_floor(cluster, tmp, [s["rate_per_worker"] for s in steps],
                                                    a.step_s, a.warmup_s, log)
            if a.rss_duration_s:
                log(f"memory run: {a.rss_duration_s:g} s at {a.rss_rate:g} requests/s per worker ...")
                try:
                    rss = rss_run(cluster, tmp / "rss", a.rss_rate, a.rss_duration_s, a.rss_interval_s,
                                  a.rss_warmup_s, a.rss_flat_mb)
                except Exception as e:
                    rss = {"error": f"{type(e).__name__}: {e}"}
    h = headline(steps, floor, rss)
    log(f"highest rate with 0 lost events: {_f(h['max_rate_no_loss_msgs_per_s'])} messages/s "
        f"(step {h['max_rate_no_loss_step']}); lowest with losses: {_f(h['lowest_rate_with_loss_msgs_per_s'])} messages/s; "
        f"closed loop: {_f(h['closed_loop_msgs_per_s'])} messages/s, {_f(h['closed_loop_lost'])} events lost")
    cm, bm, fm = h["cpu_marginal"], h["bpf_marginal"], h["floor"]["bpf_marginal"]
    log(f"cost per message beyond idle (fit over the steps without loss): agent user space "
        f"{_f(cm and cm['per_100k_messages'], '{:.1f}')} CPU s/100k messages (idle {_f(cm and cm['idle_per_s'], '{:.2f}')} "
        f"cores), agent BPF {_f(bm and bm['per_message'], '{:,.0f}')} ns/message; floor BPF "
        f"{_f(fm and fm['per_message'], '{:,.0f}')} ns/message")
    if rss and not rss.get("error"):
        log(f"memory run: RSS {_f(rss['rss_start_mb'])} -> {_f(rss['rss_half_mb'])} (half-way) -> "
            f"{_f(rss['rss_end_mb'])} MB (max {_f(rss['rss_max_mb'])}, budget {RSS_BUDGET_MB:g}: "
            f"{'under' if rss['under_budget'] else 'OVER'}); slope {_f(rss['slope_mb_per_min'], '{:+.2f}')} MB/min "
            f"after the warm-up, {_f(rss['slope_second_half_mb_per_min'], '{:+.2f}')} MB/min in the second half: "
            f"{'flat' if rss['flat'] else 'GROWING'}")
        log(f"  {_f(rss['cpu_s_per_100k_messages'], '{:.1f}')} CPU s per 100k messages at {_f(rss['messages_per_s'])} "
            f"messages/s; {_f(rss['lost'])} events lost {rss['lost_by_probe']}"
            + (f", the first {rss['first_loss_s']:g} s into the run" if rss.get("first_loss_s") is not None else ""))
    elif rss:
        log(f"memory run FAILED: {rss['error'][:300]}")
    h["config"] = {"rates": list(a.rates), "step_s": a.step_s, "rss_duration_s": a.rss_duration_s,
                   "rss_rate": a.rss_rate, "bpf_stats": stats.error or "on",
                   "elapsed_s": round(time.monotonic() - t_start, 1)}
    h["steps"], h["floor_steps"] = steps, floor
    print(json_line(h), flush=True)
    failed = any(s.get("error") for s in steps + floor) or bool(rss and rss.get("error"))
    return 1 if failed else 0


if __name__ == "__main__":
    from core.errors import run_main

    sys.exit(run_main("bench.capacity", main))
