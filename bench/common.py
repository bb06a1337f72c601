"""What the benchmarks share: statistics over interleaved runs, the JSON last
line, the tracers as child processes (`pslat agent`, bench.floor) with their
CPU, memory and in-kernel BPF time, and psbench throughput/latency from its
ground truth.

The statistics are pure (tested in tests/unit/test_bench_common.py); the rest
needs root and a cluster.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import sys
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 180       # a compile on 2 busy shared cores can take a minute
STOP_TIMEOUT_S = 120


# ---------------------------------------------------------------- statistics

def ratio(num: float | None, den: float | None) -> float | None:
    """num / den, or None when either is missing or den is not positive."""
    if num is None or den is None or not den > 0 or not math.isfinite(num) or not math.isfinite(den):
        return None
    return num / den


def median(xs: Iterable[float | None]) -> float | None:
    v = [x for x in xs if x is not None]
    return float(np.median(v)) if v else None


def spread(xs: Iterable[float | None]) -> dict[str, float | None]:
    """min, quartiles and max of the values present (the distribution of pair ratios)."""
    v = np.array([x for x in xs if x is not None], dtype=np.float64)
    keys = ("min", "p25", "p50", "p75", "max")
    if v.size == 0:
        return {k: None for k in keys} | {"n": 0}
    q = np.percentile(v, [0, 25, 50, 75, 100])
    return {k: round(float(x), 4) for k, x in zip(keys, q)} | {"n": int(v.size)}


def aa_noise(aa_ratios: Iterable[float | None]) -> float | None:
    """How far one A/A pair's ratio typically strays from 1: median |r - 1|.
    A with/without median ratio closer to 1 than this cannot be told from noise."""
    v = [abs(x - 1.0) for x in aa_ratios if x is not None]
    return float(np.median(v)) if v else None


def verdict(value: float | None, target: float, noise: float | None, higher_is_better: bool) -> str:
    """'meets' the target, 'within noise' (misses it by less than the A/A noise,
    measured around 1), or 'misses'."""
    if value is None:
        return "unmeasured"
    ok = value >= target if higher_is_better else value <= target
    if ok:
        return "meets"
    if noise is not None and abs(value - 1.0) <= noise:
        return "within noise"
    return "misses"


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares (intercept, slope) of ys over xs; None with < 3 points or no spread in xs."""
    x = np.asarray(xs, dtype=np.float64)
    y = np.asarray(ys, dtype=np.float64)
    if x.size != y.size:
        raise ValueError(f"{x.size} x values but {y.size} y values")
    if x.size < 3 or np.ptp(x) == 0:
        return None
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def slope_per_s(ts_s: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys over ts_s (units of y per second); None with < 3 points."""
    fit = linear_fit(ts_s, ys)
    return None if fit is None else fit[1]


def order_of(round_index: int, conditions: Sequence[str]) -> list[str]:
    """The conditions of one round, rotated by the round index, so that no
    condition always runs first (after a cluster start) or last (machine drift)."""
    k = round_index % len(conditions)
    return list(conditions[k:]) + list(conditions[:k])


def _clean(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.generic):
        return _clean(obj.item())
    return obj


def json_line(obj) -> str:
    """One line of strict JSON (NaN and infinities become null)."""
    return json.dumps(_clean(obj), allow_nan=False, separators=(", ", ": "))


def positive(kind=float):
    """argparse type: a positive number."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not v > 0 or (kind is float and not math.isfinite(v)):
            raise argparse.ArgumentTypeError(f"{text}: give a positive number")
        return v
    return parse


def at_least(low: int):
    """argparse type: an integer >= low."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{text}: give an integer >= {low}")
        return v
    return parse


# ---------------------------------------------------------------- psbench figures

def job_figures(truth, warmup_s: float, open_loop: bool) -> dict:
    """Throughput and slice latency of one psbench run from its ground truth
    (workers' rows), leaving out slices issued in the first warmup_s (connections,
    the tracer's first drain). Open loop: latency from when the slice was due
    (t_scheduled_ns), so a late issue counts; closed loop: from its issue."""
    w = truth[(truth["role"] == "worker")]
    if w.empty:
        raise UserError("the psbench run has no worker rows: see its logs")
    # every request and response of the whole job (warm-up included): what a tracer saw
    messages = len(w) + int(w["t_completed_ns"].notna().sum())
    t_start = int(w["t_issued_ns"].min()) + int(warmup_s * 1e9)
    w = w[w["t_issued_ns"] >= t_start]
    done = w[w["t_completed_ns"].notna()]
    if done.empty:
        raise UserError(f"no psbench slice completed after the {warmup_s:g} s warm-up: make the runs longer")
    t0_col = "t_scheduled_ns" if open_loop and done["t_scheduled_ns"].notna().all() else "t_issued_ns"
    lat_us = (done["t_completed_ns"] - done[t0_col]).to_numpy(dtype=np.float64) / 1e3
    span_s = (int(done["t_completed_ns"].max()) - t_start) / 1e9
    p50, p99 = np.percentile(lat_us, [50, 99])
    req = done.groupby(["sender", "app_id", "customer_id", "timestamp"]).ngroups
    out = {"messages_all": messages, "slices": len(done), "unanswered": int(len(w) - len(done)), "span_s": round(span_s, 3),
           "slices_per_s": len(done) / span_s if span_s > 0 else None,
           "requests_per_s": req / span_s if span_s > 0 else None,
           "p50_us": float(p50), "p99_us": float(p99)}
    if open_loop and done["t_scheduled_ns"].notna().all():
        lag_us = (done["t_issued_ns"] - done["t_scheduled_ns"]).to_numpy(dtype=np.float64) / 1e3
        out["issue_lag_p99_us"] = float(np.percentile(lag_us, 99))
        # from the issue: the path through the network stacks, without the issuer's own stalls
        from_issue_us = (done["t_completed_ns"] - done["t_issued_ns"]).to_numpy(dtype=np.float64) / 1e3
        out["p99_from_issue_us"] = float(np.percentile(from_issue_us, 99))
    return out


# ---------------------------------------------------------------- tracers as children

def libzmq() -> Path:
    """The libzmq pyzmq loads (what psbench uses): the agent's --lib."""
    import zmq
    libs = sorted(Path(zmq.__file__).parent.parent.glob("pyzmq.libs/libzmq*.so*"))
    if not libs:
        raise UserError("pyzmq's bundled libzmq not found next to the zmq package; "
                        "reinstall pyzmq from a wheel (scripts/setup.sh)")
    return libs[0]


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int) -> float | None:
    """utime + stime of a process (all its threads), in seconds."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) "
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_mb(pid: int, key: str = "VmRSS") -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def bpf_prog_stats(pid: int) -> dict[str, int] | None:
    """Sum of run_time_ns and run_cnt over the BPF programs a process holds
    (its fds' fdinfo). The kernel counts them only while stats are on
    (BpfStats); tail-called programs are counted within their caller."""
    run_ns = runs = progs = 0
    infos = bpf_prog_fdinfo(pid)
    if infos is None:
        return None
    for kv in infos:
        if "run_time_ns" not in kv:
            continue
        progs += 1
        run_ns += int(kv["run_time_ns"])
        runs += int(kv["run_cnt"])
    return {"programs": progs, "run_time_ns": run_ns, "run_cnt": runs}


def bpf_prog_fdinfo(pid: int) -> list[dict[str, str]] | None:
    """The fdinfo (key -> value text) of each BPF program fd a process holds; None when
    the process is gone."""
    out = []
    try:
        fds = os.listdir(f"/proc/{pid}/fdinfo")
    except OSError:
        return None
    for fd in fds:
        try:
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        if "prog_id:" not in info:
            continue
        out.append({k.strip(): v.strip() for k, v in (line.split(":", 1) for line in info.splitlines() if ":" in line)})
    return out


class BpfStats:
    """Kernel BPF run-time statistics switched on for as long as this is open
    (the bpf(BPF_ENABLE_STATS) fd: reference-counted, so another user's
    setting is left alone and a crash switches it off). `error` says why not."""

    _SYS_BPF = 321            # x86-64
    _BPF_ENABLE_STATS = 32
    _BPF_STATS_RUN_TIME = 0

    def __init__(self):
        self.fd: int | None = None
        self.error: str | None = None

    def __enter__(self) -> "BpfStats":
        libc = ctypes.CDLL(None, use_errno=True)
        attr = (ctypes.c_uint32 * 4)(self._BPF_STATS_RUN_TIME, 0, 0, 0)
        fd = libc.syscall(self._SYS_BPF, self._BPF_ENABLE_STATS, attr, ctypes.sizeof(attr))
        if fd < 0:
            self.error = f"bpf(BPF_ENABLE_STATS) failed: {os.strerror(ctypes.get_errno())}"
        else:
            self.fd = fd
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class Tracer:
    """A tracer as a child process that says "ready:" on stderr once attached
    and stops cleanly on SIGINT: `pslat agent` or bench.floor (agent.child.ChildProcess,
    started by start()), with its CPU, memory and BPF time."""

    def __init__(self, name: str, argv: list[str]):
        self.name = name
        self.argv = argv
        self.child = None

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> "Tracer":
        from agent.child import ChildProcess
        try:
            self.child = ChildProcess(self.argv, self.name, timeout_s, cwd=ROOT, capture_stdout=True)
        except UserError as e:
            raise RuntimeError(str(e)) from None
        return self

    @property
    def stderr(self) -> list[str]:
        return self.child.lines if self.child else []

    @property
    def stdout(self) -> str:
        return self.child.stdout if self.child else ""

    @property
    def ready_ns(self) -> int | None:
        return getattr(self.child, "ready_ns", None)

    def first_line_ns(self, text: str) -> int | None:
        """When the first stderr line (after ready) containing text was read."""
        return self.child.first_line_ns(text)

    @property
    def pid(self) -> int:
        return self.child.pid

    def cpu_s(self) -> float | None:
        return proc_cpu_s(self.pid)

    def rss_mb(self) -> float | None:
        return proc_rss_mb(self.pid)

    def bpf(self) -> dict[str, int] | None:
        return bpf_prog_stats(self.pid)

    def stop(self) -> str:
        """SIGINT, wait for a clean exit; returns its stderr. Raises if it failed."""
        try:
            rc = self.child.stop(STOP_TIMEOUT_S)
        except UserError as e:
            raise RuntimeError(str(e)) from None
        log = "".join(self.stderr)
        if rc != 0:
            raise RuntimeError(f"{self.name} exited with {rc}: {log[-2000:]}")
        return log

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill()

    def __enter__(self) -> "Tracer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.kill()


def agent_tracer(out: Path, hosts: Sequence[str], extra: Sequence[str] = ()) -> Tracer:
    """`pslat agent` with its default settings, one for all hosts (--netns each), probing
    pyzmq's libzmq. Only the hosts' namespaces are traced: the wire forwarder (netns
    pslat-wire) is not selected."""
    argv = [sys.executable, "-m", "pslat.cli", "agent", "--out", str(out), "--lib", str(libzmq())]
    for h in hosts:
        argv += ["--netns", h]
    return Tracer("pslat agent", argv + list(extra))


def floor_tracer() -> Tracer:
    return Tracer("bench.floor", [sys.executable, "-m", "bench.floor", "--lib", str(libzmq())])


def floor_hits(t: Tracer) -> dict:
    """The floor's JSON line (after stop())."""
    lines = [line for line in t.stdout.splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def agent_counters(out: Path) -> dict:
    """From the run dirs' meta.json: events seen and lost per probe (one agent: the
    same counters in every host's meta, so the max per probe), messages per host,
    rows dropped, undecodable events and the host-pair sampling rate it ended at."""
    from agent.rundir import read_meta

    probes: dict[str, dict[str, int]] = {}
    messages: dict[str, int] = {}
    dropped = undecodable = 0
    rates = []
    for d in sorted(p for p in Path(out).iterdir() if p.is_dir()):
        meta = read_meta(d)
        c = meta.get("counters", {})
        for probe, pc in c.get("probes", {}).items():
            cur = probes.setdefault(probe, {})
            for k in ("seen", "lost"):
                cur[k] = max(cur.get(k, 0), int(pc.get(k, 0)))
        messages[meta.get("host_id", d.name)] = int(c.get("messages", 0))
        dropped += int(c.get("rows_dropped", 0))
        sampling = meta.get("sampling")
        rates.append(float(sampling.get("effective_rate", sampling.get("rate", 1.0))) if isinstance(sampling, dict)
                     else 1.0)
        undecodable = max(undecodable, sum(int(v) for v in c.get("events_undecodable", {}).values()))
    return {"probes": probes, "lost": sum(p.get("lost", 0) for p in probes.values()),
            "seen": sum(p.get("seen", 0) for p in probes.values()),
            "messages": sum(messages.values()), "messages_by_host": messages,
            "rows_dropped": dropped, "undecodable": undecodable, "sampling_rate": min(rates, default=1.0)}
