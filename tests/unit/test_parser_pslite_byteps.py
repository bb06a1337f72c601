"""BytePS's ps-lite (RawMeta first, sender-id frames on a server's answers) through the
ps-lite stream parser: the layout as BytePS 0.2.5.post15's PackMeta packs it, both
directions of a worker's connection, any chunking, mid-stream joins, garbage, and
PBMeta and RawMeta streams through the same parser class without confusion."""
from __future__ import annotations

import ctypes
import random
import struct

import numpy as np
import pytest

from parsers.pslite import PsliteStreamParser
from parsers.pslite import encode as penc
from parsers.pslite.bytepskeys import KEY_MAX, split_key
from parsers.pslite.message import BytepsMessage
from parsers.pslite.meta import PS_META_EMPTY as K_EMPTY
from parsers.pslite.meta import Cmd, DataType, Role
from parsers.pslite.rawmeta import PBMETA, RAWMETA, RAW_META_BYTES, RAW_NODE_BYTES, decode_meta, read_raw_meta
from parsers.protocol import PAIR_CONNECTION, PAIR_NODES
from parsers.sniff import SniffingParser

WORKER, SERVER = 9, 8     # node ids of worker rank 0 and server rank 0


# src/meta.h's structs as ctypes lays them out with the platform's C ABI: an oracle
# for the offsets that is not our struct format strings
class _RawControl(ctypes.Structure):
    _fields_ = [("cmd", ctypes.c_int), ("node_size", ctypes.c_int), ("barrier_group", ctypes.c_int),
                ("msg_sig", ctypes.c_uint64)]


class _RawMeta(ctypes.Structure):
    _fields_ = [("head", ctypes.c_int), ("body_size", ctypes.c_int), ("control", _RawControl),
                ("request", ctypes.c_bool), ("app_id", ctypes.c_int), ("timestamp", ctypes.c_int),
                ("data_type_size", ctypes.c_int), ("customer_id", ctypes.c_int), ("push", ctypes.c_bool),
                ("simple_app", ctypes.c_bool), ("data_size", ctypes.c_int), ("key", ctypes.c_uint64),
                ("addr", ctypes.c_uint64), ("val_len", ctypes.c_int), ("option", ctypes.c_int)]


class _RawNode(ctypes.Structure):
    _fields_ = [("role", ctypes.c_int), ("id", ctypes.c_int), ("hostname", ctypes.c_char * 64),
                ("port", ctypes.c_int), ("is_recovery", ctypes.c_bool), ("customer_id", ctypes.c_int),
                ("endpoint_name", ctypes.c_char * 64), ("endpoint_name_len", ctypes.c_size_t),
                ("aux_id", ctypes.c_int)]


def test_the_layout_is_meta_h_as_the_c_abi_lays_it_out():
    assert ctypes.sizeof(_RawMeta) == RAW_META_BYTES and ctypes.sizeof(_RawNode) == RAW_NODE_BYTES
    spec = penc.MessageSpec(request=True, push=False, head=7, app_id=2, customer_id=3, timestamp=41,
                            keys=[5 << 16, (5 << 16) + 1], vals=b"", lens=[4, 4])
    got = spec.raw_frames(key=0x1122334455667788, addr=0xAABB, val_len=8, option=9)[0]
    want = _RawMeta(head=7, body_size=0, control=_RawControl(), request=True, app_id=2, timestamp=41,
                    data_type_size=3, customer_id=3, push=False, simple_app=False, data_size=16 + 0 + 8,
                    key=0x1122334455667788, addr=0xAABB, val_len=8, option=9)
    dts = struct.pack("<3i", DataType.UINT64, DataType.FLOAT, DataType.INT32)
    assert got == bytes(want) + dts
    node = _RawNode(role=Role.SERVER, id=8, hostname=b"10.1.2.3", port=9000, aux_id=-1)
    ctrl = penc.MessageSpec(control_cmd=Cmd.ADD_NODE, control_nodes=[(Role.SERVER, 8, "10.1.2.3", 9000)],
                            head=K_EMPTY, app_id=K_EMPTY, customer_id=K_EMPTY, timestamp=None)
    raw = ctrl.raw_frames()[0]
    assert len(raw) == RAW_META_BYTES + RAW_NODE_BYTES and raw[RAW_META_BYTES:] == bytes(node)
    m = read_raw_meta(raw)
    assert m.cmd == Cmd.ADD_NODE and m.app_id is None and m.timestamp is None
    assert [(n.node_id, n.role, n.hostname, n.port) for n in m.nodes] == [(8, Role.SERVER, "10.1.2.3", 9000)]


def test_what_is_not_a_rawmeta():
    good = penc.MessageSpec(timestamp=3, keys=[1], vals=b"\0" * 4).raw_frames()[0]
    assert read_raw_meta(good) is not None
    for bad in (good[:-1], good + b"\0", good[:RAW_META_BYTES - 1]):
        assert read_raw_meta(bad) is None                      # the size is PackMeta's sum
    for at in (20, 33, 54, 60):                                # the struct's zeroed padding
        assert read_raw_meta(good[:at] + b"\1" + good[at + 1:]) is None
    assert read_raw_meta(good[:32] + b"\2" + good[33:]) is None   # a bool is 0 or 1
    assert read_raw_meta(good[:12] + b"\1" + good[13:]) is None   # nodes on a data message
    # a PBMeta is no RawMeta, nor the other way
    pb = penc.MessageSpec(timestamp=3, keys=[1], vals=b"\0" * 4).frames()[0]
    assert read_raw_meta(pb) is None and decode_meta(good, PBMETA) is None
    assert decode_meta(pb, None).raw is False and decode_meta(good, None).raw is True


def _worker_stream(n: int = 30, servers: int = 1, rank: int = 0) -> tuple[bytes, list]:
    """A worker's DEALER into a server's ROUTER: READY with the worker's identity, then
    BytePS's pushes and pulls (one key each, as EncodeDefaultKey makes them)."""
    begin = KEY_MAX // servers * rank
    specs = []
    for i in range(n):
        key = begin + ((i % 7) << 16) + i % 3
        if i % 2 == 0:
            specs.append(penc.MessageSpec(request=True, push=True, head=1, timestamp=i, keys=[key],
                                          vals=np.arange(8, dtype="<f4").tobytes(), lens=[32]))
        else:
            specs.append(penc.MessageSpec(request=True, push=False, head=2, timestamp=i, keys=[key],
                                          vals=b"", lens=[32]))
    data, spans = penc.encode_stream([s.raw_frames(key=i * 977, addr=0x7F0000001000) for i, s in enumerate(specs)],
                                     identity=b"ps%d" % WORKER)
    return data, spans


def _server_stream(n: int = 30, servers: int = 1, rank: int = 0) -> tuple[bytes, list]:
    """A server's ROUTER back to the worker's DEALER: READY without identity, and every
    answer behind the server's sender-id frame (NonWorkerSendMsg)."""
    begin = KEY_MAX // servers * rank
    frames = []
    for i in range(n):
        key = begin + ((i % 7) << 16) + i % 3
        if i % 2 == 0:
            spec = penc.MessageSpec(request=False, push=True, head=1, timestamp=i)
        else:
            spec = penc.MessageSpec(request=False, push=False, head=2, timestamp=i, keys=[key],
                                    vals=np.arange(8, dtype="<f4").tobytes(), lens=[32])
        frames.append(spec.raw_frames(routing_id=b"ps%d" % (8 + 2 * rank)))
    return penc.encode_stream(frames, identity=None, socket_type=b"ROUTER")


def _parse(data: bytes, rng: random.Random | None = None, **kw) -> tuple[list, PsliteStreamParser]:
    p = PsliteStreamParser(**kw)
    out, i = [], 0
    while i < len(data):
        n = rng.randint(1, 200) if rng else len(data)
        out += p.feed(data[i:i + n])
        i += n
    return out + p.close(), p


def _ident(m, sender: bool = True) -> tuple:
    return (m.first_byte_offset, m.last_byte_offset, m.request, m.op, m.call_id,
            m.sender_node_id if sender else None, m.num_keys, m.key_sample, m.value_bytes)


def _accounted(p) -> bool:
    s = p.stats()
    return s.fed_bytes + s.gap_bytes == (s.message_bytes + s.handshake_bytes + s.unparsed_bytes
                                         + s.lost_bytes + s.pending_bytes)


def test_worker_to_server():
    data, spans = _worker_stream()
    msgs, p = _parse(data)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in msgs] == spans
    assert p.variant == RAWMETA and _accounted(p) and p.stats().unparsed_bytes == 0
    for i, m in enumerate(msgs):
        assert isinstance(m, BytepsMessage) and m.protocol == "pslite"
        assert m.request and m.call_id == i and m.sender_node_id == WORKER and not m.has_pull_field
        assert m.op == ("push" if i % 2 == 0 else "pull") and m.pair_scope == PAIR_CONNECTION
        assert m.num_keys == 1 and m.data_frames == 3 and m.value_bytes == (32 if i % 2 == 0 else 0)
        assert m.key_sample == (((i % 7) << 16) + i % 3,)
        assert m.detail() == {"variant": "byteps", "wire_key": m.key_sample[0],
                              "declared_key": i % 7, "key_partition": i % 3}


def test_server_to_worker_behind_the_sender_id_frame():
    data, spans = _server_stream(servers=3, rank=2)
    msgs, p = _parse(data)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in msgs] == spans
    assert p.variant == RAWMETA and _accounted(p) and p.stats().unparsed_bytes == 0
    for i, m in enumerate(msgs):
        assert not m.request and m.call_id == i and m.sender_node_id == 12
        if i % 2 == 0:
            assert m.op == "push" and m.data_frames == 0 and "wire_key" not in m.detail()
        else:
            # the sender names server rank 2, so the key's range and offset are known
            assert m.op == "pull" and m.num_keys == 1 and m.value_bytes == 32
            assert m.detail()["declared_key"] == i % 7 and m.detail()["key_partition"] == i % 3


def test_a_request_into_a_server_of_rank_above_zero_keeps_its_wire_key_only():
    data, _ = _worker_stream(servers=4, rank=3)
    msgs, _p = _parse(data)
    d = msgs[0].detail()
    assert d["wire_key"] == KEY_MAX // 4 * 3 and "declared_key" not in d


def test_keys_split_for_every_server_count():
    for servers in (1, 2, 3, 4, 7, 64, 1000, 1 << 16):
        for rank in {r for r in (0, 1, servers // 2, servers - 1) if r < servers}:
            for declared, part in ((0, 0), (3, 1), ((1 << 16) - 1, (1 << 16) - 1)):
                key = KEY_MAX // servers * rank + (declared << 16 | part)
                assert split_key(key, rank) == (declared, part)
    assert split_key(KEY_MAX // 4 * 2 + 5, None) is None      # needs the server's rank
    assert split_key(2**63 + 2**40, 1) is None                # no server count puts it in range


def test_control_messages_pair_between_nodes():
    nodes = [(Role.SERVER, 8, "10.0.0.1", 9000), (Role.WORKER, 9, "10.0.0.2", 9001)]
    specs = [penc.MessageSpec(control_cmd=Cmd.ADD_NODE, control_nodes=nodes, head=K_EMPTY, timestamp=None,
                              app_id=K_EMPTY, customer_id=K_EMPTY),
             penc.MessageSpec(control_cmd=Cmd.BARRIER, head=K_EMPTY, timestamp=4, request=True)]
    data, spans = penc.encode_stream([specs[0].raw_frames(), specs[1].raw_frames(barrier_group=6)], identity=b"ps1")
    msgs, p = _parse(data)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in msgs] == spans
    assert [m.op_name for m in msgs] == ["ADD_NODE", "BARRIER"]
    assert all(m.control and m.pair_scope == PAIR_NODES for m in msgs)
    assert [(n.node_id, n.hostname, n.port) for n in msgs[0].nodes] == [(8, "10.0.0.1", 9000), (9, "10.0.0.2", 9001)]
    assert msgs[0].detail() == {"cmd": Cmd.ADD_NODE, "variant": "byteps"} and msgs[0].call_space is None


@pytest.mark.parametrize("build", [_worker_stream, _server_stream])
@pytest.mark.parametrize("seed", range(5))
def test_any_chunking_gives_the_same_messages(build, seed):
    data, _ = build()
    want = [_ident(m) for m in _parse(data)[0]]
    msgs, p = _parse(data, random.Random(seed))
    assert [_ident(m) for m in msgs] == want and _accounted(p)


@pytest.mark.parametrize("build", [_worker_stream, _server_stream])
@pytest.mark.parametrize("seed", range(6))
def test_joined_mid_stream(build, seed):
    rng = random.Random(seed)
    data, spans = build(40)
    # a server's answers name their sender in every message; a worker's requests only
    # in the READY a mid-stream join misses
    routed = build is _server_stream
    full = {_ident(m, routed) for m in _parse(data)[0]}
    cut = rng.randint(1, len(data) // 2)
    msgs, p = _parse(data[cut:], rng, mid_stream=True, start_offset=cut)
    got = [_ident(m, routed) for m in msgs]
    # every message that starts after the cut but the first one or two is found, as it was
    after = [s for s in spans if s[0] >= cut]
    assert set(got) <= full and len(got) >= len(after) - 2 and p.variant == RAWMETA
    assert _accounted(p) and p.stats().resyncs >= 1


@pytest.mark.parametrize("build", [_worker_stream, _server_stream])
@pytest.mark.parametrize("seed", range(4))
def test_garbage_between_messages(build, seed):
    rng = random.Random(seed)
    data, spans = build(20)
    parts, pos, shift, want = [], 0, 0, []
    for first, last in spans:
        parts.append(data[pos:first])
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300))) if first > spans[0][0] else b""
        parts.append(junk)
        shift += len(junk)
        parts.append(data[first:last + 1])
        want.append((first + shift, last + shift))
        pos = last + 1
    msgs, p = _parse(b"".join(parts), rng)
    got = [(m.first_byte_offset, m.last_byte_offset) for m in msgs]
    # garbage may swallow the message after it (a bogus frame size), never invent one
    assert set(got) <= set(want) and len(got) >= len(want) - len(want) // 3
    assert _accounted(p)


def test_pbmeta_and_rawmeta_through_one_parser_class():
    raw, _ = _worker_stream(20)
    pb, pb_spans = penc.encode_stream([penc.MessageSpec(request=True, push=i % 2 == 0, timestamp=i,
                                                        keys=[i], vals=b"\0" * 4) for i in range(20)])
    raw_msgs, rp = _parse(raw, random.Random(1))
    pb_msgs, pp = _parse(pb, random.Random(1))
    assert rp.variant == RAWMETA and pp.variant == PBMETA
    assert all(isinstance(m, BytepsMessage) for m in raw_msgs) and len(raw_msgs) == 20
    assert not any(isinstance(m, BytepsMessage) for m in pb_msgs)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in pb_msgs] == pb_spans
    assert all(m.pair_scope == PAIR_NODES and m.detail() == {} for m in pb_msgs)
    # a direction's variant is fixed by its first message: the other kind is not read there
    mixed = pb + raw[len(penc.greeting_bytes() + penc.ready_bytes(b"DEALER", b"ps9")):]
    msgs, p = _parse(mixed)
    assert p.variant == PBMETA and len(msgs) == 20 and not any(isinstance(m, BytepsMessage) for m in msgs)
    assert _accounted(p)


def test_the_sniffer_takes_a_byteps_stream_for_pslite():
    data, _ = _worker_stream(40)
    want = [_ident(m) for m in _parse(data)[0]]
    s = SniffingParser()
    got = []
    for i in range(0, len(data), 77):
        got += s.feed(data[i:i + 77])
    got += s.close()
    assert s.verdict == "pslite" and [_ident(m) for m in got] == want and _accounted(s)
    cut = len(data) // 3
    s = SniffingParser(mid_stream=True, start_offset=cut)
    got = s.feed(data[cut:]) + s.close()
    assert s.verdict == "pslite" and got and _accounted(s)
    assert {_ident(m, False) for m in got} <= {_ident(m, False) for m in _parse(data)[0]}


@pytest.mark.parametrize("seed", range(3))
def test_hostile_rawmeta_never_raises(seed):
    rng = random.Random(seed)
    data, _ = _server_stream(10)
    for _ in range(150):
        b = bytearray(data)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.getrandbits(8)
        msgs, p = _parse(bytes(b), rng, mid_stream=rng.random() < 0.5)
        assert _accounted(p) and p.stats().pending_bytes == 0
        for m in msgs:
            m.detail()


def test_gaps_inside_values_lose_nothing_and_a_gap_in_a_meta_resyncs():
    data, spans = _server_stream(20)
    msgs = _parse(data)[0]
    pull = msgs[1]
    # a pull's answer: sender id (2 + 3 bytes), RawMeta (2 + 100), keys (2 + 8), vals (2 + 32), lens
    vals_at = pull.first_byte_offset + 5 + 102 + 10 + 2
    p = PsliteStreamParser()
    got = p.feed(data[:vals_at + 4]) + p.gap(20) + p.feed(data[vals_at + 24:]) + p.close()
    assert [_ident(m) for m in got] == [_ident(m) for m in msgs] and p.stats().lost_bytes == 0
    meta_at = msgs[4].first_byte_offset + 5 + 2 + 40    # inside the fifth message's RawMeta
    p = PsliteStreamParser()
    got = p.feed(data[:meta_at]) + p.gap(8) + p.feed(data[meta_at + 8:]) + p.close()
    ids = [m.call_id for m in got]
    assert ids[:4] == [0, 1, 2, 3] and 4 not in ids and ids[-10:] == list(range(10, 20))
    assert p.stats().lost_bytes == 8 and p.stats().resyncs >= 1 and _accounted(p)


def test_the_hunts_two_scans_agree():
    """raw_candidates: numpy over large buffers finds what the expression finds."""
    from parsers.pslite import rawmeta
    rng = np.random.default_rng(3)
    data, _ = _server_stream(60)
    for buf in (rng.integers(0, 256, 40000, dtype=np.uint8).tobytes(), bytes(5000), data * 3,
                rng.integers(0, 4, 30000, dtype=np.uint8).tobytes()):
        for start in (0, 5, 2100):
            assert rawmeta.raw_candidates(buf, start) == [m.start() for m in rawmeta._RAW_PATTERNS.finditer(buf, start)]


def test_a_sender_id_beyond_int32_is_refused_and_counted():
    spec = penc.MessageSpec(request=False, push=True, timestamp=1)
    data, spans = penc.encode_stream([spec.raw_frames(routing_id=b"ps9999999999"), spec.raw_frames(routing_id=b"ps8")],
                                     identity=None, socket_type=b"ROUTER")
    msgs, p = _parse(data)
    assert [(m.first_byte_offset, m.last_byte_offset) for m in msgs] == spans
    assert [m.sender_node_id for m in msgs] == [None, 8] and p.stats().values_rejected == 1
