"""Records real libzmq byte streams of ps-lite-shaped traffic, for the parser tests.

Two nodes as ps-lite wires them: each binds a ROUTER and connects a DEALER (identity
"ps<node id>") to the other's ROUTER, so requests (worker 9 -> server 8) and
responses (server 8 -> worker 9) travel on two different TCP connections. A small
TCP proxy sits in the middle of each connection and saves both directions byte for
byte, with the size of every recv() it made (libzmq batches several messages per
write, so one recv holds several messages).

Scenarios:
  pslite: newer dmlc/ps-lite: `pull` always set, float vals, no lens
  mxnet:  ps-lite as inside MXNet: no `pull` field, char vals with lens

Run from the repository root:  .venv/bin/python tests/data/pslite/record.py
It rewrites <scenario>.<connection>.<dealer|router>.bin (the bytes that end sent) and
<scenario>.json.gz (per stream: recv() sizes, READY facts, every message sent) here.
"""
from __future__ import annotations

import gzip
import json
import random
import socket
import sys
import threading
from pathlib import Path

import numpy as np
import zmq

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from parsers.pslite.encode import MessageSpec  # noqa: E402
from parsers.pslite.meta import Cmd, DataType, Role, identity_of, server_id, worker_id  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER, SERVER = worker_id(0), server_id(0)


class RecordingProxy:
    """Accepts one TCP connection, connects to `upstream_port`, pumps and records both ways."""

    def __init__(self, upstream_port: int):
        self.upstream_port = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.data = {"down": bytearray(), "up": bytearray()}  # down: connector -> binder
        self.chunks = {"down": [], "up": []}
        self.threads: list[threading.Thread] = []
        self.accepted = threading.Thread(target=self._accept, daemon=True)
        self.accepted.start()

    def _accept(self):
        client, _ = self.listener.accept()
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        for src, dst, name in ((client, upstream, "down"), (upstream, client, "up")):
            t = threading.Thread(target=self._pump, args=(src, dst, name), daemon=True)
            t.start()
            self.threads.append(t)

    def _pump(self, src, dst, name):
        while True:
            try:
                b = src.recv(1 << 16)
            except OSError:
                b = b""
            if not b:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            self.data[name] += b
            self.chunks[name].append(len(b))
            dst.sendall(b)

    def join(self):
        self.accepted.join(5)
        for t in self.threads:
            t.join(5)


def truth_of(spec: MessageSpec, frames: list[bytes]) -> dict:
    kind = "control" if spec.control_cmd is not None else "data"
    if kind == "control":
        op = "none"
    elif spec.pull is not None:
        op = "push" if spec.push else ("pull" if spec.pull else "unknown")
    else:  # what the parser must infer for older ps-lite
        op = "push" if spec.push else ("pull" if (spec.request or len(frames) > 1) else "unknown")
    wire = sum(len(f) + (9 if len(f) > 255 else 2) for f in frames)
    return {
        "kind": kind, "cmd": int(spec.control_cmd or 0), "request": spec.request, "op": op,
        "has_pull_field": spec.pull is not None, "app_id": spec.app_id,
        "customer_id": spec.customer_id, "timestamp": spec.timestamp,
        "num_keys": len(spec.keys) if spec.keys is not None else 0,
        "keys": list(map(int, spec.keys)) if spec.keys is not None else [],
        "value_bytes": len(spec.vals) if spec.keys is not None else 0,
        "data_frames": len(frames) - 1, "total_bytes": wire,
    }


def requests(rng: random.Random, scenario: str, n_small: int, n_large: int):
    """The worker's messages: ADD_NODE, pushes and pulls of sizes ps-lite sees, BARRIER."""
    newer = scenario == "pslite"
    yield MessageSpec(request=True, push=False, pull=False if newer else None, timestamp=None,
                      control_cmd=Cmd.ADD_NODE,
                      control_nodes=[(Role.WORKER, WORKER, "127.0.0.1", 40000)])
    sizes = [rng.choice([1, 2, 3, 8, 16, 17, 40]) for _ in range(n_small)] + [2000] * n_large
    rng.shuffle(sizes)
    for ts, n_keys in enumerate(sizes, start=1):
        keys = sorted(rng.sample(range(1 << 40), n_keys))
        push = rng.random() < 0.5
        row = rng.choice([1, 4, 16])  # values per key (an embedding row)
        vals = np.float32(rng.random()) * np.ones(n_keys * row, "<f4") if push else np.zeros(0, "<f4")
        if newer:
            yield MessageSpec(push=push, pull=not push, timestamp=ts, keys=keys,
                              vals=vals.tobytes(), val_type=DataType.FLOAT)
        else:
            yield MessageSpec(push=push, pull=None, timestamp=ts, keys=keys, vals=vals.tobytes(),
                              val_type=DataType.CHAR, lens=[row * 4] * n_keys if push else None)
        if ts % 25 == 0:
            yield MessageSpec(request=True, push=False, pull=False if newer else None,
                              timestamp=None, control_cmd=Cmd.HEARTBEAT)
    yield MessageSpec(request=True, push=False, pull=False if newer else None, timestamp=None,
                      control_cmd=Cmd.BARRIER, extra={})


def response_to(req: MessageSpec, scenario: str) -> MessageSpec | None:
    """What ps-lite's KVServer answers: an empty ack to a push, keys+vals(+lens) to a pull."""
    if req.control_cmd is not None:
        return None
    newer = scenario == "pslite"
    if req.push:
        return MessageSpec(request=False, push=True, pull=False if newer else None,
                           timestamp=req.timestamp)
    row = 4
    vals = np.arange(len(req.keys) * row, dtype="<f4").tobytes()
    return MessageSpec(request=False, push=False, pull=True if newer else None,
                       timestamp=req.timestamp, keys=req.keys, vals=vals,
                       val_type=DataType.FLOAT if newer else DataType.CHAR,
                       lens=None if newer else [row * 4] * len(req.keys))


def record(scenario: str, seed: int, n_small: int = 200, n_large: int = 2, burst: int = 40) -> dict:
    rng = random.Random(seed)
    ctx = zmq.Context()
    srv_router, wrk_router = ctx.socket(zmq.ROUTER), ctx.socket(zmq.ROUTER)
    srv_router.bind("tcp://127.0.0.1:*")
    wrk_router.bind("tcp://127.0.0.1:*")
    port_of = lambda s: int(s.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])  # noqa: E731
    p_req, p_resp = RecordingProxy(port_of(srv_router)), RecordingProxy(port_of(wrk_router))
    wrk_dealer, srv_dealer = ctx.socket(zmq.DEALER), ctx.socket(zmq.DEALER)
    wrk_dealer.setsockopt(zmq.IDENTITY, identity_of(WORKER))
    srv_dealer.setsockopt(zmq.IDENTITY, identity_of(SERVER))
    wrk_dealer.connect(f"tcp://127.0.0.1:{p_req.port}")
    srv_dealer.connect(f"tcp://127.0.0.1:{p_resp.port}")

    sent_req, sent_resp = [], []
    reqs = list(requests(rng, scenario, n_small, n_large))
    for start in range(0, len(reqs), burst):
        batch = reqs[start:start + burst]
        for spec in batch:  # a burst without waiting: libzmq batches them into few writes
            frames = spec.frames()
            wrk_dealer.send_multipart(frames)
            sent_req.append(truth_of(spec, frames))
        for spec in batch:
            got = srv_router.recv_multipart()
            assert got[0] == identity_of(WORKER) and got[1:] == spec.frames(), "server got other bytes"
            resp = response_to(spec, scenario)
            if resp is not None:
                frames = resp.frames()
                srv_dealer.send_multipart(frames)
                sent_resp.append(truth_of(resp, frames))
        for _ in range(sum(1 for s in batch if s.control_cmd is None)):
            got = wrk_router.recv_multipart()
            assert got[0] == identity_of(SERVER)
    for s in (wrk_dealer, srv_dealer, srv_router, wrk_router):
        s.close(linger=1000)
    ctx.term()
    p_req.join()
    p_resp.join()

    files = {}
    for conn, proxy, truth in (("w2s", p_req, sent_req), ("s2w", p_resp, sent_resp)):
        for direction, role in (("down", "dealer"), ("up", "router")):
            name = f"{scenario}.{conn}.{role}.bin"
            (HERE / name).write_bytes(bytes(proxy.data[direction]))
            files[name] = {"recv_chunk_bytes": proxy.chunks[direction],
                           "sender_node_id": (WORKER if conn == "w2s" else SERVER) if role == "dealer" else None,
                           "socket_type": "DEALER" if role == "dealer" else "ROUTER",
                           "messages": truth if role == "dealer" else []}
    return files


def main():
    for scenario, seed in (("pslite", 1), ("mxnet", 2)):
        files = record(scenario, seed)
        truth = json.dumps({"scenario": scenario, "libzmq": zmq.zmq_version(),
                            "pyzmq": zmq.__version__, "streams": files}, separators=(",", ":"))
        (HERE / f"{scenario}.json.gz").write_bytes(gzip.compress(truth.encode(), mtime=0))
        for name, f in files.items():
            c = f["recv_chunk_bytes"]
            print(f"{name}: {sum(c)} bytes in {len(c)} recv()s, {len(f['messages'])} messages")


if __name__ == "__main__":
    main()
