"""ps-lite messages as bytes: the PBMeta frame and the data frames.

What goes on the wire follows ps-lite's Van::PackMeta (as in MXNet's ps-lite):
head, push, request, simple_app and customer_id are always set (proto2 fields
set explicitly are serialised even when 0/false), app_id and timestamp only
when not empty, data_type lists the element type of each data frame, and
data_size (field 11) is the byte count of the data frames. Unset ids are
ps-lite's kEmpty (INT_MAX): a control message carries head = customer_id =
kEmpty unless the sender sets them.

Data frames are raw little-endian arrays (ps-lite sends host memory, x86):
keys uint64, values float32 (or float64), lens int32.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from parsers.pslite.meta import DataType, PBMeta

K_EMPTY = 2**31 - 1  # ps-lite Meta::kEmpty / Node::kEmpty

KEY_DTYPE = np.dtype("<u8")
LEN_DTYPE = np.dtype("<i4")
VALUE_DTYPES = {"float32": (np.dtype("<f4"), DataType.FLOAT), "float64": (np.dtype("<f8"), DataType.DOUBLE)}

def pack_meta(meta: PBMeta, data_size: int) -> bytes:
    """Serialise as ps-lite does, data_size included."""
    meta.data_size = data_size
    return meta.SerializeToString()


def unpack_meta(buf: bytes) -> PBMeta:
    return PBMeta.FromString(buf)


def is_control(meta: PBMeta) -> bool:
    return meta.HasField("control") and meta.control.cmd != 0


@dataclass
class Message:
    """A received message: who sent it (from the ROUTER identity frame), its
    meta, its data frames, when its last frame was received, and its size as
    ps-lite counts it (meta frame + data frames). The zmq calls that received
    it lie between t_received_before_ns and t_received_ns."""
    sender: int | None
    meta: PBMeta
    data: list[bytes] = field(default_factory=list)
    t_received_ns: int = 0
    nbytes: int = 0
    t_received_before_ns: int = 0


def data_meta(*, request: bool, push: bool, app_id: int, customer_id: int, timestamp: int,
              data_types: list[int], head: int = 0) -> PBMeta:
    m = PBMeta(head=head, push=push, request=request, simple_app=False, app_id=app_id,
               timestamp=timestamp, customer_id=customer_id)
    m.data_type.extend(data_types)
    return m


def control_meta(cmd: int, *, request: bool = False, timestamp: int | None = None,
                 app_id: int | None = None, customer_id: int = K_EMPTY) -> PBMeta:
    m = PBMeta(head=K_EMPTY, push=False, request=request, simple_app=False, customer_id=customer_id)
    if app_id is not None:
        m.app_id = app_id
    if timestamp is not None:
        m.timestamp = timestamp
    m.control.cmd = cmd
    return m


def add_node(meta: PBMeta, *, role: int, node_id: int, host: str, port: int, customer_id: int = 0) -> None:
    meta.control.node.add(id=node_id, role=role, port=port, hostname=host, is_recovery=False,
                          customer_id=customer_id)


def kv_frames(keys: np.ndarray, vals: np.ndarray | None, lens: np.ndarray | None,
              value_type: int) -> tuple[list[bytes], list[int]]:
    """Data frames and their data_type list for a KV message. vals=None still
    sends an empty values frame, as ps-lite's pull request does."""
    frames = [np.ascontiguousarray(keys, dtype=KEY_DTYPE).tobytes(),
              b"" if vals is None else np.ascontiguousarray(vals).tobytes()]
    types = [DataType.UINT64, value_type]
    if lens is not None:
        frames.append(np.ascontiguousarray(lens, dtype=LEN_DTYPE).tobytes())
        types.append(DataType.INT32)
    return frames, types
