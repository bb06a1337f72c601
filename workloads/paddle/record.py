"""A compact recording of a Paddle job's real brpc bytes, for parsers/brpc's unit tests
(tests/data/brpc/): every trainer-to-server connection's two directions as gzip'd
bytes, and what the job itself counted.

    recording.json  {"paddle": version, "servers", "trainers", "steps",
                     "counts": PaddleResult.counts(),
                     "connections": [{"trainer", "server", "sport", "dport",
                                      "request": {"file", "bytes", "sha256"},
                                      "response": {...}}]}
    c<k>.req.gz / c<k>.resp.gz   trainer -> server / server -> trainer, from the first byte

Made by `python -m workloads.paddle --record DIR` (root, a fresh cluster).
"""
from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

from core.errors import UserError

from workloads.capture import Direction
from .runner import PaddleResult
from .venv import PACKAGES

INDEX = "recording.json"
BUDGET_BYTES = 300_000


def _write(path: Path, data: bytes) -> dict:
    # mtime=0: the same bytes give the same file
    path.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    return {"file": path.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_recording(directions: list[Direction], res: PaddleResult, out_dir: Path,
                    budget_bytes: int = BUDGET_BYTES) -> dict:
    """Write every trainer<->server connection of the capture; UserError over budget."""
    procs = {(p.addr, p.port): p for p in res.processes if p.role == "PSERVER"}
    trainers = {p.addr: p.index for p in res.processes if p.role == "TRAINER"}
    by_flow = {(d.src, d.sport, d.dst, d.dport): d for d in directions}
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("c*.gz"):
        old.unlink()
    conns = []
    requests = sorted((d for d in directions
                       if (d.dst, d.dport) in procs and d.src in trainers),
                      key=lambda d: (trainers[d.src], procs[(d.dst, d.dport)].index, d.sport))
    for k, req in enumerate(requests):
        resp = by_flow.get((req.dst, req.dport, req.src, req.sport))
        conns.append({"trainer": trainers[req.src], "server": procs[(req.dst, req.dport)].index,
                      "sport": req.sport, "dport": req.dport,
                      "request": _write(out_dir / f"c{k}.req.gz", req.data),
                      "response": _write(out_dir / f"c{k}.resp.gz",
                                         resp.data if resp else b"")})
    index = {"paddle": PACKAGES[0], "servers": res.servers, "trainers": res.trainers,
             "steps": res.steps, "counts": res.counts(), "connections": conns}
    (out_dir / INDEX).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    if size > budget_bytes:
        raise UserError(f"the recording in {out_dir} is {size} bytes, over {budget_bytes}; "
                        "record fewer steps (--steps)")
    return index
