"""What the cluster's wire costs and how well it holds a delay: `python -m bench.wire` (root).

1. Added delay at 0 ms configured: UDP ping-pong RTT through the wire vs
   through a direct veth pair between two namespaces (same offloads, same
   ping-pong); added one-way = half the difference of medians. Also the
   wire's own residence time from its log (kernel receive -> send).
2. Precision at 1 ms configured: per frame, actual (kernel receive -> send)
   minus applied delay, from the wire log (p50/p99/p99.9/max/stddev); and the
   end-to-end check: RTT at 1 ms minus RTT at 0 ms, minus 2 ms.
3. Max packet rate: senders in h0 blast minimum-size frames (sendmmsg on
   AF_PACKET, as fast as they can) to h1 for a few seconds, at 0 ms and 1 ms
   configured; rate = frames the wire sent / the time it took; loss = what
   the senders sent that the wire never forwarded. On 2 shared cores the
   senders may not outrun the wire, so the forwarder's own CPU time per frame
   is reported too, with the rate one core could carry at that cost.
4. What psbench (2 servers x 4 workers) puts on the wire, for comparison.

Prints a human summary, then one JSON line (last).
"""
from __future__ import annotations

import argparse
import ctypes
import json
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from workloads.cluster import netns
from workloads.cluster.cluster import Cluster

PY = sys.executable
ROOT = Path(__file__).resolve().parents[1]
ETH_P_BENCH = 0x88B5  # IEEE 802 local experimental: the receiving kernel drops it silently
DIRECT_NS = ("pslat-bench-a", "pslat-bench-b")


# ---- ping-pong ----------------------------------------------------------------
def pingpong_rtts_ns(prefix: list[str] | None, server_cmd_ns: str, client_ns: str, addr: str,
                     count: int, runner=None) -> np.ndarray:
    """UDP ping-pong; the server runs in server_cmd_ns, the client in client_ns."""
    srv = subprocess.Popen(netns.in_ns(server_cmd_ns, [PY, "-m", "workloads.cluster.pingpong", "server",
                                                       "--proto", "udp", "--port", "7777"]),
                           stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert srv.stdout.readline().strip() == "ready"
        out = subprocess.run(netns.in_ns(client_ns, [PY, "-m", "workloads.cluster.pingpong", "client",
                                                     "--proto", "udp", "--addr", addr, "--port", "7777",
                                                     "--count", str(count), "--warmup", "50"]),
                             capture_output=True, text=True, cwd=ROOT, check=True, timeout=120).stdout
    finally:
        srv.kill()
        srv.wait()
    return np.array(json.loads(out)["rtt_ns"], dtype=np.int64)


@contextmanager
def direct_pair():
    """Two namespaces joined by one veth, set up as the cluster's hosts are: the baseline."""
    a, b = DIRECT_NS
    for ns in DIRECT_NS:
        netns.del_netns(ns)  # a killed earlier bench run's
    try:
        for ns in DIRECT_NS:
            netns.add_netns(ns)
        netns.run([netns.tool("ip"), "link", "add", "eth0", "netns", a, "type", "veth", "peer", "name",
                   "eth0", "netns", b])
        for i, ns in enumerate(DIRECT_NS):
            netns.ip_batch(ns, ["link set lo up", f"addr add 10.78.0.{i + 1}/24 dev eth0", "link set eth0 up"])
            netns.offloads_off(ns, "eth0")
        yield a, b
    finally:
        for ns in DIRECT_NS:
            netns.del_netns(ns)


def q_us(x: np.ndarray, p: float) -> float:
    return float(np.percentile(x, p)) / 1e3


# ---- blaster ------------------------------------------------------------------
class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("msg_name", ctypes.c_void_p), ("msg_namelen", ctypes.c_uint32),
                ("msg_iov", ctypes.POINTER(_IoVec)), ("msg_iovlen", ctypes.c_size_t),
                ("msg_control", ctypes.c_void_p), ("msg_controllen", ctypes.c_size_t),
                ("msg_flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint32)]


def blast(ifname: str, dst_mac: str, src_mac: str, seconds: float, batch: int = 256) -> dict:
    """Send minimum-size frames as fast as sendmmsg goes; runs inside the sending host."""
    libc = ctypes.CDLL(None, use_errno=True)
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    s.bind((ifname, 0))
    frame = (bytes.fromhex(dst_mac.replace(":", "")) + bytes.fromhex(src_mac.replace(":", "")) +
             ETH_P_BENCH.to_bytes(2, "big") + bytes(46))
    buf = ctypes.create_string_buffer(frame, len(frame))
    iov = _IoVec(ctypes.cast(buf, ctypes.c_void_p), len(frame))
    msgs = (_MMsgHdr * batch)()
    for m in msgs:
        m.msg_hdr.msg_iov = ctypes.pointer(iov)
        m.msg_hdr.msg_iovlen = 1
    sent = 0
    t0 = time.monotonic_ns()
    end = t0 + int(seconds * 1e9)
    while time.monotonic_ns() < end:
        n = libc.sendmmsg(s.fileno(), msgs, batch, 0)
        if n > 0:
            sent += n
    return {"sent": sent, "t0_ns": t0, "t1_ns": time.monotonic_ns()}


def max_rate(delay_ms: float, seconds: float, senders: int) -> dict:
    with Cluster(2, wire_delay_ms=delay_ms, wait_s=120) as c:
        h0, h1 = c.host("h0"), c.host("h1")
        procs = [c.popen(h0, [PY, "-m", "bench.wire", "blast", h0.ifname, h1.mac, h0.mac, str(seconds)],
                         stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(senders)]
        runs = [json.loads(p.communicate()[0]) for p in procs]
        # wait for the wire to drain what it still holds (a condition, not a guess)
        deadline = time.monotonic() + 10
        while c.forwarder_stats().get("queued_now", 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        df = c.wire_log()
        stats = c.forwarder_stats()
    sent = sum(r["sent"] for r in runs)
    t0, t1 = min(r["t0_ns"] for r in runs), max(r["t1_ns"] for r in runs)
    df = df[df.ethertype == ETH_P_BENCH]
    fwd = df[~df.dropped]
    span_ns = int(fwd.t_out_mono_ns.max() - fwd.t_out_mono_ns.min()) if len(fwd) > 1 else 0
    cpu_ns_per_frame = stats["cpu_ns"] / stats["frames_in"] if stats.get("frames_in") else float("nan")
    return {
        "delay_ms": delay_ms, "senders": senders,
        "offered_pps": sent / ((t1 - t0) / 1e9),
        "forwarded_pps": len(fwd) / (span_ns / 1e9) if span_ns else 0.0,
        "sent": sent, "forwarded": len(fwd),
        "loss_frac": 1 - len(fwd) / sent if sent else 0.0,
        "kernel_drops": stats.get("kernel_drops"), "pool_drops": stats.get("dropped_pool"),
        "max_queued": stats.get("max_queued"),
        # the forwarder's own CPU per frame (rx, tx and the softirq work its
        # sends trigger): the rate one core could carry, whatever the sender managed
        "cpu_ns_per_frame": cpu_ns_per_frame,
        "capacity_pps_one_core": 1e9 / cpu_ns_per_frame,
        "late_p99_us": q_us((fwd.delay_actual_ns - fwd.delay_applied_ns).to_numpy(), 99),
    }


def psbench_rate(seconds: float) -> dict:
    """The packet rate psbench's demo shape (2 servers x 4 workers, closed loop) puts on the wire."""
    import tempfile

    from workloads.psbench.launch import launch_in_cluster

    with tempfile.TemporaryDirectory(prefix="pslat-bench-wire-") as out:
        with Cluster(6, wait_s=120) as c:
            with launch_in_cluster(c, Path(out) / "psbench", servers=2, workers=4, duration_s=seconds) as job:
                job.wait()
            df = c.wire_log()
    fwd = df[~df.dropped]
    per_s = ((fwd.t_in_mono_ns - fwd.t_in_mono_ns.min()) // 1_000_000_000).value_counts()
    return {"seconds": seconds, "frames": len(df), "dropped": int(df.dropped.sum()),
            "mean_pps": len(fwd) / ((fwd.t_in_mono_ns.max() - fwd.t_in_mono_ns.min()) / 1e9),
            "busiest_second_pps": int(per_s.max()),
            "residence_p99_us": q_us((fwd.delay_actual_ns - fwd.delay_applied_ns).to_numpy(), 99)}


# ---- the benchmark ------------------------------------------------------------
def measure(count: int, blast_s: float, senders: int, psbench_s: float) -> dict:
    with direct_pair() as (a, b):
        direct = pingpong_rtts_ns(None, b, a, "10.78.0.2", count)
    wire = {}
    for delay_ms in (0.0, 1.0):
        with Cluster(2, wire_delay_ms=delay_ms, wait_s=120) as c:
            rtt = pingpong_rtts_ns(None, "h1", "h0", c.host("h1").addr, count)
            log = c.wire_log()
        log = log[~log.dropped]
        err = (log.delay_actual_ns - log.delay_applied_ns).to_numpy()
        wire[delay_ms] = {"rtt": rtt, "err": err, "actual": log.delay_actual_ns.to_numpy()}
    added_us = (np.median(wire[0.0]["rtt"]) - np.median(direct)) / 2 / 1e3
    err1 = wire[1.0]["err"]
    e2e_err_us = ((np.median(wire[1.0]["rtt"]) - np.median(wire[0.0]["rtt"])) / 1e3 - 2000) / 2
    rates = [max_rate(d, blast_s, senders) for d in (0.0, 1.0)]
    return {
        "pingpong_count": count,
        "rtt_direct_p50_us": q_us(direct, 50), "rtt_wire0_p50_us": q_us(wire[0.0]["rtt"], 50),
        "rtt_wire1ms_p50_us": q_us(wire[1.0]["rtt"], 50),
        "added_one_way_at_0ms_us": added_us,
        "residence_at_0ms_p50_us": q_us(wire[0.0]["actual"], 50),
        "residence_at_0ms_p99_us": q_us(wire[0.0]["actual"], 99),
        "error_at_1ms_p50_us": q_us(err1, 50), "error_at_1ms_p99_us": q_us(err1, 99),
        "error_at_1ms_p999_us": q_us(err1, 99.9), "error_at_1ms_max_us": float(err1.max()) / 1e3,
        "error_at_1ms_std_us": float(err1.std()) / 1e3,
        "e2e_one_way_error_at_1ms_us": e2e_err_us,
        "max_rate": rates,
        "psbench": psbench_rate(psbench_s) if psbench_s > 0 else None,
    }


def summary(r: dict) -> str:
    lines = [
        f"ping-pong ({r['pingpong_count']} UDP round trips each), RTT p50: direct veth "
        f"{r['rtt_direct_p50_us']:.1f} us, wire 0 ms {r['rtt_wire0_p50_us']:.1f} us, "
        f"wire 1 ms {r['rtt_wire1ms_p50_us']:.1f} us",
        f"added one-way delay at 0 ms configured: {r['added_one_way_at_0ms_us']:.1f} us "
        f"(wire residence, kernel rx -> send: p50 {r['residence_at_0ms_p50_us']:.1f} us, "
        f"p99 {r['residence_at_0ms_p99_us']:.1f} us)",
        f"at 1 ms configured, actual - applied per frame: p50 {r['error_at_1ms_p50_us']:.2f} us, "
        f"p99 {r['error_at_1ms_p99_us']:.2f} us, p99.9 {r['error_at_1ms_p999_us']:.1f} us, "
        f"max {r['error_at_1ms_max_us']:.1f} us, stddev {r['error_at_1ms_std_us']:.2f} us; "
        f"end to end (RTT 1 ms - RTT 0 ms - 2 ms)/2: {r['e2e_one_way_error_at_1ms_us']:.1f} us",
    ]
    for m in r["max_rate"]:
        lines.append(f"max rate at {m['delay_ms']:g} ms: forwarded {m['forwarded_pps'] / 1e3:.0f} kpps "
                     f"(offered {m['offered_pps'] / 1e3:.0f} kpps, loss {100 * m['loss_frac']:.2f} %, "
                     f"kernel drops {m['kernel_drops']}, max queued {m['max_queued']}, "
                     f"late p99 {m['late_p99_us']:.1f} us); forwarder CPU {m['cpu_ns_per_frame']:.0f} "
                     f"ns/frame = {m['capacity_pps_one_core'] / 1e3:.0f} kpps on one core")
    if r["psbench"]:
        p = r["psbench"]
        lines.append(f"psbench 2 servers x 4 workers puts {p['mean_pps'] / 1e3:.1f} kpps on the wire "
                     f"(busiest second {p['busiest_second_pps'] / 1e3:.1f} kpps), {p['dropped']} dropped, "
                     f"residence p99 {p['residence_p99_us']:.1f} us")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="What the cluster's wire adds, its precision, its max rate.")
    sub = ap.add_subparsers(dest="cmd")
    b = sub.add_parser("blast", help="(internal) the sender, run inside a host")
    b.add_argument("ifname")
    b.add_argument("dst_mac")
    b.add_argument("src_mac")
    b.add_argument("seconds", type=float)
    ap.add_argument("--count", type=int, default=2000, help="ping-pong round trips per setting")
    ap.add_argument("--blast-s", type=float, default=2.0, help="seconds of each max-rate blast")
    ap.add_argument("--senders", type=int, default=2, help="blasting processes in h0")
    ap.add_argument("--psbench-s", type=float, default=5.0,
                    help="seconds of psbench to measure its packet rate (0: skip)")
    a = ap.parse_args(argv)
    if a.cmd == "blast":
        print(json.dumps(blast(a.ifname, a.dst_mac, a.src_mac, a.seconds)))
        return
    from core.errors import require_root

    require_root("bench.wire")
    r = measure(a.count, a.blast_s, a.senders, a.psbench_s)
    print(summary(r))
    print(json.dumps(r))


if __name__ == "__main__":
    from core.errors import run_main

    run_main("bench.wire", main)
