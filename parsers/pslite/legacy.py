"""Run dirs of format 1, from before protocols were plug-ins: their messages table had
ps-lite's own id columns (app_id, customer_id, timestamp, cmd) where today's has the
generic ones of parsers/protocol.py. Every row of such a table is ps-lite."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from parsers.protocol import PAIR_NODES

from .message import ABSENT_ID, PsMessage, op_name_of

COLUMNS = ("app_id", "customer_id", "timestamp", "cmd")
_LOW32 = 0xFFFFFFFF


def is_legacy(names) -> bool:
    return "timestamp" in names and "call_id" not in names


def upgrade(tbl: pa.Table) -> pa.Table:
    """A format-1 messages table with today's id columns (as PsMessage's properties give
    them), its own id columns dropped."""
    n = tbl.num_rows

    def col(name: str, t: pa.DataType) -> pa.ChunkedArray | pa.Array:
        return tbl.column(name).cast(t) if name in tbl.column_names else pa.nulls(n, t)

    app, cust = col("app_id", pa.int64()), col("customer_id", pa.int64())
    either = pc.or_(pc.is_valid(app), pc.is_valid(cust))
    app, cust = (pc.if_else(either, pc.fill_null(x, ABSENT_ID), pa.scalar(None, pa.int64())) for x in (app, cust))
    # shift_left does not check overflow: an app_id of 2**31 or more wraps into the sign
    # bit, as call_space_of's two's complement does
    space = pc.bit_wise_or(pc.shift_left(pc.bit_wise_and(app, _LOW32), 32), pc.bit_wise_and(cust, _LOW32))
    op = col("op", pa.string())
    cmd = col("cmd", pa.int64())
    control = pc.fill_null(col("control", pa.bool_()), False)
    op_name = pa.array([None if (o is None or ctl and c is None) else op_name_of(ctl, c, o)
                        for ctl, c, o in zip(control.to_pylist(), cmd.to_pylist(), op.to_pylist())], pa.string())
    detail = pa.array([('{"cmd":%d}' % c if c is not None else None) if ctl else
                       ('{"simple_app":true}' if o == "simple" else None)
                       for ctl, c, o in zip(control.to_pylist(), cmd.to_pylist(), op.to_pylist())], pa.string())
    out = tbl.drop_columns([c for c in COLUMNS if c in tbl.column_names])
    for name, values in (("protocol", pa.array([PsMessage.protocol] * n, pa.string())),
                         ("pair_scope", pa.array([PAIR_NODES] * n, pa.string())),
                         ("op_name", op_name), ("call_space", space), ("call_id", col("timestamp", pa.int64())),
                         ("detail", detail)):
        out = out.append_column(name, values)
    return out


def ps_ids(frame):
    """ps-lite's own ids (app_id, customer_id, timestamp) of a messages DataFrame in
    today's columns, as nullable ints (to compare with ps-lite's own logs)."""
    import numpy as np
    import pandas as pd

    space = frame["call_space"].astype("Int64")
    known = space.notna().to_numpy()
    v = space.fillna(0).to_numpy(dtype=np.int64)
    low = v & _LOW32
    high = v >> 32   # the high word, signed: app_id as PBMeta had it
    low = np.where(low >= 1 << 31, low - (1 << 32), low)
    app = pd.arrays.IntegerArray(high, ~known | (high == ABSENT_ID))
    cust = pd.arrays.IntegerArray(low, ~known | (low == ABSENT_ID))
    return pd.DataFrame({"app_id": app, "customer_id": cust, "timestamp": frame["call_id"].astype("Int64")},
                        index=frame.index)
