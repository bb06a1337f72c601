"""Traffic that no protocol parser recognised, from the run dirs' `streams` tables
(agent.records.STREAMS_SCHEMA): said as what it is, never as "no traffic".

A connection traced on both of its ends has a row on each host with the same
conn_id: it is counted once, with the larger of its two byte counts (an end may
have joined later). Connections are grouped by the two hosts (a remote address
no traced host owns stays an address), the processes' thread names and the
service port (the end below the ephemeral range, else the lower port).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from agent.records import service_port
from reports.load import host_shards

COLUMNS = ["host_id", "conn_id", "local_ip", "local_port", "remote_ip", "remote_port", "threads",
           "protocol", "bytes_tx", "bytes_rx", "calls_tx", "calls_rx", "signature_tx"]
GROUPS_MAX = 20              # groups listed (the totals count every connection)


def _rows(dirs: dict[str, Path]) -> pd.DataFrame:
    parts = [t.to_pandas() for host, path in dirs.items() for t in host_shards(path, host, "streams", COLUMNS)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=COLUMNS)


def unrecognised(dirs: dict[str, Path]) -> dict[str, Any]:
    """{"traced": whether any run dir has a streams table, "connections", "bytes",
    "groups": [{"hosts", "threads", "port", "connections", "bytes", "signature"}]}."""
    rows = _rows(dirs)
    out: dict[str, Any] = {"traced": bool(len(rows)), "connections": 0, "bytes": 0, "groups": []}
    rows = rows[rows["protocol"] == "unrecognised"]
    if not len(rows):
        return out
    host_of_ip = dict(zip(rows["local_ip"], rows["host_id"]))
    rows = rows.assign(moved=rows["bytes_tx"].astype("int64") + rows["bytes_rx"].astype("int64"))
    conns = rows.sort_values("moved", ascending=False).drop_duplicates("conn_id")
    groups: dict[tuple, dict[str, Any]] = {}
    for r in conns.itertuples(index=False):
        peer = host_of_ip.get(r.remote_ip, r.remote_ip)
        ends = tuple(sorted((str(r.host_id), str(peer))))
        port = service_port(int(r.local_port), int(r.remote_port))
        threads = tuple(sorted(set(r.threads) if r.threads is not None else ()))
        g = groups.setdefault((ends, threads, port), {"hosts": list(ends), "threads": list(threads),
                                                      "port": port, "connections": 0, "bytes": 0,
                                                      "signature": r.signature_tx or ""})
        g["connections"] += 1
        g["bytes"] += int(r.moved)
    listed = sorted(groups.values(), key=lambda g: -g["bytes"])
    out.update(connections=int(len(conns)), bytes=int(conns["moved"].sum()), groups=listed[:GROUPS_MAX],
               groups_left_out=max(0, len(listed) - GROUPS_MAX))
    return out
