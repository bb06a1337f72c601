"""Reads the ground truth sparse_kv.py writes: what each MXNet worker issued, and when.

Layout of an output dir (written by workloads/mxnet/sparse_kv.py):
  worker-<rank>.jsonl  one JSON object per operation, in issue order:
      op            "create" | "init" | "set_optimizer" | "pull" | "push"
      rank, key     worker rank; the kvstore key (int)
      iter          loop iteration, -1 for the set-up ops
      rows          rows the op carried (pull: unique row ids asked for;
                    push: rows of the row_sparse gradient; init: all rows on
                    rank 0, 0 elsewhere, since only rank 0 sends the value)
      slices        pull/push/init: the ps-lite messages MXNet sends for it,
                    [{"server": server rank, "rows": n, "wire_keys": n + 1,
                      "row_base": first row of the server's range}]
                    (wire_keys: keys in the message, a zero-length master key
                    plus one per row; see wire_key_ids for their values)
      row_ids       pull/push: the sorted row ids (unless --no-log-row-ids)
      t_before_ns, t_after_ns  time.monotonic_ns() (CLOCK_MONOTONIC) right
                    before the call and once it completed (pull: data
                    readable; push: acknowledged by every server)
  worker-<rank>.json   written at the end: config, counts per op, ps_node_id,
                       pid, node_host, "finished": true

On the wire (ps-lite ids: worker rank r is node 9 + 2r, server rank s is
node 8 + 2s), as PS_VERBOSE=2 shows it for MXNet 1.9.1:
  pull: one request per slice, frames keys (wire_keys uint64) + empty vals;
        the response carries keys, vals (rows * dim floats) and lens.
  push: one request per slice with keys, vals and lens; an empty response
        (in dist_sync only once every worker pushed).
  init: a push from rank 0 only, every row.
  set_optimizer: a simple_app command (the pickled optimizer) from every
        worker to every server; create in dist_sync: a sync-mode command from
        rank 0 to every server. Neither carries keys.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UserError

# sparse_kv.py reads its output dir from this variable (or --out-dir).
OUT_DIR_ENV = "PSLAT_MXNET_OUT"
OPS = ("create", "init", "set_optimizer", "pull", "push")


@dataclass(frozen=True)
class Slice:
    server: int       # server rank (ps-lite node id 8 + 2 * rank)
    rows: int
    wire_keys: int
    row_base: int = 0  # first row of the server's row range


@dataclass(frozen=True)
class OpRecord:
    op: str
    rank: int
    key: int
    iter: int
    rows: int
    t_before_ns: int
    t_after_ns: int
    slices: tuple[Slice, ...] = field(default=())
    row_ids: tuple[int, ...] | None = None

    @property
    def latency_ns(self) -> int:
        return self.t_after_ns - self.t_before_ns


def _parse_line(path: Path, lineno: int, line: str) -> OpRecord:
    where = f"{path}:{lineno}"
    try:
        d = json.loads(line)
        rec = OpRecord(
            op=str(d["op"]), rank=int(d["rank"]), key=int(d["key"]), iter=int(d["iter"]),
            rows=int(d["rows"]), t_before_ns=int(d["t_before_ns"]),
            t_after_ns=int(d["t_after_ns"]),
            slices=tuple(Slice(int(s["server"]), int(s["rows"]), int(s["wire_keys"]),
                               int(s.get("row_base", 0)))
                         for s in d.get("slices", ())),
            row_ids=tuple(int(r) for r in d["row_ids"]) if "row_ids" in d else None)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"{where}: not a sparse_kv op record ({e!r}); "
                        "the worker crashed mid-write or the file is not sparse_kv output") from e
    if rec.op not in OPS:
        raise UserError(f"{where}: unknown op {rec.op!r}; expected one of {', '.join(OPS)}")
    if rec.t_after_ns < rec.t_before_ns:
        raise UserError(f"{where}: t_after_ns < t_before_ns; the file is corrupt")
    if rec.slices and sum(s.rows for s in rec.slices) != rec.rows:
        raise UserError(f"{where}: slices' rows do not add up to rows; the file is corrupt")
    if rec.row_ids is not None and len(rec.row_ids) != rec.rows:
        raise UserError(f"{where}: {len(rec.row_ids)} row_ids for {rec.rows} rows; "
                        "the file is corrupt")
    return rec


# ps-lite gives server s the key range [MAX // S * s, MAX // S * (s + 1)).
_PS_MAX_KEY = 2**64 - 1


def wire_key_ids(rec: OpRecord, num_servers: int) -> list[tuple[int, list[int]]]:
    """(server rank, the uint64 keys of its message) for each slice of a pull or push.

    MXNet 1.9.1 (KVStoreDist::EncodeRowSparseKey): the master key
    range_begin + key, then range_begin + key + (row - row_base) per row. The
    slices hold consecutive runs of the sorted row ids. Checked against
    captured traffic for both the split and the single-server layout.
    """
    if rec.row_ids is None:
        raise UserError(f"{rec.op} of rank {rec.rank} iter {rec.iter} has no row_ids; "
                        "rerun sparse_kv.py without --no-log-row-ids")
    out, i = [], 0
    for s in rec.slices:
        begin = _PS_MAX_KEY // num_servers * s.server + rec.key
        rows = rec.row_ids[i:i + s.rows]
        i += s.rows
        out.append((s.server, [begin] + [begin + r - s.row_base for r in rows]))
    return out


def read_worker_log(path: Path) -> list[OpRecord]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}; is it a sparse_kv output dir?") from e
    return [_parse_line(path, i, line) for i, line in enumerate(text.splitlines(), 1)
            if line.strip()]


def read_op_logs(out_dir: Path) -> dict[int, list[OpRecord]]:
    """Every worker's records, by rank, each in issue order."""
    out_dir = Path(out_dir)
    paths = sorted(out_dir.glob("worker-*.jsonl"))
    if not paths:
        raise UserError(f"no worker-*.jsonl in {out_dir}; run workloads/mxnet/sparse_kv.py "
                        "with --out-dir there first")
    logs: dict[int, list[OpRecord]] = {}
    for p in paths:
        recs = read_worker_log(p)
        ranks = {r.rank for r in recs}
        if len(ranks) > 1:
            raise UserError(f"{p}: records of several ranks {sorted(ranks)}; the file is corrupt")
        rank = ranks.pop() if ranks else int(p.stem.split("-", 1)[1])
        logs[rank] = recs
    return logs


def read_summaries(out_dir: Path) -> dict[int, dict]:
    """Each finished worker's end summary, by rank (a worker that died has none)."""
    out = {}
    for p in sorted(Path(out_dir).glob("worker-*.json")):
        try:
            d = json.loads(p.read_text())
            out[int(d["rank"])] = d
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"{p}: unreadable worker summary ({e!r}); rerun the job") from e
    return out
