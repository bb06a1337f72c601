"""`pslat demo`: a virtual cluster, psbench on it traced by one agent for all
hosts, and the reports: where each push/pull's latency went.

It also prints psbench's own ground truth, the figures the agent's
measurements are checked against.
"""
from __future__ import annotations

import time
from pathlib import Path

import typer

from core.errors import UserError, require_root


def demo(
    servers: int = typer.Option(2, min=1, help="parameter servers (one host each)"),
    workers: int = typer.Option(4, min=1, help="workers (one host each)"),
    wire_delay_ms: float = typer.Option(0.0, help="one-way wire delay, each direction"),
    server_delay_ms: float = typer.Option(0.0, help="server processing delay per request"),
    rate: float = typer.Option(100.0, help="requests/s per worker (open loop); 0 = closed loop. On a "
                               "2-vCPU machine 200 and more starve the agent of CPU: it then traces a "
                               "share of the host pairs (load shedding) and the report scales counts"),
    duration: float = typer.Option(20.0, "--duration", help="seconds of traffic"),
    out: Path = typer.Option(None, "--out", help="output dir [default: ./pslat-demo-<time>]"),
) -> None:
    """Trace psbench (2 servers, 4 workers) in a virtual cluster and report where its latency went."""
    import json

    from agent.child import AgentProcess
    from probes.zmq_layout import pyzmq_libzmq
    from reports.dissect import dissect
    from reports.html import write_html
    from reports.summary import document
    from reports.term_report import FullReport, report_console
    from reports.viewmodel import build_model
    from reports.window import select
    from workloads.cluster.cluster import Cluster
    from workloads.psbench.launch import launch_in_cluster
    from workloads.psbench.summary import summarize, summary_table

    require_root("pslat demo")
    if wire_delay_ms < 0 or server_delay_ms < 0:
        raise UserError("delays must be >= 0 ms")
    if rate < 0:
        raise UserError("--rate must be >= 0 requests/s (0 = closed loop)")
    if duration <= 0:
        raise UserError("--duration must be > 0 seconds")
    out = out or Path(f"pslat-demo-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    console = report_console()
    names = [f"ps{i}" for i in range(servers)] + [f"w{j}" for j in range(workers)]
    console.print(f"[bold]cluster[/]: {len(names)} hosts, wire {wire_delay_ms} ms each way")
    agent_args = [arg for n in names for arg in ("--netns", n)] + ["--lib", str(pyzmq_libzmq())]
    with Cluster(names, wire_delay_ms=wire_delay_ms, log_dir=out / "wire") as cluster:
        console.print("[bold]agent[/]: one for all hosts, compiling and attaching its probes")
        with AgentProcess(out / "agent", agent_args) as agent:
            load = f"{rate:g} requests/s per worker" if rate else "closed loop"
            console.print(f"[bold]psbench[/]: {servers} servers x {workers} workers, {load}, "
                          f"for {duration:g} s")
            with launch_in_cluster(cluster, out / "psbench", servers=servers, workers=workers,
                                   duration_s=duration, server_delay_ms=server_delay_ms,
                                   rate=rate) as job:
                job.wait()
            if agent.stop() != 0:
                raise UserError(f"the agent failed: {agent.log_tail()}")
    console.print(summary_table(summarize(out / "psbench")))

    run_dirs = sorted(p for p in (out / "agent").iterdir() if p.is_dir())
    sel = select(dissect(run_dirs))   # the steady state: the start-up cut, and said
    (out / "summary.json").write_text(json.dumps(document(sel), indent=1) + "\n")
    write_html(sel.whole, out / "report.html", run_dirs, sel=sel)
    console.print(FullReport(build_model(sel.whole, run_dirs, sel)))
    console.print(f"output in {out}: summary.json, report.html, agent/ (run dirs), psbench/ (ground truth)")
