"""Fuzz target: a run dir from another host, read by `pslat report` and drawn as its terminal report.

An input is one host's run dir: byte 0 says how the rest is laid out, the rest is
meta.json's bytes, SEPARATOR, then the messages shard (none without a separator;
no meta.json when its part is empty):
- byte 0 even: the shard's columns as JSON ({"column": [values...]}), made into a
  Parquet shard with the types JSON values have (int64, double, string, bool,
  null, lists): wrong types and out-of-range values in every column, as a hostile
  or broken agent would write them (Parquet's own bytes are pyarrow's to fuzz);
- byte 0 odd: the shard's bytes as they are (a small real shard, mutated).
Bits 1-3 of byte 0 zero: the run dir is loaded (reports.load), dissected, made into
the view model and rendered by reports.term_report at 100 columns (~0.1 s); else
it is only loaded and the loader's problem lines rendered (~10x faster: the
loader is where outside bytes are checked, the rest sees checked values).
UserError is the refusal the report is meant to give; anything else escaping is
a bug, and so is an escape character in the rendered text (strings from run dirs
are shown as text only).
Seeds: four rows of a request and its response from the recorded psbench run
(tests/data/agent/psbench.messages.parquet), with the meta.json fields a replay of
that recording writes (tests/data/agent/psbench.rec.gz), the readers' ones."""
from __future__ import annotations

import atexit
import io
import json
import shutil
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rich.console import Console

from core.errors import UserError
from reports.dissect import dissect
from reports.load import load
from reports.render_term import shown
from reports.term_report import FullReport, bullets
from reports.viewmodel import build_model

KIND = "reader"
SEPARATOR = b"\n--shard--\n"
_DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "agent"
_HOST = "pslat-rec-13751"   # the recording's host
# meta.json as `pslat agent --replay psbench.rec.gz` writes it (less its config and the
# counters no reader uses; messages: the seed's 4 rows), with what a live agent adds
# (agent/daemon.py: boot_id, run_id, started_realtime_ns, probe counters, sampling)
_META = {
    "host_id": _HOST, "agent_version": "0.1.0", "format_version": 1, "closed": True, "disk_full": False,
    "kernel": {"machine": "x86_64", "release": "6.18.44-fc-v782"},
    "boot_id": "6f1c0d3e-4b8e-4a65-9e02-1c1f5d0c9a11", "run_id": "b9e5d1c0a3f94e0c8d2e7a6b5c4d3e2f",
    "clock": {"offset_ns": 1795970076028397053, "samples": 9, "taken_monotonic_ns": 4606259425742,
              "uncertainty_ns": 135},
    "clock_discipline": {"esterror_us": 16000000, "maxerror_us": 16000000, "source": "adjtimex", "synced": False},
    "counters": {"messages": 4, "rows_dropped": 0, "shards_failed": 0, "meta_write_failures": 0,
                 "unparsed_bytes": 0, "lost_bytes": 0, "consumer_cpu_s": 0.539,
                 "probes": {"sockcalls": {"seen": 735, "lost": 0}}},
    "sampling": {"rate": 1.0, "mode": "fixed", "history": [[4606259425742, 1.0]]},
    "started_realtime_ns": 1796158083015000000, "updated_realtime_ns": 1796158094594260108,
}
_dir: Path | None = None


def _run_dir() -> Path:
    """One scratch run dir per process, emptied for each input."""
    global _dir
    if _dir is None:
        _dir = Path(tempfile.mkdtemp(prefix="pslat-fuzz-rundir-")) / _HOST
        _dir.mkdir()
        atexit.register(shutil.rmtree, _dir.parent, True)
    for f in _dir.iterdir():
        f.unlink()
    return _dir


def _rows() -> pa.Table:
    """A pull request and its response, both ends of each (the recording is one host: loopback)."""
    from reports.load import _wanted_schema

    from parsers.registry import upgrade_messages

    t = upgrade_messages(pq.read_table(_DATA / "psbench.messages.parquet")).to_pandas()
    pair = t[((t.sender == 9) & (t.recver == 8) | (t.sender == 8) & (t.recver == 9)) & (t.call_id == 0)
             & ~t.control.astype(bool)]
    # conn_id and null_reasons left out: 700 bytes of text, and libFuzzer's inputs are 2 KiB
    cols = [c for c in _wanted_schema().names if c in pair.columns and pair[c].notna().any()
            and c not in ("conn_id", "null_reasons")]
    return pa.Table.from_pandas(pair[cols], preserve_index=False)


def seeds() -> list[bytes]:
    rows = _rows()
    meta = json.dumps(_META, separators=(",", ":")).encode()
    as_json = json.dumps({c: rows.column(c).to_pylist() for c in rows.column_names},
                         separators=(",", ":")).encode()
    few = rows.select(["host_id", "direction", "op", "request", "sender", "recver", "call_id",
                       "ts_send_first_enter_ns", "ts_recv_last_exit_ns"])
    raw = io.BytesIO()
    pq.write_table(few, raw, compression="none", write_statistics=False, store_schema=False)
    loaded_only = [b"\x02" + meta + SEPARATOR + as_json,
                   b"\x03" + json.dumps({"host_id": _HOST}).encode() + SEPARATOR + raw.getvalue(),
                   b"\x02" + SEPARATOR + as_json, b"\x02" + meta]
    # one seed of the whole report: a mutant of it costs ~20 of the loader's
    return [b"\x00" + loaded_only[0][1:]] + loaded_only


def _json_shard(body: bytes) -> pa.Table | None:
    """The shard a JSON body describes, or None when it describes none (the harness's own
    parsing: what it refuses is no input to the reader)."""
    try:
        cols = json.loads(body)
        if not isinstance(cols, dict) or not cols:
            return None
        return pa.table({str(k): pa.array(v) for k, v in cols.items() if isinstance(v, list)})
    except (ValueError, TypeError, RecursionError, pa.ArrowException):
        return None


def one_input(data: bytes) -> None:
    if not data:
        return
    mode, rest = data[0], data[1:]
    meta, sep, shard = rest.partition(SEPARATOR)
    d = _run_dir()
    if meta:
        (d / "meta.json").write_bytes(meta)
    if sep:
        path = d / "messages-000000.parquet"
        if mode & 1:
            path.write_bytes(shard)
        else:
            tbl = _json_shard(shard)
            if tbl is None or not tbl.num_columns:
                return
            try:
                pq.write_table(tbl, path)
            except pa.ArrowException:   # pyarrow cannot write it (the harness's limit, not the reader's)
                return
    _report(d, full=not mode & 0x0E)


def _report(d: Path, full: bool) -> None:
    try:
        if full:
            dissection = dissect([d])
        else:
            loaded = load([d])
    except UserError:
        return
    out = io.StringIO()
    Console(file=out, width=100, color_system=None, force_terminal=False).print(
        FullReport(build_model(dissection, [d])) if full else bullets(shown(loaded.problems)))
    text = out.getvalue()
    assert "\x1b" not in text and "\x07" not in text, "a control character reached the terminal report"
