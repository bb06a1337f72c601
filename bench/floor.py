"""The floor: a minimal bcc program that only counts hits on the agent's hooks.

Whatever the agent does in a hook (filters, map lookups, copying payload,
ring output), running *a* BPF program there already costs the traced job
something: the tracepoint or uprobe fires, the program is entered, a counter
is bumped. This program does just that, on the same attach points as the
agent, so a benchmark can print its cost beside ours:

- the kernel probes the agent loads (agent.sources.kernel_probes: the
  send/recv syscall tracepoints, connect/accept, inet_sock_set_state, the
  net and sched raw tracepoints), one counting program per declared attach
  point, read from the declarations themselves so the floor follows the agent;
- the framework uprobes of one libzmq (probes.framework.POINTS["zmq"]: entry
  and return of each symbol), in every process that maps it, as the agent's
  --lib does.

It does no filtering (no netns, pid or port check), so it counts every hit on
the machine: that is the cheapest any tracer on these hooks can be.

    python -m bench.floor --lib LIBZMQ [--duration S]   # root

Prints "ready: ..." on stderr once attached, counts until SIGINT/SIGTERM or the
duration, then prints one JSON line on stdout: hits per attach point and in all.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError

POLL_S = 0.2


@dataclass(frozen=True)
class Hook:
    """One attach point: kind is "tracepoint", "raw_tracepoint", "uprobe" or "uretprobe";
    target is the tracepoint ("category:event"), raw tracepoint ("event") or symbol."""

    kind: str
    target: str


def agent_hooks(netstack: bool = True, framework: bool = True) -> list[Hook]:
    """The agent's attach points, one per BPF program it attaches (its declarations)."""
    from agent.sources import kernel_probes

    hooks = [Hook(a.kind, a.target) for p in kernel_probes(netstack) for a in p.attach]
    if framework:
        from probes.framework import POINTS

        for point in POINTS["zmq"]:
            hooks.append(Hook("uprobe", point.symbol))
            if point.return_fn is not None:
                hooks.append(Hook("uretprobe", point.symbol))
    return hooks


def program_text(n: int) -> str:
    """n counting functions, floor_0 .. floor_{n-1}, each bumping its own per-CPU slot.
    Generated from the count alone: no name or option reaches the C text."""
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 4096:
        raise ValueError(f"number of hooks must be an integer in 1..4096, got {n!r}")
    fns = "".join(
        f"int floor_{i}(void *ctx) {{ u32 k = {i}; u64 *v = floor_hits.lookup(&k); "
        f"if (v) *v += 1; return 0; }}\n" for i in range(n))
    return f"BPF_PERCPU_ARRAY(floor_hits, u64, {n});\n{fns}"


class Floor:
    """The counting program, attached. Use as a context manager."""

    def __init__(self, hooks: list[Hook], libzmq: Path | None):
        if any(h.kind in ("uprobe", "uretprobe") for h in hooks) and libzmq is None:
            raise UserError("the floor counts the agent's libzmq uprobes too; give --lib LIBZMQ "
                            "(the libzmq the job loads)")
        if libzmq is not None and not Path(libzmq).is_file():
            raise UserError(f"--lib {libzmq}: no such file; give the libzmq the job loads")
        self.hooks = hooks
        self.libzmq = libzmq
        self.bpf = None
        self.attach_s: float | None = None

    def start(self) -> "Floor":
        from core.errors import require_root

        require_root("bench.floor")
        import bcc

        t0 = time.perf_counter()
        self.bpf = bcc.BPF(text=program_text(len(self.hooks)).encode())
        try:
            for i, h in enumerate(self.hooks):
                fn = f"floor_{i}".encode()
                if h.kind == "tracepoint":
                    self.bpf.attach_tracepoint(tp=h.target.encode(), fn_name=fn)
                elif h.kind == "raw_tracepoint":
                    self.bpf.attach_raw_tracepoint(tp=h.target.encode(), fn_name=fn)
                elif h.kind == "uprobe":
                    self.bpf.attach_uprobe(name=os.fsencode(self.libzmq), sym=h.target.encode(), fn_name=fn,
                                           pid=-1)
                elif h.kind == "uretprobe":
                    self.bpf.attach_uretprobe(name=os.fsencode(self.libzmq), sym=h.target.encode(), fn_name=fn,
                                              pid=-1)
                else:
                    raise ValueError(f"unknown hook kind {h.kind!r}")
        except BaseException:
            self.close()
            raise
        self.attach_s = time.perf_counter() - t0
        return self

    def hits(self) -> list[int]:
        table = self.bpf[b"floor_hits"]
        return [int(sum(table[table.Key(i)])) for i in range(len(self.hooks))]

    def close(self) -> None:
        if self.bpf is not None:
            self.bpf.cleanup()
            self.bpf = None

    def __enter__(self) -> "Floor":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def hits_report(hooks: list[Hook], hits: list[int]) -> dict:
    """Hits per attach point (summed where several programs share one) and in all."""
    per: dict[str, int] = {}
    for h, n in zip(hooks, hits):
        key = f"{h.kind}:{h.target}"
        per[key] = per.get(key, 0) + n
    return {"hooks": len(hooks), "hits_total": sum(hits), "hits": per}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Count hits on the agent's hooks, and nothing else (the floor).")
    ap.add_argument("--lib", type=Path, help="the libzmq whose zmq_msg_send/recv/zmq_socket to count "
                                             "(what the agent's --lib gets)")
    ap.add_argument("--no-netstack", action="store_true", help="leave out the netstack probe's hooks "
                                                               "(as the agent's --no-netstack)")
    ap.add_argument("--duration", type=float, default=None, help="stop after S seconds (default: at SIGINT)")
    a = ap.parse_args(argv)
    if a.duration is not None and not a.duration > 0:
        raise UserError(f"--duration {a.duration}: give a positive number of seconds")
    hooks = agent_hooks(netstack=not a.no_netstack, framework=a.lib is not None)
    stop = {"why": None}

    def on_signal(signum, _frame):
        stop["why"] = signal.Signals(signum).name

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)
    with Floor(hooks, a.lib) as floor:
        print(f"ready: counting {len(hooks)} hooks (compile+attach {floor.attach_s:.1f} s)",
              file=sys.stderr, flush=True)
        deadline = time.monotonic() + a.duration if a.duration else None
        while stop["why"] is None and (deadline is None or time.monotonic() < deadline):
            time.sleep(POLL_S)
        report = hits_report(hooks, floor.hits())
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    from core.errors import run_main

    run_main("bench.floor", main)
