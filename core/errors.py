"""The one error type users see: a message that says what is wrong and what to do.

Library code raises UserError; the CLI prints it as one line and exits non-zero.
Anything else is a bug and keeps its traceback.
"""
from __future__ import annotations

import os
import sys

from core.safetext import safe_text


class UserError(Exception):
    """Bad input or a missing prerequisite, stated as 'what is wrong; what to do'."""

    exit_code = 2


def require_root(what: str) -> None:
    if os.geteuid() != 0:
        raise UserError(f"{what} needs root (namespaces and BPF); run it with sudo")


def say(prog: str, msg: object) -> None:
    """One line on stderr, `prog: msg`. Messages carry strings from outside (library
    paths from /proc/PID/maps, host ids, file names): control characters in them are
    replaced, so they cannot drive the terminal (core/safetext.py)."""
    print(f"{prog}: {safe_text(msg)}", file=sys.stderr, flush=True)


def run_main(prog: str, main, *args):
    """Runs a program's main; a UserError ends it as one line `prog: error: ...`."""
    try:
        return main(*args)
    except UserError as e:
        say(prog, f"error: {e}")
        sys.exit(e.exit_code)
