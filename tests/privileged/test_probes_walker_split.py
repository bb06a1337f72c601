"""The ZMTP walker with call boundaries everywhere.

One peer process (in a namespace of our own) writes a ZMTP 3 stream
(parsers/pslite/encode.py: greeting, READY, ps-lite messages with short and
LONG frame headers) over a TCP connection in chunks of 1 to 13 bytes, through
send, sendmsg and writev (several iovecs per call), and reads it on the other
end in chunks of 1 to 11 bytes through recv, recvmsg and readv. So calls begin
and end at every position of the greeting, of headers (inside the 8 size
bytes of LONG ones too) and of bodies, and the walker's state must carry
across all of them. Both ends' records must rebuild exactly the messages,
their end sequence numbers, and the greeting and READY bytes.

This file is also the peer program: `python test_probes_walker_split.py`.
"""
from __future__ import annotations

import itertools
import json
import os
import socket
import sys

import pytest
from test_probes_walker import PeerProc, check_messages, directions, make_messages, netns  # noqa: F401

SEND_SIZES = range(1, 14)
RECV_SIZES = range(1, 12)


def the_stream():
    from parsers.pslite.encode import encode_stream

    msgs = make_messages("small", 30, 31) + make_messages("tiny", 10, 32)
    data, spans = encode_stream(msgs, identity=b"ps7")
    return msgs, data, spans


def peer_split() -> None:
    _msgs, data, _spans = the_stream()
    lst = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lst.getsockname())
    s = lst.accept()[0]
    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    assert sys.stdin.readline().strip() == "go"
    calls = 0
    pos = 0
    sizes = itertools.cycle(SEND_SIZES)
    while pos < len(data):  # the reader below keeps up: the socket buffer holds it all
        n = next(sizes)
        chunk = memoryview(data)[pos:pos + n]
        how = calls % 3
        if how == 0:
            sent = c.send(chunk)
        elif how == 1:  # iovecs of 1, 2, rest
            sent = c.sendmsg([chunk[:1], chunk[1:3], chunk[3:]])
        else:
            sent = os.writev(c.fileno(), [chunk[:2], chunk[2:]])
        pos += sent
        calls += 1
    got = bytearray()
    sizes = itertools.cycle(RECV_SIZES)
    while len(got) < len(data):
        n = next(sizes)
        how = len(got) % 3
        if how == 0:
            got += s.recv(n)
        elif how == 1:
            bufs = [bytearray(1), bytearray(max(0, n - 1))]
            k = s.recvmsg_into(bufs)[0]
            got += (bytes(bufs[0]) + bytes(bufs[1]))[:k]
        else:
            bufs = [bytearray(2), bytearray(max(0, n - 2))]
            k = os.readv(s.fileno(), bufs)
            got += (bytes(bufs[0]) + bytes(bufs[1]))[:k]
    assert bytes(got) == data
    print(json.dumps({"done": True, "send_calls": calls}), flush=True)


if __name__ == "__main__":
    peer_split()
    sys.exit(0)


@pytest.mark.privileged
def test_walker_follows_frames_across_any_call_boundary(netns):  # noqa: F811
    from test_probes_walker import start_probe

    msgs, data, spans = the_stream()
    peer = PeerProc(netns, script=__file__)
    try:
        ready = peer.read()
        prog, cap = start_probe(netns)
        with prog:
            done = peer.ask("go", prog)
            cap.drain()
            counters = prog.counters()["sockcalls"]
    finally:
        peer.stop()
    dirs = directions([c for c in cap.calls if c.event.tgid == ready["pid"]])
    assert len(dirs) == 2  # the client's sends, the server's receives
    ends = [last + 1 for _first, last in spans]
    for (_pid, _conn, is_send), d in dirs.items():
        assert len(d.calls) >= done["send_calls"] if is_send else len(d.calls) > len(data) // 11
        check_messages(d.messages, msgs)
        assert [m.end_offset for m in d.messages] == ends
        assert [off for off, _e in d.message_ends()] == ends
        assert d.parser.greeting is not None and d.parser.identity == b"ps7"
        assert d.parser.stats().unparsed_bytes == 0
        # the captured bytes are the stream's, wherever they are
        for view in d.views:
            for off, x in view:
                if isinstance(x, bytes):
                    assert data[off:off + len(x)] == x
    print("\ncounters:", counters)
    assert counters["desyncs"] == counters["walk_aborted"] == counters["stream_gaps"] == 0
    assert counters["messages"] == 2 * len(msgs)
