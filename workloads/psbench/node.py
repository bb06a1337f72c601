"""One psbench process (scheduler, server or worker) from start to exit.

Life, as a ps-lite program: Van start (join the job) -> BARRIER -> the role's
work (workers: the training loop for duration_s; servers and the scheduler:
nothing but answering) -> BARRIER (ps::Finalize) -> TERMINATE to itself.
Threads: main, "ps-van" (receive loop), "ps-customer" (servers and workers:
the request/response handler), "ps-heartbeat" (only with a heartbeat
interval), "ps-truth" (Parquet shards), plus libzmq's I/O and reaper threads.

SIGTERM/SIGINT: the ground truth is flushed, then the process exits at once.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import threading

from parsers.pslite.meta import SCHEDULER_ID
from workloads.psbench.customer import Fatal
from workloads.psbench.keys import KeySpace
from workloads.psbench.options import NodeConfig, Workload
from workloads.psbench.server import KVServer
from workloads.psbench.timing import die_with_parent, name_all_threads, set_fine_timer_slack, set_thread_name
from workloads.psbench.truth import TruthWriter
from workloads.psbench.van import Van
from workloads.psbench.worker import KVWorker

FINALIZE_MARGIN_S = 60.0  # how long past the workers' duration a node waits in the last barrier


class Terminated(Exception):
    def __init__(self, signum: int):
        super().__init__(f"terminated by signal {signum}")
        self.exit_code = 128 + signum


def _raise_terminated(signum, _frame):
    raise Terminated(signum)


def _heartbeats(van: Van, interval_s: float, stop: threading.Event, fatal: Fatal) -> None:
    set_thread_name("ps-heartbeat")
    try:
        while not stop.wait(interval_s):
            van.heartbeat()
    except BaseException as e:  # noqa: BLE001 - handed to the main thread
        fatal.fail(e)


def write_node_file(cfg: NodeConfig, van: Van) -> None:
    """<out>/nodes/<node id>.json: who is where, written once the job formed
    (a launcher's ready signal, and the map from ports to node ids)."""
    d = cfg.out_dir / "nodes"
    d.mkdir(parents=True, exist_ok=True)
    info = {"role": cfg.role, "node_id": van.my_id, "host": cfg.host_id, "addr": cfg.node_host,
            "port": van.port, "pid": os.getpid()}
    tmp = d / f".{van.my_id}.json.tmp"
    tmp.write_text(json.dumps(info))
    os.replace(tmp, d / f"{van.my_id}.json")


SWITCH_INTERVAL_S = 100e-6


def run_node(cfg: NodeConfig, wl: Workload) -> None:
    set_fine_timer_slack()  # before any thread starts: threads inherit it
    if wl.proc_name:
        name_all_threads(wl.proc_name)
    # The truth's stamps sit next to the zmq calls, but a thread that returns
    # from a call that dropped the GIL waits for it up to the switch interval
    # (5 ms by default) before it can stamp: 100 us keeps the stamps within
    # ~0.1 ms of the calls, as ps-lite's C++ threads would be.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    if cfg.die_with_parent:
        die_with_parent()
    signal.signal(signal.SIGTERM, _raise_terminated)
    signal.signal(signal.SIGINT, _raise_terminated)
    heartbeat_s = wl.heartbeat_interval_s or float(os.environ.get("PS_HEARTBEAT_INTERVAL", 0) or 0)

    fatal = Fatal()
    space = KeySpace(wl.key_space, cfg.num_servers)
    truth = None if cfg.role == "scheduler" else TruthWriter(cfg.out_dir, cfg.role, cfg.host_id)
    app = None
    van = Van(cfg, on_data=lambda m: app.customer.accept(m), fatal=fatal)
    stop_heartbeat = threading.Event()
    try:
        van.start(wl.start_timeout_s)
        ident = {"role": cfg.role, "host": cfg.host_id, "addr": cfg.node_host, "pid": os.getpid(),
                 "node_id": van.my_id}
        if cfg.role == "server":
            app = KVServer((van.my_id - 8) // 2, wl, space, truth, fatal, ident)
        elif cfg.role == "worker":
            app = KVWorker((van.my_id - 9) // 2, wl, space, truth, fatal, ident)
        if app is not None:
            app.van = van
        if heartbeat_s > 0 and van.my_id != SCHEDULER_ID:
            threading.Thread(target=_heartbeats, args=(van, heartbeat_s, stop_heartbeat, fatal),
                             name="ps-heartbeat", daemon=True).start()
        van.barrier(wl.start_timeout_s)
        if wl.proc_name:   # again: libzmq's threads named themselves since
            name_all_threads(wl.proc_name)
        write_node_file(cfg, van)
        if isinstance(app, KVWorker):
            app.run(wl.duration_s, wait_timeout_s=wl.start_timeout_s)
        van.barrier(wl.duration_s + wl.start_timeout_s + FINALIZE_MARGIN_S)
        stop_heartbeat.set()
        van.stop()
        if app is not None:
            app.customer.stop()
    finally:
        stop_heartbeat.set()
        if truth is not None:
            truth.close(app.pending_rows() if isinstance(app, KVWorker) else ())
