"""A psbench server: one shard of the embedding table (the key ids of its
ps-lite key range), answering pushes (add the gradient) and pulls (return
the rows), as ps-lite's KVServer with its default handle, one request at a time
on the customer thread.

Processing delay: each slice takes server_delay_ms + uniform(0, server_jitter_ms)
of handling time on top of the table update, slept precisely (timing.py); a
slice queued behind others waits for them first, as on a real server.
"""
from __future__ import annotations

import numpy as np

from core.errors import UserError
from parsers.pslite.meta import server_id
from workloads.psbench.customer import Customer, Fatal
from workloads.psbench.keys import KeySpace
from workloads.psbench.options import Workload
from workloads.psbench.timing import sleep_ns
from workloads.psbench.truth import TruthWriter
from workloads.psbench.wire import KEY_DTYPE, VALUE_DTYPES, Message, data_meta, kv_frames

MAX_TABLE_BYTES = 8 << 30  # virtual: np.zeros pages stay unbacked until a key is touched
LEARNING_RATE = 0.01


class KVServer:
    APP_ID = 0  # ps-lite: KVServer(app_id); its customer id is its app id

    def __init__(self, rank: int, workload: Workload, space: KeySpace, truth: TruthWriter, fatal: Fatal,
                 ident: dict):
        self.rank, self.node_id = rank, server_id(rank)
        self.wl, self.space, self.truth, self.ident = workload, space, truth, ident
        self.dtype, self.value_type = VALUE_DTYPES[workload.dtype]
        self.lo, hi = space.server_id_range(rank)
        nbytes = (hi - self.lo) * workload.embedding_dim * self.dtype.itemsize
        if nbytes > MAX_TABLE_BYTES:
            raise UserError(f"server shard would need {nbytes / 2**30:.1f} GiB; lower --key-space or "
                            "--embedding-dim, or add servers")
        self.table = np.zeros((hi - self.lo, workload.embedding_dim), dtype=self.dtype)
        self._rng = np.random.default_rng([workload.seed, 1_000_000 + rank])
        self.van = None  # set by the node once the van exists (the van needs our customer)
        self.customer = Customer(self.APP_ID, self.APP_ID, self.handle, fatal)

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        rows = self.space.key_ids(keys).astype(np.int64) - self.lo
        if rows.size and (rows.min() < 0 or rows.max() >= self.table.shape[0]):
            raise RuntimeError(f"server {self.node_id} got keys outside its range: workers and servers "
                               "disagree on --key-space or the number of servers")
        return rows

    def _delay_ns(self) -> int:
        jitter = self._rng.uniform(0.0, self.wl.server_jitter_ms) if self.wl.server_jitter_ms else 0.0
        return int((self.wl.server_delay_ms + jitter) * 1e6)

    def handle(self, msg: Message) -> None:
        """Customer thread: process one request slice and reply (KVServer::Process + Response)."""
        meta = msg.meta
        keys = np.frombuffer(msg.data[0], dtype=KEY_DTYPE) if msg.data else np.empty(0, KEY_DTYPE)
        row = {**self.ident, "app_id": meta.app_id, "customer_id": meta.customer_id,
               "timestamp": meta.timestamp, "sender": msg.sender, "recver": self.node_id,
               "op": "push" if meta.push else "pull", "num_keys": int(keys.size),
               "req_bytes": msg.nbytes, "t_received_ns": msg.t_received_ns,
               "t_received_before_ns": msg.t_received_before_ns}
        rows = self._rows(keys)
        delay_ns = self._delay_ns()
        row["server_delay_ns"] = delay_ns
        sleep_ns(delay_ns)
        dim = self.wl.embedding_dim
        if meta.push:
            vals = np.frombuffer(msg.data[1], dtype=self.dtype)
            if vals.size != keys.size * dim:
                raise RuntimeError(f"server {self.node_id}: push of {keys.size} keys carries {vals.size} values, "
                                   f"expected {keys.size * dim}: workers and servers disagree on --embedding-dim")
            self.table[rows] -= LEARNING_RATE * vals.reshape(-1, dim)
            frames, types = [], []  # ps-lite answers a push with an empty response
        else:
            lens = np.full(keys.size, dim, dtype=np.int32) if self.wl.lens else None
            frames, types = kv_frames(keys, self.table[rows].ravel(), lens, self.value_type)
        reply = data_meta(request=False, push=meta.push, app_id=self.APP_ID, customer_id=meta.customer_id,
                          timestamp=meta.timestamp, data_types=types, head=meta.head)
        row["resp_bytes"] = self.van.send(msg.sender, reply, frames, stamp=row, stamp_field="t_replied_ns",
                                       stamp_after_field="t_replied_after_ns")
        self.truth.add(row)
