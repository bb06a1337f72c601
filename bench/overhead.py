"""What tracing costs the job: psbench in the virtual cluster without and with
`pslat agent` (default settings, one agent for all hosts), in runs interleaved
in one invocation, because these machines are noisy. Root.

    python -m bench.overhead [--settings production,worst] [--pairs 7] [--duration-s 5]

Settings (2 servers x 4 workers, one host each):
- production: 1 ms wire each way, 1 ms server delay. Throughput from a closed-
  loop job, p99 slice latency from an open-loop job at a fixed rate (--rate
  requests/s per worker; latency from when each request was due, so a late
  issue counts). Targets: throughput ratio (with/without) >= 0.99, p99 ratio
  <= 1.02, or within the A/A noise when that is wider.
- worst: no wire delay, no server delay, small requests, closed loop (the
  highest rate the job reaches). Beside the agent, bench.floor: a program that
  only counts hits on the agent's hooks. Target: our throughput loss within
  1.5x of the floor's.

--variant-args "ARGS" adds a condition "variant": the agent with these extra
options (e.g. "--nice 10"), measured in the same rounds, its ratios beside the
default agent's.

Each round runs every condition once, in an order rotated per round: a
baseline (no tracer), the agent, a second baseline (A/A: its ratio to the
first measures the noise with the same structure as with/without) and, in
`worst`, the floor. A condition runs its jobs under one tracer instance,
started before and stopped after them. Figures: per-round ratios to the
round's baseline, the median over rounds, and their spread.

Prints one line per run, a summary per setting, then one JSON line (last):
{"production": {"throughput_ratio", "p99_ratio", "aa_noise", ...},
 "worst": {"throughput_ratio", "floor_throughput_ratio", ...}}
"""
from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from bench.common import (Tracer, aa_noise, agent_counters, agent_tracer, at_least, floor_hits, floor_tracer,
                          job_figures, json_line, median, order_of, positive, ratio, spread, verdict)

SERVERS, WORKERS = 2, 4
HOSTS = SERVERS + WORKERS
CLUSTER_WAIT_S = 600       # one cluster per machine: wait for another bench's or test's
TARGETS = {"throughput_ratio": 0.99, "p99_ratio": 1.02, "floor_loss_factor": 1.5}


@dataclass(frozen=True)
class Job:
    """One psbench job of a condition: its name and launch_in_cluster's options."""
    name: str
    open_loop: bool
    opts: dict


@dataclass(frozen=True)
class Setting:
    name: str
    wire_delay_ms: float
    jobs: tuple[Job, ...]
    conditions: tuple[str, ...]


def settings(rate: float, small_keys: int, small_dim: int) -> dict[str, Setting]:
    base = ("baseline", "agent", "baseline2")
    prod = dict(server_delay_ms=1.0)
    small = dict(keys_per_request=small_keys, embedding_dim=small_dim, lens=False)
    return {
        "production": Setting("production", 1.0, (Job("closed", False, prod),
                                                  Job("open", True, dict(prod, rate=rate))), base),
        "worst": Setting("worst", 0.0, (Job("closed", False, small),), base + ("floor",)),
    }


@dataclass
class Run:
    setting: str
    round: int
    condition: str
    jobs: dict = field(default_factory=dict)     # job name -> job_figures
    tracer: dict = field(default_factory=dict)   # cpu, rss, lost events, hits
    error: str | None = None


AGENTS = ("agent", "variant")   # conditions that run pslat agent (variant: with --variant-args)


def _tracer(condition: str, out: Path, hosts: list[str], variant_args: Sequence[str] = ()) -> Tracer | None:
    if condition in AGENTS:
        return agent_tracer(out / "agent", hosts, variant_args if condition == "variant" else ())
    if condition == "floor":
        return floor_tracer()
    return None


def run_condition(cluster, s: Setting, rnd: int, condition: str, out: Path, duration_s: float,
                  warmup_s: float, variant_args: Sequence[str] = ()) -> Run:
    from workloads.psbench.launch import launch_in_cluster

    run = Run(s.name, rnd, condition)
    hosts = [h.name for h in cluster.hosts]
    tracer = _tracer(condition, out, hosts, variant_args)
    try:
        if tracer is not None:
            tracer.start()
            cpu0 = tracer.cpu_s()
        for job in s.jobs:
            with launch_in_cluster(cluster, out / f"ps-{job.name}", servers=SERVERS, workers=WORKERS,
                                   duration_s=duration_s, **job.opts) as j:
                j.wait()
            run.jobs[job.name] = job_figures(j.truth(), warmup_s, job.open_loop)
        if tracer is not None:
            run.tracer = {"cpu_s": tracer.cpu_s() - cpu0, "rss_mb": tracer.rss_mb()}
            tracer.stop()
            if condition in AGENTS:
                c = agent_counters(out / "agent")
                run.tracer.update(lost=c["lost"], messages=c["messages"], rows_dropped=c["rows_dropped"],
                                  sampling=c["sampling_rate"])
            else:
                run.tracer.update(hits=floor_hits(tracer).get("hits_total"))
    except Exception as e:   # one failed run must not lose the others: counted and said
        run.error = f"{type(e).__name__}: {e}"
    finally:
        if tracer is not None:
            tracer.kill()
    return run


def describe(run: Run) -> str:
    head = f"{run.setting:10s} round {run.round} {run.condition:9s}"
    if run.error:
        return f"{head} FAILED: {run.error.splitlines()[0][:300]}"
    parts = [f"{name}: {f['slices_per_s']:,.0f} slices/s p50 {f['p50_us'] / 1e3:.2f} ms p99 {f['p99_us'] / 1e3:.2f} ms"
             for name, f in run.jobs.items()]
    t = run.tracer
    if "lost" in t:
        parts.append(f"agent {t['cpu_s']:.1f} CPU s, {t['rss_mb']:.0f} MB, {t['messages']:,} messages, "
                     f"{t['lost']:,} events lost, sampling {t.get('sampling', 1.0):.3g}")
    elif "hits" in t:
        parts.append(f"floor {t['hits']:,} hits")
    return f"{head} " + "; ".join(parts)


def _metric(run: Run | None, job: str, key: str) -> float | None:
    if run is None or run.error or job not in run.jobs:
        return None
    return run.jobs[job].get(key)


def pair_ratios(runs: list[Run], condition: str, job: str, key: str, base: str = "baseline") -> list[float | None]:
    """Per round: condition's figure / the round's baseline figure."""
    by = {(r.round, r.condition): r for r in runs}
    rounds = sorted({r.round for r in runs})
    return [ratio(_metric(by.get((k, condition)), job, key), _metric(by.get((k, base)), job, key)) for k in rounds]


def summarize(s: Setting, runs: list[Run]) -> dict:
    runs = [r for r in runs if r.setting == s.name]
    out: dict = {"rounds": len({r.round for r in runs}), "failed_runs": sum(r.error is not None for r in runs)}
    tput_job = "closed"
    lat_job = "open" if any(j.name == "open" for j in s.jobs) else "closed"
    tp = pair_ratios(runs, "agent", tput_job, "slices_per_s")
    aa_tp = pair_ratios(runs, "baseline2", tput_job, "slices_per_s")
    p99 = pair_ratios(runs, "agent", lat_job, "p99_us")
    aa_p99 = pair_ratios(runs, "baseline2", lat_job, "p99_us")
    out.update(throughput_ratio=median(tp), p99_ratio=median(p99),
               aa_throughput_ratio=median(aa_tp), aa_p99_ratio=median(aa_p99),
               aa_noise_throughput=aa_noise(aa_tp), aa_noise_p99=aa_noise(aa_p99),
               throughput_ratios=spread(tp), p99_ratios=spread(p99),
               aa_throughput_ratios=spread(aa_tp), aa_p99_ratios=spread(aa_p99))
    noises = [x for x in (out["aa_noise_throughput"], out["aa_noise_p99"]) if x is not None]
    out["aa_noise"] = max(noises) if noises else None
    if lat_job != tput_job:
        out["p99_from_issue_ratio"] = median(pair_ratios(runs, "agent", lat_job, "p99_from_issue_us"))
        out["aa_p99_from_issue_ratio"] = median(pair_ratios(runs, "baseline2", lat_job, "p99_from_issue_us"))
        out["closed_p99_ratio"] = median(pair_ratios(runs, "agent", tput_job, "p99_us"))
        out["open_throughput_ratio"] = median(pair_ratios(runs, "agent", lat_job, "slices_per_s"))
    agent_runs = [r for r in runs if r.condition == "agent" and not r.error]
    out["agent_lost_events"] = [r.tracer.get("lost") for r in agent_runs]
    # an agent that lost events skipped part of its work: its ratio flatters it
    out["agent_runs_with_loss"] = sum(1 for r in agent_runs if r.tracer.get("lost"))
    out["agent_cpu_s"] = median(r.tracer.get("cpu_s") for r in agent_runs)
    out["agent_rss_mb"] = median(r.tracer.get("rss_mb") for r in agent_runs)
    base_runs = [r for r in runs if r.condition == "baseline" and not r.error]
    out["baseline_slices_per_s"] = median(_metric(r, tput_job, "slices_per_s") for r in base_runs)
    out["baseline_p99_us"] = median(_metric(r, lat_job, "p99_us") for r in base_runs)
    out["agent_sampling"] = median(r.tracer.get("sampling") for r in agent_runs)
    if any(r.condition == "variant" for r in runs):
        v_runs = [r for r in runs if r.condition == "variant" and not r.error]
        out["variant"] = {"throughput_ratio": median(pair_ratios(runs, "variant", tput_job, "slices_per_s")),
                          "p99_ratio": median(pair_ratios(runs, "variant", lat_job, "p99_us")),
                          "cpu_s": median(r.tracer.get("cpu_s") for r in v_runs),
                          "sampling": median(r.tracer.get("sampling") for r in v_runs),
                          "lost_events": [r.tracer.get("lost") for r in v_runs]}
    if "floor" in s.conditions:
        fl = pair_ratios(runs, "floor", tput_job, "slices_per_s")
        out["floor_throughput_ratio"] = median(fl)
        out["floor_throughput_ratios"] = spread(fl)
        out["floor_p99_ratio"] = median(pair_ratios(runs, "floor", tput_job, "p99_us"))
        loss, floor_loss = _loss(out["throughput_ratio"]), _loss(out["floor_throughput_ratio"])
        out["loss_vs_floor"] = ratio(loss, floor_loss)
        out["verdict"] = ("unmeasured" if loss is None or floor_loss is None else
                          "meets" if loss <= TARGETS["floor_loss_factor"] * max(floor_loss, 0.0) else "misses")
    else:
        out["verdict_throughput"] = verdict(out["throughput_ratio"], TARGETS["throughput_ratio"],
                                            out["aa_noise_throughput"], higher_is_better=True)
        out["verdict_p99"] = verdict(out["p99_ratio"], TARGETS["p99_ratio"], out["aa_noise_p99"],
                                     higher_is_better=False)
    return out


def _loss(r: float | None) -> float | None:
    return None if r is None else 1.0 - r


def _f(x: float | None, fmt: str = "{:.3f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def summary_lines(name: str, s: dict, rate: float, variant_args: str = "") -> list[str]:
    sp = s["throughput_ratios"]
    lines = [f"{name}: {s['rounds']} rounds, {s['failed_runs']} failed runs; baseline "
             f"{_f(s['baseline_slices_per_s'], '{:,.0f}')} slices/s, p99 {_f(s['baseline_p99_us'], '{:,.0f}')} us",
             f"  throughput with/without: median {_f(s['throughput_ratio'])} (pairs {_f(sp['min'])}.."
             f"{_f(sp['max'])}); A/A median {_f(s['aa_throughput_ratio'])}, noise +-{_f(s['aa_noise_throughput'])}",
             f"  p99 latency with/without: median {_f(s['p99_ratio'])} (pairs {_f(s['p99_ratios']['min'])}.."
             f"{_f(s['p99_ratios']['max'])}); A/A median {_f(s['aa_p99_ratio'])}, noise +-{_f(s['aa_noise_p99'])}"]
    if "closed_p99_ratio" in s:
        lines.append(f"  open loop at {rate:g} req/s per worker: p99 counted from the issue (not from when due) "
                     f"ratio {_f(s['p99_from_issue_ratio'])} (A/A {_f(s['aa_p99_from_issue_ratio'])}); throughput "
                     f"ratio {_f(s['open_throughput_ratio'])}; closed loop p99 ratio {_f(s['closed_p99_ratio'])}")
        lines.append(f"  target throughput >= {TARGETS['throughput_ratio']}: {s['verdict_throughput']}; "
                     f"p99 <= {TARGETS['p99_ratio']}: {s['verdict_p99']}")
    if "floor_throughput_ratio" in s:
        lines.append(f"  floor (counting only) throughput ratio: median {_f(s['floor_throughput_ratio'])} "
                     f"(pairs {_f(s['floor_throughput_ratios']['min'])}..{_f(s['floor_throughput_ratios']['max'])}); "
                     f"our loss / floor's loss {_f(s['loss_vs_floor'], '{:.2f}')} "
                     f"(target <= {TARGETS['floor_loss_factor']}): {s['verdict']}")
    lines.append(f"  agent per run: median {_f(s['agent_cpu_s'], '{:.1f}')} CPU s, {_f(s['agent_rss_mb'], '{:.0f}')} MB "
                 f"RSS; events lost per run {s['agent_lost_events']}")
    v = s.get("variant")
    if v:
        lines.append(f"  variant agent ({variant_args}): throughput ratio {_f(v['throughput_ratio'])}, p99 ratio "
                     f"{_f(v['p99_ratio'])}; {_f(v['cpu_s'], '{:.1f}')} CPU s, sampling {_f(v['sampling'], '{:.3g}')}, "
                     f"events lost per run {v['lost_events']}")
    if s["agent_runs_with_loss"]:
        lines.append(f"  NOTE: the agent lost events in {s['agent_runs_with_loss']} of {len(s['agent_lost_events'])} "
                     "runs, so it skipped part of its work there: its ratios flatter it")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="What tracing costs psbench: interleaved runs without and with "
                                             "the agent (and the floor), ratios over rounds.")
    ap.add_argument("--settings", default="production,worst",
                    help="comma-separated: production, worst [%(default)s]")
    ap.add_argument("--pairs", type=at_least(1), default=7, help="rounds (pairs with/without) [%(default)s]")
    ap.add_argument("--duration-s", type=positive(float), default=5.0,
                    help="seconds each psbench job issues requests [%(default)s]")
    ap.add_argument("--warmup-s", type=float, default=1.0,
                    help="first seconds of each job left out of its figures [%(default)s]")
    ap.add_argument("--rate", type=positive(float), default=50.0,
                    help="production open loop: requests/s per worker [%(default)s]")
    ap.add_argument("--small-keys", type=at_least(1), default=4, help="worst: keys per request [%(default)s]")
    ap.add_argument("--small-dim", type=at_least(1), default=2, help="worst: values per key [%(default)s]")
    ap.add_argument("--variant-args", default="",
                    help='also run the agent with these extra options as condition "variant" (e.g. "--nice 10")')
    a = ap.parse_args(argv)
    names = [x.strip() for x in a.settings.split(",") if x.strip()]
    known = settings(a.rate, a.small_keys, a.small_dim)
    bad = [n for n in names if n not in known]
    if bad or not names:
        ap.error(f"--settings {a.settings!r}: give a comma-separated list of {', '.join(known)}")
    if not 0 <= a.warmup_s < a.duration_s:
        ap.error(f"--warmup-s {a.warmup_s:g}: give 0 <= warm-up < --duration-s ({a.duration_s:g})")
    a.settings = names
    a.variant = shlex.split(a.variant_args)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    from core.errors import require_root
    from workloads.cluster.cluster import Cluster

    require_root("bench.overhead")
    known = settings(a.rate, a.small_keys, a.small_dim)
    results: dict = {}
    all_runs: list[Run] = []
    t_start = time.monotonic()
    for name in a.settings:
        s = known[name]
        runs: list[Run] = []
        with tempfile.TemporaryDirectory(prefix=f"pslat-bench-overhead-{name}-") as tmp:
            with Cluster(HOSTS, wire_delay_ms=s.wire_delay_ms, wait_s=CLUSTER_WAIT_S,
                         log_dir=Path(tmp) / "wire") as cluster:
                for rnd in range(a.pairs):
                    for cond in order_of(rnd, s.conditions + (("variant",) if a.variant else ())):
                        out = Path(tmp) / f"r{rnd}-{cond}"
                        run = run_condition(cluster, s, rnd, cond, out, a.duration_s, a.warmup_s, a.variant)
                        print(describe(run), flush=True)
                        runs.append(run)
        results[name] = summarize(s, runs)
        all_runs += runs
        for line in summary_lines(name, results[name], a.rate, a.variant_args):
            print(line, flush=True)
    results["config"] = {"servers": SERVERS, "workers": WORKERS, "pairs": a.pairs, "duration_s": a.duration_s,
                         "warmup_s": a.warmup_s, "rate_per_worker": a.rate, "small_keys": a.small_keys,
                         "small_dim": a.small_dim, "elapsed_s": round(time.monotonic() - t_start, 1),
                         "targets": TARGETS, "variant_args": a.variant}
    results["runs"] = [{"setting": r.setting, "round": r.round, "condition": r.condition, "error": r.error,
                        "jobs": r.jobs, "tracer": r.tracer} for r in all_runs]
    print(json_line(results), flush=True)
    return 1 if any(r.error for r in all_runs) else 0


if __name__ == "__main__":
    from core.errors import run_main

    sys.exit(run_main("bench.overhead", main))
