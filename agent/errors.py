"""The one error type users see: a message that says what is wrong and what to do.

Library code raises UserError; the CLI prints it as one line and exits non-zero.
Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import os


class UserError(Exception):
    """Bad input or a missing prerequisite, stated as 'what is wrong; what to do'."""

    exit_code = 2


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UserError(f"{what} needs root (namespaces and BPF); run it with sudo")


def run_main(prog: str, main, *args):
    """Runs a program's main; a UserError ends it as one line `prog: error: ...`."""
    import sys

    try:
        return main(*args)
    except UserError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        sys.exit(e.exit_code)
