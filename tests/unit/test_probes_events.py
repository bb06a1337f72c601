"""events.h and its ctypes mirror in probes/events.py agree: gcc compiles the
header and prints every field's offset and size, every enum and flag value."""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from probes import events
from probes.events import EVENTS_H, SockCall, SockcallEvent, SockcallMsg

needs_gcc = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc (and linux-libc-dev for linux/types.h)")

MIRRORS = [SockcallEvent, SockcallMsg]

# C constant -> the Python value that mirrors it.
CONSTANTS = {
    "PSLAT_COUNTER_SEEN": events.COUNTER_SEEN,
    "PSLAT_COUNTER_LOST": events.COUNTER_LOST,
    "SOCKCALL_COUNTER_EAGAIN": events.SOCKCALL_COUNTERS.index("eagain"),
    "SOCKCALL_COUNTER_INFLIGHT_FULL": events.SOCKCALL_COUNTERS.index("inflight_full"),
    "SOCKCALL_COUNTER_NR": len(events.SOCKCALL_COUNTERS),
    "SOCKCALL_F_ISN_EXACT": events.SOCKCALL_F_ISN_EXACT,
    "SOCKCALL_F_ISN_DERIVED": events.SOCKCALL_F_ISN_DERIVED,
    "SOCKCALL_F_PAYLOAD_FAULT": events.SOCKCALL_F_PAYLOAD_FAULT,
    "SOCKCALL_PAYLOAD_MAX": events.SOCKCALL_PAYLOAD_MAX,
    "SOCKCALL_MSG_ITEMS_MAX": events.SOCKCALL_MSG_ITEMS_MAX,
    "SOCKCALL_MSG_F_ITEMS_CUT": events.SOCKCALL_MSG_F_ITEMS_CUT,
    "SOCKCALL_MSG_F_ITEMS_LOST": events.SOCKCALL_MSG_F_ITEMS_LOST,
    "SOCKCALL_MSG_F_RX_TIMES": events.SOCKCALL_MSG_F_RX_TIMES,
    "SOCKCALL_COUNTER_MSGS_OUT": events.SOCKCALL_COUNTERS.index("msgs_out"),
    "SOCKCALL_COUNTER_MSGS_LOST": events.SOCKCALL_COUNTERS.index("msgs_lost"),
    **{f"SOCKCALL_{c.name}": c.value for c in SockCall},
    **{f"SOCKCALL_PROTO_{c.name}": c.value for c in events.WalkProtocol},
    "SOCKCALL_PROTO_MAX": max(events.WalkProtocol),
}


def compile_and_run(tmp_path, body: str) -> str:
    src = tmp_path / "layout.c"
    src.write_text(f'#include <stdio.h>\n#include <stddef.h>\n#include "{EVENTS_H}"\n'
                   f"int main(void) {{\n{body}\n  return 0;\n}}\n")
    exe = tmp_path / "layout"
    subprocess.run(["gcc", "-Wall", "-Werror", "-o", str(exe), str(src)], check=True)
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


@needs_gcc
@pytest.mark.parametrize("mirror", MIRRORS, ids=lambda m: m.__name__)
def test_struct_layout_matches_header(tmp_path, mirror):
    c = mirror.c_name
    lines = [f'  printf("sizeof %zu\\n", sizeof({c}));']
    for name, _ in mirror._fields_:
        lines.append(f'  printf("{name} %zu %zu\\n", offsetof({c}, {name}), sizeof((({c} *)0)->{name}));')
    out = compile_and_run(tmp_path, "\n".join(lines)).splitlines()
    assert out[0] == f"sizeof {ctypes.sizeof(mirror)}"
    for line, (name, _) in zip(out[1:], mirror._fields_):
        field = getattr(mirror, name)
        assert line == f"{name} {field.offset} {field.size}"
    # No field in the header that the mirror lacks: the header's size is the
    # end of the mirror's last field.
    last = mirror._fields_[-1][0]
    assert getattr(mirror, last).offset + getattr(mirror, last).size == ctypes.sizeof(mirror)


@needs_gcc
def test_constants_match_header(tmp_path):
    body = "\n".join(f'  printf("{k} %lld\\n", (long long)({k}));' for k in CONSTANTS)
    out = dict(line.split() for line in compile_and_run(tmp_path, body).splitlines())
    assert {k: int(v) for k, v in out.items()} == CONSTANTS


def make_record(payload: bytes, **fields) -> bytes:
    ev = SockcallEvent(**fields)
    ev.payload_bytes = len(payload)
    ctypes.memmove(ctypes.addressof(ev.payload), payload, len(payload))
    # The probe emits the record cut after payload[payload_bytes].
    return bytes(ev)[: SockcallEvent.payload.offset + len(payload)]


def test_decode_short_record():
    rec = make_record(b"hello", ret=5, call=SockCall.SENDTO, family=events.AF_INET, sport=4000, dport=5000,
                      seq_start=0xFFFFFFFE, seq_end=3, tgid=7, tid=8)
    ev = SockcallEvent.decode(rec)
    assert ev.payload_data == b"hello"
    assert ev.call_kind is SockCall.SENDTO and ev.call_kind.is_send
    assert ev.seq_bytes == 5  # wraps around 2**32
    ev.saddr[:4] = (127, 0, 0, 1)
    assert ev.local_addr == "127.0.0.1"
    r = ev.as_record()
    assert (r["call"], r["local_port"], r["remote_port"], r["payload"]) == ("sendto", 4000, 5000, b"hello")


def test_decode_ipv6_addr():
    ev = SockcallEvent(family=events.AF_INET6)
    ev.daddr[15] = 1
    assert ev.remote_addr == "::1"


def test_decode_rejects_inconsistent_records():
    rec = make_record(b"abcdef", call=SockCall.READ)
    with pytest.raises(ValueError, match="claims 6 payload bytes"):
        SockcallEvent.decode(rec[:-2])
    with pytest.raises(ValueError, match="shorter than its header"):
        SockcallEvent.decode(rec[:20])
    with pytest.raises(ValueError, match="unknown call 0"):
        SockcallEvent.decode(make_record(b""))
