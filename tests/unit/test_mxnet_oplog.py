"""workloads/mxnet without running MXNet: the op-log reader, MXNet's slicing rule, placement, env."""
from __future__ import annotations

import importlib.util
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from core.errors import UserError
from workloads.mxnet import oplog, runner, venv

SPARSE_KV = Path(runner.__file__).with_name("sparse_kv.py")


def _load_sparse_kv():
    # The script is run by the MXNet venv's python; its module level needs only
    # the standard library, so pslat's python can import it to test its helpers.
    spec = importlib.util.spec_from_file_location("sparse_kv", SPARSE_KV)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rec(op="pull", rank=0, it=0, rows=3, t0=100, t1=250, slices=None):
    d = {"op": op, "rank": rank, "key": 3, "iter": it, "rows": rows,
         "t_before_ns": t0, "t_after_ns": t1}
    if slices is not None:
        d["slices"] = slices
    return json.dumps(d)


def test_reader_round_trip(tmp_path):
    sl = [{"server": 0, "rows": 1, "wire_keys": 2}, {"server": 1, "rows": 2, "wire_keys": 3}]
    (tmp_path / "worker-0.jsonl").write_text("\n".join([
        _rec("create", rows=0, it=-1), _rec("pull", slices=sl), _rec("push", t0=300, t1=900, slices=sl),
    ]) + "\n")
    (tmp_path / "worker-1.jsonl").write_text(_rec("pull", rank=1, slices=sl) + "\n")
    logs = oplog.read_op_logs(tmp_path)
    assert sorted(logs) == [0, 1]
    push = logs[0][2]
    assert (push.op, push.rows, push.latency_ns) == ("push", 3, 600)
    assert push.slices == (oplog.Slice(0, 1, 2), oplog.Slice(1, 2, 3))
    assert [r.op for r in logs[0]] == ["create", "pull", "push"]


def test_reader_names_the_bad_line(tmp_path):
    (tmp_path / "worker-0.jsonl").write_text(_rec() + "\n" + '{"op":"pull","rank":0,"ke')
    with pytest.raises(UserError, match=r"worker-0\.jsonl:2"):
        oplog.read_op_logs(tmp_path)


@pytest.mark.parametrize("line, msg", [
    (_rec(op="frobnicate"), "unknown op"),
    (_rec(t0=500, t1=400), "t_after_ns < t_before_ns"),
    (_rec(rows=5, slices=[{"server": 0, "rows": 1, "wire_keys": 2}]), "do not add up"),
])
def test_reader_rejects_inconsistent_records(tmp_path, line, msg):
    (tmp_path / "worker-0.jsonl").write_text(line + "\n")
    with pytest.raises(UserError, match=msg):
        oplog.read_op_logs(tmp_path)


def test_reader_on_empty_dir(tmp_path):
    with pytest.raises(UserError, match="no worker-\\*.jsonl"):
        oplog.read_op_logs(tmp_path)


def test_summaries(tmp_path):
    (tmp_path / "worker-1.json").write_text(json.dumps({"rank": 1, "finished": True}))
    assert oplog.read_summaries(tmp_path) == {1: {"rank": 1, "finished": True}}
    (tmp_path / "worker-2.json").write_text("{")
    with pytest.raises(UserError, match="worker-2.json"):
        oplog.read_summaries(tmp_path)


def test_wire_slices_follow_mxnet_partitioning():
    sk = _load_sparse_kv()
    # Big table: split by row ranges over all servers, every server gets a
    # message. 5 rows over 2 servers: llround(2.5) = 3 -> [0, 3) and [3, 5).
    s = sk.wire_slices(3, [0, 2, 3, 4], num_rows=5, dim=1, num_servers=2, bigarray_bound_elems=5)
    assert s == [{"server": 0, "rows": 2, "wire_keys": 3, "row_base": 0},
                 {"server": 1, "rows": 2, "wire_keys": 3, "row_base": 3}]
    s = sk.wire_slices(3, [4], num_rows=5, dim=1, num_servers=2, bigarray_bound_elems=5)
    assert [x["rows"] for x in s] == [0, 1]  # server 0 still gets the master key
    # Small table: all of it on server (key * 9973) % num_servers.
    s = sk.wire_slices(3, [0, 1], num_rows=5, dim=1, num_servers=2, bigarray_bound_elems=6)
    assert s == [{"server": (3 * 9973) % 2, "rows": 2, "wire_keys": 3, "row_base": 0}]


def test_wire_key_ids():
    # ps-lite's key ranges for 2 servers start at 0 and (2**64 - 1) // 2.
    half = (2**64 - 1) // 2
    rec = oplog.OpRecord("pull", 0, 3, 0, 3, 1, 2,
                         (oplog.Slice(0, 1, 2, 0), oplog.Slice(1, 2, 3, 500)), (7, 500, 612))
    assert oplog.wire_key_ids(rec, 2) == [(0, [3, 10]), (1, [half + 3, half + 3, half + 115])]
    with pytest.raises(UserError, match="no-log-row-ids"):
        oplog.wire_key_ids(oplog.OpRecord("pull", 0, 3, 0, 1, 1, 2), 2)


def test_reader_checks_row_ids_count(tmp_path):
    d = json.loads(_rec(rows=2))
    d["row_ids"] = [1]
    (tmp_path / "worker-0.jsonl").write_text(json.dumps(d) + "\n")
    with pytest.raises(UserError, match="1 row_ids for 2 rows"):
        oplog.read_op_logs(tmp_path)


def test_script_rejects_bad_options():
    sk = _load_sparse_kv()
    for argv in (["--zipf-exponent", "1.0"], ["--iters", "-1"], ["--num-rows", "0"]):
        with pytest.raises(SystemExit):
            sk.parse_args(argv)


def test_placement_like_psbench():
    hosts = ["h0", "h1", "h2", "h3"]
    specs = {s.name: s.host for s in runner.place(hosts, servers=2, workers=2)}
    assert specs == {"scheduler": "h0", "server-0": "h0", "server-1": "h1",
                     "worker-0": "h2", "worker-1": "h3"}
    wrapped = {s.name: s.host for s in runner.place(hosts[:2], servers=1, workers=2)}
    assert wrapped["worker-1"] == "h0"
    with pytest.raises(UserError):
        runner.place([], 1, 1)


@dataclass(frozen=True)
class _Host:
    name: str
    addr: str


class _FakeCluster:
    hosts = [_Host("ns0", "10.0.0.1"), _Host("ns1", "10.0.0.2"), _Host("ns2", "10.0.0.3")]


def test_env_per_role_and_host(monkeypatch, tmp_path):
    monkeypatch.setenv("DMLC_NUM_WORKER", "99")  # a caller's leftover must not leak in
    job = runner.MxnetJob(_FakeCluster(), ["--iters", "1"], tmp_path, servers=1, workers=2,
                          mode="dist_sync", python="/bin/true")
    envs = {s.name: job._env(s) for s in job.specs}
    assert envs["scheduler"]["DMLC_ROLE"] == "scheduler"
    for name, env in envs.items():
        assert env["DMLC_PS_ROOT_URI"] == "10.0.0.1"
        assert env["DMLC_PS_ROOT_PORT"] == str(runner.DEFAULT_ROOT_PORT)
        assert (env["DMLC_NUM_SERVER"], env["DMLC_NUM_WORKER"]) == ("1", "2")
        assert env["OMP_NUM_THREADS"] == "1" and env["MXNET_CPU_WORKER_NTHREADS"] == "1"
        assert env[oplog.OUT_DIR_ENV] == str(tmp_path)
    assert envs["server-0"]["DMLC_NODE_HOST"] == "10.0.0.1"
    assert envs["worker-0"]["DMLC_NODE_HOST"] == "10.0.0.2"
    assert envs["worker-1"]["DMLC_NODE_HOST"] == "10.0.0.3"


@pytest.mark.parametrize("kw, msg", [
    ({"mode": "local"}, "unknown kvstore mode"),
    ({"servers": 0}, "at least 1 server"),
    ({"script_args": ["--mode", "dist_sync"]}, "mode=..."),
    ({"script": "/nonexistent.py"}, "no MXNet script"),
])
def test_job_rejects_bad_input(tmp_path, kw, msg):
    args = {"cluster": _FakeCluster(), "script_args": [], "out_dir": tmp_path, "python": "/bin/true"}
    args.update(kw)
    with pytest.raises(UserError, match=msg):
        runner.MxnetJob(**args)


def test_missing_venv_without_create(tmp_path):
    with pytest.raises(UserError, match="make setup"):
        venv.ensure_venv(tmp_path / "nope", create=False)


def test_venv_creation_failure_says_make_setup(tmp_path, monkeypatch):
    monkeypatch.setattr(venv, "SYS_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(UserError, match="cannot create the MXNet venv.*make setup"):
        venv.ensure_venv(tmp_path / "venv", create=True)


def test_node_id_from_pslite_log(tmp_path):
    log = tmp_path / "w.log"
    log.write_bytes(b"[16:42:16] ../3rdparty/ps-lite/src/van.cc:257: W[11] is connected to others\n")
    info = runner.ProcInfo("worker-0", "worker", "h", "1.2.3.4", 1, log, 0, runner._node_id(log))
    assert (info.node_id, info.rank) == (11, 1)


@pytest.mark.skipif(not venv.venv_ready(), reason="no MXNet venv; run `make setup`")
def test_libmxnet_exports_the_van_functions():
    points = venv.van_uprobe_points()
    assert venv.van_symbols() == {
        "ps::ZMQVan::SendMsg": "_ZN2ps6ZMQVan7SendMsgERKNS_7MessageE",
        "ps::ZMQVan::RecvMsg": "_ZN2ps6ZMQVan7RecvMsgEPNS_7MessageE",
    }
    assert all(p.offset > 0 for p in points.values())
    # Cross-check with readelf, an independent reader of .dynsym.
    out = subprocess.run(["readelf", "-W", "--dyn-syms", str(venv.libmxnet_path())],
                         capture_output=True, text=True, check=True).stdout
    for p in points.values():
        assert any(p.symbol in line and "FUNC" in line for line in out.splitlines())
