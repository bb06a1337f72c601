"""The agent's ring-record decoders against records no kernel writes (a damaged or
doctored recording) and framework messages a hostile peer shapes (issue 11): every
value that goes on to a run-dir column fits its type (agent.records), or the record is
refused with a ValueError, which the agent counts as undecodable; a routing id whose
node id does not fit is refused and counted."""
from __future__ import annotations

import pytest

from agent.calls import SockcallAssembler
from agent.framework_records import FrameworkDecoder
from probes.events import NetstackEvent, NsClockEvent, NsConnEvent, NsEventKind
from probes.framework import Kind
from test_agent_decode import ISN_C, record
from test_framework_events import calls, kernel_events, meta

PUSH = meta(app_id=0, customer_id=2, timestamp=41, request=True, push=True)


def _recv(peer: bytes):
    dec = FrameworkDecoder()
    got = [m for m in map(dec.feed, kernel_events(calls(Kind.ZMQ_RECV, [peer, PUSH, b"k" * 8], sock=0xE0)))
           if m is not None]
    return dec, got


def test_a_routing_id_past_int32_gives_no_sender_and_is_counted():
    dec, (m,) = _recv(b"ps3000000000")
    assert m.peer == b"ps3000000000" and m.meta.sender is None   # before: 3000000000
    assert dec.values_rejected == 1
    dec, (m,) = _recv(b"ps12")
    assert m.meta.sender == 12 and dec.values_rejected == 0


@pytest.mark.parametrize("field,value", [("tgid", 2**32 - 1), ("tid", 2**31), ("ts", 2**64 - 600)])
def test_a_sockcall_record_with_values_no_kernel_gives_is_refused(field, value):
    kw = {field: value}
    raw = record(True, ISN_C + 1, 10, b"x" * 10, **kw)
    with pytest.raises(ValueError, match="no kernel gives"):
        SockcallAssembler("prefix").feed(raw)   # before: a Call whose pid or times no column holds


def test_a_framework_record_shorter_than_its_header_is_refused():
    with pytest.raises(ValueError, match="shorter than its header"):   # before: struct.error
        FrameworkDecoder().feed(b"\x00" * 74)


def test_a_framework_record_with_a_time_past_int64_is_refused():
    (raw,) = kernel_events(calls(Kind.ZMQ_SEND, [PUSH], t0=2**64 - 1000))
    with pytest.raises(ValueError, match="no kernel gives"):
        FrameworkDecoder().feed(raw)


@pytest.mark.parametrize("cls,field,value", [(NsClockEvent, "ts_ns", 2**64 - 1),
                                             (NsConnEvent, "tgid", 2**32 - 1)])
def test_a_netstack_record_with_values_no_kernel_gives_is_refused(cls, field, value):
    ev = cls(kind=int(cls.kind_value))
    setattr(ev, field, value)
    with pytest.raises(ValueError, match=field):
        NetstackEvent.decode(bytes(ev))
    setattr(ev, field, 1000)
    assert getattr(NetstackEvent.decode(bytes(ev)), field) == 1000


def test_a_comm_with_terminal_escapes_is_text():
    raw = record(True, ISN_C + 1, 10, b"x" * 10)
    at = raw.index(b"pslat-test")
    raw = raw[:at] + b"\x1b[2Jps\x07\x9b".ljust(16, b"\0") + raw[at + 16:]
    c = SockcallAssembler("prefix").feed(raw)
    assert c.comm.isprintable() and "\x1b" not in c.comm and c.comm.endswith("ps\ufffd\ufffd")
