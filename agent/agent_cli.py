"""`pslat agent`: trace the selected processes and write one run dir per host."""
from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from core.errors import UserError
from agent.priority import check_nice


@contextlib.contextmanager
def _nothing_left_behind(out: Path):
    """An --out this run made is removed again when the run fails before writing into it
    (a bad recording, a port in use, a probe that will not load): bad input leaves
    nothing behind."""
    existed = out.exists()
    try:
        yield
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                out.rmdir()   # only when empty: a run dir written before a failure stays
        raise


def agent(
    out: Path = typer.Option(..., "--out", help="output dir: one run dir per host inside",
                             rich_help_panel="Output"),
    pid: List[int] = typer.Option([], "--pid", help="trace this process (repeat)", rich_help_panel="Filters"),
    comm: List[str] = typer.Option([], "--comm", help="trace processes of this name (repeat)",
                                   rich_help_panel="Filters"),
    netns: List[str] = typer.Option([], "--netns", help="trace sockets in this `ip netns` (repeat)",
                                    rich_help_panel="Filters"),
    port: List[int] = typer.Option([], "--port", help="trace TCP connections on this port (repeat)",
                                   rich_help_panel="Filters"),
    lib: List[Path] = typer.Option([], "--lib", help="a framework library the job loads (README: what it understands) to probe in every selected "
                                   "process, also ones not started yet (repeat)", rich_help_panel="Filters"),
    host_id: Optional[str] = typer.Option(None, "--host-id", help="host id (default: the hostname; "
                                          "a named netns is a host of that name, unless it is the "
                                          "one --netns traced: then this names it)", rich_help_panel="Output"),
    duration: Optional[float] = typer.Option(None, "--duration", help="stop after S seconds "
                                             "[default: at Ctrl-C / SIGTERM]"),
    record: Optional[Path] = typer.Option(None, "--record", help="also save the raw events to FILE",
                                          rich_help_panel="Output"),
    replay: Optional[Path] = typer.Option(None, "--replay", help="decode a --record FILE instead of "
                                          "tracing (no root needed); with --listen, then serve what it "
                                          "gave until Ctrl-C/SIGTERM/--duration"),
    pace: bool = typer.Option(False, "--pace", help="with --replay: feed the events at the pace they were "
                              "recorded (gaps over 1 s cut to 1 s), so /metrics rates look live"),
    print_bpf: bool = typer.Option(False, "--print-bpf", help="print the BPF program and exit"),
    netstack: bool = typer.Option(True, "--netstack/--no-netstack", help="also probe the kernel network "
                                  "stack (segment, window, scheduler and connection times)"),
    listen: Optional[str] = typer.Option(None, "--listen", help="serve live aggregates on ADDR:PORT over "
                                         "HTTP: /metrics (Prometheus) and /snapshot.json (pslat top); "
                                         "e.g. 127.0.0.1:9465", rich_help_panel="Output"),
    test_clock_skew: List[str] = typer.Option(
        [], "--test-clock-skew", rich_help_panel="For tests",
        help="FOR TESTS ONLY: write HOST's times as a clock OFFSET_US ahead, drifting DRIFT_PPM, would "
             "(HOST:OFFSET_US:DRIFT_PPM, repeat); marked in its meta.json, to check the report's clock alignment"),
    sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="trace this share R (0 < R <= 1) "
                                                "of host pairs, fixed (default: all, fewer when the agent "
                                                "cannot keep up)", rich_help_panel="Filters"),
    cpu_budget: Optional[float] = typer.Option(None, "--cpu-budget", help="keep the agent's own CPU under "
                                               "CORES (e.g. 0.1: a tenth of one core) by sampling fewer host "
                                               "pairs (default: no budget; the agent sheds only when it "
                                               "cannot keep up)", rich_help_panel="Filters"),
    nice: Optional[int] = typer.Option(None, "--nice", help="run the agent at this nice value once attached (e.g. 10: "
                                       "the job's threads get saturated cores first; the agent sheds host "
                                       "pairs when it falls behind; default: the priority it started with)"),
    protocol: List[str] = typer.Option([], "--protocol", help="connections with an end on PORT speak protocol "
                                       "NAME (PORT=NAME, repeat; default: told from their first bytes)",
                                       rich_help_panel="Filters"),
    all_call_hooks: bool = typer.Option(False, "--all-call-hooks", help="keep the read, write, readv and "
                                        "writev hooks attached even while no traced TCP traffic uses them "
                                        "(default: detached then, and attached again when a new traced "
                                        "process appears, a stream gap is seen, and every 60 s)"),
    call_hooks_quiet_s: Optional[float] = typer.Option(None, "--call-hooks-quiet-s", hidden=True,
                                                       help="seconds without a traced call before a hook "
                                                            "is detached (tests: shorter than 10)"),
    ring_pages: Optional[int] = typer.Option(None, "--ring-pages", hidden=True,
                                             help="kernel ring buffers' size in pages (tests: flood the agent)"),
) -> None:
    """Trace every message of the selected processes, with its per-stage times."""
    from agent.daemon import AgentOptions, replay as do_replay, replay_and_serve, run_live
    from parsers.registry import parse_forced

    try:
        protocols = parse_forced(protocol)
    except ValueError as e:
        raise UserError(str(e)) from None

    if duration is not None and duration <= 0:
        raise UserError(f"--duration {duration:g}: give a positive number of seconds")
    if sample_rate is not None and not 0 < sample_rate <= 1:
        raise UserError(f"--sample-rate {sample_rate:g}: give the share of host pairs to trace, 0 < R <= 1 "
                        "(e.g. 0.25), or leave it out to let the agent shed load when it must")
    if nice is not None:
        check_nice(nice)
    if cpu_budget is not None:
        if not 0 < cpu_budget <= 1024:
            raise UserError(f"--cpu-budget {cpu_budget:g}: give the CPU the agent may use in cores, e.g. 0.1")
        if sample_rate is not None:
            raise UserError("--cpu-budget adapts the share of host pairs traced; leave out --sample-rate "
                            "(a fixed share)")
    overrides = {} if ring_pages is None else {"SOCKCALLS_RING_PAGES": ring_pages, "NS_RING_PAGES": ring_pages}
    if listen is not None:
        from agent.http import parse_listen
        parse_listen(listen)   # a bad address fails before any probe is compiled
    if pace and replay is None:
        raise UserError("--pace sets the speed of a --replay; give --replay FILE")
    if replay is not None:
        if pid or comm or netns or port or lib or record or print_bpf or sample_rate is not None \
                or cpu_budget is not None:
            raise UserError("--replay decodes what a recording holds; leave out the filters, --record, "
                            "--sample-rate, --cpu-budget and --print-bpf")
        if listen is not None:   # serve the replayed totals until Ctrl-C/SIGTERM/--duration
            with _nothing_left_behind(out):
                replay_and_serve(replay, out, listen, duration, protocols=protocols or None, paced=pace)
            return
        with _nothing_left_behind(out):
            pipeline, elapsed = do_replay(replay, out, protocols=protocols or None, paced=pace)
        n = sum(pipeline.events.values())
        rows = ", ".join(f"{h}: {k} messages" for h, k in sorted(pipeline.rows.items())) or "no messages"
        typer.echo(f"replayed {n} events in {elapsed:.2f} s ({n / max(elapsed, 1e-9):,.0f} events/s); {rows}; "
                   f"run dirs: {', '.join(str(w.path) for w in pipeline.writers.values()) or out}", err=True)
        return
    with _nothing_left_behind(out):
        run_live(AgentOptions(out=out, test_clock_skews=tuple(test_clock_skew), pids=tuple(pid),
                              comms=tuple(comm), netns=tuple(netns), ports=tuple(port), host_id=host_id,
                              duration_s=duration, record=record, libs=tuple(lib), print_bpf=print_bpf,
                              netstack=netstack, listen=listen, sample_rate=sample_rate,
                              overrides=overrides, nice=nice, cpu_budget=cpu_budget, protocols=protocols,
                              all_call_hooks=all_call_hooks, call_hooks_quiet_s=call_hooks_quiet_s))
    if not print_bpf:
        # Everything is written and closed: skip the interpreter's teardown (0.3-0.5 s
        # under load, of the 2 s a SIGTERM may take; the kernel closes what is left).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
