"""agent/check.py (`pslat check`) on made-up hosts: a hand-made tracefs, module trees,
a BTF file that is not BTF, capability sets; each missing piece named with its cost,
and the verdict (can the agent start) from the required ones only."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_probes_program import fake_tracefs  # noqa: E402  (the sockcalls probe's tracepoints, hand-made)

from agent.check import (CAPABILITIES, NETSTACK_COSTS, can_start, check_btf, check_headers, check_kernel,  # noqa: E402
                         check_root_and_capabilities, check_tracefs)
from probes.sockcalls import SOCKCALLS  # noqa: E402

ALL_CAPS = sum(1 << bit for bit, _, _ in CAPABILITIES.values())


def _by_name(checks):
    return {c.name: c for c in checks}


def test_root_and_capabilities():
    assert can_start(check_root_and_capabilities(euid=0, cap_eff=ALL_CAPS))
    c = _by_name(check_root_and_capabilities(euid=1000, cap_eff=0))
    assert not c["root"].ok and "sudo" in c["root"].line()
    assert not can_start(list(c.values()))
    # root without setns and ptrace: the agent starts, and the lines say what is lost
    c = check_root_and_capabilities(euid=0, cap_eff=ALL_CAPS & ~(1 << 21) & ~(1 << 19))
    assert can_start(c)
    lines = [x.line() for x in c if not x.ok]
    assert lines == ["absent  CAP_SYS_PTRACE: not effective; without it: other users' processes: their "
                     "/proc/PID/maps and libraries",
                     "absent  CAP_SYS_ADMIN: not effective; without it: --netns (setns) and mounting tracefs"]
    assert not can_start(check_root_and_capabilities(euid=0, cap_eff=ALL_CAPS & ~(1 << 39)))


def test_kernel_version():
    assert check_kernel("6.1.0-57-amd64").ok and check_kernel("5.8.0").ok
    old = check_kernel("5.4.0-100-generic")
    assert not old.ok and "ring buffers" in old.line()
    assert not check_kernel("weird").ok


def test_a_tracefs_with_only_the_syscalls_starts_the_agent_without_netstack(tmp_path):
    root = fake_tracefs(tmp_path / "tracing")
    c = check_tracefs([root])
    by = _by_name(c)
    assert by["tracefs"].ok and by["tracepoints (sockcalls)"].ok and by["tracepoint fields (sockcalls)"].ok
    absent = [x for x in c if x.name.startswith("tracepoint ") and not x.ok]
    # netstack's raw tracepoints are not in this tracefs's available_events: each named with its cost
    assert {x.name.split()[-1] for x in absent} >= set(NETSTACK_COSTS)
    sched = by["tracepoint sched_switch"].line()
    assert "runq_wait" in sched and "--no-netstack" in sched
    assert can_start(c)


def test_a_missing_syscall_tracepoint_stops_the_agent(tmp_path):
    root = fake_tracefs(tmp_path / "tracing")
    gone = next(a.target for a in SOCKCALLS.attach if a.target.endswith("sys_enter_sendto"))
    cat, _, ev = gone.partition(":")
    (root / "events" / cat / ev / "format").unlink()
    (root / "events" / cat / ev).rmdir()
    c = _by_name(check_tracefs([root]))
    assert not c["tracepoints (sockcalls)"].ok and gone in c["tracepoints (sockcalls)"].detail
    assert not can_start(list(c.values()))


def test_no_tracefs(tmp_path):
    c = check_tracefs([tmp_path / "nothing"])
    assert [x.name for x in c] == ["tracefs"] and not c[0].ok and "mount -t tracefs" in c[0].line()


def test_kernel_headers(tmp_path):
    tree = tmp_path / "modules" / "6.1.0-57-amd64"
    for f in ("build/include/generated/autoconf.h", "source/include/linux/kconfig.h"):
        (tree / f).parent.mkdir(parents=True)
        (tree / f).write_text("")
    ok = check_headers("6.1.0-57-amd64", kheaders=tmp_path / "none", modules=tmp_path / "modules")
    assert ok.ok and "another kernel" not in ok.detail
    (tree / "source/include/linux/kconfig.h").unlink()
    assert not check_headers("6.1.0-57-amd64", kheaders=tmp_path / "none", modules=tmp_path / "modules").ok
    (tmp_path / "kheaders.tar.xz").write_bytes(b"x")
    assert check_headers("6.9.0", kheaders=tmp_path / "kheaders.tar.xz", modules=tmp_path / "modules").ok
    none = check_headers("6.9.0", kheaders=tmp_path / "none", modules=tmp_path / "modules")
    assert not none.ok and "make setup" in none.line()


def test_a_btf_that_is_not_btf(tmp_path):
    bad = tmp_path / "vmlinux"
    bad.write_bytes(b"\0" * 64)
    c = check_btf(bad)
    assert len(c) == 1 and not c[0].ok and "not BTF" in c[0].detail
    c = check_btf(tmp_path / "missing")
    assert not c[0].ok
