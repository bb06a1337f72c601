"""`python -m workloads.psbench --role scheduler|server|worker ...`: one process
of a job, configured like ps-lite (DMLC_* variables; flags override)."""
import sys

import typer

from agent.errors import UserError
from workloads.psbench.cli import role

main = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
main.command()(role)

if __name__ == "__main__":
    try:
        main()
    except UserError as e:
        print(f"pslat psbench: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
