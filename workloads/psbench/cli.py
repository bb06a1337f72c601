"""`pslat psbench`: run a local job, run one role, summarise a run's ground truth.

(No `from __future__ import annotations` here: typer reads the annotations
of the generated signatures as objects.)
"""
import dataclasses
import functools
import inspect
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from core.errors import UserError
from workloads.psbench.options import Workload

app = typer.Typer(help="psbench: a ps-lite-compatible sparse parameter-server job with its own ground truth.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)

WORKLOAD_PANEL = "Workload (same for every role)"


def workload_options(func):
    """Give a command one --flag per Workload field (declared once, in
    options.py); the command receives them as `workload: Workload`."""
    sig = inspect.signature(func)
    own = [p for p in sig.parameters.values() if p.name != "workload"]
    extra = []
    for f in dataclasses.fields(Workload):
        flag = "--" + f.name.replace("_", "-")
        kind = type(f.default)
        decl = f"{flag}/--no-{flag[2:]}" if kind is bool else flag
        opt = typer.Option(decl, help=f.metadata["help"], rich_help_panel=WORKLOAD_PANEL)
        extra.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                       annotation=Annotated[kind, opt]))
    names = [f.name for f in dataclasses.fields(Workload)]

    @functools.wraps(func)
    def wrapper(**kw):
        workload = Workload(**{n: kw.pop(n) for n in names})
        return func(workload=workload, **kw)

    params = own + extra
    wrapper.__signature__ = sig.replace(parameters=[p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params])
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper


@app.command("role")
@workload_options
def role(
    role: Annotated[Optional[str], typer.Option("--role", help="scheduler, server or worker [env DMLC_ROLE]")] = None,
    root_uri: Annotated[Optional[str], typer.Option(help="Scheduler address [env DMLC_PS_ROOT_URI]")] = None,
    root_port: Annotated[Optional[int], typer.Option(help="Scheduler port [env DMLC_PS_ROOT_PORT]")] = None,
    num_servers: Annotated[Optional[int], typer.Option(help="Servers in the job [env DMLC_NUM_SERVER]")] = None,
    num_workers: Annotated[Optional[int], typer.Option(help="Workers in the job [env DMLC_NUM_WORKER]")] = None,
    node_host: Annotated[Optional[str], typer.Option(help="This node's address [env DMLC_NODE_HOST]")] = None,
    port: Annotated[Optional[int], typer.Option(help="This node's port, 0 = any [env PORT]")] = None,
    host_id: Annotated[str, typer.Option(help="Host id in the ground truth [default: hostname]")] = "",
    out: Annotated[Path, typer.Option(help="Ground-truth directory (shared by the job)")] = Path("psbench-out"),
    die_with_parent: Annotated[bool, typer.Option(hidden=True)] = False,
    workload: Workload = None,
):
    """Run one process of a job (as ps-lite: settings from DMLC_* variables, flags override)."""
    from workloads.psbench.node import Terminated, run_node
    from workloads.psbench.options import NodeConfig

    code = 0
    try:
        cfg = NodeConfig.resolve(role=role, root_uri=root_uri, root_port=root_port, num_servers=num_servers,
                                 num_workers=num_workers, node_host=node_host, port=port, host_id=host_id,
                                 out_dir=out, die_with_parent=die_with_parent)
        run_node(cfg, workload)
    except UserError as e:
        print(f"pslat psbench: error: {e}", file=sys.stderr)
        code = e.exit_code
    except Terminated as e:
        code = e.exit_code
    except Exception:  # noqa: BLE001 - a bug: keep the traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    # Exit now: a failed node may leave zmq and daemon threads that would
    # otherwise hold the interpreter; the ground truth is already flushed.
    os._exit(code)


@app.command("run")
@workload_options
def run(
    servers: Annotated[int, typer.Option(help="Parameter servers.")] = 1,
    workers: Annotated[int, typer.Option(help="Workers.")] = 1,
    out: Annotated[Optional[Path], typer.Option(help="Output directory [default: ./psbench-<time>]")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    workload: Workload = None,
):
    """Run a whole job locally (scheduler, servers, workers on loopback) and summarise it."""
    from workloads.psbench.launch import launch_local
    from workloads.psbench.summary import summarize, summary_table

    out = out or Path(f"psbench-{time.strftime('%Y%m%d-%H%M%S')}")
    opts = dataclasses.asdict(workload)
    with launch_local(out, servers, workers, **opts) as job:
        job.wait()
        summary = summarize(job.truth())
    if json_out:
        print(json.dumps(summary))
    else:
        Console().print(summary_table(summary))
        print(f"ground truth: {out / 'truth'}")


@app.command("summary")
def summary(
    out_dir: Annotated[Path, typer.Argument(help="A psbench output directory.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
):
    """Requests/s and latency percentiles per op, from a run's ground truth."""
    from workloads.psbench.summary import summarize, summary_table
    from workloads.psbench.truth import read_truth

    truth = read_truth(out_dir)
    if not (truth["role"] == "worker").any():
        raise UserError(f"no worker ground truth under {out_dir / 'truth'}; pass a psbench --out directory")
    s = summarize(truth)
    if json_out:
        print(json.dumps(s))
    else:
        Console().print(summary_table(s))
