"""What the agent's user space costs per message: a recording of real events
replayed through the live decoders and correlator (agent.daemon.replay), without
root and without the job competing for the cores.

    python -m bench.consumer [FILE] [--repeat 3] [--baseline REV]   replay cost of a recording
    python -m bench.consumer --record FILE [--rate 200 --duration-s 15]   (root)

FILE defaults to bench/data/production-30s.rec.gz: 30 s of psbench 2x4 in the
virtual cluster (1 ms wire, 1 ms server delay, open loop at 50 requests/s per
worker, the production setting of bench.overhead), made by `python -m
bench.cost --record`: steady state, for cost figures (the 2 s recordings under
tests/data are mostly start-up).

Replay: each repeat runs in a fresh child process (peak RSS is per process), and
prints CPU seconds (user + system of the whole replay, shard writing included,
after a warm-up replay of a small recording), messages out, CPU per message and
peak RSS. --baseline REV replays the same file with the agent of another git
revision too, interleaved. The last line is JSON: {"cpu_us_per_message",
"events_per_message", "peak_rss_mb", "messages", "events", "runs": [...],
"baseline": {same, "rev"}, "cpu_per_message_ratio", "peak_rss_ratio"} (medians
over the repeats; ratios are baseline / current).

Record: a psbench job (--servers x --workers, open loop at --rate requests/s per
worker, 0 = closed loop) on the loopback of a network namespace made for it,
traced by one `pslat agent --record` with every probe (tests/data/agent/record.py
uses the same path for the unit tests' recordings).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WARMUP = ROOT / "tests" / "data" / "agent" / "netstack.rec.gz"
STEADY = ROOT / "bench" / "data" / "production-30s.rec.gz"


# ---------------------------------------------------------------- recording

def record(rec: Path | None, psbench_args: list[str], agent_flags: list[str] = (), out: Path | None = None,
           psbench_out: Path | None = None, log=None) -> Path:
    """A psbench job in a fresh namespace's loopback, traced by `pslat agent --record rec`.
    Returns the agent's --out dir (out, or a temporary one the caller removes)."""
    from agent.child import AgentProcess
    from bench.common import libzmq

    log = log or (lambda m: print(m, file=sys.stderr))
    ns = f"pslat-rec-{os.getpid()}"
    work = Path(tempfile.mkdtemp(prefix="pslat-consumer-rec-"))
    out = Path(out) if out else work / "out"
    psbench_out = Path(psbench_out) if psbench_out else work / "ps"
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "set", "lo", "up"], check=True)
        record_flags = ["--record", str(rec)] if rec else []   # None: traced, not recorded
        with AgentProcess(out, ["--netns", ns, "--lib", str(libzmq()), *record_flags, *agent_flags],
                          echo=log) as agent:
            subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "pslat.cli", "psbench", "run",
                            "--out", str(psbench_out), *psbench_args], cwd=ROOT, check=True,
                           stdout=subprocess.DEVNULL)
            if agent.stop() != 0:
                raise SystemExit(f"the agent failed: {agent.log_tail()}")
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
    return out


# ---------------------------------------------------------------- replay

def _peak_rss_kb() -> int:
    """This process's peak RSS since its exec (VmHWM). Not ru_maxrss: Linux carries that
    over an exec from the forking process (a child of a 2 GB pytest said 2,007 MB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def replay_once(path: Path, warmup: Path = WARMUP) -> dict:
    """One replay in this process: its CPU, messages out and peak RSS."""
    from agent.daemon import replay

    with tempfile.TemporaryDirectory(prefix="pslat-consumer-") as tmp:
        # first a small recording: the modules the pipeline imports on first use
        # (pyarrow.parquet, protobuf...) are a start-up cost, not a per-message one
        replay(Path(warmup), Path(tmp) / "warmup")
        # the whole replay, shard writing included (the live agent writes them too)
        c0 = time.process_time()
        pipeline, wall_s = replay(Path(path), Path(tmp) / "run")
        cpu_s = time.process_time() - c0
        events = sum(pipeline.events.values())
        msgs = sum(pipeline.rows.values())
    rss_mb = _peak_rss_kb() / 1024
    return {"cpu_s": round(cpu_s, 3), "wall_s": round(wall_s, 3), "events": events,
            "messages": msgs, "cpu_us_per_message": round(cpu_s * 1e6 / max(msgs, 1), 2),
            "events_per_message": round(events / max(msgs, 1), 2), "peak_rss_mb": round(rss_mb, 1)}


def replay_in_child(path: Path, cwd: Path = ROOT) -> dict:
    """replay_once in a fresh interpreter, for a clean peak RSS; cwd: the tree whose
    agent replays it (another checkout: the baseline)."""
    code = ("import json,sys; sys.path.insert(0, sys.argv[3]); from consumer import replay_once; "
            "print(json.dumps(replay_once(sys.argv[1], sys.argv[2])))")
    got = subprocess.run([sys.executable, "-c", code, str(Path(path).resolve()), str(WARMUP),
                          str(Path(__file__).resolve().parent)], cwd=cwd, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(cwd)})
    if got.returncode != 0:
        raise RuntimeError(f"replay of {path} failed: {got.stderr[-2000:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    med = {k: statistics.median(r[k] for r in runs)
           for k in ("cpu_us_per_message", "peak_rss_mb", "cpu_s", "wall_s")}
    return {**med, "messages": runs[0]["messages"], "events": runs[0]["events"],
            "events_per_message": runs[0]["events_per_message"], "runs": runs}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.consumer", description=__doc__.split("\n\n")[0])
    ap.add_argument("file", type=Path, nargs="?", default=STEADY,
                    help="a recording (`pslat agent --record`) [bench/data/production-30s.rec.gz]")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", metavar="REV", help="also replay with the agent of git revision REV, "
                    "runs interleaved; prints both and the ratios")
    ap.add_argument("--record", action="store_true", help="make FILE (root): psbench traced with --record")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s per worker (0: closed loop)")
    ap.add_argument("--duration-s", type=float, default=15.0)
    a = ap.parse_args(argv)
    if a.record:
        out = record(a.file, ["--servers", str(a.servers), "--workers", str(a.workers),
                              "--duration-s", str(a.duration_s), "--rate", str(a.rate)])
        shutil.rmtree(out.parent, ignore_errors=True)
        print(json.dumps({"recording": str(a.file), "bytes": a.file.stat().st_size}))
        return
    trees = {"current": ROOT}
    with tempfile.TemporaryDirectory(prefix="pslat-consumer-base-") as base:
        if a.baseline:
            trees = {"baseline": checkout(a.baseline, Path(base)), **trees}
        runs: dict[str, list] = {k: [] for k in trees}
        for i in range(a.repeat):   # interleaved: the machine's load drifts
            for name, tree in trees.items():
                r = replay_in_child(a.file, cwd=tree)
                print(f"{name} run {i}: {r['messages']} messages, {r['events']} events, {r['cpu_s']} s CPU, "
                      f"{r['cpu_us_per_message']} us/message, peak RSS {r['peak_rss_mb']} MB", file=sys.stderr)
                runs[name].append(r)
    out = summary(runs["current"])
    if a.baseline:
        base = out["baseline"] = {"rev": a.baseline, **summary(runs["baseline"])}
        out["cpu_per_message_ratio"] = round(base["cpu_us_per_message"] / out["cpu_us_per_message"], 2)
        out["peak_rss_ratio"] = round(base["peak_rss_mb"] / out["peak_rss_mb"], 2)
    print(json.dumps(out))


def checkout(rev: str, into: Path) -> Path:
    """The tree of git revision rev, extracted into `into` (no working tree touched)."""
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {rev}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


if __name__ == "__main__":
    main()
