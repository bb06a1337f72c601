"""A run dir of format 1 (the messages table with ps-lite's own id columns, written
before protocols were plug-ins) still reports: the same requests, with the same
components, as the report of that time said (tests/data/rundir_v1/README.md)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from parsers.pslite.legacy import ps_ids
from parsers.registry import upgrade_messages
from reports.report_cli import report

V1 = Path(__file__).resolve().parents[1] / "data" / "rundir_v1"


def test_a_format_1_run_dir_reports_as_it_did(tmp_path, capsys):
    out = tmp_path / "r.json"
    report([V1], fmt="json", output=out, clocks="auto")
    got, then = json.loads(out.read_text()), json.loads((V1 / "report.json").read_text())
    assert got["requests"] == then["requests"] == 160
    assert got["unmatched"] == then["unmatched"] and got["by_op"] == then["by_op"]


def test_its_requests_have_the_same_ids_and_components(tmp_path, capsys):
    out = tmp_path / "r.csv"
    report([V1], fmt="csv", output=out, clocks="auto")
    got = pd.read_csv(out)
    then = pd.read_csv(V1 / "report.csv.gz")
    assert len(got) == len(then) == 160
    got = pd.concat([got, ps_ids(got.astype({"call_space": "Int64", "call_id": "Int64"}))], axis=1)
    key = ["app_id", "customer_id", "timestamp", "worker", "server"]
    j = then.merge(got, on=key, suffixes=("_then", ""), validate="one_to_one")
    assert len(j) == 160 and (got["protocol"] == "pslite").all()
    comps = [c for c in then.columns if c.endswith("_us")]
    assert len(comps) > 13
    for c in comps + ["op", "num_keys", "req_bytes", "resp_bytes"]:
        pd.testing.assert_series_equal(j[c], j[f"{c}_then"], check_names=False)


def test_the_upgrade_gives_what_the_parser_gives_today():
    """Every format-1 row's ids in today's columns, as PsMessage's properties make them."""
    from parsers.pslite.message import call_space_of

    [shard] = sorted(V1.glob("*/messages-*.parquet"))
    old = pq.read_table(shard).to_pandas()
    new = upgrade_messages(pq.read_table(shard)).to_pandas()
    want = [call_space_of(None if pd.isna(a) else int(a), None if pd.isna(c) else int(c))
            for a, c in zip(old["app_id"], old["customer_id"])]
    assert [None if pd.isna(x) else int(x) for x in new["call_space"]] == want
    assert (new["call_id"].fillna(-1) == old["timestamp"].fillna(-1)).all()
    assert set(new["protocol"]) == {"pslite"} and set(new["pair_scope"]) == {"nodes"}
    ctl = old["control"].astype(bool)
    assert set(new.loc[ctl, "op_name"]) <= {"ADD_NODE", "BARRIER", "TERMINATE", "ACK", "HEARTBEAT", "EMPTY"}
    assert (new.loc[~ctl, "op_name"] == old.loc[~ctl, "op"]).all()
