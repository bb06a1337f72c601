"""agent --pcap's join (capture/annotate.py) on the recorded job (tests/data/capture: psbench
1 x 1, tcpdump in both hosts while the agent traced them): each host's capture with the
agent's rows of that host, into one pcapng of two interfaces. Oracles from outside the
join: psbench's own log (truth.parquet: every request's timestamp, sender, recver, op)
for the ids the comments name, tshark for the packets and their comments."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from capture.annotate import annotate
from capture.pcapng_write import PcapngWriter
from capture.read import CaptureReader

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
IDS = re.compile(r"pslite (push|pull) (request|response) \(call_space \d+, call_id (\d+), sender (\d+), recver (\d+)\)")


def test_every_data_packet_names_its_request_as_psbench_logged_it(tmp_path):
    out = tmp_path / "agent.pcapng"
    with PcapngWriter(out) as w:
        for h in ("h0", "h1"):
            m = pd.concat([pq.read_table(f).to_pandas() for f in sorted((DATA / "agent" / h).glob("messages-*.parquet"))])
            with CaptureReader(DATA / f"{h}.pcap") as r:
                annotate(r, h, m, w, w.interface(1, h, f"network namespace {h}"))
    got = subprocess.run(["tshark", "-r", str(out), "-T", "fields", "-E", "separator=\t", "-e", "frame.interface_name",
                          "-e", "tcp.len", "-e", "tcp.srcport", "-e", "tcp.dstport", "-e", "frame.comment"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    rows = [line.split("\t") for line in got]
    assert len(rows) == 471 and all(r[4].startswith(f"pslat {r[0]}: ") for r in rows)   # every packet commented

    truth = pd.read_parquet(DATA / "truth.parquet")
    truth = truth[truth.role == "server"]
    requests = {(op, int(t), int(s), int(r)) for op, t, s, r in zip(truth.op, truth.timestamp, truth.sender, truth.recver)}
    named = {}
    for host, length, sport, dport, comment in rows:
        for op, kind, call_id, sender, recver in IDS.findall(comment):
            key = (op, int(call_id), int(sender), int(recver)) if kind == "request" else \
                (op, int(call_id), int(recver), int(sender))
            assert key in requests, comment   # every id a comment names is a request psbench made
            named.setdefault(key, set()).add((host, kind))
    # every request psbench logged is named on both hosts, its request and its response
    assert set(named) == requests
    assert all(v == {(h, k) for h in ("h0", "h1") for k in ("request", "response")} for v in named.values())
    # what carries bytes and names no message: ZMTP's greetings (sent in pieces of 10, 1, 53
    # bytes) and READY commands, before a connection's first ps-lite message
    unnamed = [r for r in rows if int(r[1] or 0) and "pslite" not in r[4]]
    assert all(int(r[1]) <= 128 and "bytes of no message" in r[4] for r in unnamed), unnamed[:3]
