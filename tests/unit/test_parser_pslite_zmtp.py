"""ZMTP 3.x pieces of the ps-lite parser: greeting, commands, framing, mechanisms."""
from __future__ import annotations

from parsers.pslite.encode import (MessageSpec, command_bytes, encode_stream, frame_bytes,
                                   greeting_bytes, message_bytes, ready_bytes)
from parsers.pslite.meta import Cmd, Role
from parsers.pslite.parser import PsliteStreamParser
from parsers.pslite.zmtp import greeting_prefix_ok, parse_command, parse_greeting


def test_greeting_fields_and_rejects():
    g = greeting_bytes(mechanism=b"NULL", as_server=True, minor=0)
    got = parse_greeting(g)
    assert (got.version_major, got.version_minor, got.mechanism, got.as_server) == (3, 0, b"NULL", True)
    bad = [b"\x00" + g[1:], g[:9] + b"\x00" + g[10:], g[:10] + b"\x02" + g[11:],
           g[:32] + b"\x02" + g[33:], g[:40] + b"\x01" + g[41:], g[:12] + b"\x00" * 20 + g[32:]]
    assert all(parse_greeting(b) is None for b in bad)
    assert greeting_prefix_ok(g[:5]) and not greeting_prefix_ok(b"\x01")
    assert not greeting_prefix_ok(g[:10] + b"\x01")  # ZMTP 1.0/2.0


def test_commands():
    ready = ready_bytes(b"DEALER", b"ps11")
    c = parse_command(ready[2:])
    assert c.name == b"READY" and c.properties == {b"socket-type": b"DEALER", b"identity": b"ps11"}
    e = parse_command(command_bytes(b"ERROR", b"\x05nope!")[2:])
    assert e.name == b"ERROR" and e.error_reason == b"nope!"
    assert parse_command(command_bytes(b"PING", b"\x00\x10")[2:]).name == b"PING"
    assert parse_command(command_bytes(b"BOGUS")[2:]) is None
    assert parse_command(b"\x09READY") is None  # name longer than the body
    # a READY with malformed metadata is still a READY, without properties
    assert parse_command(command_bytes(b"READY", b"\x0bSocket-Type\x00\x00\x00\x09DEAL")[2:]).properties == {}


def test_identity_and_socket_type_from_ready():
    for identity, node in ((b"ps12", 12), (b"", None), (None, None), (b"\x00\x8b\x45", None)):
        data, _ = encode_stream([MessageSpec(timestamp=1, keys=[1], vals=b"\0" * 4)], identity=identity)
        p = PsliteStreamParser()
        (m,) = p.feed(data)
        assert p.identity == identity and m.sender_node_id == node and p.socket_type == b"DEALER"


def test_error_command_is_recorded_and_stream_goes_on():
    data = (greeting_bytes() + ready_bytes() + command_bytes(b"ERROR", b"\x0bbad version")
            + message_bytes(MessageSpec(timestamp=4, keys=[1], vals=b"\0" * 4).frames()))
    p = PsliteStreamParser()
    assert [m.timestamp for m in p.feed(data)] == [4]
    assert p.error_reason == b"bad version"


def test_curve_stream_is_opaque_and_counted():
    data = greeting_bytes(mechanism=b"CURVE") + command_bytes(b"HELLO", b"\x00" * 200) + b"\x91" * 5000
    p = PsliteStreamParser()
    assert p.feed(data) == [] and p.close() == []
    s = p.stats()
    assert s.handshake_bytes == 64 and s.unparsed_bytes == len(data) - 64


def test_long_frames_and_big_control_messages():
    nodes = [(Role.WORKER, 9 + 2 * i, "host-%03d.example" % i, 9000 + i) for i in range(40)]
    spec = MessageSpec(request=True, push=False, timestamp=None, control_cmd=Cmd.ADD_NODE, control_nodes=nodes)
    meta = spec.frames()[0]
    assert len(meta) > 255  # sent as a long frame
    data, spans = encode_stream([spec, MessageSpec(timestamp=2, keys=[5], vals=b"\0" * 4)])
    assert frame_bytes(meta)[0] == 0x02
    msgs = PsliteStreamParser().feed(data)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in msgs] == spans
    assert msgs[0].cmd == Cmd.ADD_NODE and len(msgs[0].nodes) == 40
    assert msgs[0].nodes[3].hostname == "host-003.example" and msgs[0].nodes[3].port == 9003


def test_meta_larger_than_the_limit_is_unparsed_and_the_stream_recovers():
    big = MessageSpec(timestamp=1, keys=[1], vals=b"\0" * 4, extra={"body": b"b" * 5000})
    small = [MessageSpec(timestamp=t, keys=[t], vals=b"\0" * 4) for t in (2, 3)]
    data, spans = encode_stream([big] + small)
    p = PsliteStreamParser(meta_max_bytes=1024)
    msgs = p.feed(data) + p.close()
    assert [m.timestamp for m in msgs] == [2, 3]
    assert p.stats().unparsed_bytes == spans[0][1] - spans[0][0] + 1


def test_ops_with_and_without_the_pull_field():
    specs = [MessageSpec(request=True, push=True, pull=False, timestamp=1, keys=[1], vals=b"\0" * 4),
             MessageSpec(request=True, push=False, pull=True, timestamp=2, keys=[1], vals=b""),
             MessageSpec(request=False, push=False, pull=True, timestamp=2, keys=[1], vals=b"\0" * 4),
             MessageSpec(request=False, push=True, pull=False, timestamp=1),
             # older ps-lite (MXNet): no pull field
             MessageSpec(request=True, push=False, timestamp=3, keys=[1], vals=b""),
             MessageSpec(request=False, push=False, timestamp=3, keys=[1], vals=b"\0" * 4),
             MessageSpec(request=False, push=True, timestamp=4),
             MessageSpec(request=False, push=False, timestamp=5),  # empty answer: cannot tell
             MessageSpec(request=True, push=False, timestamp=None, control_cmd=Cmd.BARRIER),
             MessageSpec(request=True, push=False, timestamp=6, simple_app=True, extra={"body": b"hi"})]
    msgs = PsliteStreamParser().feed(encode_stream(specs)[0])
    assert [m.ps_op.value for m in msgs] == ["push", "pull", "pull", "push", "pull", "pull", "push",
                                          "unknown", "none", "none"]
    assert [m.has_pull_field for m in msgs[:5]] == [True, True, True, True, False]
    assert [m.kind.value for m in msgs[-2:]] == ["control", "data"]


def test_stream_without_greeting_is_hunted_even_when_said_to_start_at_zero():
    specs = [MessageSpec(timestamp=t, keys=[t], vals=b"\0" * 4) for t in range(3)]
    data, spans = encode_stream(specs, handshake=False)
    p = PsliteStreamParser()  # told this is the connection's first byte, but it is not
    msgs = p.feed(data) + p.close()
    assert [m.timestamp for m in msgs] == [0, 1, 2]
    assert p.greeting is None and p.stats().unparsed_bytes == 0


def test_greeting_found_by_a_parser_started_mid_stream():
    data, spans = encode_stream([MessageSpec(timestamp=1, keys=[1], vals=b"\0" * 4)], identity=b"ps13")
    p = PsliteStreamParser(mid_stream=True)
    (m,) = p.feed(b"\x17" * 30 + data)
    assert m.sender_node_id == 13 and p.stats().unparsed_bytes == 30 and p.stats().resyncs == 1
