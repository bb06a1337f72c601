"""No code from a traced process's libraries runs in the agent (DESIGN.md, "What the
agent trusts"; issue 11's first finding).

A library named like libzmq whose ELF constructor creates a file named for the
user it runs as (`ran-as-<euid>`) is mapped (mmap'd, never executed) by processes
of an unprivileged user and of root, started before and after a real `pslat agent`
that selects every process, then one that selects them by --comm. The agent finds
each in /proc/PID/maps as its rescan does. It must never run the constructor as
root: no `ran-as-0`. The user's own library in the user's process may be measured,
confined (probes/sandbox.py): it runs as nobody there, where no file of the host is
writable (no mark at all), and fails as the decoy it is;
a library of that user mapped by a root process is refused before anything reads
it. The agent says so for each and keeps tracing."""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from agent.child import AgentProcess
from agent.rundir import META_FILE

pytestmark = pytest.mark.privileged

USER = 4242          # an unprivileged uid of no account: nothing of it exists on the host
COMM = "libtrustdecoy"
DECOY = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char path[512];
    snprintf(path, sizeof path, "%s/ran-as-%d", MARKS, (int)geteuid());
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
}
int zmq_decoy(void) { return 0; }
"""
# maps the library without running it (mmap, not dlopen): only a loader would run it
MAPPER = r"""
import mmap, sys, time
open("/proc/self/comm", "w").write(sys.argv[2])
with open(sys.argv[1], "rb") as f:
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ | mmap.PROT_EXEC)
print("mapped", flush=True)
time.sleep(float(sys.argv[3]))
"""


def _decoy(d: Path, name: str, marks: Path) -> Path:
    src = d / "decoy.c"
    src.write_text(DECOY)
    lib = d / name
    subprocess.run([shutil.which("cc") or "gcc", "-shared", "-fPIC", f'-DMARKS="{marks}"',
                    "-o", str(lib), str(src)], check=True)
    os.chown(lib, USER, USER)
    lib.chmod(0o755)
    return lib


def _mapper(lib: Path, uid: int | None, seconds: float) -> subprocess.Popen:
    # the distro's Python: the project's venv may sit where that user cannot read
    p = subprocess.Popen(["/usr/bin/python3", "-c", MAPPER, str(lib), COMM, str(seconds)],
                         stdout=subprocess.PIPE, text=True, user=uid, group=uid,
                         extra_groups=[] if uid is not None else None, cwd="/")
    assert p.stdout.readline().strip() == "mapped"
    return p


@pytest.fixture
def place():
    """A directory the unprivileged user owns (its libraries' home), and one for marks
    that anyone may create files in (so the constructor can say whoever it ran as);
    under /var/tmp, where that user can reach them."""
    top = Path("/var/tmp") / f"pslat-libtrust-{os.getpid()}"
    top.mkdir(mode=0o755)
    home, marks = top / "home", top / "marks"
    home.mkdir(mode=0o755)
    os.chown(home, USER, USER)
    marks.mkdir()
    marks.chmod(0o1777)
    yield home, marks
    shutil.rmtree(top, ignore_errors=True)


@pytest.mark.parametrize("by_comm", [False, True], ids=["every-process", "by-comm"])
def test_a_decoy_library_never_runs_as_root(tmp_path, place, by_comm):
    home, marks = place
    before = _decoy(home, "libzmq-before.so", marks)     # the user's, in the user's process
    after = _decoy(home, "libzmq-after.so", marks)       # the same, started after the agent
    foreign = _decoy(home, "libzmq-foreign.so", marks)   # the user's, in a root process
    procs = [_mapper(before, USER, 60)]
    args = ["--no-netstack", "--duration", "60"] + (["--comm", COMM] if by_comm else [])
    try:
        with AgentProcess(tmp_path / "out", args) as agent:
            procs += [_mapper(after, USER, 60), _mapper(foreign, None, 60)]
            deadline = time.monotonic() + 20
            said = lambda lib: any(str(lib) in line for line in agent.lines)   # noqa: E731
            while not all(said(lib) for lib in (before, after, foreign)):
                assert time.monotonic() < deadline, f"the agent said nothing of every decoy: {agent.log_tail(20)}"
                assert agent.proc.poll() is None, f"the agent died: {agent.log_tail(20)}"
                time.sleep(0.1)
            assert agent.stop() == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    log = "".join(agent.lines)
    assert not (marks / "ran-as-0").exists(), "a traced library's constructor ran as root"
    assert list(marks.iterdir()) == [], "the confined measurement reached the host's files"
    for lib in (before, after):
        line = next(ln for ln in agent.lines if str(lib) in ln)
        assert "not a libzmq" in line, line   # measured, confined, and found to be no libzmq
        print(line.strip())
    line = next(ln for ln in agent.lines if str(foreign) in ln)
    print(line.strip())
    assert f"owned by uid {USER}, neither root nor the process's user (uid 0)" in line, line
    metas = list((tmp_path / "out").glob(f"*/{META_FILE}"))
    assert metas, f"no run dir closed: {log[-2000:]}"
