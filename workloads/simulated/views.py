"""What workloads.simulated.job's run dirs lack for the views, added with a known truth.

workloads.simulated.job writes the messages the dissection needs, with empty key
samples and no `connections` table. The HTML/terminal/trace views also show
key skew, connection management and the agents' health, so this adds to those
run dirs, as the agent would write them:
- key samples: each request draws `keys_per_request` keys from a Zipf law (the
  same keys on both ends of a message), keeps the bottom-k by the agent's hash
  (parsers.keysample, k = 16) and the true count of every key;
- a `connections` row per connection end (connect on the sender, accept on the
  receiver) with handshake and accept-wait times and a close;
- per-probe counters in meta.json (events seen; `lost` on chosen hosts).

    truth = simulate(out, Sim(...)); keys = add_views(out, ViewSim(zipf_s=1.1))
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from agent.records import CONNECTIONS_SCHEMA, MESSAGES_SCHEMA
from agent.rundir import META_FILE, SHARD_SUFFIX
from parsers.keysample import key_hash

SAMPLE_K = 16                      # the agent's key_sample_max
_SCATTER = np.uint64(0x9E3779B97F4A7C15)   # odd: rank -> key is a bijection of uint64


@dataclass
class ViewSim:
    keys_per_request: int = 64
    key_space: int = 100_000
    zipf_s: float = 1.1
    seed: int = 7
    lost: dict = field(default_factory=dict)     # host -> {probe: lost events}
    connections: bool = True
    comm: str = "psbench"                        # thread name written into every row
    handshake_ns: tuple = (40_000, 400_000)


def _zipf_ranks(rng, n_ranks: int, s: float, size) -> np.ndarray:
    """Ranks 1..n with P(r) ~ r^-s (inverse CDF over the exact table: key spaces here are small)."""
    p = np.arange(1, n_ranks + 1, dtype=np.float64) ** -s
    cdf = np.cumsum(p / p.sum())
    return np.searchsorted(cdf, rng.random(size), side="right").clip(0, n_ranks - 1) + 1


def _messages(out: Path) -> dict[str, list[Path]]:
    return {p.name: sorted(p.glob(f"messages-*{SHARD_SUFFIX}")) for p in sorted(out.iterdir()) if p.is_dir()}


def add_views(out: Path, v: ViewSim) -> dict:
    """Rewrites the run dirs under `out`; returns the truth: {"push": counts, "pull": counts}
    (pandas Series: true updates per key, keys being uint64) and the connections per host."""
    rng = np.random.default_rng(v.seed)
    shards = _messages(out)
    # one draw per request message, keyed by its ids (both ends carry the same keys)
    ids = []
    for host, files in shards.items():
        for f in files:
            t = pq.read_table(f, columns=["sender", "recver", "call_id", "request", "control", "op"]).to_pandas()
            ids.append(t[(t["control"] == False) & (t["request"] == True)])  # noqa: E712
    ids = pd.concat(ids).drop_duplicates(["sender", "recver", "call_id"]).reset_index(drop=True)
    n = len(ids)
    ranks = np.sort(_zipf_ranks(rng, v.key_space, v.zipf_s, (n, v.keys_per_request)), axis=1)
    keys = ranks.astype(np.uint64) * _SCATTER
    dup = np.zeros_like(ranks, dtype=bool)
    dup[:, 1:] = ranks[:, 1:] == ranks[:, :-1]     # a key appears once per message
    h = key_hash(keys)
    h[dup] = np.iinfo(np.uint64).max
    k = min(SAMPLE_K, v.keys_per_request)
    pick = np.argpartition(h, k - 1, axis=1)[:, :k]
    sample = np.take_along_axis(keys, pick, axis=1)
    ok = np.take_along_axis(~dup, pick, axis=1)
    num_keys = (~dup).sum(axis=1)
    samples = [np.sort(row[m]).tolist() for row, m in zip(sample, ok)]
    ids["_row"] = np.arange(n)
    truth = {}
    for op in ("push", "pull"):
        rows = (ids["op"] == op).to_numpy()
        ks = keys[rows][~dup[rows]]
        truth[op] = pd.Series(ks).value_counts()
    for host, files in shards.items():
        for f in files:
            t = pq.read_table(f).to_pandas()
            m = t.merge(ids[["sender", "recver", "call_id", "_row"]], how="left",
                        on=["sender", "recver", "call_id"])
            is_req = ((t["control"] == False) & (t["request"] == True)).to_numpy()  # noqa: E712
            r = m["_row"].to_numpy()
            t["key_sample"] = [samples[int(x)] if q else [] for x, q in zip(r, is_req)]
            t["num_keys"] = np.where(is_req, num_keys[np.nan_to_num(r, nan=0).astype(np.int64)], t["num_keys"])
            t["comm"] = v.comm
            pq.write_table(pa.Table.from_pandas(t, schema=MESSAGES_SCHEMA, preserve_index=False), f)
    conns = _connections(out, v, rng) if v.connections else {}
    _counters(out, v)
    return {**truth, "connections": conns}


def _connections(out: Path, v: ViewSim, rng) -> dict[str, int]:
    per_host = {}
    for host, files in _messages(out).items():
        t = pd.concat([pq.read_table(f, columns=["direction", "pid", "local_ip", "local_port", "remote_ip",
                                                 "remote_port", "conn_id", "ts_send_first_enter_ns",
                                                 "ts_recv_last_exit_ns"]).to_pandas() for f in files])
        t["t"] = t["ts_send_first_enter_ns"].fillna(t["ts_recv_last_exit_ns"])
        g = t.groupby("conn_id", sort=True).agg(direction=("direction", "first"), pid=("pid", "first"),
                                                local_ip=("local_ip", "first"), local_port=("local_port", "first"),
                                                remote_ip=("remote_ip", "first"),
                                                remote_port=("remote_port", "first"),
                                                first=("t", "min"), last=("t", "max")).reset_index()
        n = len(g)
        hs = rng.integers(*v.handshake_ns, n)
        est = g["first"].to_numpy(dtype=np.int64) - rng.integers(100_000, 2_000_000, n)
        connect = (g["direction"] == "tx").to_numpy()   # the sender of a connection's data dialled it
        rows = pd.DataFrame({
            "host_id": host, "netns_ino": 4026531840, "pid": g["pid"].astype("int32"),
            "role": np.where(connect, "connect", "accept"),
            "local_ip": g["local_ip"], "local_port": g["local_port"].astype("int32"),
            "remote_ip": g["remote_ip"], "remote_port": g["remote_port"].astype("int32"),
            "conn_id": g["conn_id"],
            "ts_connect_enter_ns": pd.array(np.where(connect, est - hs, 0), dtype="Int64"),
            "ts_established_ns": pd.array(est, dtype="Int64"),
            "handshake_ns": pd.array(np.where(connect, hs, 0), dtype="Int64"),
            "accept_wait_ns": pd.array(np.where(connect, 0, rng.integers(5_000, 50_000, n)), dtype="Int64"),
            "ts_close_ns": pd.array(g["last"].to_numpy(dtype=np.int64) + 1_000_000, dtype="Int64"),
            "retransmits": 0, "retransmit_failures": 0, "states": "",
        })
        for c, m in (("ts_connect_enter_ns", connect), ("handshake_ns", connect), ("accept_wait_ns", ~connect)):
            rows.loc[~m, c] = pd.NA
        for f in CONNECTIONS_SCHEMA:
            if f.name not in rows:
                rows[f.name] = pd.NA
        pq.write_table(pa.Table.from_pandas(rows, schema=CONNECTIONS_SCHEMA, preserve_index=False),
                       out / host / f"connections-000000{SHARD_SUFFIX}")
        per_host[host] = n
    return per_host


def _counters(out: Path, v: ViewSim) -> None:
    for host in _messages(out):
        f = out / host / META_FILE
        meta = json.loads(f.read_text())
        n = int(meta.get("counters", {}).get("messages", 0))
        lost = v.lost.get(host, {})
        probes = {p: {"seen": n * k, "lost": int(lost.get(p, 0))}
                  for p, k in (("sockcalls", 3), ("netstack", 5), ("framework", 2))}
        meta.setdefault("counters", {}).update(
            probes=probes, events_consumed={p: c["seen"] - c["lost"] for p, c in probes.items()})
        f.write_text(json.dumps(meta))
