"""Synthetic run dirs with a known truth, for the report's tests and its benchmark.

Simulates a ps-lite job the way the agent would record it: workers and
servers on hosts whose CLOCK_MONOTONIC has its own offset and drift, per-stage
delays drawn per request slice, wires with their own delay per direction and
jitter, requests on the worker's DEALER -> server's ROUTER connection and
responses on the server's DEALER -> worker's ROUTER connection (each with its
ISNs and TCP sequence ranges; optionally reconnecting on the same port with
new ISNs), control messages beside them, lost message ends, untraced hosts.
It writes one run dir per traced host (agent.rundir's meta.json + Parquet
shards with agent.records.MESSAGES_SCHEMA) and returns the truth: every
component of every request slice in the worker's clock, and each host pair's
true clock relation.

    truth = simulate(tmp_path, Sim(requests=2000, wire_req_ns=1_000_000))
    python -m workloads.simulated.job --requests 100000    # time and peak memory of dissect()
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from agent.endpoints import conn_id_of
from agent.records import MESSAGES_SCHEMA
from agent.rundir import SHARD_SUFFIX, RunDirWriter
from reports.components import BASE

T0_NS = 5_000_000_000_000       # true time of the first request (any value works)
SHARD_ROWS = 50_000
NO_TXDONE = "the device has no TX completion (veth)"
NO_NIC_RX = "the device has no IRQ/NAPI entry or hardware RX timestamp (veth)"
NO_FW = "no framework probe on this process"
NO_NETSTACK = "netstack probe not loaded"


@dataclass
class Sim:
    workers: int = 2
    servers: int = 2
    requests: int = 500                 # per worker; each is sliced over `slices` servers
    slices: int = 1                     # servers per request (ps-lite slices by key range)
    wire_req_ns: int = 50_000           # one way, worker -> server
    wire_resp_ns: int = 50_000          # one way, server -> worker
    jitter: float = 0.2                 # each wire/server delay times U(1 - j, 1 + j)
    server_user_ns: int = 200_000
    nic: bool = False                   # the device has TX completion and NIC RX stages
    netstack: bool = True
    framework: bool = True
    clocks: dict = field(default_factory=dict)   # host -> (offset_ns, drift_ppm); host t = true + ...
    shared_clock: bool = False          # meta.json says one kernel (the same boot_id)
    disciplined: bool = False           # meta.json says synced, with true mappings
    traced: tuple | None = None         # hosts with a run dir (None: all)
    lose_end: float = 0.0               # each message end lost with this probability
    lose_response: float = 0.0          # both ends of a response lost
    lose_request: float = 0.0           # both ends of a request lost
    reconnect_every: int = 0            # new ISNs on the same ports every K slices of a pair
    negative_wire_at: tuple = ()        # slice indices whose wire_req is made negative (-20 us)
    control_every: int = 10             # a control message per K slices of a pair
    think_ns: tuple = (20_000, 60_000)  # a worker's pause between requests (uniform)
    warmup_requests: int = 0            # a worker's first K requests: a start-up (tables touched first)
    warmup_factor: float = 1.0          # their server_user times this
    seed: int = 0
    run_id: str | None = None
    started_realtime_ns: int = 1_700_000_000 * 10**9


def hosts_of(sim: Sim) -> tuple[list[str], list[str]]:
    return [f"w{j}" for j in range(sim.workers)], [f"ps{i}" for i in range(sim.servers)]


def _u(rng, n, lo_ns, hi_ns):
    return rng.integers(lo_ns, hi_ns + 1, n)


def _jit(rng, n, base, j):
    return np.rint(base * rng.uniform(1 - j, 1 + j, n)).astype(np.int64)


def _clock(sim: Sim, host: str, true_ns: np.ndarray) -> np.ndarray:
    off, ppm = sim.clocks.get(host, (0, 0.0))
    return true_ns + off + np.rint((true_ns - T0_NS) * ppm * 1e-6).astype(np.int64)


def simulate(out: Path, sim: Sim) -> dict:
    """Writes the run dirs under `out`; returns {"slices": truth DataFrame, "clocks": {...}}."""
    rng = np.random.default_rng(sim.seed)
    workers, servers = hosts_of(sim)
    ip = {h: f"10.77.0.{k + 1}" for k, h in enumerate(servers + workers)}
    node = {**{s: 8 + 2 * i for i, s in enumerate(servers)}, **{w: 9 + 2 * j for j, w in enumerate(workers)}}
    router_port = {h: 9000 + k for k, h in enumerate(servers + workers)}
    # slices: per worker, requests 0..R-1, each over `slices` servers (rotating)
    R, S = sim.requests, sim.slices
    w_idx = np.repeat(np.arange(sim.workers), R * S)
    ts = np.tile(np.repeat(np.arange(R), S), sim.workers)
    # the servers of a request: S consecutive ones from a random first one
    s_idx = (np.repeat(rng.integers(0, sim.servers, R * sim.workers), S)
             + np.tile(np.arange(S), R * sim.workers)) % sim.servers
    n = len(w_idx)
    op = np.where(ts % 2 == 0, "pull", "push")
    def nic():   # a device without NIC stages spends no time there
        return _u(rng, n, 1_000, 4_000) if sim.nic else np.zeros(n, np.int64)

    d = {  # true delays, ns (BASE order)
        "client_user_tx": _u(rng, n, 5_000, 20_000),
        "client_kernel_tx": _u(rng, n, 8_000, 30_000),
        "client_nic_tx": nic(),
        "wire_req": _jit(rng, n, sim.wire_req_ns, sim.jitter),
        "server_nic_rx": nic(),
        "server_kernel_rx": None,
        "server_user": _jit(rng, n, sim.server_user_ns, sim.jitter),
        "server_kernel_tx": _u(rng, n, 8_000, 30_000),
        "server_nic_tx": nic(),
        "wire_resp": _jit(rng, n, sim.wire_resp_ns, sim.jitter),
        "client_nic_rx": nic(),
        "client_kernel_rx": None,
        "client_user_rx": _u(rng, n, 5_000, 20_000),
    }
    sub = {}
    for side in ("server", "client"):
        sub[f"{side}_stack_rx"] = _u(rng, n, 5_000, 15_000)
        sub[f"{side}_runq_wait"] = _u(rng, n, 0, 10_000)
        sub[f"{side}_busy_wait"] = _u(rng, n, 0, 30_000)
        d[f"{side}_kernel_rx"] = sub[f"{side}_stack_rx"] + sub[f"{side}_runq_wait"] + sub[f"{side}_busy_wait"]
        for w in ("cwnd", "rwnd", "qdisc"):
            sub[f"{side}_{w}_wait"] = np.minimum(_u(rng, n, 0, 3_000), d[f"{side}_kernel_tx"] // 4)
    for k in sim.negative_wire_at:
        d["wire_req"][k] = -20_000
    if sim.warmup_requests:
        early = ts < sim.warmup_requests
        d["server_user"] = np.where(early, np.rint(d["server_user"] * sim.warmup_factor).astype(np.int64),
                                    d["server_user"])
    # pair (worker, server) connection epochs: reconnects reuse the ports with new ISNs
    pair = w_idx * sim.servers + s_idx
    nth = pd.Series(pair).groupby(pair).cumcount().to_numpy()
    epoch = nth // sim.reconnect_every if sim.reconnect_every else np.zeros(n, np.int64)
    new_conn = (nth % sim.reconnect_every == 0) if sim.reconnect_every else nth == 0
    sub["client_connect_wait"] = np.where(new_conn, np.minimum(3_000, d["client_user_tx"]), 0)
    # closed loop per worker: a request starts after the previous one's last slice ended
    e2e = sum(d[c] for c in BASE)
    req_len = pd.Series(e2e).groupby(w_idx * R + ts).transform("max").to_numpy()
    first_slice = np.r_[True, (w_idx[1:] != w_idx[:-1]) | (ts[1:] != ts[:-1])]
    step = np.where(first_slice, req_len + _u(rng, n, *sim.think_ns), 0)
    start = T0_NS + w_idx * 7_919 + pd.Series(step).groupby(w_idx).cumsum().to_numpy() - step
    # slices of one request leave one after the other (one send each)
    start = start + pd.Series(np.ones(n, np.int64)).groupby(w_idx * R + ts).cumcount().to_numpy() * 3_000
    P = np.zeros((n, 14), np.int64)
    P[:, 0] = start
    for k, c in enumerate(BASE):
        P[:, k + 1] = P[:, k] + d[c]
    wh = np.array(workers)[w_idx]
    sh = np.array(servers)[s_idx]
    truth = _truth(sim, P, wh, sh, node, ts, op, d, sub)
    rows = _rows(sim, rng, P, d, sub, wh, sh, ts, op, node, ip, router_port, pair, epoch, nth)
    _write(out, sim, rows, workers + servers)
    clocks = {}
    for a in workers + servers:
        for b in workers + servers:
            if a < b:
                clocks[f"{a}~{b}"] = _true_offset(sim, a, b)
    return {"slices": truth, "clocks": clocks}


TRUTH_KEY = ["worker", "server", "call_id"]


def joined_to_truth(dissection, truth: dict) -> pd.DataFrame:
    """The dissection's measured requests beside their truth, one row per request slice
    (the truth's columns suffixed `_true` where names clash)."""
    got = dissection.complete.astype({c: "int64" for c in TRUTH_KEY})
    return got.merge(truth["slices"], on=TRUTH_KEY, suffixes=("", "_true"), validate="one_to_one")


def _true_offset(sim: Sim, a: str, b: str):
    """(offset_ns at b's time t_b, drift): t_a = t_b + offset + drift (t_b - ref) for any ref."""
    oa, pa_ = sim.clocks.get(a, (0, 0.0))
    ob, pb = sim.clocks.get(b, (0, 0.0))

    def offset_at(t_b: float) -> float:
        true = T0_NS + (t_b - ob - T0_NS) / (1 + pb * 1e-6)
        return (true + oa + (true - T0_NS) * pa_ * 1e-6) - t_b
    return offset_at


def _truth(sim, P, wh, sh, node, ts, op, d, sub) -> pd.DataFrame:
    """True components in the worker's clock (what a perfect report gives)."""
    n = len(P)
    Pc = np.zeros_like(P)
    for w in np.unique(wh):
        rows = wh == w
        Pc[rows] = _clock(sim, w, P[rows])
    t = pd.DataFrame({"worker": [node[w] for w in wh], "server": [node[s] for s in sh],
                      "worker_host": wh, "server_host": sh, "call_id": ts, "op": op})
    for k, c in enumerate(BASE):
        t[c] = Pc[:, k + 1] - Pc[:, k]
    t["e2e"] = Pc[:, 13] - Pc[:, 0]
    # the same in true (real) time: the split the clock estimate should find
    for c in ("wire_req", "wire_resp"):
        t[f"{c}_real"] = d[c]
    for c, v in sub.items():
        t[c] = v
    t["start_true_ns"] = P[:, 0]
    return t


def _rows(sim, rng, P, d, sub, wh, sh, ts, op, node, ip, router_port, pair, epoch, nth) -> pd.DataFrame:
    n = len(P)
    pid = {h: 1000 + k for k, h in enumerate(sorted(set(wh) | set(sh)))}
    isn = rng.integers(0, 2**32, size=(pair.max() + 1, epoch.max() + 1, 2), dtype=np.int64)
    req_bytes = np.where(op == "push", 2_000, 400).astype(np.int64)
    resp_bytes = np.where(op == "pull", 1_800, 120).astype(np.int64)
    ctl = (nth % sim.control_every == 0) if sim.control_every else np.zeros(n, bool)
    frames = []
    for kind in ("req", "resp"):
        nbytes = req_bytes if kind == "req" else resp_bytes
        # TCP sequence per connection epoch: messages back to back, a control one before some
        end = pd.Series(np.where(ctl, 64, 0) + nbytes).groupby(pair * 1_000_000 + epoch).cumsum().to_numpy()
        isn_dir = isn[pair, epoch, 0 if kind == "req" else 1]
        seq_end = (isn_dir + 1 + end) % 2**32
        seq_first = (seq_end - nbytes) % 2**32
        if kind == "req":   # the worker's DEALER into the server's ROUTER
            src, dst, sport = wh, sh, 40000 + pair
            dport = np.array([router_port[s] for s in sh])
        else:               # the server's DEALER into the worker's ROUTER
            src, dst, sport = sh, wh, 50000 + pair
            dport = np.array([router_port[w] for w in wh])
        cid = _conn_ids(src, sport, dst, dport, isn_dir, ip)
        # as parsers.pslite gives them (a simulated ps-lite job)
        ids = {"protocol": "pslite", "pair_scope": "nodes", "call_space": 0, "call_id": ts,
               "sender": np.array([node[h] for h in src]), "recver": np.array([node[h] for h in dst]),
               "request": kind == "req", "control": False, "op": op, "op_name": op, "num_keys": 8,
               "msg_bytes": nbytes, "value_bytes": np.maximum(nbytes - 200, 0)}
        m = dict(src=src, dst=dst, sport=sport, dport=dport, cid=cid, seq_first=seq_first, seq_end=seq_end)
        for dirn in ("tx", "rx"):
            f = _end(sim, dirn, kind, m, ids, P, sub, ip, pid)
            f["_slice"] = np.arange(n)
            frames.append(f)
        if sim.control_every:
            c = np.flatnonzero(ctl)
            mc = {k: v[c] for k, v in m.items()}
            mc["seq_first"], mc["seq_end"] = (seq_first[c] - 64) % 2**32, seq_first[c]
            cids = {"protocol": "pslite", "pair_scope": "nodes", "call_space": None, "call_id": None,
                    "sender": ids["sender"][c], "recver": ids["recver"][c], "request": True, "control": True,
                    "op": "control", "op_name": "ACK", "detail": '{"cmd":4}', "num_keys": 0, "msg_bytes": 64,
                    "value_bytes": 0}
            for dirn in ("tx", "rx"):
                # sent 100 us before the data message, with causal stage times like it
                f = _end(sim, dirn, kind, mc, cids, P[c] - 100_000, {k: v[c] for k, v in sub.items()},
                         ip, pid, control=True)
                f["_slice"] = -1
                frames.append(f)
    rows = pd.concat(frames, ignore_index=True)
    data = ~rows["control"].to_numpy(dtype=bool)
    is_req = rows["request"].to_numpy(dtype=bool)
    sl = rows["_slice"].to_numpy()
    drop = np.zeros(len(rows), bool)
    for frac, which in ((sim.lose_request, is_req), (sim.lose_response, ~is_req)):
        if frac:
            lost = rng.random(n) < frac
            drop |= data & which & lost[np.maximum(sl, 0)]
    if sim.lose_end:
        drop |= rng.random(len(rows)) < sim.lose_end
    return rows[~drop].drop(columns=["_slice"]).reset_index(drop=True)


def _conn_ids(src, sport, dst, dport, isn_dir, ip):
    """agent.endpoints' conn_id (the same string on both ends), per distinct connection."""
    key = pd.DataFrame({"a": src, "pa": sport, "b": dst, "pb": dport, "i": isn_dir})
    uniq = key.drop_duplicates()
    ids = [conn_id_of((ip[a], int(pa_)), (ip[b], int(pb)), int(i), int(i) ^ 0x5A5A5A5A, True)[0]
           for a, pa_, b, pb, i in uniq.itertuples(index=False)]
    return key.merge(uniq.assign(cid=ids), how="left", on=list(key.columns))["cid"].to_numpy()


def _host_clock(sim, host: np.ndarray, true_ns: np.ndarray) -> np.ndarray:
    out = np.zeros_like(true_ns)
    for h in np.unique(host):
        rows = host == h
        out[rows] = _clock(sim, h, true_ns[rows])
    return out


def _end(sim, direction, kind, m, ids, P, sub, ip, pid, control=False) -> pd.DataFrame:
    """The rows of one end (tx: on the sender, rx: on the receiver) of every message of one kind."""
    host, peer = (m["src"], m["dst"]) if direction == "tx" else (m["dst"], m["src"])
    lport, rport = (m["sport"], m["dport"]) if direction == "tx" else (m["dport"], m["sport"])
    n = len(host)
    side = "client" if (kind == "req") == (direction == "tx") else "server"
    c = lambda k: _host_clock(sim, host, P[:, k])  # noqa: E731  (a chain point in this host's clock)
    r: dict = {}
    reasons = []
    if direction == "tx":
        k = 0 if kind == "req" else 6          # the point before the first send
        r["ts_send_first_enter_ns"] = c(k + 1)
        r["ts_framework_ns"] = c(0) if kind == "req" else r["ts_send_first_enter_ns"] - 4_000
        r["ts_send_last_exit_ns"] = r["ts_send_first_enter_ns"] + 4_000
        r["ts_xmit_last_ns"], r["ts_txdone_last_ns"] = c(k + 2), c(k + 3)
        if not sim.nic:
            r["ts_txdone_last_ns"] = None
            reasons.append(f"ts_txdone_last_ns={NO_TXDONE}")
        waits = {f"{w}_wait_ns": sub[f"{side}_{w}_wait"] for w in ("cwnd", "rwnd", "qdisc")}
        if side == "client":
            waits["connect_wait_ns"] = sub["client_connect_wait"]
        net = ("ts_xmit_last_ns", "ts_txdone_last_ns")
    else:
        k = 4 if kind == "req" else 10         # NIC RX of the last segment
        r["ts_nic_rx_last_ns"], r["ts_netif_rx_last_ns"], r["ts_recv_last_exit_ns"] = c(k), c(k + 1), c(k + 2)
        r["ts_data_ready_ns"] = _host_clock(sim, host, P[:, k + 1] + sub[f"{side}_stack_rx"])
        r["ts_framework_ns"] = c(13) if kind == "resp" else r["ts_recv_last_exit_ns"] + 3_000
        if not sim.nic:
            r["ts_nic_rx_last_ns"] = None
            reasons.append(f"ts_nic_rx_last_ns={NO_NIC_RX}")
        waits = {"runq_wait_ns": sub[f"{side}_runq_wait"], "busy_wait_ns": sub[f"{side}_busy_wait"]}
        net = ("ts_nic_rx_last_ns", "ts_netif_rx_last_ns", "ts_data_ready_ns")
    if not sim.netstack:
        reasons = [f"{col}={NO_NETSTACK}" for col in net]
        r.update({col: None for col in net})
    if not sim.framework or control:
        r["ts_framework_ns"] = None
        reasons.append(f"ts_framework_ns={NO_FW if not control else 'control message'}")
    if control:
        waits = {}
    col = lambda v: v if np.ndim(v) else np.full(n, v, dtype=object)  # noqa: E731
    df = pd.DataFrame({
        "host_id": host, "direction": direction, "pid": [pid[h] for h in host], "tid": 1, "comm": "psbench",
        "netns_ino": 4026531840, "local_ip": [ip[h] for h in host], "local_port": lport,
        "remote_ip": [ip[h] for h in peer], "remote_port": rport, "conn_id": m["cid"],
        "seq_first": m["seq_first"], "seq_end": m["seq_end"], "key_sample": [[]] * n,
        "key_sample_complete": True, "framework_layer": None if control else "ps",
        "null_reasons": ";".join(reasons), **{k: col(v) for k, v in ids.items()},
    })
    for name in ("ts_framework_ns", "ts_send_first_enter_ns", "ts_send_last_exit_ns", "ts_xmit_last_ns",
                 "ts_txdone_last_ns", "ts_nic_rx_last_ns", "ts_netif_rx_last_ns", "ts_data_ready_ns",
                 "ts_recv_last_exit_ns", "runq_wait_ns", "busy_wait_ns", "cwnd_wait_ns", "rwnd_wait_ns",
                 "qdisc_wait_ns", "connect_wait_ns"):
        v = r.get(name, waits.get(name))
        df[name] = pd.array(v, dtype="Int64") if v is not None else pd.array([None] * n, dtype="Int64")
    return df


def _write(out: Path, sim: Sim, rows: pd.DataFrame, hosts: list[str]) -> None:
    traced = hosts if sim.traced is None else list(sim.traced)
    started = sim.started_realtime_ns
    for h in traced:
        part = rows[rows["host_id"] == h]
        off, _ = sim.clocks.get(h, (0, 0.0))
        meta = {"host_id": h, "kernel": {"release": "sim", "boot_id": "one-boot" if sim.shared_clock else f"boot-{h}"},
                # realtime = monotonic + offset_ns; the simulated wall clock is true time - T0 + started
                "clock": {"offset_ns": started - T0_NS - off, "uncertainty_ns": 500, "taken_monotonic_ns": T0_NS},
                "clock_discipline": {"synced": sim.disciplined, "esterror_us": 2},
                "config": {"simulated": True}, "agent_version": "sim", "selection": {},
                "started_realtime_ns": started}
        if sim.run_id:
            meta["run_id"] = sim.run_id
        w = RunDirWriter(out / h, meta, shard_interval_s=3600)
        for k, lo in enumerate(range(0, len(part), SHARD_ROWS)):
            tbl = pa.Table.from_pandas(part.iloc[lo:lo + SHARD_ROWS], schema=MESSAGES_SCHEMA, preserve_index=False)
            pq.write_table(tbl, out / h / f"messages-{k:06d}{SHARD_SUFFIX}")
        w.meta["counters"]["messages"] = len(part)
        w.close()
        # the writer stamps the time of writing: put the simulated run's back
        w.meta["updated_realtime_ns"] = started + 60 * 10**9
        (out / h / "meta.json").write_text(json.dumps(w.meta))


def _bench(argv=None) -> None:
    import subprocess
    import sys
    import tempfile

    ap = argparse.ArgumentParser(description="time and peak memory of reports.dissect on synthetic run dirs")
    ap.add_argument("--requests", type=int, default=100_000, help="request slices in all")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        sim = Sim(workers=4, servers=2, requests=a.requests // 4, wire_req_ns=1_000_000,
                  wire_resp_ns=1_000_000, clocks={"ps1": (5_000_000, 50.0)})
        t0 = time.perf_counter()
        simulate(Path(tmp), sim)
        gen_s = time.perf_counter() - t0
        # a fresh process, so that the peak RSS is the report's alone
        subprocess.run([sys.executable, "-c", _CHILD, tmp], check=True)
    print(f"(run dirs generated in {gen_s:.1f} s)")


# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork and exec, so a child would report ours
_CHILD = """
import re, sys, time
from pathlib import Path
def hwm_mb():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024
from reports.dissect import dissect
from reports.summary import summary
rss0 = hwm_mb()
t0, c0 = time.perf_counter(), time.process_time()
d = dissect([Path(sys.argv[1])])
s = summary(d)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(f"{len(d.requests):,} requests: dissect + summary {wall:.2f} s wall, {cpu:.2f} s CPU; "
      f"peak RSS {hwm_mb():.0f} MB ({rss0:.0f} MB after imports)")
"""


if __name__ == "__main__":
    _bench()
