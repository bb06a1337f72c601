"""A compact recording of a BytePS ps-lite job's real bytes, for parsers/pslite's unit
tests (tests/data/byteps/): every worker<->server connection's two directions as gzip'd
bytes from their first one, and what the job's own log says went over each.

    recording.json  {"byteps": version, "servers", "workers",
                     "benchmark": {"length", "repeat", "mode", "keys_per_server"},
                     "node_ids": {process name: ps-lite node id},
                     "counts": BytepsResult.counts(), "expected": expected_counts(),
                     "connections": [{"worker", "server", "worker_node_id", "server_node_id",
                                      "initiator": "worker" | "server",
                                      "worker_port", "server_port",   # the TCP ports
                                      "to_server": {"file", "bytes", "sha256", "oracle"},
                                      "to_worker": {...}}]}
    c<k>.to_server.gz / c<k>.to_worker.gz   each direction's bytes, from the first

A worker's DEALER connects to each server's ROUTER ("initiator": "worker"): its
requests go up, and the server's data answers come back on it (behind the sender-id
frame "ps<N>"). A server's DEALER connects to each worker's ROUTER ("initiator":
"server") for its control and SimpleApp messages (none in the benchmark: only ZMTP's
handshake). "oracle" is the direction's messages as the sender's van logged them, in
order (LoggedMessage.summary(): request, op, timestamp, app_id, customer_id, head,
data_sizes), with "key": the key test_benchmark.cc sends in that request (it is not
in the log; runner.expected_requests), on a pull's answer the key of its request.

Made by `python -m workloads.byteps --record DIR` (root, a fresh cluster).
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

from core.errors import UserError
from workloads.capture import Direction

from .build import VERSION
from .runner import BytepsResult, expected_requests

INDEX = "recording.json"
BUDGET_BYTES = 300_000


def _write(path: Path, data: bytes, oracle: list[dict]) -> dict:
    # mtime=0: the same bytes give the same file
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "oracle": oracle}


def _json(obj: dict) -> str:
    """Indented JSON with each list of scalars, then each object of no objects, on one
    line: an oracle message a line."""
    text = json.dumps(obj, indent=1, sort_keys=True)
    text = re.sub(r"\[\s*([^\[\]{}]*?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1).strip()) + "]", text)
    text = re.sub(r"\{\n([^{}]*?)\n\s*\}", lambda m: "{" + re.sub(r"\n\s*", " ", m.group(1).strip()) + "}", text)
    return text + "\n"


def _with_keys(res: BytepsResult, server_index: int, conn: dict) -> tuple[list, list]:
    """The oracle of a worker's connection, each request with the key the benchmark
    sent in it and each pull's answer with its request's."""
    keys = [key for _op, s, key in expected_requests(res.args, res.servers) if s == server_index]
    up, key_of = [], {}
    data_reqs = [m for m in conn["request"] if m.data]
    if len(data_reqs) != len(keys):
        raise UserError(f"the log has {len(data_reqs)} requests to server-{server_index}, the "
                        f"arguments imply {len(keys)}; see {res.out_dir / 'logs'}")
    it = iter(keys)
    for m in conn["request"]:
        d = m.summary()
        if m.data:
            d["key"] = key_of[m.timestamp] = next(it)
        up.append(d)
    down = []
    for m in conn["answer"]:
        d = m.summary()
        if m.op == "pull":
            d["key"] = key_of.get(m.timestamp)
        down.append(d)
    return up, down


def write_recording(directions: list[Direction], res: BytepsResult, out_dir: Path,
                    budget_bytes: int = BUDGET_BYTES) -> dict:
    """Write every worker<->server connection of the capture; UserError over budget or
    when the capture does not hold exactly one connection each way per pair."""
    procs = {p.name: p for p in res.processes}
    sched = procs["scheduler"]
    workers = [p for p in res.processes if p.role == "worker"]
    servers = [p for p in res.processes if p.role == "server"]
    if sched.addr in {p.addr for p in servers + workers}:
        raise UserError("the scheduler shares a host with a server or worker: its connections "
                        "would pass for theirs; record with a host of its own for it")
    ids = res.node_ids()
    by_flow = {(d.src, d.sport, d.dst, d.dport): d for d in directions}
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("c*.gz"):
        old.unlink()
    conns = []
    for w in workers:
        for s in servers:
            logged = res.connection_messages(w.name, s.name)
            up, down = _with_keys(res, s.index, logged)
            for initiator, (src, dst) in (("worker", (w, s)), ("server", (s, w))):
                found = [d for d in directions if d.src == src.addr and d.dst == dst.addr
                         and d.dport == dst.port and d.data]
                if len(found) != 1:
                    raise UserError(f"{len(found)} connections from {src.name} into {dst.name}'s "
                                    f"port {dst.port} carried bytes, not 1; record again")
                fwd = found[0]
                back = by_flow.get((fwd.dst, fwd.dport, fwd.src, fwd.sport))
                back_data = back.data if back else b""
                k = len(conns)
                if initiator == "worker":
                    to_server = _write(out_dir / f"c{k}.to_server.gz", fwd.data, up)
                    to_worker = _write(out_dir / f"c{k}.to_worker.gz", back_data, down)
                    ports = {"worker_port": fwd.sport, "server_port": fwd.dport}
                else:
                    oracle = [m.summary() for m in logged["server_dealer"]]
                    to_worker = _write(out_dir / f"c{k}.to_worker.gz", fwd.data, oracle)
                    to_server = _write(out_dir / f"c{k}.to_server.gz", back_data, [])
                    ports = {"worker_port": fwd.dport, "server_port": fwd.sport}
                conns.append({"worker": w.name, "server": s.name, "worker_node_id": ids[w.name],
                              "server_node_id": ids[s.name], "initiator": initiator, **ports,
                              "to_server": to_server, "to_worker": to_worker})
    a = res.args
    index = {"byteps": VERSION, "servers": res.servers, "workers": res.workers,
             "benchmark": {"length": a.length, "repeat": a.repeat, "mode": a.mode,
                           "keys_per_server": a.keys_per_server},
             "node_ids": ids, "counts": res.counts(), "expected": res.expected_counts(),
             "connections": conns}
    (out_dir / INDEX).write_text(_json(index))
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    if size > budget_bytes:
        raise UserError(f"the recording in {out_dir} is {size} bytes, over {budget_bytes}; "
                        "record fewer rounds (--repeat) or smaller values (--len)")
    return index
