"""PBMeta schema: round trip, and that unknown fields (BytePS/newer variants) are tolerated."""
from parsers.pslite.meta import PBMeta, Cmd, DataType, identity_of, node_id_of_identity


def test_roundtrip_data_request():
    m = PBMeta(head=0, request=True, push=True, app_id=0, customer_id=0, timestamp=42,
               data_type=[DataType.UINT64, DataType.FLOAT, DataType.INT32])
    b = m.SerializeToString()
    m2 = PBMeta.FromString(b)
    assert (m2.request, m2.push, m2.timestamp, list(m2.data_type)) == (True, True, 42, [8, 9, 3])


def test_control_roundtrip():
    m = PBMeta()
    m.control.cmd = Cmd.ADD_NODE
    n = m.control.node.add(role=1, id=9, hostname="10.0.0.1", port=1234)
    assert PBMeta.FromString(m.SerializeToString()).control.node[0].port == 1234


def test_unknown_fields_ignored():
    # field 20, varint 7: a field we do not declare
    b = PBMeta(timestamp=3).SerializeToString() + bytes([0xA0, 0x01, 7])  # tag varint(20<<3|0), value 7
    assert PBMeta.FromString(b).timestamp == 3


def test_identity():
    assert identity_of(9) == b"ps9"
    assert node_id_of_identity(b"ps12") == 12
    assert node_id_of_identity(b"\x00abc") is None
