"""A psbench worker: ps-lite's KVWorker (slice each request by server key range,
one message per server holding keys, all slices sharing the request's
timestamp) driven by a training loop.

Closed loop (default): pull(keys) -> wait -> compute (--compute-ms) ->
push(keys, grads) -> wait, until --duration-s. Open loop (--rate R): request k
is due at t0 + k/R (pulls and pushes alternate, keys drawn afresh); the main
thread issues it then, without waiting for earlier ones.

Reconnect (--reconnect-every K): before every K-th request the worker closes
and reopens its DEALERs to all servers (same identity). zmq connects in the
background, so the TCP and ZMTP set-up of the new connection is NOT in any
gap between requests: it falls inside the next slice to each server, between
its t_issued_ns and t_completed_ns (that slice has new_connection = true).
The close/open calls themselves happen before t_issued_ns and are counted in
no slice. In open loop the worker first waits until every request in flight
is answered: the server's ROUTER hands the identity over to the new
connection at once (ROUTER_HANDOVER) and would deliver requests still unread
on the old one under an anonymous identity, i.e. without their sender; that
wait delays the next issue past its due time (visible as t_issued_ns -
t_scheduled_ns).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from parsers.pslite.meta import server_id, worker_id
from workloads.psbench.customer import Customer, Fatal
from workloads.psbench.keys import KeySpace, KeyStream
from workloads.psbench.options import Workload
from workloads.psbench.timing import IssueSchedule, sleep_ns, sleep_until
from workloads.psbench.truth import TruthWriter
from workloads.psbench.van import Peer
from workloads.psbench.wire import KEY_DTYPE, VALUE_DTYPES, Message, data_meta, kv_frames

APP_ID, CUSTOMER_ID = 0, 0  # ps-lite: KVWorker<float> kv(0, 0)


class KVWorker:
    def __init__(self, rank: int, workload: Workload, space: KeySpace, truth: TruthWriter, fatal: Fatal,
                 ident: dict):
        self.rank, self.node_id = rank, worker_id(rank)
        self.wl, self.space, self.truth, self.ident = workload, space, truth, ident
        self.dtype, self.value_type = VALUE_DTYPES[workload.dtype]
        stream_seed = int(np.random.SeedSequence([workload.seed, rank]).generate_state(1)[0])
        self.keys = KeyStream(space, workload.zipf_exponent, workload.keys_per_request,
                              perm_seed=workload.seed, stream_seed=stream_seed)
        self.server_ids = [server_id(r) for r in range(space.num_servers)]
        self.van = None  # set by the node
        self.customer = Customer(APP_ID, CUSTOMER_ID, self.handle, fatal)
        self._lock = threading.Lock()
        self._pending: dict[tuple[int, int], dict] = {}  # (timestamp, server id) -> truth row
        self._pulled: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        self._keep_pulled = workload.rate == 0  # open loop never reads pulled values
        self._fresh: set[int] = set()  # servers whose connection was just reopened
        self.requests_issued = 0

    # -- KVWorker --------------------------------------------------------------

    def request(self, push: bool, keys: np.ndarray, vals: np.ndarray | None = None,
                t_scheduled_ns: int | None = None) -> int:
        """Send one push or pull (sorted unique uint64 keys); returns its timestamp."""
        if self.wl.reconnect_every and self.requests_issued and self.requests_issued % self.wl.reconnect_every == 0:
            self.drain(self.wl.start_timeout_s)
            self.reconnect()
        self.requests_issued += 1
        bounds = self.space.slice_bounds(keys)
        slices = [(i, bounds[i], bounds[i + 1]) for i in range(len(self.server_ids)) if bounds[i + 1] > bounds[i]]
        ts = self.customer.new_request(len(slices))
        dim = self.wl.embedding_dim
        for i, lo, hi in slices:
            k = keys[lo:hi]
            if push:
                lens = np.full(k.size, dim, dtype=np.int32) if self.wl.lens else None
                frames, types = kv_frames(k, vals[lo * dim:hi * dim], lens, self.value_type)
            else:
                frames, types = kv_frames(k, None, None, self.value_type)  # keys + empty values, as ps-lite
            sid = self.server_ids[i]
            meta = data_meta(request=True, push=push, app_id=APP_ID, customer_id=CUSTOMER_ID, timestamp=ts,
                             data_types=types)
            row = {**self.ident, "app_id": APP_ID, "customer_id": CUSTOMER_ID, "timestamp": ts,
                   "sender": self.node_id, "recver": sid, "op": "push" if push else "pull",
                   "num_keys": int(k.size), "t_scheduled_ns": t_scheduled_ns,
                   "new_connection": sid in self._fresh}
            self._fresh.discard(sid)
            with self._lock:
                self._pending[(ts, sid)] = row  # before sending: the reply may beat us back
            row["req_bytes"] = self.van.send(sid, meta, frames, stamp=row, stamp_field="t_issued_ns",
                                             stamp_after_field="t_issued_after_ns")
        return ts

    def handle(self, msg: Message) -> None:
        """Customer thread: a response arrived (KVWorker::Process)."""
        ts = msg.meta.timestamp
        with self._lock:
            row = self._pending.pop((ts, msg.sender), None)
        if row is None:
            raise RuntimeError(f"worker {self.node_id}: response from {msg.sender} to unknown request {ts}")
        row["t_completed_ns"] = msg.t_received_ns
        row["t_completed_before_ns"] = msg.t_received_before_ns
        # the reply can beat send()'s return: the request's zmq calls began before it came
        row.setdefault("t_issued_after_ns", msg.t_received_before_ns)
        row["resp_bytes"] = msg.nbytes
        if not msg.meta.push and self._keep_pulled:
            keys = np.frombuffer(msg.data[0], dtype=KEY_DTYPE)
            vals = np.frombuffer(msg.data[1], dtype=self.dtype)
            with self._lock:
                self._pulled.setdefault(ts, []).append((keys, vals))
        self.truth.add(row)

    def pulled_values(self, ts: int) -> np.ndarray:
        """The values of a completed pull, in key order (slices sorted by first key)."""
        with self._lock:
            parts = sorted(self._pulled.pop(ts, []), key=lambda kv: int(kv[0][0]) if kv[0].size else 0)
        return np.concatenate([v for _, v in parts]) if parts else np.empty(0, self.dtype)

    def reconnect(self) -> None:
        for sid in self.server_ids:
            p = self.van.peers[sid]
            self.van.connect(Peer(p.node_id, p.role, p.host, p.port))
            self._fresh.add(sid)

    def pending_rows(self) -> list[dict]:
        with self._lock:
            return list(self._pending.values())

    # -- training loops ----------------------------------------------------------

    def run(self, duration_s: float, wait_timeout_s: float) -> None:
        end_ns = time.monotonic_ns() + int(duration_s * 1e9)
        if self.wl.rate > 0:
            self._open_loop(end_ns, wait_timeout_s)
        else:
            self._closed_loop(end_ns, wait_timeout_s)

    def _wait(self, ts: int, timeout_s: float) -> None:
        if not self.customer.wait_request(ts, timeout_s):
            raise RuntimeError(f"worker {self.node_id}: request {ts} unanswered after {timeout_s:g} s")

    def _closed_loop(self, end_ns: int, timeout_s: float) -> None:
        compute_ns = int(self.wl.compute_ms * 1e6)
        while time.monotonic_ns() < end_ns:
            keys = self.keys.next_keys()
            ts = self.request(False, keys)
            self._wait(ts, timeout_s)
            vals = self.pulled_values(ts)
            sleep_ns(compute_ns)
            grads = (vals * -0.5 + 0.001).astype(self.dtype)  # a stand-in gradient of the pulled rows
            self._wait(self.request(True, keys, grads), timeout_s)

    def _open_loop(self, end_ns: int, timeout_s: float) -> None:
        schedule = IssueSchedule(self.wl.rate, time.monotonic_ns())
        grads = np.full(self.wl.keys_per_request * self.wl.embedding_dim, 0.001, dtype=self.dtype)
        while (due := schedule.next_due_ns()) < end_ns:
            sleep_until(due)
            push = schedule.k % 2 == 0  # k was advanced: requests 0, 2, ... pull; 1, 3, ... push
            self.request(push, self.keys.next_keys(), grads if push else None, t_scheduled_ns=due)
        self.drain(timeout_s)

    def drain(self, timeout_s: float) -> None:
        """Wait until every request issued so far is answered."""
        deadline = time.monotonic() + timeout_s
        for ts in self.customer.outstanding():
            self._wait(ts, max(0.0, deadline - time.monotonic()))
