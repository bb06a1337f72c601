"""`python -m workloads.psbench --role scheduler|server|worker ...`: one process
of a job, configured like ps-lite (DMLC_* variables; flags override)."""
import os

# Before numpy loads: no BLAS worker threads in a process that does no linear
# algebra (they would show up beside ps-lite's threads in every trace).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import typer  # noqa: E402

from core.errors import run_main  # noqa: E402
from workloads.psbench.cli import role  # noqa: E402

main = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
main.command()(role)

if __name__ == "__main__":
    run_main("pslat psbench", main)
