"""The framework-boundary probe on MXNet's real ps-lite (libmxnet.so, mxnet==1.9.1):
ps::ZMQVan::SendMsg / RecvMsg read on a dist_async kvstore (scheduler, 1 server, 1 worker
on loopback), verifying the ps::Meta layout the decoder assumes (PS_META_FORMAT in
parsers/pslite/framework.py)."""
from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from agent.framework_records import FrameworkDecoder
from probes.framework import FrameworkProbe, Target

pytestmark = [pytest.mark.privileged, pytest.mark.mxnet]

ROOT = Path(__file__).resolve().parents[2]
MXNET_VENV = Path(os.environ.get("PSLAT_MXNET_VENV", ROOT / ".venv-mxnet"))
RUN_TIMEOUT_S = 60.0
PUSHES = 5
SCHEDULER, SERVER, WORKER = 1, 8, 9      # ps-lite node ids with 1 server and 1 worker

WORKER_SCRIPT = f"""
import mxnet as mx
kv = mx.kv.create("dist_async")
kv.set_optimizer(mx.optimizer.SGD(learning_rate=0.1))  # dist_async servers need one
kv.init(3, mx.nd.ones((4, 4)))
out = mx.nd.zeros((4, 4))
for i in range({PUSHES}):
    kv.push(3, mx.nd.ones((4, 4)) * i)
    kv.pull(3, out=out)
    out.wait_to_read()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def mxnet_python() -> Path:
    py = MXNET_VENV / "bin" / "python"
    libs = sorted(MXNET_VENV.glob("lib/python3*/site-packages/mxnet/libmxnet.so"))
    if not py.exists() or not libs:
        pytest.skip(f"needs the MXNet venv at {MXNET_VENV} (scripts/setup.sh makes it)")
    return py


def test_ps_lite_van_calls_carry_sane_ids(mxnet_python, tmp_path):
    lib = next(MXNET_VENV.glob("lib/python3*/site-packages/mxnet/libmxnet.so"))
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(_free_port()),
               DMLC_NODE_HOST="127.0.0.1", DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="1",
               OMP_NUM_THREADS="1")
    # Attached to the library itself (every process that maps it), before the
    # processes start: the registration messages are the first ones they send.
    with FrameworkProbe([Target(lib, "ps")], decoder=FrameworkDecoder()) as probe:
        procs = {}
        for role in ("scheduler", "server", "worker"):
            cmd = [str(mxnet_python), "-c", WORKER_SCRIPT if role == "worker" else "import mxnet"]
            out = open(tmp_path / f"{role}.log", "w")
            procs[role] = subprocess.Popen(cmd, env=dict(env, DMLC_ROLE=role), stdout=out,
                                           stderr=subprocess.STDOUT)
        records = []
        deadline = time.monotonic() + RUN_TIMEOUT_S
        try:
            while any(p.poll() is None for p in procs.values()) and time.monotonic() < deadline:
                records += probe.poll(100)
        finally:
            for p in procs.values():
                if p.poll() is None:
                    p.kill()
        records += probe.drain()
        counters = probe.counters()
    logs = {r: (tmp_path / f"{r}.log").read_text()[-2000:] for r in procs}
    assert all(p.wait() == 0 for p in procs.values()), logs

    role_of = {p.pid: role for role, p in procs.items()}
    node_id = {"scheduler": SCHEDULER, "server": SERVER, "worker": WORKER}
    ours = [r for r in records if r.tgid in role_of]
    assert {role_of[r.tgid] for r in ours} == set(procs)
    assert counters["lost"] == 0 and counters["orphan"] == 0
    for r in ours:
        assert r.layer == "ps" and r.total_bytes > 0 and r.meta is not None
        # the three bools of ps::Meta are real bools: the layout lines up
        assert set(r.frame_heads[0][24:27]) <= {0, 1}, r
        m, me = r.meta, node_id[role_of[r.tgid]]
        if r.direction == "send":
            assert m.recver in node_id.values(), r
            assert m.sender in (None, me), r          # a van leaves sender unset on send
        else:
            assert m.sender in (None, *node_id.values()), r   # None: before ids are assigned
            assert m.recver in (None, me), r

    def data(role, direction, **want):
        return [r for r in ours if role_of[r.tgid] == role and r.direction == direction
                and all(getattr(r.meta, k) == v for k, v in want.items())]

    requests = data("worker", "send", recver=SERVER, request=True)
    stamps = [r.meta.timestamp for r in requests]
    assert len(stamps) >= 1 + 2 * PUSHES          # init, then a push and a pull per round
    assert stamps == sorted(set(stamps)), "the worker's timestamps must increase"
    assert sum(r.meta.push for r in requests) >= PUSHES

    # Exact matching by ids across processes: each request the worker sent is
    # received once by the server, and answered once, later.
    for req in requests:
        ts = req.meta.timestamp
        (got,) = data("server", "recv", sender=WORKER, request=True, timestamp=ts)
        (resp,) = data("server", "send", recver=WORKER, request=False, timestamp=ts)
        (back,) = data("worker", "recv", sender=SERVER, request=False, timestamp=ts)
        assert req.ts_ns < got.ts_ns < resp.ts_ns < back.ts_ns
        assert got.meta.push == req.meta.push == resp.meta.push
        # RecvMsg also counts the routing-id frame ("ps9" / "ps8") that SendMsg never sees
        assert got.total_bytes == req.total_bytes + len(b"ps9")
        assert back.total_bytes == resp.total_bytes + len(b"ps8")
