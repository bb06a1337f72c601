"""psbench's ground truth: one row per request slice, per process, as Parquet.

Each process buffers rows and a background thread writes them as a new shard
every `flush_interval_s` (written to a temporary name, then renamed, so a
reader never sees half a shard and a killed process loses at most the last
interval). The schema is documented in README.md.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from workloads.psbench.timing import set_thread_name

SCHEMA = pa.schema([
    ("role", pa.string()),            # worker | server: who logged the row
    ("host", pa.string()),            # host id (hostname, namespace name, or --host-id)
    ("addr", pa.string()),            # the node's address (DMLC_NODE_HOST)
    ("pid", pa.int32()),
    ("node_id", pa.int32()),          # this process's ps-lite node id
    ("app_id", pa.int32()),
    ("customer_id", pa.int32()),
    ("timestamp", pa.int32()),        # ps-lite request timestamp (per worker customer)
    ("sender", pa.int32()),           # worker node id (the request's sender)
    ("recver", pa.int32()),           # server node id (the request's receiver)
    ("op", pa.string()),              # push | pull
    ("num_keys", pa.int32()),
    ("req_bytes", pa.int64()),        # request: PBMeta frame + data frames
    ("resp_bytes", pa.int64()),       # response: PBMeta frame + data frames
    ("t_scheduled_ns", pa.int64()),   # worker, open loop: when the request was due
    ("t_issued_ns", pa.int64()),      # worker: just before the first zmq send of the slice
    ("t_completed_ns", pa.int64()),   # worker: just after the response's last frame arrived
    ("t_received_ns", pa.int64()),    # server: just after the request's last frame arrived
    ("t_replied_ns", pa.int64()),     # server: just before the first zmq send of the reply
    # the other side of each zmq call: the calls lie between the two stamps
    ("t_issued_after_ns", pa.int64()),      # worker: just after the slice's last zmq send returned
    ("t_completed_before_ns", pa.int64()),  # worker: the response was ready (poll), before its zmq recvs
    ("t_received_before_ns", pa.int64()),   # server: the request was ready (poll), before its zmq recvs
    ("t_replied_after_ns", pa.int64()),     # server: just after the reply's last zmq send returned
    ("server_delay_ns", pa.int64()),  # server: the processing delay it drew for this slice
    ("new_connection", pa.bool_()),   # worker: first slice on a freshly (re)opened connection
])
COLUMNS = SCHEMA.names


class TruthWriter:
    """Append rows (dicts with SCHEMA's names; missing ones are null) from any
    thread; shards go to `<out>/truth/<role>-<host>-<pid>-<seq>.parquet`."""

    def __init__(self, out_dir: Path, role: str, host: str, flush_interval_s: float = 1.0):
        self.dir = Path(out_dir) / "truth"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._prefix = f"{role}-{host}-{os.getpid()}"
        self._rows: list[dict] = []
        self._lock = threading.Lock()
        self._seq = 0
        self._stop = threading.Event()
        self._interval = flush_interval_s
        self._thread = threading.Thread(target=self._run, name="ps-truth", daemon=True)
        self._thread.start()

    def add(self, row: dict) -> None:
        with self._lock:
            self._rows.append(row)

    def _run(self) -> None:
        set_thread_name("ps-truth")
        while not self._stop.wait(self._interval):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            rows, self._rows = self._rows, []
            seq = self._seq
            self._seq += 1 if rows else 0
        if not rows:
            return
        table = pa.Table.from_pydict({c: [r.get(c) for r in rows] for c in COLUMNS}, schema=SCHEMA)
        final = self.dir / f"{self._prefix}-{seq:05d}.parquet"
        tmp = final.with_suffix(".parquet.tmp")
        pq.write_table(table, tmp)
        os.replace(tmp, final)

    def close(self, extra_rows: list[dict] = ()) -> None:
        for r in extra_rows:
            self.add(r)
        self._stop.set()
        self._thread.join()
        self.flush()


def read_truth(out_dir: Path):
    """All shards under `<out_dir>/truth` as one pandas DataFrame (empty, with
    the schema's columns, when there are none)."""
    import pandas as pd  # here, not at the top: psbench's processes never need it

    files = sorted((Path(out_dir) / "truth").glob("*.parquet"))
    tables = [pq.read_table(f, schema=SCHEMA) for f in files] or [SCHEMA.empty_table()]
    # Nullable pandas dtypes: ns timestamps stay exact ints (float64 would round them).
    types = {pa.int32(): pd.Int32Dtype(), pa.int64(): pd.Int64Dtype(),
             pa.bool_(): pd.BooleanDtype(), pa.string(): pd.StringDtype()}
    return pa.concat_tables(tables).to_pandas(types_mapper=types.get)
