"""brpc's framework records (framework.bpf.c's FW_BRPC_* events: one per RPC end, the
correlation id in `sock`) decode to KeyedMessages naming their wire message's ids, through
the reference (tests/oracles/framework.py) and the agent's FrameworkDecoder alike; and the export check
reads an ELF's dynamic symbols, refusing files that are not what they claim."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from core.errors import UserError
from agent.framework_records import FrameworkDecoder
from probes.elf_symbols import defined_functions
from probes.framework import (COUNTERS, POINTS, FrameworkProbe, FwEvent, KeyedMessage, Kind, Target,
                              decode_event, targets_of_pid)
from oracles.framework import MessageAssembler

BRPC_KINDS = (Kind.BRPC_CLIENT_SEND, Kind.BRPC_CLIENT_RECV, Kind.BRPC_SERVER_RECV,
              Kind.BRPC_SERVER_SEND)


def brpc_record(kind: Kind, cid: int, ts: int, done: int, tgid: int = 41, tid: int = 42) -> bytes:
    """What brpc_event() sends: the fixed part only, frames 0."""
    e = FwEvent(ts_ns=ts, first_ret_ts_ns=ts, ret_ts_ns=done, sock=cid & (2**64 - 1),
                tgid=tgid, tid=tid, kind=kind)
    return bytes(e)[:FwEvent.heads.offset]


@pytest.mark.parametrize("kind,direction,is_request", [
    (Kind.BRPC_CLIENT_SEND, "send", True), (Kind.BRPC_CLIENT_RECV, "recv", False),
    (Kind.BRPC_SERVER_RECV, "recv", True), (Kind.BRPC_SERVER_SEND, "send", False)])
def test_each_end_names_its_wire_ids(kind, direction, is_request):
    raw = brpc_record(kind, 0x1_0000_0201, 1_000, 1_500)
    for m in (MessageAssembler().feed(decode_event(raw)), FrameworkDecoder().feed(raw)):
        assert isinstance(m, KeyedMessage) and m.layer == "brpc" and m.meta is None
        assert (m.direction, m.tgid, m.tid) == (direction, 41, 42)
        assert m.call_key == (None, 0x1_0000_0201, is_request)
        assert (m.ts_ns, m.ret_ts_ns) == (1_000, 1_500)


def test_correlation_id_is_signed_like_the_wires():
    # RpcMeta.correlation_id is an int64; the probe reads the register's 64 bits
    m = FrameworkDecoder().feed(brpc_record(Kind.BRPC_SERVER_SEND, -5, 7, 7))
    assert m.call_key[1] == -5


def test_ps_lite_messages_stay_unkeyed():
    # the ps layer's records keep their meta; KeyedMessage is brpc's alone
    e = FwEvent(ts_ns=1, first_ret_ts_ns=2, ret_ts_ns=2, sock=9, ret=100, tgid=1, tid=1,
                kind=Kind.PS_SEND, frames=1)
    m = MessageAssembler().feed(decode_event(bytes(e)[:FwEvent.heads.offset + 64]))
    assert type(m) is not KeyedMessage and m.layer == "ps"


def test_brpc_points_are_entry_only_and_counters_named():
    assert [p.return_fn for p in POINTS["brpc"]] == [None] * 4
    assert {p.entry_fn for p in POINTS["brpc"]} == {
        "brpc_client_send", "brpc_client_recv", "brpc_server_recv", "brpc_server_send"}
    # enum fw_counter's order in framework.bpf.c
    src = Path(__file__).resolve().parents[2].joinpath("probes", "framework.bpf.c").read_text()
    for i, name in enumerate(COUNTERS):
        assert f"FW_{name.upper()} = {i}," in src, name
    for kind in BRPC_KINDS:
        assert f"FW_{kind.name} = {int(kind)}," in src


def test_libpaddle_found_in_a_process_maps(tmp_path, monkeypatch):
    lib = "/opt/venv/lib/python3.11/site-packages/paddle/base/libpaddle.so"
    maps = f"7f00-7f10 r-xp 00000000 08:01 12 {lib}\n7f20-7f30 r-xp 00000000 08:01 13 /usr/lib/libc.so.6\n"
    real_read = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: maps if str(self) == "/proc/4242/maps"
                        else real_read(self, *a, **k))
    (t,) = targets_of_pid(4242)
    assert t.layer == "brpc" and t.pid == 4242 and t.library.name == "libpaddle.so"


# --- the export check ------------------------------------------------------------------

def _libc() -> Path:
    for p in ("/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libc.so.6"):
        if Path(p).exists():
            return Path(p)
    pytest.skip("no libc.so.6 at the Debian path")


def test_defined_functions_agrees_with_nm():
    lib = _libc()
    got = defined_functions(lib, ["malloc", "free", "getpid", "no_such_function_here", "stdin"])
    assert got == {"malloc", "free", "getpid"}   # stdin is an object, not a function
    if shutil.which("nm"):   # binutils, an independent reader of .dynsym
        out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True,
                             text=True, check=True).stdout
        names = {ln.split()[2].split("@")[0] for ln in out.splitlines()
                 if len(ln.split()) == 3 and ln.split()[1] in "TWi"}
        assert {"malloc", "free", "getpid"} <= names and "no_such_function_here" not in names


@pytest.mark.parametrize("mangle", [
    lambda b: b"not an elf" + b[10:],
    lambda b: b[:64],                                          # headers cut off
    lambda b: b[:4] + b"\x01" + b[5:],                         # 32-bit class
    lambda b: b[:0x28] + struct.pack("<Q", 2**62) + b[0x30:],  # section headers far away
])
def test_hostile_files_are_refused_not_crashed_on(tmp_path, mangle):
    bad = tmp_path / "libpaddle.so"
    bad.write_bytes(mangle(_libc().read_bytes()))
    with pytest.raises(UserError, match="not a shared library the probes can read"):
        defined_functions(bad, ["malloc"])


def test_a_library_without_the_symbols_is_refused_by_name(tmp_path):
    # another build: libc where libpaddle.so should be (root's, not writable by others)
    lib = tmp_path / "libpaddle.so"
    lib.write_bytes(_libc().read_bytes())
    lib.chmod(0o644)
    target = Target(lib, "brpc", os.getpid())
    probe = FrameworkProbe([target])
    with pytest.raises(UserError, match="does not export _ZN4brpc6policy14PackRpcRequest.*, where the brpc"):
        probe._check_exports(target)


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="cannot read the symbols"):
        defined_functions(tmp_path / "gone.so", ["malloc"])
