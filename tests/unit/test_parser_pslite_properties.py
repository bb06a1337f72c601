"""Property tests of the ps-lite stream parser: any chunking, mid-stream starts, garbage,
gaps and truncation, on streams built by parsers.pslite.encode."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from parsers.pslite.encode import MessageSpec, command_bytes, encode_stream, frame_bytes, message_bytes
from parsers.pslite.meta import Cmd, DataType, Role
from parsers.pslite.parser import PsliteStreamParser

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def message_specs(draw):
    newer = draw(st.booleans())  # with the pull field, or MXNet's older ps-lite without
    if draw(st.integers(0, 9)) == 0:
        cmd = draw(st.sampled_from([Cmd.ADD_NODE, Cmd.BARRIER, Cmd.HEARTBEAT, Cmd.ACK]))
        nodes = [(Role.WORKER, 9 + 2 * i, "10.0.0.%d" % i, 9000 + i)
                 for i in range(draw(st.integers(0, 12)))]
        return MessageSpec(request=draw(st.booleans()), push=False, pull=False if newer else None,
                           timestamp=None, control_cmd=cmd, control_nodes=nodes)
    request = draw(st.booleans())
    push = draw(st.booleans())
    n_keys = draw(st.one_of(st.integers(0, 20), st.integers(21, 400)))
    keys = sorted(draw(st.sets(st.integers(0, 2**64 - 1), min_size=n_keys, max_size=n_keys)))
    row = draw(st.integers(1, 8))
    with_vals = push if request else not push
    vals = np.arange(n_keys * row, dtype="<f4").tobytes() if with_vals else b""
    lens = [row * 4] * n_keys if (with_vals and draw(st.booleans())) else None
    return MessageSpec(request=request, push=push, pull=(not push) if newer else None,
                       app_id=draw(st.integers(0, 3)), customer_id=draw(st.integers(0, 3)),
                       timestamp=draw(st.integers(0, 2**31 - 1)),
                       keys=keys if (request or with_vals or n_keys) else None, vals=vals,
                       val_type=DataType.FLOAT, lens=lens)


streams = st.lists(message_specs(), min_size=1, max_size=12).map(lambda specs: (specs, *encode_stream(specs)))


def feed_chunks(p: PsliteStreamParser, data: bytes, cuts: list[int]) -> list:
    out, prev = [], 0
    for c in sorted(set(cuts)) + [len(data)]:
        out += p.feed(data[prev:c])
        prev = c
    return out


def spans_of(msgs) -> list[tuple[int, int]]:
    return [(m.first_byte_offset, m.last_byte_offset) for m in msgs]


def assert_accounting(p: PsliteStreamParser) -> None:
    s = p.stats()
    assert s.fed_bytes + s.gap_bytes == (s.message_bytes + s.handshake_bytes + s.unparsed_bytes
                                         + s.lost_bytes + s.pending_bytes)
    assert min(s.message_bytes, s.handshake_bytes, s.unparsed_bytes, s.lost_bytes, s.pending_bytes) >= 0


def assert_same_message(m, spec: MessageSpec) -> None:
    assert m.request == spec.request
    assert m.timestamp == spec.timestamp
    assert m.num_keys == (len(spec.keys) if spec.keys is not None else 0)
    assert m.kind.value == ("control" if spec.control_cmd is not None else "data")
    assert set(m.key_sample) <= set(spec.keys or ())
    if m.key_sample_complete:  # else a gap hid some of the keys
        assert len(m.key_sample) == min(16, m.num_keys)
    if spec.keys is not None:
        assert m.value_bytes == len(spec.vals)


@SETTINGS
@given(streams, st.lists(st.integers(0, 200_000), max_size=40))
def test_any_chunking_gives_every_message(stream, cuts):
    specs, data, spans = stream
    cuts = [c % (len(data) + 1) for c in cuts]
    p = PsliteStreamParser()
    msgs = feed_chunks(p, data, cuts)
    assert spans_of(msgs) == spans
    for m, spec in zip(msgs, specs):
        assert_same_message(m, spec)
        assert m.sender_node_id == 9
    s = p.stats()
    assert (s.unparsed_bytes, s.pending_bytes, s.resyncs, s.messages) == (0, 0, 0, len(specs))
    assert_accounting(p)


@SETTINGS
@given(streams, st.integers(0, 10**9), st.lists(st.integers(0, 200_000), max_size=10))
def test_mid_stream_start_finds_every_later_message(stream, cut_seed, cuts):
    specs, data, spans = stream
    cut = cut_seed % len(data)
    tail = data[cut:]
    p = PsliteStreamParser(mid_stream=True, start_offset=cut)
    msgs = feed_chunks(p, tail, [cut + c % (len(tail) + 1) - cut for c in cuts])
    msgs += p.close()
    expected = [s for s in spans if s[0] >= cut]
    # every message that starts after the cut is found (the first one is the chain
    # that confirms sync), none is invented; the sender's id comes only with READY
    assert spans_of(msgs) == expected
    assert all(m.sender_node_id == (9 if cut == 0 else None) for m in msgs)
    assert_accounting(p)
    assert p.stats().pending_bytes == 0


@SETTINGS
@given(streams, st.data())
def test_garbage_between_messages_is_counted_and_skipped(stream, data_st):
    specs, data, spans = stream
    boundaries = [s[0] for s in spans] + [len(data)]
    pieces, garbage, prev = [], [], 0
    for b in boundaries:
        pieces.append(data[prev:b])
        prev = b
        g = data_st.draw(st.binary(max_size=40)) if data_st.draw(st.booleans()) else b""
        garbage.append(len(g))  # garbage[i]: right before message i (the last: at the end)
        pieces.append(g)
    noisy = b"".join(pieces)
    expected = [(f + sum(garbage[:i + 1]), l_ + sum(garbage[:i + 1])) for i, (f, l_) in enumerate(spans)]
    cuts = data_st.draw(st.lists(st.integers(0, len(noisy)), max_size=20))
    p = PsliteStreamParser()
    got = spans_of(feed_chunks(p, noisy, cuts) + p.close())
    assert set(got) <= set(expected) and got == sorted(got)
    # A message found by hunting (garbage before it) is confirmed by its keys and
    # values agreeing, or else by the next message's meta. One without data frames
    # (a push ack, a control message) with garbage right after it has neither: it may
    # be dropped (as unparsed). Every other message must be found.
    missing = [i for i, e in enumerate(expected) if e not in got]
    for i in missing:
        assert specs[i].keys is None and garbage[i] and garbage[i + 1], (i, garbage)
    s = p.stats()
    lost = sum(expected[i][1] - expected[i][0] + 1 for i in missing)
    assert s.unparsed_bytes == sum(garbage) + lost
    assert_accounting(p)


@SETTINGS
@given(streams, st.integers(0, 10**9), st.lists(st.integers(0, 200_000), max_size=10))
def test_truncated_input_never_raises_and_loses_only_the_cut_message(stream, cut_seed, cuts):
    specs, data, spans = stream
    cut = cut_seed % (len(data) + 1)
    head = data[:cut]
    p = PsliteStreamParser()
    msgs = feed_chunks(p, head, [c % (cut + 1) for c in cuts])
    assert spans_of(msgs) == [s for s in spans if s[1] < cut]
    assert_accounting(p)
    p.close()
    s = p.stats()
    assert s.pending_bytes == 0 and s.unparsed_bytes == cut - (s.message_bytes + s.handshake_bytes)


@SETTINGS
@given(st.binary(max_size=3000), st.booleans(), st.lists(st.integers(0, 3000), max_size=10))
def test_random_bytes_never_raise(blob, mid_stream, cuts):
    p = PsliteStreamParser(mid_stream=mid_stream)
    feed_chunks(p, blob, [c % (len(blob) + 1) for c in cuts])
    p.gap(7)
    p.feed(blob[:100])
    p.close()
    assert_accounting(p)


@SETTINGS
@given(streams, st.integers(0, 10**9), st.integers(1, 5000))
def test_gap_finds_messages_before_and_after(stream, at_seed, gap_bytes):
    specs, data, spans = stream
    at = at_seed % len(data)
    resume = min(len(data), at + gap_bytes)
    p = PsliteStreamParser()
    msgs = p.feed(data[:at])
    msgs += p.gap(resume - at)
    msgs += p.feed(data[resume:])
    msgs += p.close()
    got = spans_of(msgs)
    before = [s for s in spans if s[1] < at]
    after = [s for s in spans if s[0] >= resume]
    assert got[:len(before)] == before
    assert got[len(got) - len(after):] == after if after else True
    # anything else found is a message the gap fell inside a skipped data frame of
    extra = got[len(before):len(got) - len(after)]
    assert all(s in spans and s[0] < at and s[1] >= at for s in extra)
    assert_accounting(p)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 50), st.data())
def test_gap_inside_a_values_frame_loses_nothing(n_vals_kib, data_st):
    vals = np.ones(n_vals_kib * 256, "<f4").tobytes()
    specs = [MessageSpec(push=True, pull=False, timestamp=t, keys=list(range(40)), vals=vals)
             for t in range(3)]
    data, spans = encode_stream(specs)
    first, last = spans[1]
    vals_start = last + 1 - len(vals)  # the vals frame is the last of message 1
    at = data_st.draw(st.integers(vals_start, last - 1))
    n = data_st.draw(st.integers(1, last + 1 - at))
    p = PsliteStreamParser()
    msgs = p.feed(data[:at]) + p.gap(n) + p.feed(data[at + n:])
    assert spans_of(msgs) == spans
    assert msgs[1].value_bytes == len(vals) and msgs[1].key_sample_complete
    s = p.stats()
    assert (s.gap_bytes, s.lost_bytes, s.unparsed_bytes, s.resyncs) == (n, 0, 0, 0)
    assert_accounting(p)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**9), st.integers(1, 200), st.sampled_from([100, 1000]))
def test_gap_inside_a_keys_frame_keeps_the_message_with_a_partial_sample(at_seed, n, n_keys):
    # 100 keys: the split frame is buffered; 1000: it is streamed through a sampler
    keys = list(range(0, 3 * n_keys, 3))
    specs = [MessageSpec(push=True, pull=False, timestamp=t, keys=keys, vals=b"\0" * 4000)
             for t in range(2)]
    data, spans = encode_stream(specs)
    keys_end = spans[0][1] + 1 - 4000 - 9  # vals frame: 9-byte header + 4000 bytes
    keys_start = keys_end - 8 * len(keys)
    at = keys_start + at_seed % (keys_end - keys_start - n)
    p = PsliteStreamParser()
    msgs = p.feed(data[:at]) + p.gap(n) + p.feed(data[at + n:])
    assert spans_of(msgs) == spans
    assert not msgs[0].key_sample_complete and msgs[1].key_sample_complete
    assert set(msgs[0].key_sample) <= set(keys) and msgs[0].num_keys == len(keys)


def test_zmtp_31_commands_between_messages_are_tolerated():
    specs = [MessageSpec(push=True, pull=False, timestamp=t, keys=[t], vals=b"\0" * 4) for t in range(3)]
    head, spans = encode_stream(specs[:1])
    mid = command_bytes(b"PING", b"\x00\x0a" + b"ctx") + command_bytes(b"PONG", b"ctx")
    rest = encode_stream(specs[1:], handshake=False)[0]
    p = PsliteStreamParser()
    msgs = p.feed(head + mid + command_bytes(b"SUBSCRIBE", b"topic") + rest)
    assert [m.timestamp for m in msgs] == [0, 1, 2]
    assert p.stats().unparsed_bytes == 0


def test_many_messages_in_one_chunk_and_one_message_over_many_chunks():
    specs = [MessageSpec(push=False, pull=True, timestamp=t, keys=[t, t + 1], vals=b"")
             for t in range(500)]
    data, spans = encode_stream(specs)
    assert spans_of(PsliteStreamParser().feed(data)) == spans
    p = PsliteStreamParser()
    assert spans_of([m for b in data for m in p.feed(bytes([b]))]) == spans


def test_mid_stream_start_inside_a_large_frame_of_noise():
    # the cut falls inside 1 MiB of random float32 values: the hunt must skip them
    rng = np.random.default_rng(3)
    vals = rng.random(1 << 18, dtype=np.float32).tobytes()
    specs = [MessageSpec(push=True, pull=False, timestamp=t, keys=list(range(128)), vals=vals)
             for t in range(4)]
    data, spans = encode_stream(specs)
    cut = spans[1][0] + 5000
    p = PsliteStreamParser(mid_stream=True, start_offset=cut)
    msgs = [m for i in range(cut, len(data), 65536) for m in p.feed(data[i:i + 65536])] + p.close()
    assert spans_of(msgs) == spans[2:]
    assert p.stats().unparsed_bytes == spans[2][0] - cut


def _fake_chain_around(inner: bytes) -> bytes:
    """A message start that passes the first checks (meta, keys frame) whose keys frame
    holds `inner`, then a values frame whose size no float32 array has: the chain breaks
    there, after the parser went through `inner`."""
    meta = MessageSpec(push=True, pull=False, timestamp=77, keys=[1], vals=b"").frames()[0]
    body = inner + b"\0" * (-len(inner) % 8)
    return (frame_bytes(meta, more=True) + frame_bytes(body, more=True)
            + frame_bytes(b"\1\2\3", more=False))


@pytest.mark.parametrize("replay_max_bytes,found_inside", [(256 * 1024, True), (64, False)])
def test_broken_chain_is_rescanned_within_the_replay_cap(replay_max_bytes, found_inside):
    real = [MessageSpec(push=True, pull=False, timestamp=t, keys=[t, t + 1], vals=b"\0" * 8)
            for t in range(4)]
    inner = message_bytes(real[0].frames())
    after, _ = encode_stream(real[1:], handshake=False)
    fake = _fake_chain_around(inner)
    p = PsliteStreamParser(mid_stream=True, replay_max_bytes=replay_max_bytes)
    msgs = p.feed(fake + after) + p.close()
    assert [m.timestamp for m in msgs] == ([0] if found_inside else []) + [1, 2, 3]
    s = p.stats()
    assert s.unparsed_bytes == len(fake) - (len(inner) if found_inside else 0)
    assert_accounting(p)


def holes_in(gaps: list[tuple[int, int]], length: int) -> list[tuple[int, int]]:
    """Drawn (position seed, size) pairs -> sorted, non-overlapping (start, end) byte
    ranges inside a stream of `length` bytes."""
    holes, prev = [], 0
    for at_seed, n in sorted(gaps):
        at = max(prev, at_seed % length)
        end = min(length, at + n)
        if at < end:
            holes.append((at, end))
            prev = end
    return holes


@SETTINGS
@given(streams, st.lists(st.tuples(st.integers(0, 10**9), st.integers(1, 3000)), min_size=1, max_size=6),
       st.booleans())
def test_many_gaps_never_invent_messages(stream, gaps, mid_stream):
    specs, data, spans = stream
    holes = holes_in(gaps, len(data))
    p = PsliteStreamParser(mid_stream=mid_stream)
    msgs, pos = [], 0
    for at, end in holes:
        msgs += p.feed(data[pos:at]) + p.gap(end - at)
        pos = end
    msgs += p.feed(data[pos:]) + p.close()
    got = spans_of(msgs)
    assert set(got) <= set(spans) and got == sorted(got)
    by_span = dict(zip(spans, specs))
    for m in msgs:
        assert_same_message(m, by_span[(m.first_byte_offset, m.last_byte_offset)])
    if not mid_stream:
        assert [s for s in spans if s[1] < holes[0][0]] == got[:len([s for s in spans if s[1] < holes[0][0]])]
    after = [i for i, s in enumerate(spans) if s[0] >= holes[-1][1]]
    missed = [i for i in after if spans[i] not in got]
    assert len(missed) <= 1 and all(specs[i].keys is None for i in missed)
    assert_accounting(p)
