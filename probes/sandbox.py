"""Run our own code on a library from a traced process, in a child without privileges.

Loading a library runs its ELF constructors, so a library that a local user can
place in front of the agent must never be loaded in the agent (root). Where a
measurement needs the library loaded (probes/zmq_layout.py calls its public API),
it runs here instead:

  agent (root)  --spawn-->  python -m probes.sandbox MODULE LIBRARY
                              as root: import MODULE (our code, before anything
                              of the library's is touched), then confine:
                              - new mount namespace, every mount read-only, a
                                fresh tmpfs on /tmp (the host's /tmp is out of
                                reach), the library's
                                directory bind-mounted read-only at /tmp/lib
                                (its siblings stay next to it for $ORIGIN);
                              - new network namespace with only loopback up;
                              - rlimits: no file can grow (RLIMIT_FSIZE 0), CPU
                                seconds, address space, open files, no core;
                              - groups dropped, then gid and uid to nobody
                                (65534): no capabilities left, no root-owned
                                file writable; no_new_privs (no setuid exec);
                            then MODULE.confined_main(/tmp/lib/NAME) -> JSON line

The parent reads at most OUTPUT_MAX_BYTES of stdout within TIMEOUT_S and parses
one JSON object; the caller validates every value before use. A library whose
directory nobody can read, or one whose constructor misbehaves, only makes the
measurement fail: it is said, and the library is not probed.
"""
from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import struct
import subprocess
import sys
from pathlib import Path

NOBODY = 65534
TIMEOUT_S = 20.0
OUTPUT_MAX_BYTES = 64 * 1024
CPU_LIMIT_S = 15
ADDRESS_SPACE_BYTES = 4 << 30
OPEN_FILES_MAX = 64
INSIDE = Path("/tmp/lib")

_CLONE_NEWNS = 0x00020000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV = 1, 2, 4
_MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 32, 4096, 16384, 1 << 18
_PR_SET_DUMPABLE, _PR_SET_NO_NEW_PRIVS = 4, 38
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 1
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE = 442, -100, 0x8000   # x86-64 and arm64 alike
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID, _MOUNT_ATTR_NODEV = 1, 2, 4


class SandboxFailed(Exception):
    """The confined measurement did not give an answer (the message says why)."""


def run(module: str, library: Path) -> dict:
    """MODULE.confined_main on `library`, confined; its JSON object (not yet validated)."""
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root), "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        p = subprocess.Popen([sys.executable, "-m", "probes.sandbox", module, str(library)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=env, cwd="/", close_fds=True,
                             start_new_session=True)
    except OSError as e:
        raise SandboxFailed(f"cannot start the confined child ({e.strerror})") from None
    try:
        out, err = p.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        raise SandboxFailed(f"no answer within {TIMEOUT_S:.0f} s") from None
    if p.returncode != 0:
        raise SandboxFailed(_last_line(err) or f"the confined child exited with {p.returncode}")
    if len(out) > OUTPUT_MAX_BYTES:
        raise SandboxFailed(f"{len(out)} bytes of answer, more than {OUTPUT_MAX_BYTES}")
    try:
        answer = json.loads(out.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SandboxFailed("its answer is not JSON") from None
    if not isinstance(answer, dict):
        raise SandboxFailed("its answer is not a JSON object")
    if "error" in answer:
        raise SandboxFailed(_printable(str(answer["error"]))[:300])
    return answer


def _last_line(err: bytes) -> str:
    lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return _printable(lines[-1])[:300] if lines else ""


def _printable(text: str) -> str:
    """The child's words may come from the library: never control characters."""
    return "".join(ch if ch.isprintable() else "?" for ch in text)


# --- the child --------------------------------------------------------------------

def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]
    return libc


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _loopback_up() -> None:
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _read_only_everywhere(libc) -> None:
    """Every mount of this namespace read-only (mount_setattr, Linux 5.12+); on an older
    kernel, at least the world-writable places hidden under empty tmpfs mounts."""
    attr = struct.pack("QQQQ", _MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID | _MOUNT_ATTR_NODEV, 0, 0, 0)
    buf = ctypes.create_string_buffer(attr, len(attr))
    long = ctypes.c_long
    if libc.syscall(long(_SYS_MOUNT_SETATTR), long(_AT_FDCWD), ctypes.c_char_p(b"/"),
                    long(_AT_RECURSIVE), buf, long(len(attr))) == 0:
        return
    for d in (b"/var/tmp", b"/dev/shm", b"/run/lock"):
        if os.path.isdir(d):
            _check(libc.mount(b"tmpfs", d, b"tmpfs", _MS_RDONLY | _MS_NOSUID | _MS_NODEV, b"size=4k"),
                   f"hiding {d.decode()}")


def _confine(library: Path) -> Path:
    """Everything above the module docstring's line "then"; returns the library's new path."""
    libc = _libc()
    _check(libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET), "unshare")
    _check(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making mounts private")
    _read_only_everywhere(libc)
    # held open across the tmpfs mount, which may hide it (a library under /tmp)
    src = os.open(library.parent, os.O_PATH | os.O_DIRECTORY)
    _check(libc.mount(b"tmpfs", b"/tmp", b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=755,size=1m"),
           "mounting a tmpfs on /tmp")
    INSIDE.mkdir()
    _check(libc.mount(f"/proc/self/fd/{src}".encode(), os.fsencode(INSIDE), None, _MS_BIND, None),
           "bind-mounting the library's directory")
    os.close(src)
    _check(libc.mount(None, os.fsencode(INSIDE), None,
                      _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID | _MS_NODEV, None),
           "making the library's directory read-only")
    _loopback_up()
    for limit, value in ((resource.RLIMIT_FSIZE, 0), (resource.RLIMIT_CORE, 0),
                         (resource.RLIMIT_CPU, CPU_LIMIT_S),
                         (resource.RLIMIT_AS, ADDRESS_SPACE_BYTES),
                         (resource.RLIMIT_NOFILE, OPEN_FILES_MAX)):
        resource.setrlimit(limit, (value, value))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails, not kills
    os.setgroups([])
    os.setresgid(NOBODY, NOBODY, NOBODY)
    os.setresuid(NOBODY, NOBODY, NOBODY)
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    # changing uid made the process undumpable, which makes /proc/self/mem root's;
    # the measurement reads its own memory through it
    _check(libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0), "dumpable")
    if os.geteuid() == 0 or os.getegid() == 0:
        raise OSError("still root after dropping privileges")
    return INSIDE / library.name


def _child(module: str, library: str) -> int:
    import importlib

    mod = importlib.import_module(module)   # ours, imported while we can still read it
    try:
        inside = _confine(Path(library))
    except OSError as e:
        print(f"cannot confine the measurement: {e}", file=sys.stderr)
        return 3
    answer = mod.confined_main(inside)
    sys.stdout.write(json.dumps(answer))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m probes.sandbox MODULE LIBRARY (the agent runs it)", file=sys.stderr)
        sys.exit(2)
    sys.exit(_child(sys.argv[1], sys.argv[2]))
