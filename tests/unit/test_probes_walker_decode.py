"""The user-space side of the ZMTP walker (probes.sockcalls, probes.events):
item structs against events.h, item decoding, records joined into calls, the
stream view the ps-lite parser consumes, stream offsets, sync hints, the key
sampling rule. The kernel side is tested in tests/privileged/test_probes_walker*.py."""
from __future__ import annotations

import ctypes
import random
import shutil

import numpy as np
import pytest

from core.errors import UserError
from probes import events
from probes.events import (SockCall, SockcallEvent, SockcallItem, SockcallItemKind, SockcallKeys, SockcallMsgEnd,
                           SockcallWalkMark, WalkProtocol, WalkStart, WalkStop, decode_items)
from probes.sockcalls import Direction, set_count_only, set_sync_hint
from oracles.walker import (CallAssembler, Gap, Skip, StreamOffsets, WalkedCall, feed_parser, key_sample_level,
                            key_sampled)

needs_gcc = pytest.mark.skipif(not shutil.which("gcc"), reason="needs gcc (and linux-libc-dev for linux/types.h)")

ITEM_MIRRORS = [SockcallItem, SockcallWalkMark, SockcallMsgEnd, SockcallKeys]

CONSTANTS = {
    "SOCKCALL_F_CONTINUED": events.SOCKCALL_F_CONTINUED,
    "SOCKCALL_PAYLOAD_MAX": events.SOCKCALL_PAYLOAD_MAX,
    "SOCKCALL_BYTES_PREFIX": events.SOCKCALL_BYTES_PREFIX,
    "SOCKCALL_BYTES_GREETING": events.SOCKCALL_BYTES_GREETING,
    "SOCKCALL_BYTES_HEADER": events.SOCKCALL_BYTES_HEADER,
    "SOCKCALL_BYTES_BODY": events.SOCKCALL_BYTES_BODY,
    "SOCKCALL_BYTES_RAW": events.SOCKCALL_BYTES_RAW,
    **{f"SOCKCALL_ITEM_{k.name}": k.value for k in SockcallItemKind},
    **{f"SOCKCALL_WALK_{k.name}": k.value for k in WalkStart},
    **{f"SOCKCALL_STOP_{k.name}": k.value for k in WalkStop},
    **{f"SOCKCALL_COUNTER_{name.upper()}": i for i, name in enumerate(events.SOCKCALL_COUNTERS) if i >= 2},
}


@needs_gcc
@pytest.mark.parametrize("mirror", ITEM_MIRRORS, ids=lambda m: m.__name__)
def test_item_layouts_match_header(tmp_path, mirror):
    from test_probes_events import test_struct_layout_matches_header as layout_matches

    layout_matches(tmp_path, mirror)


@needs_gcc
def test_walker_constants_match_header(tmp_path):
    from test_probes_events import compile_and_run

    body = "\n".join(f'  printf("{k} %lld\\n", (long long)({k}));' for k in CONSTANTS)
    out = dict(line.split() for line in compile_and_run(tmp_path, body).splitlines())
    assert {k: int(v) for k, v in out.items()} == CONSTANTS


# ---------------------------------------------------------------- building records

def item(kind, body: bytes = b"", call_off: int = 0, what: int = 0) -> bytes:
    return bytes(SockcallItem(kind, what, len(body), call_off)) + body


def mark(kind, how, call_off, frame_idx=0, phase=2) -> bytes:
    return item(kind, bytes(SockcallWalkMark(frame_idx, how, phase, 0)), call_off)


def keys_item(call_off, keys, mask, scanned, level=0) -> bytes:
    body = bytes(SockcallKeys(scanned, level, len(keys), 0, mask)) + np.asarray(keys, "<u8").tobytes()
    return item(SockcallItemKind.KEYS, body, call_off)


def record(payload: bytes, *, ret: int, seq_start: int = 1001, isn: int = 1000, call=SockCall.SENDTO, tid=7,
           enter=5, flags=0) -> SockcallEvent:
    ev = SockcallEvent(ret=ret, seq_start=seq_start, seq_end=(seq_start + max(ret, 0)) & 0xFFFFFFFF,
                       isn_local=isn, isn_remote=isn + 500, call=call, tid=tid, enter_ts_ns=enter, sk=99,
                       flags=flags, family=events.AF_INET, payload_bytes=len(payload))
    ctypes.memmove(ctypes.addressof(ev.payload), payload, len(payload))
    return SockcallEvent.decode(bytes(ev)[:SockcallEvent.payload.offset + len(payload)])


# ---------------------------------------------------------------- items

def test_decode_items_round_trip():
    payload = (mark(SockcallItemKind.WALK_START, WalkStart.CONTINUE, 0)
               + item(SockcallItemKind.BYTES, b"\x01\x05hello", 0, events.SOCKCALL_BYTES_HEADER)
               + item(SockcallItemKind.MSG_END, bytes(SockcallMsgEnd(1008, 1, 3)), 7))
    got = decode_items(payload)
    assert [(it.kind, it.call_off, len(b)) for it, b in got] == [(2, 0, 8), (1, 0, 7), (4, 7, 16)]


@pytest.mark.parametrize("payload, message", [
    (b"\x01\x00", "header cut"),
    (item(SockcallItemKind.BYTES, b"abc")[:-1], "claims 3 bytes"),
    (item(42, b""), "unknown kind 42"),
    (item(SockcallItemKind.MSG_END, b"\x00" * 4), "MSG_END item of 4 bytes"),
])
def test_decode_items_rejects_bad_payloads(payload, message):
    with pytest.raises(ValueError, match=message):
        decode_items(payload)


def test_decode_items_on_random_bytes_raises_only_value_error():
    rng = random.Random(3)
    for _ in range(2000):
        data = rng.randbytes(rng.randint(0, 64))
        try:
            items = decode_items(data)
        except ValueError:
            continue
        call = WalkedCall(record(data, ret=rng.randint(1, 100)), items)
        try:
            call.stream_view(0)
            call.message_ends()
            call.key_samples()
        except ValueError:
            pass


# ---------------------------------------------------------------- the stream view

def test_stream_view_skips_inside_the_walk_and_gaps_outside():
    # unsynced prefix [0, 4), a hint starts the walk at 10, it stops at 30
    payload = (item(SockcallItemKind.BYTES, b"PREF", 0, events.SOCKCALL_BYTES_PREFIX)
               + mark(SockcallItemKind.WALK_START, WalkStart.HINT, 10)
               + item(SockcallItemKind.BYTES, b"\x01\x02", 10, events.SOCKCALL_BYTES_HEADER)
               + item(SockcallItemKind.BYTES, b"\x00\x03", 20, events.SOCKCALL_BYTES_HEADER)
               + mark(SockcallItemKind.WALK_END, WalkStop.BAD_FLAGS, 30)
               + item(SockcallItemKind.BYTES, b"\xff\xfe", 30, events.SOCKCALL_BYTES_RAW))
    call = WalkedCall(record(payload, ret=40), decode_items(payload))
    assert call.walked_ranges() == [(10, 30)]
    view = call.stream_view(1000)
    assert view == [(1000, b"PREF"), (1004, Gap(6)), (1010, b"\x01\x02"), (1012, Skip(8)), (1020, b"\x00\x03"),
                    (1022, Skip(8)), (1030, b"\xff\xfe"), (1032, Gap(8))]
    assert sum(len(x) if isinstance(x, bytes) else int(x) for _, x in view) == 40
    assert [type(x).__name__ for _, x in view if isinstance(x, int)] == ["Gap", "Skip", "Skip", "Gap"]


def test_stream_view_places_sampled_keys_and_merges_adjacent_bytes():
    payload = (mark(SockcallItemKind.WALK_START, WalkStart.CONTINUE, 0)
               + item(SockcallItemKind.BYTES, b"\x01\x18", 0, events.SOCKCALL_BYTES_HEADER)
               # 3 keys hashed from offset 2; keys 0 and 2 sampled
               + keys_item(2, [11, 33], 0b101, 24, level=1))
    call = WalkedCall(record(payload, ret=40), decode_items(payload))
    (ks,) = call.key_samples()
    assert ks.key_offsets() == [2, 18] and ks.keys == (11, 33)
    view = call.stream_view(0)
    assert view == [(0, b"\x01\x18" + (11).to_bytes(8, "little")), (10, Skip(8)), (18, (33).to_bytes(8, "little")),
                    (26, Skip(14))]


def test_stream_view_of_a_peek_or_failure_is_empty_and_overlaps_are_refused():
    assert WalkedCall(record(b"", ret=-11), []).stream_view(0) == []
    ev = record(b"", ret=10)
    ev.seq_end = ev.seq_start  # MSG_PEEK: returned bytes, consumed none
    assert WalkedCall(ev, []).stream_view(0) == []
    bad = item(SockcallItemKind.BYTES, b"abcd", 0) + item(SockcallItemKind.BYTES, b"xy", 2)
    with pytest.raises(ValueError, match="overlap"):
        WalkedCall(record(bad, ret=10), decode_items(bad)).stream_view(0)


def test_message_ends_carry_their_rx_times():
    times = bytes(range(32))
    payload = (item(SockcallItemKind.MSG_END, bytes(SockcallMsgEnd(1021, 4, 9)), 20)
               + item(SockcallItemKind.RX_TIMES, times, 20))
    (end,) = WalkedCall(record(payload, ret=30), decode_items(payload)).message_ends()
    assert (end.call_off, end.end_seq, end.frames, end.msg_index, end.rx_times) == (20, 1021, 4, 9, times)


# ---------------------------------------------------------------- records -> calls

def test_call_assembler_joins_continued_records():
    a = record(item(SockcallItemKind.BYTES, b"ab", 0), ret=10, flags=events.SOCKCALL_F_CONTINUED)
    b = record(item(SockcallItemKind.BYTES, b"cd", 8), ret=10)
    other = record(item(SockcallItemKind.BYTES, b"zz", 0), ret=5, tid=8)
    asm = CallAssembler()
    assert asm.add(a) is None
    assert asm.add(other).pieces() == [(0, b"zz", 0)]  # another thread's call in between
    call = asm.add(b)
    assert [p[:2] for p in call.pieces()] == [(0, b"ab"), (8, b"cd")]
    # the rest of a continued call lost: the next call of the thread starts afresh
    asm.add(record(item(SockcallItemKind.BYTES, b"ab", 0), ret=10, flags=events.SOCKCALL_F_CONTINUED))
    fresh = asm.add(record(item(SockcallItemKind.BYTES, b"qq", 0), ret=3, enter=6))
    assert [p[:2] for p in fresh.pieces()] == [(0, b"qq")]


def test_stream_offsets_unwrap_sequence_numbers():
    offs = StreamOffsets()
    isn = 0xFFFFFF00
    assert offs.offset_of(record(b"", ret=1, isn=isn, seq_start=(isn + 1) & 0xFFFFFFFF)) == 0
    # past the wrap of the 32-bit sequence, and past 4 GiB of stream
    assert offs.offset_of(record(b"", ret=1, isn=isn, seq_start=0x10)) == 0x10 + 0xFF
    for rel, expect in ((0x7FFF0000, 0x7FFF0000), (0xF0000000, 0xF0000000), (0x10000000, 2**32 + 0x10000000)):
        assert offs.offset_of(record(b"", ret=1, isn=isn, seq_start=(isn + 1 + rel) & 0xFFFFFFFF)) == expect
    # receives count from the peer's ISN
    rx = record(b"", ret=1, isn=7, seq_start=7 + 500 + 1 + 42, call=SockCall.RECVFROM)
    assert StreamOffsets().offset_of(rx) == 42


# ---------------------------------------------------------------- the parser on a view

ZMTP_META_MIN = 8   # zmtp_framing.bpf.h: a frame 0 shorter than this, with MORE, is a sender id


def walked_view(stream: bytes, meta_max: int = 2048):
    """What the walker hands over for a stream seen from its start
    (zmtp_framing.bpf.h): the greeting, every frame header, meta and command bodies
    (the meta is frame 1 behind a short frame 0 with MORE: copied too); the rest
    skipped."""
    from parsers.pslite.zmtp import FLAG_COMMAND, FLAG_LONG, FLAG_MORE

    view = [(0, stream[:64])]
    pos, idx, meta_idx = 64, 0, 0
    while pos < len(stream):
        flags = stream[pos]
        hl = 9 if flags & FLAG_LONG else 2
        size = int.from_bytes(stream[pos + 1:pos + hl], "big")
        if idx == 0:
            meta_idx = int(bool(flags & FLAG_MORE) and size < ZMTP_META_MIN)
        copied = flags & FLAG_COMMAND or idx == 0 or idx == meta_idx
        copy = min(size, meta_max) if copied else 0
        view.append((pos, stream[pos:pos + hl + copy]))
        if size > copy:
            view.append((pos + hl + copy, Skip(size - copy)))
        pos += hl + size
        if not flags & FLAG_COMMAND:
            idx = idx + 1 if flags & FLAG_MORE else 0
    return view


def test_feed_parser_rebuilds_messages_from_headers_and_metas():
    from parsers.pslite import PsliteStreamParser
    from parsers.pslite.encode import MessageSpec, encode_stream

    rng = random.Random(5)
    specs = [MessageSpec(timestamp=i, keys=sorted(rng.sample(range(10**9), n)), vals=b"\x00" * (8 * n))
             for i, n in enumerate([1, 3, 40, 300])]
    stream, spans = encode_stream(specs)
    view = walked_view(stream)
    assert sum(len(x) if isinstance(x, bytes) else int(x) for _, x in view) == len(stream)
    msgs = feed_parser(PsliteStreamParser(), view)
    assert [(m.timestamp, m.num_keys, m.first_byte_offset, m.last_byte_offset) for m in msgs] == [
        (i, n, a, b) for (i, n), (a, b) in zip(enumerate([1, 3, 40, 300]), spans)]


def test_feed_parser_rebuilds_a_byteps_servers_answers_behind_their_sender_id():
    """A BytePS server's answers: frame 0 its id "ps8", frame 1 the RawMeta, which
    the walker copies as the meta; a control message with 8 nodes (88 + 8 x 168
    bytes) within the copy bound."""
    from parsers.pslite import PsliteStreamParser
    from parsers.pslite.encode import MessageSpec, encode_stream
    from parsers.pslite.meta import Cmd

    nodes = [(1 + k % 2, 8 + k, "10.77.0.%d" % k, 9000 + k) for k in range(8)]
    frames = [MessageSpec(request=True, control_cmd=Cmd.ADD_NODE, control_nodes=nodes, timestamp=0).raw_frames()]
    for i in range(1, 9):
        spec = MessageSpec(request=False, push=i % 2 == 0, timestamp=i,
                           **({} if i % 2 == 0 else dict(keys=[i << 16], vals=b"\x00" * 32, lens=[32])))
        frames.append(spec.raw_frames(routing_id=b"ps8"))
    stream, spans = encode_stream(frames, identity=None, socket_type=b"ROUTER")
    view = walked_view(stream)
    assert sum(len(x) if isinstance(x, bytes) else int(x) for _, x in view) == len(stream)
    msgs = feed_parser(PsliteStreamParser(), view)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in msgs] == spans
    assert [m.call_id for m in msgs[1:]] == list(range(1, 9))
    assert len(msgs[0].nodes) == 8 and all(m.sender_node_id == 8 for m in msgs[1:])


# ---------------------------------------------------------------- hints, sampling rule

class FakeMap(list):
    """A bcc table's item assignment, recorded (ctypes keys are not hashable)."""

    def __setitem__(self, key, value):
        self.append((key, value))


class FakeProg:
    def __init__(self):
        self.maps = {}

    @property
    def bpf(self):
        return self

    def __getitem__(self, name):
        return self.maps.setdefault(name, FakeMap())


def test_set_sync_hint_writes_the_map_and_validates():
    prog = FakeProg()
    set_sync_hint(prog, 0xFFFF8881_00000000, Direction.RX, 2**32 - 1, 2, WalkProtocol.BRPC)
    ((key, val),) = prog.maps[b"sockcalls_sync_hint"]
    assert (key.sk, key.dir, val.seq, val.frame_idx, val.proto) == (0xFFFF8881_00000000, 1, 2**32 - 1, 2, 2)
    assert ctypes.sizeof(val) == 8   # struct wk_hint
    for bad in (dict(seq=2**32), dict(seq=-1), dict(frame_index=1.5), dict(frame_index=2**16), dict(sk=True)):
        args = dict(sk=1, direction=Direction.TX, seq=5, frame_index=0) | bad
        with pytest.raises(UserError, match="sync hint"):
            set_sync_hint(prog, **args)
    assert val.flags == 0


def test_set_count_only_writes_a_hint_with_its_flag_and_validates():
    prog = FakeProg()
    set_count_only(prog, 0xFFFF8881_00000040, Direction.TX)
    ((key, val),) = prog.maps[b"sockcalls_sync_hint"]
    assert (key.sk, key.dir, val.seq, val.frame_idx, val.proto, val.flags) == (0xFFFF8881_00000040, 0, 0, 0, 0, 1)
    import re
    from pathlib import Path

    from probes import sockcalls
    engine = (Path(sockcalls.__file__).parent / "walk_engine.bpf.h").read_text()
    assert int(re.search(r"#define WK_HINT_COUNT_ONLY (\d+)", engine).group(1)) == val.flags
    for bad in (-1, 2**64, True, 1.0):
        with pytest.raises(UserError, match="count-only hint"):
            set_count_only(prog, bad, Direction.TX)


def test_key_sampling_rule():
    # every key of a frame of up to 16; else 4 to 8 expected of the keys hashed
    assert [key_sample_level(n) for n in (1, 16, 17, 31, 32, 255, 256, 4000)] == [0, 0, 2, 2, 3, 5, 6, 9]
    keys = np.arange(1, 200_001, dtype=np.uint64)
    for level in (0, 2, 6):
        kept = sum(key_sampled(int(k), level) for k in keys[:4096])
        assert abs(kept - 4096 / 2**level) < 5 * (4096 / 2**level) ** 0.5 + 1
    # nested: a key kept at a level is kept at every lower one
    for k in keys[:2000]:
        levels = [key_sampled(int(k), lv) for lv in range(8)]
        assert levels == sorted(levels, reverse=True)
