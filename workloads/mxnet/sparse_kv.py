"""A row_sparse push/pull job on MXNet's real ps-lite kvstore, with ground truth.

Run by the MXNet venv's python (mxnet==1.9.1, numpy<1.24, no pandas), one
process per role; the role comes from DMLC_ROLE as MXNet's own launcher does
it. For a server or the scheduler, `import mxnet` never returns: MXNet runs the
server loop inside the import and exits. A worker:

  1. creates the kvstore (dist_async or dist_sync),
  2. kv.init of one row_sparse key with EVERY row present and non-zero: the
     server sizes its stored table from the rows of this first push, so an
     empty or partial init breaks it,
  3. sets an SGD optimizer (dist_async servers refuse pushes without one),
  4. loops: row_sparse_pull(rows drawn Zipf-like) -> push a row_sparse
     gradient on the same rows, --iters times,

and logs every operation it issued as one JSON line in
OUT_DIR/worker-<rank>.jsonl: op, key, rows, t_before_ns/t_after_ns on
time.monotonic_ns() (CLOCK_MONOTONIC, the clock the agent's probes use), rank,
and the per-server slices MXNet sends on the wire. A final
OUT_DIR/worker-<rank>.json says the worker finished and what it issued.

Standalone on purpose: it imports nothing from pslat, because the MXNet venv
does not have pslat installed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

OUT_DIR_ENV = "PSLAT_MXNET_OUT"
# MXNet's default for MXNET_KVSTORE_BIGARRAY_BOUND (elements): a key at least
# this big is split over all servers by row range, a smaller one lives on one.
DEFAULT_BIGARRAY_BOUND_ELEMS = 1000 * 1000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["dist_async", "dist_sync"], default="dist_async",
                   help="kvstore type (dist_sync: a push is answered once every worker pushed)")
    p.add_argument("--iters", type=int, default=20, help="pull+push iterations per worker")
    p.add_argument("--num-rows", type=int, default=65536,
                   help="rows of the embedding table (the row_sparse key)")
    p.add_argument("--dim", type=int, default=16, help="embedding dimension (floats per row)")
    p.add_argument("--rows-per-pull", type=int, default=256,
                   help="row ids drawn per pull before de-duplication")
    p.add_argument("--zipf-exponent", type=float, default=1.2,
                   help="exponent of the Zipf law row ids are drawn from (> 1)")
    p.add_argument("--key", type=int, default=3, help="the kvstore key (an int, so the wire key is known)")
    p.add_argument("--seed", type=int, default=1, help="random seed (each worker adds its rank)")
    p.add_argument("--no-log-row-ids", dest="log_row_ids", action="store_false",
                   help="leave the row ids out of the pull/push records (smaller logs)")
    p.add_argument("--gate-file", default=None,
                   help="before connecting, write OUT_DIR/ready-<pid> and wait until this "
                        "file exists (lets a tracer attach to the pids before any traffic)")
    p.add_argument("--gate-timeout-s", type=float, default=300.0,
                   help="give up waiting for --gate-file after this long")
    p.add_argument("--out-dir", default=os.environ.get(OUT_DIR_ENV),
                   help=f"where worker logs go (default: ${OUT_DIR_ENV})")
    args = p.parse_args(argv)
    if args.iters < 0 or args.num_rows < 1 or args.dim < 1 or args.rows_per_pull < 1:
        p.error("--iters must be >= 0; --num-rows, --dim and --rows-per-pull >= 1")
    if args.zipf_exponent <= 1.0:
        p.error("--zipf-exponent must be > 1 (numpy's Zipf sampler needs it)")
    if args.key < 0:
        p.error("--key must be >= 0")
    return args


def _llround(x: float) -> int:
    """C's llround for x >= 0 (half away from zero), unlike Python's round()."""
    return int(x + 0.5)


def wire_slices(key: int, row_ids: list[int], num_rows: int, dim: int,
                num_servers: int, bigarray_bound_elems: int) -> list[dict]:
    """The messages MXNet 1.9 sends for one row_sparse push or pull.

    Mirrors KVStoreDist::EncodeRowSparseKey: a table of at least
    bigarray_bound elements is split over all servers by contiguous row
    ranges, and EVERY server gets a message (a zero-length "master key" first,
    then one key per row in its range, so possibly zero rows); a smaller table
    goes whole to server (key * 9973) % num_servers. The ps-lite message thus
    carries rows + 1 keys: the master key range_begin(server) + key, then
    range_begin(server) + key + (row - row_base) per row, with ps-lite's
    range_begin(s) = (2**64 - 1) // num_servers * s. row_ids must be sorted
    and unique.
    """
    if num_rows * dim >= bigarray_bound_elems:
        slices = []
        start = 0
        for server in range(num_servers):
            end = start + (_llround(num_rows / num_servers * (server + 1))
                           - _llround(num_rows / num_servers * server))
            n = sum(1 for r in row_ids if start <= r < end)
            slices.append({"server": server, "rows": n, "wire_keys": n + 1, "row_base": start})
            start = end
        return slices
    server = (key * 9973) % num_servers
    return [{"server": server, "rows": len(row_ids), "wire_keys": len(row_ids) + 1,
             "row_base": 0}]


class OpLog:
    """One JSON line per operation, flushed at once so a crash keeps what ran."""

    def __init__(self, path: str, base: dict):
        self._f = open(path, "w", buffering=1)
        self._base = base
        self.counts: dict[str, int] = {}

    def write(self, op: str, t_before_ns: int, t_after_ns: int, **fields) -> None:
        rec = {"op": op, **self._base, "t_before_ns": t_before_ns,
               "t_after_ns": t_after_ns, **fields}
        self._f.write(json.dumps(rec, separators=(",", ":")) + "\n")
        self.counts[op] = self.counts.get(op, 0) + 1

    def close(self) -> None:
        self._f.close()


GATE_POLL_S = 0.005


def wait_at_gate(out_dir: str, gate_file: str, timeout_s: float) -> None:
    """Say we are ready (OUT_DIR/ready-<pid>), then wait for the gate file to appear."""
    ready = os.path.join(out_dir, f"ready-{os.getpid()}")
    with open(ready + ".tmp", "w") as f:
        f.write(f"{time.monotonic_ns()}\n")
    os.replace(ready + ".tmp", ready)
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(gate_file):
        if time.monotonic() > deadline:
            sys.exit(f"sparse_kv: {gate_file} did not appear within {timeout_s:.0f} s")
        time.sleep(GATE_POLL_S)


def run_worker(args: argparse.Namespace) -> None:
    import mxnet as mx  # only here: for a server or scheduler this import runs the role
    import numpy as np

    if not args.out_dir:
        sys.exit(f"sparse_kv: no output dir; pass --out-dir or set ${OUT_DIR_ENV}")
    os.makedirs(args.out_dir, exist_ok=True)
    if args.gate_file:
        # After the import (libmxnet.so mapped, no socket yet): a worker opens
        # its connections in mx.kv.create, so nothing it sends is missed.
        wait_at_gate(args.out_dir, args.gate_file, args.gate_timeout_s)

    t0 = time.monotonic_ns()
    kv = mx.kv.create(args.mode)
    t1 = time.monotonic_ns()
    rank, num_workers = kv.rank, kv.num_workers
    num_servers = int(os.environ["DMLC_NUM_SERVER"])
    bound = int(os.environ.get("MXNET_KVSTORE_BIGARRAY_BOUND", DEFAULT_BIGARRAY_BOUND_ELEMS))
    base = {"rank": rank, "key": args.key}
    log = OpLog(os.path.join(args.out_dir, f"worker-{rank}.jsonl"), base)
    # create: in dist_sync, rank 0 sends the servers a sync-mode command here.
    log.write("create", t0, t1, rows=0, iter=-1)

    shape = (args.num_rows, args.dim)
    all_rows = list(range(args.num_rows))
    # Every row present and non-zero: tostype drops all-zero rows, and the
    # server sizes its table from the rows it receives in this push.
    init = (mx.nd.ones(shape) * 0.01).tostype("row_sparse")
    t0 = time.monotonic_ns()
    kv.init(args.key, init)
    t1 = time.monotonic_ns()
    # Only rank 0 pushes the initial value; the others wait in a barrier.
    init_slices = (wire_slices(args.key, all_rows, *shape, num_servers, bound)
                   if rank == 0 else [])
    log.write("init", t0, t1, rows=args.num_rows if rank == 0 else 0,
              slices=init_slices, iter=-1)

    t0 = time.monotonic_ns()
    # lazy_update: touch only the rows of each row_sparse gradient.
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.01, lazy_update=True))
    t1 = time.monotonic_ns()
    log.write("set_optimizer", t0, t1, rows=0, iter=-1)

    rng = np.random.default_rng(args.seed + rank)
    # A fixed permutation (same on every worker) spreads the hot rows over the
    # servers' row ranges instead of piling them on server 0.
    perm = np.random.default_rng(args.seed).permutation(args.num_rows)
    out = mx.nd.sparse.zeros("row_sparse", shape)
    for it in range(args.iters):
        draws = (rng.zipf(args.zipf_exponent, args.rows_per_pull) - 1) % args.num_rows
        # Sorted and unique, as a row_sparse array's indices must be; MXNet
        # would de-duplicate pull row ids itself, this keeps "rows" exact.
        row_ids = np.unique(perm[draws]).astype("int64")
        rows = [int(r) for r in row_ids]
        slices = wire_slices(args.key, rows, *shape, num_servers, bound)

        ids_nd = mx.nd.array(row_ids, dtype="int64")
        t0 = time.monotonic_ns()
        kv.row_sparse_pull(args.key, out=out, row_ids=ids_nd)
        out.wait_to_read()  # the pull is asynchronous in MXNet's engine
        t1 = time.monotonic_ns()
        ids_field = {"row_ids": rows} if args.log_row_ids else {}
        log.write("pull", t0, t1, rows=len(rows), slices=slices, iter=it, **ids_field)

        grad_vals = mx.nd.array(rng.standard_normal((len(rows), args.dim)) * 1e-3)
        grad = mx.nd.sparse.row_sparse_array((grad_vals, ids_nd), shape=shape)
        grad.wait_to_read()  # build the gradient before the clock starts
        t0 = time.monotonic_ns()
        kv.push(args.key, grad)
        # The push completes in the engine when every server acknowledged it.
        mx.nd.waitall()
        t1 = time.monotonic_ns()
        log.write("push", t0, t1, rows=len(rows), slices=slices, iter=it, **ids_field)

    log.close()
    summary = {"rank": rank, "num_workers": num_workers, "num_servers": num_servers,
               "mode": args.mode, "key": args.key, "num_rows": args.num_rows,
               "dim": args.dim, "iters": args.iters, "bigarray_bound_elems": bound,
               "ps_node_id": 9 + 2 * rank,  # ps-lite's WorkerRankToID
               "pid": os.getpid(), "node_host": os.environ.get("DMLC_NODE_HOST"),
               "ops": log.counts, "finished": True}
    tmp = os.path.join(args.out_dir, f".worker-{rank}.json.tmp")
    with open(tmp, "w") as f:
        json.dump(summary, f)
    os.replace(tmp, os.path.join(args.out_dir, f"worker-{rank}.json"))
    # Destroy the kvstore now, not at interpreter teardown: its destructor
    # holds a barrier of all workers, then rank 0 stops the servers.
    del kv
    import gc
    gc.collect()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    role = os.environ.get("DMLC_ROLE", "worker")
    if role in ("server", "scheduler"):
        import mxnet  # noqa: F401  # runs this role's loop and exits inside the import
        sys.exit(f"sparse_kv: mxnet returned from its {role} loop unexpectedly")
    run_worker(args)


if __name__ == "__main__":
    main()
