"""The CLI: --help on every command; bad usage is one line on stderr and exit 2."""
import subprocess
import sys

import pytest
import typer.main

from pslat.cli import app


def _run(*args):
    return subprocess.run([sys.executable, "-m", "pslat.cli", *args], capture_output=True, text=True, timeout=60)


def _command_paths(group, prefix=()):
    for name, cmd in getattr(group, "commands", {}).items():
        path = (*prefix, name)
        yield path
        yield from _command_paths(cmd, path)


ALL_COMMANDS = sorted(_command_paths(typer.main.get_command(app)))


def test_every_command_is_listed():
    names = {p[0] for p in ALL_COMMANDS}
    assert {"demo", "cluster", "psbench"} <= names


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=lambda p: " ".join(p))
def test_help(path):
    r = _run(*path, "--help")
    assert r.returncode == 0, r.stderr
    assert "Usage" in r.stdout


@pytest.mark.parametrize("args, expect", [
    (["demo", "--servers", "0"], "--servers"),
    (["demo", "--bogus"], "No such option: --bogus"),
    (["cluster", "up", "--hosts", "0"], "at least 1 host"),
    (["cluster", "up", "--hosts", "2", "--wire-delay-ms", "-1"], "wire delay"),
    (["agent", "--out", "x", "--nice", "20"], "--nice 20"),
    (["agent", "--out", "x", "--cpu-budget", "0"], "--cpu-budget 0"),
    (["agent", "--out", "x", "--cpu-budget", "0.1", "--sample-rate", "0.5"], "leave out --sample-rate"),
])
def test_bad_input_is_one_line(args, expect):
    r = _run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pslat: error: ") and expect in lines[0], r.stderr


def test_an_error_naming_a_hostile_path_cannot_drive_the_terminal(tmp_path):
    """A path from outside (a run dir's name, a library in /proc/PID/maps) inside an error
    line: its escape sequences and newlines are replaced, the line stays one line."""
    import subprocess
    import sys

    bad = tmp_path / "x\x1b]8;;http://evil.example/\x07link\x1b[2J\nsecond"
    p = subprocess.run([sys.executable, "-m", "pslat.cli", "report", str(bad)],
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("pslat: error: ")
