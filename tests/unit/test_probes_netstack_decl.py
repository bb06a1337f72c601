"""The netstack probe without root: its event structs match events.h, records
decode by kind, and its declaration generates a program with every constant
the C uses (alone and together with sockcalls, which includes rings.bpf.h)."""
from __future__ import annotations

import ctypes
import re

import pytest
from test_probes_events import compile_and_run, needs_gcc
from test_probes_program import needs_vmlinux, write_format

from probes import events as E
from probes.declare import PROBES_DIR
from probes.filters import Filters
from probes.netstack import NETSTACK, NETSTACK_NO_COMPLETION, RAW_HOOKS
from probes.program import generate

CONSTANTS = {
    **{f"NS_EV_{k.name}": k.value for k in E.NsEventKind},
    **{f"NS_COUNTER_{name.upper()}": i for i, name in enumerate(E.NETSTACK_COUNTERS) if i >= 2},
    "NS_COUNTER_NR": len(E.NETSTACK_COUNTERS),
    **{name: getattr(E, name) for name in dir(E)
       if re.match(r"NS_(TX_F|TXC|CONN_F|CALL|RX_F|SCHED_F|WIN_F)_[A-Z_]+$", name) and name != "NS_TXC_NAMES"},
}


@needs_gcc
@pytest.mark.parametrize("mirror", E.NETSTACK_MIRRORS, ids=lambda m: m.__name__)
def test_struct_layout_matches_header(tmp_path, mirror):
    c = mirror.c_name
    lines = [f'  printf("sizeof %zu\\n", sizeof({c}));']
    lines += [f'  printf("{n} %zu %zu\\n", offsetof({c}, {n}), sizeof((({c} *)0)->{n}));' for n, _ in mirror._fields_]
    out = compile_and_run(tmp_path, "\n".join(lines)).splitlines()
    assert out[0] == f"sizeof {ctypes.sizeof(mirror)}"
    for line, (name, _) in zip(out[1:], mirror._fields_):
        field = getattr(mirror, name)
        assert line == f"{name} {field.offset} {field.size}"
    last = getattr(mirror, mirror._fields_[-1][0])
    assert last.offset + last.size == ctypes.sizeof(mirror)  # no field the mirror lacks


@needs_gcc
def test_constants_match_header(tmp_path):
    body = "\n".join(f'  printf("{k} %lld\\n", (long long)({k}));' for k in CONSTANTS)
    out = dict(line.split() for line in compile_and_run(tmp_path, body).splitlines())
    assert {k: int(v) for k, v in out.items()} == CONSTANTS
    assert len(CONSTANTS) > 40  # the regex above found the flag families


def test_decode_by_kind():
    ev = E.NsTxEvent(kind=E.NsEventKind.TX, end_seq=5, msg_id=7, flags=E.NS_TX_F_BEFORE_EXPECT)
    got = E.NetstackEvent.decode(bytes(ev))
    assert isinstance(got, E.NsTxEvent) and (got.end_seq, got.msg_id) == (5, 7)
    conn = E.NsConnEvent(kind=E.NsEventKind.CONN, family=E.AF_INET, sport=80, newstate=1)
    conn.saddr[:4] = (10, 77, 0, 1)
    rec = E.NetstackEvent.decode(bytes(conn)).as_record()
    assert (rec["kind"], rec["saddr"], rec["sport"]) == ("conn", "10.77.0.1", 80)
    call = E.NsCallEvent(kind=E.NsEventKind.CALL, family=E.AF_INET6, comm=b"psbench")
    call.daddr[15] = 1
    rec = E.NetstackEvent.decode(bytes(call)).as_record()
    assert (rec["daddr"], rec["comm"]) == ("::1", "psbench")


def test_decode_rejects_bad_records():
    with pytest.raises(ValueError, match="unknown kind 9"):
        E.NetstackEvent.decode(b"\x09" + bytes(63))
    with pytest.raises(ValueError, match="expected 64"):
        E.NetstackEvent.decode(bytes(E.NsTxEvent(kind=E.NsEventKind.TX))[:40])
    with pytest.raises(ValueError, match="empty"):
        E.NetstackEvent.decode(b"")
    with pytest.raises(ValueError, match="is not a NsTxEvent"):
        E.NsTxEvent.decode(bytes(E.NsTxDoneEvent(kind=E.NsEventKind.TX_DONE)))


def fake_syscall_formats(root):
    for tp in ("connect", "accept", "accept4"):
        write_format(root, f"syscalls:sys_enter_{tp}", [("int __syscall_nr", 8, 4), ("int fd", 16, 8)])
        write_format(root, f"syscalls:sys_exit_{tp}", [("int __syscall_nr", 8, 4), ("long ret", 16, 8)])
    return root


def identifiers(text: str, prefix: str) -> set[str]:
    return set(re.findall(rf"\b({prefix}[A-Z0-9_]+)\b", text))


@needs_vmlinux
def test_every_constant_the_c_uses_is_declared(tmp_path):
    g = generate([NETSTACK], Filters.build(ports=[5000]), tracefs_root=fake_syscall_formats(tmp_path))
    declared = set(g.constants)
    for prefix in ("NS_OFF_", "NS_TP_", "OFF_", "FILTER_"):
        used = identifiers(g.text, prefix)
        assert used <= declared, f"used but not declared: {used - declared}"
    ns_declared = {c for c in declared if c.startswith(("NS_OFF_", "NS_TP_"))}
    assert ns_declared <= identifiers(g.text, "NS_"), "declared but unused"
    # ring sizes are powers of two by construction (LOG2 constants)
    assert all(1 <= g.constants[k] <= 9 for k in g.constants if k.endswith("_SLOTS_LOG2"))
    assert g.constants["NS_TX_COMPLETION"] == 1
    assert "NETSTACK_LOADED" in g.constants and "ns_tx_expect_end" in g.text


def test_declaration_hooks():
    fns = {a.fn for a in NETSTACK.attach}
    src = (PROBES_DIR / NETSTACK.source).read_text()
    assert all(f"int {fn}(" in src for fn in fns)
    assert {a.target for a in NETSTACK.attach if a.kind == "raw_tracepoint"} == set(RAW_HOOKS)
    # without TX completion the hooks on every freed skb are not attached
    assert not {"consume_skb", "kfree_skb"} & {a.target for a in NETSTACK_NO_COMPLETION.attach}
    assert NETSTACK.counters == E.NETSTACK_COUNTERS and NETSTACK.ring == "ns_events"


@needs_vmlinux
def test_generates_with_sockcalls_once(tmp_path):
    """Both probes in one program: rings.bpf.h and events.h inlined once,
    no map or function name twice."""
    from test_probes_program import fake_tracefs

    from probes.sockcalls import SOCKCALLS

    root = fake_syscall_formats(fake_tracefs(tmp_path / "tracing"))
    g = generate([SOCKCALLS, NETSTACK], tracefs_root=root)
    assert g.text.count("#ifndef PSLAT_RINGS_BPF_H") == 1
    assert g.text.count("struct ns_tx_event {") == 1
    names = map_names(g.text)
    assert {"ns_tx_socks", "ns_flows", "ns_events", "sockcalls_events"} <= set(names)
    assert len(names) == len(set(names)), sorted(names)
    # functions: the ns_* API exists twice in the text (with and without the
    # probe, one #if branch each); nothing else may
    fns = re.findall(r"^(?:static __always_inline )?(?:int|void|u\d+|s\d+) (\w+)\(", g.text, re.M)
    api = {"ns_track", "ns_tx_expect_end", "ns_rx_lookup_end", "ns_thread_sched", "ns_window_state"}
    assert not {f for f in fns if fns.count(f) > 1} - api


def map_names(text: str) -> list[str]:
    """Names of the maps a bcc program declares (BPF_TABLE: 4th argument, others: 1st)."""
    out = []
    for macro, args in re.findall(r"^(BPF_\w+)\((.*)\);", text, re.M):
        parts = [a.strip() for a in args.split(",")]
        out.append(parts[3] if macro == "BPF_TABLE" else parts[0])
    return out


def test_every_per_connection_lru_map_declares_its_eviction_count():
    """made - removed - size, never negative; every probe's LRU maps name real slots."""
    from probes.declare import LruMap
    from probes.netstack import NETSTACK
    from probes.sockcalls import SOCKCALLS

    assert {m.name for m in SOCKCALLS.lru_maps} == {"conns", "walks"}
    assert {m.name for m in NETSTACK.lru_maps} == {"socks"}
    m = LruMap("conns", "conns_made", "conns_removed", "SOCKCALLS_CONNS_MAX")
    sizes = {"SOCKCALLS_CONNS_MAX": 64}
    assert m.evicted({"conns_made": 100, "conns_removed": 10}, sizes) == 26
    assert m.evicted({"conns_made": 50, "conns_removed": 10}, sizes) == 0
