"""The ZMTP walker joining connections mid-stream.

A DEALER sends to a ROUTER before the probe attaches, so the probe sees both
ends' calls from the middle of the stream: the walker does not know where
frames start, and hands over each call's first bytes raw until it finds sync:
- by itself (zmtp_walk.bpf.h, self-sync): a ps-lite meta header starting a
  chain of frames that completes two messages inside one call (a busy stream
  of small messages), or one message ending exactly at the call's end (paced
  traffic: a call per message);
- from a hint (probes.sockcalls.set_sync_hint): messages larger than a call
  never show a whole chain; the ps-lite parser finds sync in the raw prefixes
  (a large frame's header at the start of a call, the rest inside its body),
  and once it stands at a message boundary the test hints there. The large
  messages are paced, one per command, so that the hint lies ahead of the
  stream when it is written (on a busy connection it would be stale).
From the sync point on, every message is rebuilt as on a connection seen from
its start. Peers and checks: test_probes_walker.py.
"""
from __future__ import annotations

import contextlib

import pytest
from test_probes_walker import (check_messages, directions, expected_timestamp, make_messages, netns,  # noqa: F401
                                router_and_dealer, start_probe)

WARMUP = 50   # messages before the probe attaches


def walk_starts(d) -> tuple[object, int]:
    """(why, stream offset) of the first walk of a direction; every call after
    it is walked."""
    from probes.events import SockcallItemKind

    walked = [c for c in d.calls if c.walked_ranges()]
    first = walked[0]
    assert all(c.walked_ranges() for c in d.calls[d.calls.index(first):])
    (why,) = [m[2] for m in first.marks() if m[1] == SockcallItemKind.WALK_START]
    return why, d.offset_of_seq(first.event.seq_start) + first.walked_ranges()[0][0]


@contextlib.contextmanager
def joined(netns_name):
    """A router, and a dealer that sent WARMUP messages before the probe; the
    two sides to follow: {(pid, is_send)}. Both stopped at the end."""
    router, dealer, pids = router_and_dealer(netns_name)
    try:
        dealer.ask(f"send small {WARMUP} 1")
        router.ask(f"wait {WARMUP}")
        yield router, dealer, {(pids["dealer"], True), (pids["router"], False)}
    finally:
        router.stop()
        dealer.stop()


def drained(prog, cap) -> dict:
    """Every record delivered; the probe's counters."""
    cap.drain()
    return prog.counters()["sockcalls"]


def check_self_synced(calls, sides, sent, max_first: int) -> None:
    """Both sides walked from a self-sync, and from there on every message is
    the app's: the first is sent[i], i <= max_first."""
    from probes.events import WalkStart

    stamps = [expected_timestamp(f) for f in sent]
    seen = set()
    for side, d in followed(calls, sides):
        seen.add(side)
        why, start = walk_starts(d)
        assert why == WalkStart.SELF
        after = [m for m in d.messages if m.first_byte_offset >= start]
        i = stamps.index(after[0].timestamp)
        print(f"\nside {side}: walked from message {i} of {len(sent)} (a frame of it, or its start)")
        assert i <= max_first
        check_messages(after, sent[i:])
        assert d.parser.stats().desyncs == 0
    assert seen == sides


def followed(calls, sides):
    """(side, Direction) of each side to check, rebuilt from mid-stream."""
    for key, d in directions(calls, mid_stream=True).items():
        if (key[0], key[2]) in sides:
            yield (key[0], key[2]), d


@pytest.mark.privileged
def test_walker_joins_mid_stream_through_a_sync_hint(netns):  # noqa: F811
    """A hint starts the walk exactly where it says. The traffic after the
    join is first a ZMTP message that is no ps-lite message (so the walker
    cannot sync by itself, and stays unsynced); its calls' end is where the
    next message starts (the traffic is paced): the test hints there, and
    the ps-lite messages that follow are walked from their first byte."""
    from probes.events import WalkStart
    from probes.sockcalls import Direction as Dir
    from probes.sockcalls import set_sync_hint

    with joined(netns) as (router, dealer, sides):
        prog, cap = start_probe(netns)
        with prog:
            dealer.ask("send opaque 1 100", prog)
            router.ask(f"wait {WARMUP + 1}", prog)
            cap.drain()
            hinted = {}  # (pid, is_send) -> stream offset of the hint
            for side, d in followed(cap.calls, sides):
                assert not any(c.walked_ranges() for c in d.calls)
                last = d.calls[-1].event
                set_sync_hint(prog, last.sk, Dir.TX if side[1] else Dir.RX, last.seq_end, 0)
                hinted[side] = d.offset_of_seq(last.seq_end)
            assert set(hinted) == sides
            after, got = [], WARMUP + 1
            for kind, n, seed in (("small", 300, 200), ("large", 3, 201), ("tiny", 5, 202)):
                dealer.ask(f"send {kind} {n} {seed}", prog)
                got += n
                after += make_messages(kind, n, seed)
            router.ask(f"wait {got}", prog)
            counters = drained(prog, cap)

    for side, d in followed(cap.calls, sides):
        assert walk_starts(d) == (WalkStart.HINT, hinted[side])
        check_messages([m for m in d.messages if m.first_byte_offset >= hinted[side]], after)
        assert d.parser.stats().desyncs == 0
    print("\ncounters:", counters)
    assert counters["hints_applied"] == 2 and counters["hints_stale"] == 0 and counters["self_syncs"] == 0
    assert counters["desyncs"] == counters["walk_aborted"] == counters["not_zmtp"] == 0


@pytest.mark.privileged
def test_walker_syncs_by_itself_on_paced_large_messages(netns):  # noqa: F811
    """Large messages, paced: no call holds a whole message, but a meta
    header at a call's start predicts where its frames' headers are in later
    calls; after the walker found ZW_HUNT_CONFIRM of them it walks from the
    next one (a hint from inside the kernel, which cannot go stale)."""
    with joined(netns) as (router, dealer, sides):
        prog, cap = start_probe(netns)
        with prog:
            got = WARMUP
            for k in range(4):
                dealer.ask(f"send large 1 {100 + k}", prog)
                got += 1
                router.ask(f"wait {got}", prog)
            dealer.ask("send small 100 101", prog)
            router.ask(f"wait {got + 100}", prog)
            counters = drained(prog, cap)
    sent = [make_messages("large", 1, 100 + k)[0] for k in range(4)] + make_messages("small", 100, 101)
    check_self_synced(cap.calls, sides, sent, max_first=1)  # inside the first large message, or the second
    print("counters:", counters)
    assert counters["self_syncs"] == 2 and counters["hints_applied"] == 0
    assert counters["desyncs"] == counters["walk_aborted"] == 0


@pytest.mark.privileged
def test_walker_syncs_by_itself_on_paced_calls(netns):  # noqa: F811
    """Paced small messages (up to 850 bytes: longer than a raw prefix, so the
    parser could not find sync on its own): one call per message, and the
    walker syncs at the first one, on both ends."""
    with joined(netns) as (router, dealer, sides):
        prog, cap = start_probe(netns)
        with prog:
            got = WARMUP
            for k in range(20):
                dealer.ask(f"send small 1 {400 + k}", prog)
                got += 1
                router.ask(f"wait {got}", prog)
            counters = drained(prog, cap)
    check_self_synced(cap.calls, sides, [make_messages("small", 1, 400 + k)[0] for k in range(20)], max_first=0)
    for _side, d in followed(cap.calls, sides):  # at the first call
        assert walk_starts(d)[1] == d.offset_of_seq(d.calls[0].event.seq_start)
    print("\ncounters:", counters)
    assert counters["self_syncs"] == 2 and counters["desyncs"] == counters["walk_aborted"] == 0


@pytest.mark.privileged
def test_walker_syncs_by_itself_in_a_busy_stream(netns):  # noqa: F811
    """Joined in the middle of a burst of small messages, the walker finds
    sync by itself (a meta header starting a chain of two messages inside
    one call), without a hint: the parser then gets walked records, and every
    message from there on is rebuilt."""
    with joined(netns) as (router, dealer, expect_sides):
        prog, cap = start_probe(netns)
        with prog:
            dealer.ask("send small 1000 300", prog)
            router.ask(f"wait {WARMUP + 1000}", prog)
            counters = drained(prog, cap)
    check_self_synced(cap.calls, expect_sides, make_messages("small", 1000, 300), max_first=100)
    print("counters:", counters)
    assert counters["self_syncs"] == 2 and counters["hints_applied"] == 0
    assert counters["desyncs"] == counters["walk_aborted"] == 0
