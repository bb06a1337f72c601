"""One process of a PaddlePaddle parameter-server job ("the_one_ps", fleet, CPU, async):
a pserver or a trainer, as the role maker's environment says (TRAINING_ROLE etc., set by
workloads/paddle/runner.py).

Run with the Paddle venv's python (workloads/paddle/venv.py), never imported by pslat.

The model: ids [batch x slots, 1] -> a distributed sparse embedding (a MemorySparseTable on
the servers: PS_PULL_SPARSE_TABLE / PS_PUSH_SPARSE_TABLE) -> fc(hidden, relu) -> fc(1),
the fc parameters in a dense table (PS_PULL_DENSE_TABLE / PS_PUSH_DENSE_TABLE), square
error against a label made from the ids. SGD.

A pserver serves until it is killed (Paddle's run_server never returns by itself). A
trainer builds the program, says it is ready (ready-<pid> in --out), waits for the gate
file (the runner opens it once every server listens), runs --steps steps of exe.run,
stops its client (fleet.stop_worker flushes the asynchronous pushes first) and writes
trainer-<id>.json: its own count of its steps and what each step fed (see STEP_FIELDS).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

GATE_POLL_S = 0.02
GATE_TIMEOUT_S = 300.0
# what trainer-<id>.json records per step (the oracle beside the servers' counters)
STEP_FIELDS = ("step", "ids", "distinct_ids", "t_before_ns", "t_after_ns", "loss")


def _args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--vocab", type=int, default=100000, help="ids are drawn from 1..vocab")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--gate-file", type=Path, required=True)
    return p.parse_args(argv)


def _build(args):
    import paddle
    import paddle.distributed.fleet as fleet

    # lookup_table wants one id per row: a sample's slots are consecutive rows
    ids = paddle.static.data(name="ids", shape=[-1, 1], dtype="int64")
    label = paddle.static.data(name="label", shape=[-1, 1], dtype="float32")
    emb = paddle.static.nn.sparse_embedding(
        input=ids, size=[args.vocab + 1, args.dim],
        param_attr=paddle.ParamAttr(name="emb",
                                    initializer=paddle.nn.initializer.Uniform(-0.1, 0.1)))
    x = paddle.reshape(emb, [-1, args.slots * args.dim])
    h = paddle.static.nn.fc(x, args.hidden, activation="relu")
    pred = paddle.static.nn.fc(h, 1)
    loss = paddle.mean(paddle.nn.functional.square_error_cost(pred, label))
    strategy = fleet.DistributedStrategy()
    strategy.a_sync = True
    opt = fleet.distributed_optimizer(paddle.optimizer.SGD(learning_rate=0.01), strategy)
    opt.minimize(loss)
    return loss


def _wait_gate(gate: Path) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT_S
    while not gate.exists():
        if time.monotonic() > deadline:
            sys.exit(f"ps_job: the gate {gate} did not open within {GATE_TIMEOUT_S:.0f} s")
        time.sleep(GATE_POLL_S)


def _table_ids() -> dict:
    """Paddle's own table ids: sparse by parameter name, and the dense ones."""
    import paddle.distributed.fleet as fleet
    from paddle.distributed.fleet.proto import the_one_ps_pb2 as pb2

    # the worker's table descriptors, as init_worker built them (a table class set:
    # entries left empty by a table of another kind are skipped)
    builder = fleet.fleet._runtime_handle.ps_desc_builder
    tables = [t for t in builder.ps_desc.worker_param.downpour_worker_param.downpour_table_param
              if t.table_class]
    sparse = {t.common.table_name: int(t.table_id) for t in tables
              if t.type == pb2.PS_SPARSE_TABLE}
    dense = sorted({int(t.table_id) for t in tables if t.type == pb2.PS_DENSE_TABLE})
    return {"sparse": sparse, "dense": dense}


def _trainer(args, loss) -> None:
    import numpy as np
    import paddle
    import paddle.distributed.fleet as fleet

    tid = fleet.worker_index()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    (args.out / f"ready-{os.getpid()}").write_text("")
    _wait_gate(args.gate_file)
    t_start = time.monotonic_ns()
    fleet.init_worker()
    t_inited = time.monotonic_ns()
    rng = np.random.default_rng([args.seed, tid])
    main = paddle.static.default_main_program()
    steps = []
    fed = set()   # every id fed: each gets a gradient pushed (the pushes' lower bound)
    for step in range(args.steps):
        ids = rng.integers(1, args.vocab + 1, size=(args.batch, args.slots), dtype=np.int64)
        label = (ids.sum(axis=1, keepdims=True) % 7).astype(np.float32) / 7.0
        t0 = time.monotonic_ns()
        out, = exe.run(main, feed={"ids": ids.reshape(-1, 1), "label": label},
                       fetch_list=[loss])
        t1 = time.monotonic_ns()
        fed.update(ids.ravel().tolist())
        steps.append({"step": step, "ids": int(ids.size),
                      "distinct_ids": int(len(np.unique(ids))), "t_before_ns": t0,
                      "t_after_ns": t1, "loss": float(np.asarray(out).ravel()[0])})
    t_steps = time.monotonic_ns()
    fleet.stop_worker()
    t_stopped = time.monotonic_ns()
    summary = {"trainer_id": tid, "pid": os.getpid(), "pod_ip": os.environ.get("POD_IP"),
               "steps_done": len(steps), "steps_asked": args.steps, "batch": args.batch,
               "slots": args.slots, "tables": _table_ids(), "steps": steps,
               "distinct_ids_all": len(fed),
               "t_start_ns": t_start, "t_init_worker_done_ns": t_inited,
               "t_steps_done_ns": t_steps, "t_stop_worker_done_ns": t_stopped}
    tmp = args.out / f".trainer-{tid}.json"
    tmp.write_text(json.dumps(summary))
    tmp.rename(args.out / f"trainer-{tid}.json")


def main(argv=None) -> int:
    args = _args(argv)
    import paddle
    import paddle.distributed.fleet as fleet

    paddle.enable_static()
    fleet.init()   # PaddleCloudRoleMaker: the role from the environment
    loss = _build(args)
    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()   # returns only on PS_STOP_SERVER; the runner kills it instead
        return 0
    _trainer(args, loss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
