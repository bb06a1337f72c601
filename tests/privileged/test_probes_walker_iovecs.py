"""The walker on calls with many buffers: one sendmsg and one writev of 256
iovecs each (brpc's writev uses up to 256, gRPC's sendmsg 260), read with
recvmsg and readv of 64 buffers (gRPC's recvmsg), on a real TCP connection on
a 1500-byte loopback. The stream is a ZMTP one (greeting, READY, ps-lite
messages, parsers/pslite/encode.py) cut at random points into the buffers, so
headers straddle iovecs. From the probe's records alone the ps-lite parser
must rebuild exactly the messages sent, on both ends, with no walk cut short;
and with SOCKCALLS_IOV_WALK_MAX below a call's iovecs the cut is said
(WALK_END IOV, walk_aborted) and the bytes beyond it are a gap, not skipped.

This file is also the peer: `python test_probes_walker_iovecs.py SEED` (one
process, both ends; "go" on stdin; JSON lines on stdout).
"""
from __future__ import annotations

import os
import random
import socket
import sys
import threading

import pytest

IOVECS_SENT = 256
IOVECS_READ = 64
SMALL, LARGE = 100, 2  # ~650 walk steps per send call: 10 passes, 8 more for the windows


def stream(seed: int) -> tuple[bytes, list[list[bytes]]]:
    from parsers.pslite.encode import greeting_bytes, message_bytes, ready_bytes
    from test_probes_walker import IDENTITY, make_messages

    sent = make_messages("small", SMALL, seed) + make_messages("large", LARGE, seed + 1)
    random.Random(seed).shuffle(sent)
    data = greeting_bytes() + ready_bytes(b"DEALER", IDENTITY) + b"".join(message_bytes(f) for f in sent)
    return data, sent


def cut(data: bytes, pieces: int, rng: random.Random) -> list[bytes]:
    """`pieces` buffers of data, cut at random points (some 1 byte long)."""
    at = sorted(rng.sample(range(1, len(data)), pieces - 1))
    bounds = [0] + at + [len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


def peer(seed: int) -> None:
    import json

    print(json.dumps({"ready": True, "pid": os.getpid()}), flush=True)
    assert sys.stdin.readline().strip() == "go"
    data, _sent = stream(seed)
    half = len(data) // 2
    rng = random.Random(seed)
    lst = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lst.getsockname())
    s = lst.accept()[0]
    got = bytearray()

    def receive() -> None:
        # recvmsg into 64 buffers, then readv into 64: both in windows of iovecs
        use_readv = False
        while len(got) < len(data):
            bufs = [bytearray(rng_r.randint(1, 4096)) for _ in range(IOVECS_READ)]
            n = os.readv(s.fileno(), bufs) if use_readv else s.recvmsg_into(bufs)[0]
            if n == 0:
                break
            got.extend(b"".join(bytes(b) for b in bufs)[:n])
            use_readv = not use_readv

    rng_r = random.Random(seed + 7)
    reader = threading.Thread(target=receive)
    reader.start()
    calls = []
    for part, how in ((data[:half], "sendmsg"), (data[half:], "writev")):
        bufs = cut(part, IOVECS_SENT, rng)
        n = c.sendmsg(bufs) if how == "sendmsg" else os.writev(c.fileno(), bufs)
        calls.append({"call": how, "bytes": n, "iovecs": len(bufs), "whole": n == len(part),
                      "first_64_bytes": sum(len(b) for b in bufs[:64])})
    reader.join(60)
    c.close()
    s.close()
    print(json.dumps({"calls": calls, "received": len(got), "same": bytes(got) == data}), flush=True)


if __name__ == "__main__":
    peer(int(sys.argv[1]))
    sys.exit(0)


from test_probes_walker import PeerProc, check_messages, directions, netns, start_probe  # noqa: E402,F401


def run(netns_name: str, seed: int, **overrides):
    from probes.events import SockCall

    p = PeerProc(netns_name, seed, script=__file__)
    try:
        p.read()
        prog, cap = start_probe(netns_name, **overrides)
        with prog:
            done = p.ask("go", prog)
            cap.drain()
            counters = prog.counters()["sockcalls"]
    finally:
        p.stop()
    # the sends went out as one call each (else the test proves nothing about 256 iovecs)
    assert done["same"] and all(c["whole"] and c["iovecs"] == IOVECS_SENT for c in done["calls"]), done
    big = [c for c in cap.calls if c.event.call in (SockCall.SENDMSG, SockCall.WRITEV) and c.walkable_bytes]
    assert sorted(c.walkable_bytes for c in big) == sorted(c["bytes"] for c in done["calls"])
    return cap, counters, done


@pytest.mark.privileged
def test_walker_reads_calls_of_256_iovecs(netns):  # noqa: F811
    seed = 11
    cap, counters, _done = run(netns, seed)
    _data, sent = stream(seed)
    dirs = [d for d in directions(cap.calls).values() if d.messages]
    assert len(dirs) == 2  # the send side and the receive side of the one connection
    for d in dirs:
        check_messages(d.messages, sent)
        assert d.parser.stats().desyncs == 0 and d.parser.stats().unparsed_bytes == 0
        assert len(d.message_ends()) == len(sent)
    print("\ncounters:", counters)
    assert counters["walk_aborted"] == 0 and counters["walk_budget"] == 0 and counters["desyncs"] == 0
    assert counters["messages"] == 2 * len(sent) and counters["lost"] == 0


@pytest.mark.privileged
def test_walker_says_where_it_stopped_reading_iovecs(netns):  # noqa: F811
    from probes.events import SockCall, WalkStop
    from oracles.walker import Gap

    cap, counters, done = run(netns, 12, SOCKCALLS_IOV_WALK_MAX=64)
    first = next(c for c in cap.calls if c.event.call == SockCall.SENDMSG and c.walkable_bytes)
    # walked from the connection's first byte up to its 64th buffer's end, and said so there
    stops = [off for off, _kind, why, _m in first.marks() if why == WalkStop.IOV]
    assert stops == [done["calls"][0]["first_64_bytes"]]
    view = first.stream_view(0)
    assert isinstance(view[-1][1], Gap) and view[-1][0] == stops[0]  # the rest unknown, not skipped
    assert not any(isinstance(x, Gap) for _o, x in view[:-1])
    assert counters["walk_aborted"] >= 1
    # the writev after it starts unsynced (mid-message): if the walker syncs in it, it stops there too
    second = next(c for c in cap.calls if c.event.call == SockCall.WRITEV and c.walkable_bytes)
    assert [off for off, _k, why, _m in second.marks() if why == WalkStop.IOV] in (
        [], [done["calls"][1]["first_64_bytes"]])
