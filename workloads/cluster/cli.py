"""`pslat cluster`: bring the virtual cluster up, run commands in its hosts, take it down."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import List, Optional

import typer

app = typer.Typer(
    help="The virtual cluster: hosts as network namespaces joined by a wire with known delays.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command()
def up(
    hosts: int = typer.Option(..., "--hosts", help="number of hosts (h0..hN-1)",
                              rich_help_panel="Topology"),
    wire_delay_ms: float = typer.Option(0.0, "--wire-delay-ms", help="one-way delay, each direction",
                                        rich_help_panel="Wire"),
    jitter_ms: float = typer.Option(0.0, "--jitter-ms", help="jitter on each frame's delay",
                                    rich_help_panel="Wire"),
    jitter_dist: str = typer.Option("uniform", "--jitter-dist",
                                    help="uniform: in [-J, +J]; normal: std dev J",
                                    rich_help_panel="Wire"),
    pair_delay: Optional[List[str]] = typer.Option(None, "--pair-delay",
                                                   help="SRC:DST=MS, one ordered pair (repeatable)",
                                                   rich_help_panel="Wire"),
    log_dir: Path = typer.Option(Path("/run/pslat/wire"), "--log-dir",
                                 help="where the wire's per-frame log goes",
                                 rich_help_panel="Output"),
    as_json: bool = typer.Option(False, "--json", help="print the description as JSON",
                                 rich_help_panel="Output"),
    wait_s: float = typer.Option(0.0, "--wait-s",
                                 help="if another process's cluster is up, wait this long for it",
                                 rich_help_panel="Topology"),
) -> None:
    """Bring the cluster up and leave it running (the wire runs as a daemon)."""
    from .cluster import Cluster
    from .spec import parse_pair_delay

    pairs = dict(parse_pair_delay(p) for p in pair_delay or [])
    cluster = Cluster(hosts, wire_delay_ms=wire_delay_ms, jitter_ms=jitter_ms, pair_delay_ms=pairs,
                      log_dir=log_dir, jitter_dist=jitter_dist, wait_s=wait_s)
    cluster.up(detach=True)
    d = cluster.describe()
    if as_json:
        print(json.dumps(d))
        return
    for h in d["hosts"]:
        print(f"{h['netns']:<16} {h['addr']}")
    print(f"wire: {wire_delay_ms:g} ms each way, jitter {jitter_ms:g} ms ({jitter_dist}); "
          f"log {d['wire_log']}", file=sys.stderr)


@app.command()
def down() -> None:
    """Remove the cluster: processes in its hosts, the wire, namespaces (also a killed run's)."""
    from .cluster import down as remove

    removed = remove()
    print(f"removed {', '.join(removed)}" if removed else "no cluster was up", file=sys.stderr)


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_(
    host: str = typer.Argument(..., help="host name, e.g. h0"),
    cmd: List[str] = typer.Argument(..., help="the command, after --"),
) -> None:
    """Run a command inside a host: pslat cluster exec h0 -- ip addr."""
    from .cluster import Cluster

    cluster = Cluster.attach()
    try:
        rc = subprocess.call(cluster.command(host, cmd))
    except KeyboardInterrupt:
        rc = 130
    raise typer.Exit(rc)


@app.command()
def status(as_json: bool = typer.Option(False, "--json", help="print it as JSON")) -> None:
    """Show the cluster that is up: hosts, addresses, wire, offloads."""
    from .cluster import status as get_status

    s = get_status()
    if as_json:
        print(json.dumps(s))
        return
    if s is None:
        print("no cluster is up")
        return
    d = s["describe"] or {}
    for h in d.get("hosts", []):
        print(f"{h['netns']:<16} {h['addr']:<12} {h['mac']}")
    delays = sorted(set(d.get("delay_ms", {}).values()))
    print(f"wire: {'running' if s['forwarder_running'] else 'NOT running'}; delay ms "
          f"{', '.join(f'{x:g}' for x in delays) or '-'}; jitter {d.get('jitter_ms', 0):g} ms "
          f"({d.get('jitter_dist', '-')}); log {d.get('wire_log', '-')}")
    if not s["in_use"]:
        print("leftover of a run that ended without tearing down: `pslat cluster down` removes it")
