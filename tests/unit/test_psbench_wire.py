"""psbench's PBMeta bytes follow ps-lite's Van::PackMeta, byte for byte."""
import numpy as np

from parsers.pslite.meta import Cmd, DataType, PBMeta
from workloads.psbench.wire import K_EMPTY, add_node, control_meta, data_meta, kv_frames, pack_meta


def _fields(buf: bytes):
    """(field number, value) in wire order; a minimal protobuf walker (varint and length-delimited)."""
    out, i = [], 0

    def varint():
        nonlocal i
        shift = value = 0
        while True:
            b = buf[i]
            i += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return value

    while i < len(buf):
        tag = varint()
        if tag & 7 == 0:
            out.append((tag >> 3, varint()))
        else:
            n = varint()
            out.append((tag >> 3, buf[i:i + n]))
            i += n
    return out


def test_push_request_bytes_as_pslite_packs_them():
    meta = data_meta(request=True, push=True, app_id=0, customer_id=0, timestamp=3,
                     data_types=[DataType.UINT64, DataType.FLOAT, DataType.INT32])
    got = pack_meta(meta, data_size=100)
    # head=0, request=1, push=1, simple_app=0, app_id=0, timestamp=3,
    # data_type=[8,9,3] packed, customer_id=0, data_size=100 (field 11), in field order.
    assert got == bytes.fromhex("0800" "2001" "2801" "3000" "3800" "4003" "4a03080903" "5000" "5864")


def test_data_size_field_counts_data_bytes_and_large_values_encode():
    got = _fields(pack_meta(data_meta(request=False, push=False, app_id=0, customer_id=0, timestamp=70000,
                                      data_types=[]), data_size=300_000))
    assert (8, 70000) in got and got[-1] == (11, 300_000)
    assert [f for f, _ in got] == sorted(f for f, _ in got)
    assert PBMeta.FromString(pack_meta(PBMeta(timestamp=5), 9)).timestamp == 5  # still a valid PBMeta


def test_control_messages_carry_kempty_ids():
    meta = control_meta(Cmd.ADD_NODE, timestamp=0)
    add_node(meta, role=1, node_id=K_EMPTY, host="10.0.0.2", port=4242)
    decoded = PBMeta.FromString(pack_meta(meta, 0))
    assert decoded.head == K_EMPTY == decoded.customer_id == 2**31 - 1
    assert not decoded.HasField("app_id")
    n = decoded.control.node[0]
    assert (decoded.control.cmd, n.id, n.role, n.hostname, n.port) == (Cmd.ADD_NODE, K_EMPTY, 1, "10.0.0.2", 4242)


def test_pull_request_frames_keys_and_empty_values():
    frames, types = kv_frames(np.array([1, 2**63], dtype=np.uint64), None, None, DataType.FLOAT)
    assert frames == [(1).to_bytes(8, "little") + (2**63).to_bytes(8, "little"), b""]
    assert types == [DataType.UINT64, DataType.FLOAT]
    frames, types = kv_frames(np.array([7], dtype=np.uint64), np.array([0.5, 1.0], np.float32),
                              np.array([2], np.int32), DataType.FLOAT)
    assert frames[2] == (2).to_bytes(4, "little") and types[-1] == DataType.INT32
    assert np.frombuffer(frames[1], "<f4").tolist() == [0.5, 1.0]
