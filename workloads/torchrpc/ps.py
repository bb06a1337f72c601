"""A parameter server on PyTorch RPC over TensorPipe's TCP (uv) transport, in the shape
of PyTorch's RPC parameter-server tutorial: rank 0 ("ps") holds an embedding table;
ranks 1.. (trainers) each get a reference to it with `rpc.remote`, then for a fixed
number of steps look a batch of rows up (`rpc.rpc_sync` of a function on the server)
and send their gradients back (`rpc_sync` through the reference). Every process writes
OUT/rank-N.json: the RPCs it made (trainers) or served (the server).

Run in .venv-torch, one process per host, by workloads/torchrpc/runner.py (which sets
RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and TP_SOCKET_IFNAME).
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import torch
import torch.distributed.rpc as rpc

SERVER = "ps"
RPC_TIMEOUT_S = 60.0


class EmbeddingTable:
    """The server's table; RPC calls reach it from several server threads at once."""

    def __init__(self, rows: int, dim: int, seed: int):
        self.weight = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed))
        self.lock = threading.Lock()
        self.lookups = self.updates = self.rows_served = self.rows_updated = 0

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        with self.lock:
            self.lookups += 1
            self.rows_served += ids.numel()
            return self.weight.index_select(0, ids)

    def update(self, ids: torch.Tensor, grads: torch.Tensor, lr: float) -> int:
        with self.lock:
            self.updates += 1
            self.rows_updated += ids.numel()
            self.weight.index_add_(0, ids, grads, alpha=-lr)
            return ids.numel()


_table: EmbeddingTable | None = None
_table_lock = threading.Lock()


def table(rows: int = 0, dim: int = 0, seed: int = 0) -> EmbeddingTable:
    """The server's one table, made by the first call (the trainers' `remote`)."""
    global _table
    with _table_lock:
        if _table is None:
            _table = EmbeddingTable(rows, dim, seed)
        return _table


def lookup(ids: torch.Tensor) -> torch.Tensor:
    return table().lookup(ids)


def _options(args) -> rpc.TensorPipeRpcBackendOptions:
    # TCP only: TensorPipe would take shared memory or cross-memory attach between
    # processes of one kernel, and the cluster's hosts share one
    return rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        num_worker_threads=4, rpc_timeout=RPC_TIMEOUT_S, _transports=["uv"], _channels=["basic"])


def train(args, rank: int) -> dict:
    gen = torch.Generator().manual_seed(args.seed + rank)
    made = {"remote": 0, "rpc_sync_lookup": 0, "rpc_sync_update": 0}
    ref = rpc.remote(SERVER, table, args=(args.rows, args.dim, args.seed))
    made["remote"] += 1
    rows = 0
    for _ in range(args.steps):
        # skewed ids, as an embedding's hot rows are
        ids = (torch.rand(args.batch, generator=gen) ** 3 * args.rows).long()
        emb = rpc.rpc_sync(SERVER, lookup, args=(ids,))
        made["rpc_sync_lookup"] += 1
        grads = 2 * emb   # d/demb of sum(emb ** 2)
        rows += ref.rpc_sync().update(ids, grads, args.lr)
        made["rpc_sync_update"] += 1
    return {"rpcs": made, "rows_updated": rows}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--rows", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(1)   # 2 shared cores for every process of the job and the tracer
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    name = SERVER if rank == 0 else f"trainer{rank}"
    t0 = time.monotonic()
    rpc.init_rpc(name, rank=rank, world_size=world, rpc_backend_options=_options(args))
    out = {"rank": rank, "name": name, "pid": os.getpid()}
    if rank > 0:
        out.update(train(args, rank))
    rpc.shutdown()   # graceful: returns once every process is done
    if rank == 0:
        t = table()
        out["served"] = {"lookups": t.lookups, "updates": t.updates, "rows_served": t.rows_served,
                         "rows_updated": t.rows_updated}
    out["wall_s"] = round(time.monotonic() - t0, 3)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank-{rank}.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
