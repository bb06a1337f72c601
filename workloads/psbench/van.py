"""ps-lite's ZMQVan and the control half of its Van, over pyzmq.

Sockets, as ps-lite: each node binds one ROUTER on its port and opens one
DEALER per peer, connected to the peer's ROUTER, with ZMQ identity "ps<my id>"
once the scheduler has given it an id. Everything a node sends goes out of
its DEALERs (all sends serialised by one lock, as ZMQVan's mu_); everything it
receives comes in on its ROUTER, read by one thread ("ps-van", ps-lite's
Van::Receiving), which learns the sender from the identity frame. So a
request and its response travel on different TCP connections. One ZMQ
context with one I/O thread per process, libzmq's default and ps-lite's.

Start-up, as ps-lite: a node connects to the scheduler with an anonymous
DEALER and sends ADD_NODE (role, host, port); once every node has, the
scheduler assigns ids (server rank r -> 8+2r, worker rank r -> 9+2r), connects
to each and sends each the full node table; a node then connects to the
scheduler (again, now with its identity), to itself, and to every node of the
other role. BARRIER requests go to the scheduler, which answers every member
of the group when all have arrived. Stop: a node sends TERMINATE to itself,
which ends its receive loop.
"""
from __future__ import annotations

import ipaddress
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import zmq

from core.errors import UserError
from parsers.pslite.meta import (SCHEDULER_ID, SERVER_GROUP, WORKER_GROUP, Cmd, Role, identity_of,
                                 node_id_of_identity, server_id, worker_id)
from workloads.psbench.customer import Fatal
from workloads.psbench.options import NodeConfig
from workloads.psbench.timing import set_thread_name
from workloads.psbench.wire import K_EMPTY, Message, add_node, control_meta, is_control, pack_meta, unpack_meta

ALL_GROUPS = SCHEDULER_ID | SERVER_GROUP | WORKER_GROUP  # ps-lite: kScheduler + kServerGroup + kWorkerGroup
ROLE_OF = {"scheduler": Role.SCHEDULER, "server": Role.SERVER, "worker": Role.WORKER}
STOP_LINGER_MS = 2000  # ps-lite lingers 0 ms; we let queued control replies (barrier) leave first


@dataclass
class Peer:
    node_id: int
    role: int
    host: str
    port: int


def _addr_key(peer: Peer):
    try:
        return (0, int(ipaddress.ip_address(peer.host)), peer.port)
    except ValueError:
        return (1, peer.host, peer.port)


class Van:
    def __init__(self, cfg: NodeConfig, on_data: Callable[[Message], None], fatal: Fatal):
        self.cfg = cfg
        self.role = ROLE_OF[cfg.role]
        self.on_data = on_data
        self.fatal = fatal
        self.my_id: int | None = SCHEDULER_ID if self.role == Role.SCHEDULER else None
        self.peers: dict[int, Peer] = {}
        self.ready = threading.Event()
        self._barrier_done = threading.Event()
        fatal.on_fail(self.ready.set)
        fatal.on_fail(self._barrier_done.set)
        self._send_lock = threading.Lock()
        self._timestamp = 0  # ps-lite Van::timestamp_: numbers the van's own control messages
        self._senders: dict[int, zmq.Socket] = {}
        self._joining: list[Peer] = []  # scheduler: ADD_NODE requests so far
        self._barrier_count: dict[int, int] = defaultdict(int)
        self.ctx = zmq.Context(io_threads=1)
        self.ctx.set(zmq.MAX_SOCKETS, 65536)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Not in ps-lite: a worker that reconnects (--reconnect-every) reuses its
        # identity; handover lets the new connection take it over at once.
        self.router.setsockopt(zmq.ROUTER_HANDOVER, 1)
        try:
            self.router.bind(f"tcp://*:{cfg.port}")
        except zmq.ZMQError as e:
            self.ctx.destroy(linger=0)
            raise UserError(f"psbench {cfg.role} cannot bind port {cfg.port}: {e}; "
                            "pick a free port (DMLC_PS_ROOT_PORT / PORT)") from None
        self.port = int(self.router.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
        self._thread = threading.Thread(target=self._receiving, name="ps-van", daemon=True)

    # -- ids and sockets -------------------------------------------------------

    def _next_timestamp(self) -> int:
        with self._send_lock:
            ts = self._timestamp
            self._timestamp += 1
            return ts

    def connect(self, peer: Peer) -> None:
        """ps-lite ZMQVan::Connect: (re)open the DEALER to `peer`."""
        if peer.role == self.role and peer.node_id != self.my_id:
            return  # workers don't talk to workers, nor servers to servers
        sock = self.ctx.socket(zmq.DEALER)
        if self.my_id is not None:
            sock.setsockopt(zmq.IDENTITY, identity_of(self.my_id))
        sock.connect(f"tcp://{peer.host}:{peer.port}")
        with self._send_lock:
            old = self._senders.get(peer.node_id)
            self._senders[peer.node_id] = sock
        if old is not None:
            old.close()  # default linger: what it still queues is delivered

    def send(self, recver: int, meta, frames: list[bytes] = (), stamp: dict | None = None,
             stamp_field: str = "", stamp_after_field: str = "") -> int:
        """Send one message; returns its size as ps-lite counts it (meta +
        data frames). With `stamp`, stamp[stamp_field] is set to
        time.monotonic_ns() immediately before the first zmq send and
        stamp[stamp_after_field] right after the last: the zmq calls lie between."""
        data_size = sum(len(f) for f in frames)
        meta_bytes = pack_meta(meta, data_size)
        with self._send_lock:
            sock = self._senders.get(recver)
            if sock is None:
                raise RuntimeError(f"psbench: no connection to node {recver}")
            if stamp is not None:
                stamp[stamp_field] = time.monotonic_ns()
            sock.send_multipart([meta_bytes, *frames])
            if stamp is not None and stamp_after_field:
                stamp[stamp_after_field] = time.monotonic_ns()
        return len(meta_bytes) + data_size

    # -- start, barrier, stop --------------------------------------------------

    def start(self, timeout_s: float) -> None:
        self._thread.start()
        self.connect(Peer(SCHEDULER_ID, Role.SCHEDULER, self.cfg.root_uri, self.cfg.root_port))
        if self.role != Role.SCHEDULER:
            meta = control_meta(Cmd.ADD_NODE, timestamp=self._next_timestamp())
            add_node(meta, role=self.role, node_id=K_EMPTY, host=self.cfg.node_host, port=self.port)
            self.send(SCHEDULER_ID, meta)
        if not self.ready.wait(timeout_s):
            raise UserError(
                f"psbench {self.cfg.role}: the job did not form within {timeout_s:g} s (scheduler "
                f"{self.cfg.root_uri}:{self.cfg.root_port}, expecting {self.cfg.num_servers} servers and "
                f"{self.cfg.num_workers} workers); start every role or raise --start-timeout-s")
        self.fatal.check()

    def barrier(self, timeout_s: float | None, group: int = ALL_GROUPS) -> None:
        """ps-lite Postoffice::Barrier: block until every node of `group` arrived."""
        self._barrier_done.clear()
        meta = control_meta(Cmd.BARRIER, request=True, timestamp=self._next_timestamp(), app_id=0, customer_id=0)
        meta.control.barrier_group = group
        self.send(SCHEDULER_ID, meta)
        if not self._barrier_done.wait(timeout_s):
            raise UserError(f"psbench {self.cfg.role}: barrier not reached within {timeout_s:g} s "
                            "(another node of the job is missing or stuck); check the other roles' logs")
        self.fatal.check()

    def heartbeat(self) -> None:
        meta = control_meta(Cmd.HEARTBEAT, timestamp=self._next_timestamp())
        add_node(meta, role=self.role, node_id=self.my_id, host=self.cfg.node_host, port=self.port)
        self.send(SCHEDULER_ID, meta)

    def stop(self) -> None:
        meta = control_meta(Cmd.TERMINATE, customer_id=0)
        self.send(self.my_id, meta)
        self._thread.join()
        self.close()

    def close(self) -> None:
        self.ctx.destroy(linger=STOP_LINGER_MS)

    # -- receiving ---------------------------------------------------------------

    def _receiving(self) -> None:
        set_thread_name("ps-van")
        try:
            while True:
                # wait for a whole message (zmq delivers a message's frames together),
                # then take it: the zmq calls that hand it over lie between the stamps,
                # however long this thread waits for a CPU or the GIL around them
                self.router.poll()
                t_before_ns = time.monotonic_ns()
                frames = self.router.recv_multipart(zmq.NOBLOCK)
                t_received_ns = time.monotonic_ns()
                meta = unpack_meta(frames[1])
                msg = Message(node_id_of_identity(frames[0]), meta, frames[2:], t_received_ns,
                              sum(len(f) for f in frames[1:]), t_before_ns)
                if not is_control(meta):
                    self.on_data(msg)
                elif meta.control.cmd == Cmd.TERMINATE:
                    return
                elif meta.control.cmd == Cmd.ADD_NODE:
                    self._on_add_node(msg)
                elif meta.control.cmd == Cmd.BARRIER:
                    self._on_barrier(msg)
                elif meta.control.cmd == Cmd.HEARTBEAT and self.role == Role.SCHEDULER:
                    self._on_heartbeat(msg)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread
            self.fatal.fail(e)

    def _on_add_node(self, msg: Message) -> None:
        nodes = [Peer(n.id, n.role, n.hostname, n.port) for n in msg.meta.control.node]
        if self.role == Role.SCHEDULER:
            self._joining.extend(nodes)
            if len(self._joining) == self.cfg.num_servers + self.cfg.num_workers:
                self._assign_ids()
            return
        for n in nodes:
            if n.host == self.cfg.node_host and n.port == self.port:
                self.my_id = n.node_id
        if self.my_id is None:
            raise RuntimeError(f"psbench: the scheduler's node table lacks {self.cfg.node_host}:{self.port}")
        for n in nodes:
            self.peers[n.node_id] = n
            self.connect(n)
        self.ready.set()

    def _assign_ids(self) -> None:
        """Ranks in address order, so that in the virtual cluster (addresses
        ascending with host index) server i on hosts[i] gets rank i."""
        servers = sorted((p for p in self._joining if p.role == Role.SERVER), key=_addr_key)
        workers = sorted((p for p in self._joining if p.role == Role.WORKER), key=_addr_key)
        if len(servers) != self.cfg.num_servers:
            raise UserError(f"psbench scheduler: {len(servers)} servers and {len(workers)} workers joined, "
                            f"expected {self.cfg.num_servers} and {self.cfg.num_workers}; fix DMLC_NUM_*")
        for rank, p in enumerate(servers):
            p.node_id = server_id(rank)
        for rank, p in enumerate(workers):
            p.node_id = worker_id(rank)
        table = servers + workers
        for p in table:
            self.peers[p.node_id] = p
            self.connect(p)
        me = Peer(SCHEDULER_ID, Role.SCHEDULER, self.cfg.root_uri, self.port)
        for p in table:
            meta = control_meta(Cmd.ADD_NODE, timestamp=self._next_timestamp())
            for n in table + [me]:
                add_node(meta, role=n.role, node_id=n.node_id, host=n.host, port=n.port)
            self.send(p.node_id, meta)
        self.ready.set()

    def group_members(self, group: int) -> list[int]:
        ids = [SCHEDULER_ID] if group & SCHEDULER_ID else []
        ids += [i for i, p in sorted(self.peers.items()) if
                (p.role == Role.SERVER and group & SERVER_GROUP) or (p.role == Role.WORKER and group & WORKER_GROUP)]
        return ids

    def _on_barrier(self, msg: Message) -> None:
        if not msg.meta.request:
            self._barrier_done.set()
            return
        group = msg.meta.control.barrier_group
        self._barrier_count[group] += 1
        members = self.group_members(group)
        if self._barrier_count[group] < len(members):
            return
        self._barrier_count[group] = 0
        # Others first, the scheduler itself last: it may stop as soon as it hears its own reply.
        for node_id in sorted(members, key=lambda i: i == SCHEDULER_ID):
            meta = control_meta(Cmd.BARRIER, timestamp=self._next_timestamp(), app_id=msg.meta.app_id,
                                customer_id=msg.meta.customer_id)
            meta.control.barrier_group = group
            self.send(node_id, meta)

    def _on_heartbeat(self, msg: Message) -> None:
        for n in msg.meta.control.node:
            meta = control_meta(Cmd.HEARTBEAT, timestamp=self._next_timestamp())
            add_node(meta, role=self.role, node_id=SCHEDULER_ID, host=self.cfg.root_uri, port=self.port)
            self.send(n.id, meta)
