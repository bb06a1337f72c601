"""probes.program: what the loader hands to bcc, built without root from a
hand-made tracefs and the sample BTF's real counterpart (the kernel's)."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from core.errors import UserError
from probes.btf import VMLINUX_BTF_PATH, BtfError, load
from probes.declare import COMMON_KERNEL_FIELDS, PROBES_DIR
from probes.filters import Filters
from probes.program import generate
from probes.sockcalls import SOCKCALLS, SYSCALL_ARGS

needs_vmlinux = pytest.mark.skipif(not VMLINUX_BTF_PATH.exists(), reason="no /sys/kernel/btf/vmlinux")

COMMON_HEAD = """\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;
"""


def write_format(root, tracepoint: str, fields: list[tuple[str, int, int]]):
    cat, ev = tracepoint.split(":")
    d = root / "events" / cat / ev
    d.mkdir(parents=True, exist_ok=True)
    body = "".join(f"\tfield:{decl};\toffset:{off};\tsize:{size};\tsigned:0;\n" for decl, off, size in fields)
    (d / "format").write_text(f"name: {ev}\nID: 1\nformat:\n{COMMON_HEAD}\n{body}\nprint fmt: \"\"\n")


def fake_tracefs(root, exit_ret_offset: int = 16):
    """The layout this kernel family uses: syscall args are 8-byte slots from 16."""
    for syscall, args in SYSCALL_ARGS.items():
        fields = [("int __syscall_nr", 8, 4)] + [(f"unsigned long {a}", 16 + 8 * i, 8) for i, a in enumerate(args)]
        write_format(root, f"syscalls:sys_enter_{syscall}", fields)
        write_format(root, f"syscalls:sys_exit_{syscall}", [("int __syscall_nr", 8, 4), ("long ret", exit_ret_offset, 8)])
    write_format(root, "sock:inet_sock_set_state", [
        ("const void * skaddr", 8, 8), ("int oldstate", 16, 4), ("int newstate", 20, 4),
        ("__u16 sport", 24, 2), ("__u16 dport", 26, 2), ("__u16 family", 28, 2), ("__u16 protocol", 30, 2),
        ("__u8 saddr[4]", 32, 4),
    ])
    return root


@pytest.fixture
def tracefs_root(tmp_path):
    return fake_tracefs(tmp_path / "tracing")


@needs_vmlinux
def test_generated_program(tracefs_root):
    filters = Filters.build(pids=[1], ports=[8080], check_pids=False)
    g = generate([SOCKCALLS], filters, tracefs_root=tracefs_root)
    btf = load()
    assert g.constants["OFF_TCP_WRITE_SEQ"] == btf.member("tcp_sock.write_seq").offset_bytes
    assert g.constants["OFF_SKC_DADDR"] == btf.member("sock.__sk_common.skc_daddr").offset_bytes
    assert g.constants["TP_SENDTO_LEN"] == 32 and g.constants["TP_EXIT_RET"] == 16
    assert g.constants["TP_ISS_PROTOCOL"] == 30
    assert (g.constants["FILTER_TGIDS"], g.constants["FILTER_PORTS"], g.constants["FILTER_COMMS"]) == (1, 1, 0)
    assert all(re.fullmatch(r"-D[A-Z][A-Z0-9_]*=\d+", f) for f in g.cflags)
    rendered = g.render()
    assert f"#define OFF_TCP_WRITE_SEQ {g.constants['OFF_TCP_WRITE_SEQ']}" in rendered
    # Our headers are inlined, system ones left alone; the C is used as written.
    assert '#include "' not in g.text
    assert (PROBES_DIR / "sockcalls.bpf.c").read_text().split('#include "common.bpf.h"')[1] in g.text
    assert "struct sockcall_event {" in g.text and g.text.count("struct sockcall_event {") == 1


def identifiers(text: str, prefix: str) -> set[str]:
    return set(re.findall(rf"\b({prefix}[A-Z0-9_]+)\b", text))


@needs_vmlinux
def test_every_constant_the_c_uses_is_declared_and_vice_versa(tracefs_root):
    g = generate([SOCKCALLS], tracefs_root=tracefs_root)
    text = g.text
    used_off = identifiers(text, "OFF_")
    declared_off = {f.const for f in COMMON_KERNEL_FIELDS + SOCKCALLS.kernel_fields}
    assert used_off == declared_off
    # TP_U64/TP_S32... are accessor macros, not field constants
    used_tp = {n for n in identifiers(text, "TP_") if not re.fullmatch(r"TP_[US]\d+", n)}
    assert used_tp == {f.const for f in SOCKCALLS.tracepoint_fields}
    for name in SOCKCALLS.constants:
        assert name in text
    for a in SOCKCALLS.attach:
        assert re.search(rf"^int {a.fn}\(void \*ctx\)$", text, re.M), a.fn


@needs_vmlinux
def test_overrides_are_validated(tracefs_root):
    g = generate([SOCKCALLS], tracefs_root=tracefs_root, overrides={"SOCKCALLS_RING_PAGES": 64})
    assert g.constants["SOCKCALLS_RING_PAGES"] == 64
    for bad, msg in [({"SOCKCALLS_RING_PAGES": 48}, "power of two"),
                     ({"SOCKCALLS_RING_PAGES": "64"}, "must be an integer"),
                     ({"SOCKCALLS_IOV_WALK_MAX": 1025}, "out of range"),
                     ({"SOCKCALLS_IOV_WALK_MAX": True}, "must be an integer"),
                     ({"NOPE": 1}, "unknown probe setting")]:
        with pytest.raises(UserError, match=msg):
            generate([SOCKCALLS], tracefs_root=tracefs_root, overrides=bad)


@needs_vmlinux
def test_tracepoint_mismatches_are_refused(tmp_path):
    root = fake_tracefs(tmp_path / "t1", exit_ret_offset=24)
    (root / "events/syscalls/sys_exit_read/format").write_text(
        (root / "events/syscalls/sys_exit_read/format").read_text().replace("offset:24", "offset:16"))
    with pytest.raises(UserError, match="disagree on where 'ret' is"):
        generate([SOCKCALLS], tracefs_root=root)
    root = fake_tracefs(tmp_path / "t2")
    p = root / "events/sock/inet_sock_set_state/format"
    p.write_text(p.read_text().replace("__u16 protocol;\toffset:30;\tsize:2", "__u32 protocol;\toffset:30;\tsize:4"))
    with pytest.raises(UserError, match="'protocol' is 4 bytes"):
        generate([SOCKCALLS], tracefs_root=root)
    p.write_text(p.read_text().replace("protocol", "proto"))
    with pytest.raises(UserError, match="no field 'protocol'"):
        generate([SOCKCALLS], tracefs_root=root)
    (root / "events/sock/inet_sock_set_state/format").unlink()
    with pytest.raises(UserError, match="no tracepoint sock:inet_sock_set_state"):
        generate([SOCKCALLS], tracefs_root=root)


@needs_vmlinux
def test_kernel_field_size_mismatch_is_refused(tracefs_root):
    fields = tuple(replace(f, size_bytes=8) if f.const == "OFF_TCP_WRITE_SEQ" else f for f in SOCKCALLS.kernel_fields)
    probe = replace(SOCKCALLS, kernel_fields=fields)
    with pytest.raises(BtfError, match=r"tcp_sock.write_seq is 4 bytes .* the probe reads 8"):
        generate([probe], tracefs_root=tracefs_root)
