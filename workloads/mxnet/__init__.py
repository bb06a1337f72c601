"""MXNet's real ps-lite as a workload: a row_sparse push/pull script and its runner.

- sparse_kv.py: the job (run by the MXNet venv's python, one process per role).
- runner: run_in_cluster / run_local / MxnetJob start it over a cluster's hosts.
- oplog: reads what every worker issued (the ground truth).
- venv: the MXNet venv, libmxnet.so, and the ps::ZMQVan uprobe symbols.
"""
from .oplog import OpRecord, Slice, read_op_logs, read_summaries, wire_key_ids
from .runner import LoopbackCluster, MxnetJob, MxnetResult, run_in_cluster, run_local
from .venv import ensure_venv, libmxnet_path, van_symbols, van_uprobe_points

__all__ = ["OpRecord", "Slice", "read_op_logs", "read_summaries", "wire_key_ids", "LoopbackCluster",
           "MxnetJob", "MxnetResult", "run_in_cluster", "run_local", "ensure_venv",
           "libmxnet_path", "van_symbols", "van_uprobe_points"]
