"""The ZMTP walker joining a connection mid-stream, synced by a hint from user space.

A DEALER sends to a ROUTER before the probe attaches, so the probe sees both
ends' calls from the middle of the stream: the walker cannot know where frames
start, and hands over each call's first bytes raw. The ps-lite parser hunts in
those bytes, and once it has confirmed a chain of messages and stands at a
message boundary, the test writes a sync hint for the next byte
(probes.sockcalls.set_sync_hint). The traffic is paced (one tiny message per
command) so that the hint lies ahead of the stream when it is written: the
walker applies it at the next call, and from there on the messages, small and
large, are rebuilt from walked records as on a connection seen from its start.
Peers and checks: test_probes_walker.py.
"""
from __future__ import annotations

import pytest
from test_probes_walker import (PeerProc, check_messages, directions, expected_timestamp, make_messages,  # noqa: F401
                                netns, start_probe)

WARMUP = 50   # messages before the probe attaches
PACED = 10    # tiny messages one by one until both ends are hinted


@pytest.mark.privileged
def test_walker_joins_mid_stream_through_a_sync_hint(netns):  # noqa: F811
    from probes.events import SockcallItemKind, WalkStart
    from probes.sockcalls import Direction as Dir
    from probes.sockcalls import set_sync_hint

    router = PeerProc(netns, "router")
    peers = [router]
    try:
        r_ready = router.read()
        dealer = PeerProc(netns, "dealer", r_ready["port"])
        peers.append(dealer)
        d_ready = dealer.read()
        dealer.ask("connect")
        dealer.ask(f"send small {WARMUP} 1")
        router.ask(f"wait {WARMUP}")
        prog, cap = start_probe(netns)
        with prog:
            got = WARMUP
            hinted = {}  # (pid, is_send) -> stream offset of the hint
            for k in range(PACED):
                dealer.ask(f"send tiny 1 {100 + k}", prog)
                got += 1
                router.ask(f"wait {got}", prog)
                cap.drain()
                for key, d in directions(cap.calls, mid_stream=True).items():
                    side = (key[0], key[2])
                    p = d.parser
                    # synced, and the last message released ends where the stream stands
                    if side in hinted or not (p.synced and d.messages and d.messages[-1].end_offset == p.offset):
                        continue
                    set_sync_hint(prog, d.event.sk, Dir.TX if key[2] else Dir.RX, d.seq_of(p.offset), 0)
                    hinted[side] = p.offset
                if len(hinted) == 2:
                    break
            assert set(hinted) == {(d_ready["pid"], True), (r_ready["pid"], False)}, hinted
            after = []
            for kind, n, seed in (("small", 300, 200), ("large", 3, 201), ("tiny", 5, 202)):
                dealer.ask(f"send {kind} {n} {seed}", prog)
                got += n
                after += make_messages(kind, n, seed)
            router.ask(f"wait {got}", prog)
            cap.drain()
            counters = prog.counters()["sockcalls"]
    finally:
        for p in peers:
            p.stop()

    dirs = directions(cap.calls, mid_stream=True)
    for key, d in dirs.items():
        side = (key[0], key[2])
        if side not in hinted:
            continue
        # before the hint: raw prefixes only, never a walk
        walked = [c for c in d.calls if c.walked_ranges()]
        first = walked[0]
        assert [m[2] for m in first.marks() if m[1] == SockcallItemKind.WALK_START] == [WalkStart.HINT]
        assert d.offset_of_seq(first.event.seq_start) + first.walked_ranges()[0][0] == hinted[side]
        assert all(c.walked_ranges() for c in d.calls[d.calls.index(first):])
        # after it: every message, small and large, as the app sent it
        check_messages([m for m in d.messages if m.first_byte_offset >= hinted[side]], after)
        assert d.parser.stats().desyncs == 0
    print("\ncounters:", counters)
    assert counters["hints_applied"] == 2 and counters["hints_stale"] == 0
    assert counters["desyncs"] == counters["walk_aborted"] == counters["not_zmtp"] == 0


@pytest.mark.privileged
def test_walker_syncs_by_itself_in_a_busy_stream(netns):  # noqa: F811
    """Joined in the middle of a burst of small messages, the walker finds
    sync by itself (a meta header starting a chain of two messages inside
    one call), without a hint: the parser then gets walked records, and every
    message from there on is rebuilt."""
    from probes.events import SockcallItemKind, WalkStart

    router = PeerProc(netns, "router")
    peers = [router]
    try:
        r_ready = router.read()
        dealer = PeerProc(netns, "dealer", r_ready["port"])
        peers.append(dealer)
        d_ready = dealer.read()
        dealer.ask("connect")
        dealer.ask(f"send small {WARMUP} 1")
        router.ask(f"wait {WARMUP}")
        prog, cap = start_probe(netns)
        with prog:
            dealer.ask("send small 1000 300", prog)
            router.ask(f"wait {WARMUP + 1000}", prog)
            cap.drain()
            counters = prog.counters()["sockcalls"]
    finally:
        for p in peers:
            p.stop()
    sent = make_messages("small", 1000, 300)
    stamps = [expected_timestamp(f) for f in sent]
    sides = set()
    for key, d in directions(cap.calls, mid_stream=True).items():
        walked = [c for c in d.calls if c.walked_ranges()]
        if not walked:
            continue
        sides.add((key[0], key[2]))
        first = walked[0]
        assert [m[2] for m in first.marks() if m[1] == SockcallItemKind.WALK_START] == [WalkStart.SELF]
        start = d.offset_of_seq(first.event.seq_start) + first.walked_ranges()[0][0]
        assert all(c.walked_ranges() for c in d.calls[d.calls.index(first):])
        after = [m for m in d.messages if m.first_byte_offset >= start]
        i = stamps.index(after[0].timestamp)
        print(f"\nside {key[0]} {'tx' if key[2] else 'rx'}: synced at message {i} of {len(sent)}, "
              f"call {d.calls.index(first)} of {len(d.calls)}")
        assert i < 100
        check_messages(after, sent[i:])
        assert d.parser.stats().desyncs == 0
    assert sides == {(d_ready["pid"], True), (r_ready["pid"], False)}
    print("counters:", counters)
    assert counters["self_syncs"] == 2 and counters["hints_applied"] == 0
    assert counters["desyncs"] == counters["walk_aborted"] == 0
