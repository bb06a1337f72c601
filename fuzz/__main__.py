"""`make fuzz`: every target (or those named) for a set time and input budget.

Coverage-guided with atheris where it is installed (a child process per target:
libFuzzer's per-input timeout, an RSS limit, crashers written to
tests/data/fuzz/<target>/); without atheris, the brief driver's mutator for the
same budget. Prints, per target, inputs run, inputs/s, RSS at start and at the end,
and one JSON line last. Exit status 1 when any target crashed, hung or ran out of
memory.

  python -m fuzz [--seconds S] [--parser-inputs N] [--reader-inputs N] [TARGET...]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fuzz.targets import CORPUS_ROOT, TARGETS, target

RSS_LIMIT_MB = 2048
TIMEOUT_S = 10
MAX_LEN = 2048   # bytes an input may grow to; a target may set a smaller MAX_LEN of its own
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)")
_PULSE = re.compile(r"^#(\d+)\s.*\brss: (\d+)Mb", re.M)


def _have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def _with_atheris(name: str, inputs: int, seconds: float) -> dict:
    crash_dir = CORPUS_ROOT / name
    crash_dir.mkdir(parents=True, exist_ok=True)
    corpus = Path(tempfile.mkdtemp(prefix=f"pslat-fuzz-{name}-"))
    try:
        for i, s in enumerate(target(name).seeds()):
            (corpus / f"seed-{i}").write_bytes(s)
        args = [sys.executable, "-m", "fuzz.atheris_child", name, f"-runs={inputs}",
                f"-max_total_time={int(seconds)}", f"-timeout={TIMEOUT_S}",
                f"-rss_limit_mb={RSS_LIMIT_MB}", f"-max_len={getattr(target(name), 'MAX_LEN', MAX_LEN)}", "-print_final_stats=1",
                f"-artifact_prefix={crash_dir}/", str(corpus)]
        t0 = time.monotonic()
        p = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", timeout=seconds + 600)
        wall = time.monotonic() - t0
    finally:
        shutil.rmtree(corpus, ignore_errors=True)
    stats = {m.group(1): int(m.group(2)) for m in map(_STAT.match, p.stdout.splitlines()) if m}
    # (inputs so far, RSS) at libFuzzer's status lines: growth is judged over the
    # second half of the run, after the corpus and the coverage maps have filled in
    pulses = [(int(m.group(1)), int(m.group(2))) for m in _PULSE.finditer(p.stdout)]
    ran = stats.get("number_of_executed_units", 0)
    mid = next((rss for n, rss in pulses if n >= ran // 2), None)
    failed = p.returncode != 0
    if failed:
        sys.stdout.write(p.stdout[-4000:])
    return {"target": name, "engine": "atheris", "inputs": ran,
            "inputs_per_s": round(ran / wall, 1) if wall else 0.0,
            "rss_start_mb": pulses[0][1] if pulses else None, "rss_mid_mb": mid,
            "rss_end_mb": stats.get("peak_rss_mb", pulses[-1][1] if pulses else None),
            "seconds": round(wall, 1), "ok": not failed}


def _with_mutator(name: str, inputs: int, seconds: float) -> dict:
    from fuzz.brief import run

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    ok = True
    try:
        r = run(target(name), seed=1, max_inputs=inputs, max_seconds=seconds)
        ran, wall = r.inputs, r.seconds
    except BaseException as e:  # a crash: keep the input, say what it was
        data = getattr(e, "fuzz_input", b"")
        crash_dir = CORPUS_ROOT / name
        crash_dir.mkdir(parents=True, exist_ok=True)
        import hashlib
        out = crash_dir / f"crash-{hashlib.sha1(data).hexdigest()}"
        out.write_bytes(data)
        print(f"{name}: {type(e).__name__}: {e} (input kept as {out})", file=sys.stderr)
        ok, ran, wall = False, 0, 0.0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return {"target": name, "engine": "mutator", "inputs": ran,
            "inputs_per_s": round(ran / wall, 1) if wall else 0.0,
            "rss_start_mb": rss0, "rss_mid_mb": None, "rss_end_mb": rss1, "seconds": round(wall, 1),
            "ok": ok}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("targets", nargs="*", help=f"default: all of {', '.join(TARGETS)}")
    ap.add_argument("--seconds", type=float, default=600.0, help="time budget per target")
    ap.add_argument("--parser-inputs", type=int, default=1_000_000)
    ap.add_argument("--reader-inputs", type=int, default=100_000)
    a = ap.parse_args()
    names = a.targets or list(TARGETS)
    for n in names:
        if n not in TARGETS:
            ap.error(f"no fuzz target {n!r}; targets: {', '.join(TARGETS)}")
    drive = _with_atheris if _have_atheris() else _with_mutator
    results = []
    for n in names:
        budget = a.parser_inputs if target(n).KIND == "parser" else a.reader_inputs
        r = drive(n, budget, a.seconds)
        results.append(r)
        print(f"{n:24s} {r['engine']:8s} {r['inputs']:>9,} inputs  {r['inputs_per_s']:>9,.0f}/s  "
              f"RSS {r['rss_start_mb']} -> {r['rss_mid_mb']} (half) -> {r['rss_end_mb']} MB  "
              f"{'ok' if r['ok'] else 'FAILED'}",
              flush=True)
    print(json.dumps({"fuzz": results}))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
