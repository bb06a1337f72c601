"""`pslat`: the one command-line entry point. Sub-commands live beside the code they drive."""
from __future__ import annotations

import sys

import typer

from core.errors import UserError, say

app = typer.Typer(
    name="pslat",
    help="Where the latency of parameter-server push/pull goes: host, NIC or wire, on both ends.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    # Imported here so that `pslat --help` stays fast and a broken optional part
    # cannot hide the others.
    from workloads.cluster.cli import app as cluster_app
    from workloads.psbench.cli import app as psbench_app
    from pslat.demo import demo

    app.add_typer(cluster_app, name="cluster")
    app.add_typer(psbench_app, name="psbench")
    app.command("demo")(demo)
    app.command("report")(__import__("reports.report_cli", fromlist=["report"]).report)
    app.command("agent")(__import__("agent.agent_cli", fromlist=["agent"]).agent)
    app.command("top")(__import__("agent.top", fromlist=["top"]).top)
    app.command("check")(__import__("agent.check", fromlist=["check"]).check)


_register()


def main() -> None:
    """Every failure a user can cause ends as one line on stderr and exit 2."""
    try:
        rc = app(standalone_mode=False)
    except UserError as e:
        say("pslat", f"error: {e}")
        sys.exit(e.exit_code)
    except typer.TyperException as e:  # bad usage: unknown option, invalid value
        ctx = getattr(e, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        if e.format_message():  # empty when the help was shown for a bare command
            say("pslat", f"error: {e.format_message()}{hint}")
        sys.exit(2)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("pslat: interrupted", file=sys.stderr)
        sys.exit(130)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
