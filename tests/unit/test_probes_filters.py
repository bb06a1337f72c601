"""probes.filters and probes.tracefs: user options become validated integers;
tracefs formats are parsed; missing things are one clear error."""
from __future__ import annotations

import os

import pytest

from core.errors import UserError
from probes import filters as F
from probes.filters import Filters, netns_inode
from probes.tracefs import parse_format, tracefs_root, tracepoint_format


def test_build_normalises_and_flags():
    f = Filters.build(pids=[os.getpid(), str(os.getpid())], comms=["python3", b"ZMQbg/IO/0"], ports=["9000", 80])
    assert f.tgids == (os.getpid(),)
    assert f.ports == (80, 9000)
    assert f.comms == (b"ZMQbg/IO/0\0\0\0\0\0\0", b"python3" + b"\0" * 9)
    c = f.constants()
    assert (c["FILTER_TGIDS"], c["FILTER_COMMS"], c["FILTER_PORTS"], c["FILTER_NETNS"]) == (1, 1, 1, 0)
    assert Filters().constants()["FILTER_TGIDS"] == 0


@pytest.mark.parametrize("kwargs, msg", [
    ({"pids": ["12x"]}, "not a number"),
    ({"pids": [0]}, "out of range"),
    ({"pids": [True]}, "not a number"),
    ({"ports": [0]}, "1-65535"),
    ({"ports": [65536]}, "1-65535"),
    ({"comms": ["a-name-longer-than-15"]}, "kernel keeps only 15"),
    ({"comms": [""]}, "empty"),
    ({"netns": ["no-such-ns-pslat-test"]}, "no such network namespace"),
    ({"netns": [0]}, "not a namespace inode"),
])
def test_bad_options_are_user_errors(kwargs, msg):
    with pytest.raises(UserError, match=msg):
        Filters.build(**kwargs)


def test_pid_must_exist_unless_told_otherwise():
    dead = 2**22  # above pid_max's default range: never a live process here
    while os.path.exists(f"/proc/{dead}"):
        dead -= 1
    with pytest.raises(UserError, match=f"--pid {dead}: no such process"):
        Filters.build(pids=[dead])
    assert Filters.build(pids=[dead], check_pids=False).tgids == (dead,)


def test_too_many_is_an_error_not_a_partial_filter():
    with pytest.raises(UserError, match="at most"):
        Filters.build(ports=range(1, F.MAX_PORTS + 2))


def test_netns_by_path_and_number():
    ino = os.stat("/proc/self/ns/net").st_ino
    assert netns_inode("/proc/self/ns/net") == ino
    assert netns_inode(str(ino)) == ino
    assert Filters.build(netns=["/proc/self/ns/net", ino]).netns_inos == (ino,)


def test_netns_by_name(tmp_path, monkeypatch):
    (tmp_path / "red").write_text("")
    monkeypatch.setattr(F, "NETNS_DIR", tmp_path)
    assert netns_inode("red") == os.stat(tmp_path / "red").st_ino


SENDTO_FORMAT = """name: sys_enter_sendto
ID: 2224
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int __syscall_nr;\toffset:8;\tsize:4;\tsigned:1;
\tfield:int fd;\toffset:16;\tsize:8;\tsigned:0;
\tfield:void * buff;\toffset:24;\tsize:8;\tsigned:0;
\tfield:struct sockaddr * addr;\toffset:48;\tsize:8;\tsigned:0;
\tfield:__u8 saddr_v6[16];\toffset:40;\tsize:16;\tsigned:0;

print fmt: "fd: 0x%08lx", ((unsigned long)(REC->fd))
"""


def test_parse_format():
    f = parse_format(SENDTO_FORMAT)
    assert (f["fd"].offset_bytes, f["fd"].size_bytes) == (16, 8)
    assert f["buff"].offset_bytes == 24 and f["addr"].offset_bytes == 48
    assert f["saddr_v6"].size_bytes == 16
    assert f["__syscall_nr"].signed and not f["buff"].signed


def test_tracefs_missing(tmp_path):
    with pytest.raises(UserError, match="tracefs is not mounted"):
        tracefs_root([tmp_path])
    (tmp_path / "events").mkdir()
    with pytest.raises(UserError, match="no tracepoint syscalls:sys_enter_nope"):
        tracepoint_format("syscalls:sys_enter_nope", tmp_path)
    with pytest.raises(UserError, match="category:event"):
        tracepoint_format("../etc:passwd", tmp_path)
