"""What the netstack probe costs per hook hit, measured with kernel.bpf_stats_enabled.

One process in a namespace of its own runs loopback ping-pongs on two
connections: a traced port and a decoy port the filters reject. Phases: decoy
only, then traced only, each with the probe (plus the test harness that
plays the walker: test_probes_netstack.HARNESS) attached; the traced phase
also runs once before the probe attaches, for the round-trip rate without it.
Per BPF program: hits and mean ns per hit (run_time_ns / run_cnt from the
program's fdinfo). The sysctl is switched on only for the measurement and
restored. Prints the table (the figures the report quotes); asserts loose
bounds so that a pathological regression (a per-packet loop gone wrong) fails.
The round-trip times printed are indicative only: the machine's two cores
are shared. (TCP frees most skbs without the consume_skb tracepoint, so on
loopback that hook is rarely hit.)

This file is also the peer program: `python test_probes_netstack_cost.py pingpong`.
"""
from __future__ import annotations

import re
import socket
import sys
import time

import pytest
from test_probes_netstack import lo_netns  # noqa: F401 (fixture)

ROUND_TRIPS = 3000
MSG_BYTES = 100
STATS_SYSCTL = "/proc/sys/kernel/bpf_stats_enabled"


# ---------------------------------------------------------------- peer side

def _pair():
    lst = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(lst.getsockname())
    s = lst.accept()[0]
    return lst.getsockname()[1], c, s


def _pingpong(c, s, n: int) -> float:
    msg = b"m" * MSG_BYTES
    t0 = time.perf_counter()
    for _ in range(n):
        c.sendall(msg)
        got = 0
        while got < MSG_BYTES:
            got += len(s.recv(MSG_BYTES - got))
        s.sendall(msg)
        got = 0
        while got < MSG_BYTES:
            got += len(c.recv(MSG_BYTES - got))
    return time.perf_counter() - t0


def peer_pingpong() -> None:
    import json

    traced_port, tc, ts = _pair()
    decoy_port, dc, ds = _pair()
    print(json.dumps({"ready": True, "traced_port": traced_port, "decoy_port": decoy_port}), flush=True)
    for line in sys.stdin:
        phase = line.strip()
        c, s = (tc, ts) if phase == "traced" else (dc, ds)
        print(json.dumps({"phase": phase, "s": _pingpong(c, s, ROUND_TRIPS)}), flush=True)


if __name__ == "__main__":
    assert sys.argv[1] == "pingpong"
    peer_pingpong()
    sys.exit(0)


# ---------------------------------------------------------------- test side

def prog_stats(prog) -> dict[str, tuple[int, int]]:
    """BPF function name -> (run_cnt, run_time_ns), from each program's fdinfo."""
    out = {}
    for name, fn in prog.bpf.funcs.items():
        info = open(f"/proc/self/fdinfo/{fn.fd}").read()
        cnt = int(re.search(r"run_cnt:\s*(\d+)", info).group(1))
        ns = int(re.search(r"run_time_ns:\s*(\d+)", info).group(1))
        out[name.decode() if isinstance(name, bytes) else name] = (cnt, ns)
    return out


def delta(after, before):
    return {k: (after[k][0] - before.get(k, (0, 0))[0], after[k][1] - before.get(k, (0, 0))[1]) for k in after}


def rss_mib() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def bpf_stats():
    old = open(STATS_SYSCTL).read().strip()
    yield
    with open(STATS_SYSCTL, "w") as f:
        f.write(old)


def set_stats(on: bool) -> None:
    with open(STATS_SYSCTL, "w") as f:
        f.write("1" if on else "0")


@pytest.mark.privileged
def test_netstack_cost_per_hit(lo_netns, bpf_stats, tmp_path):
    from test_probes_netstack import Peer, Traced

    netns = lo_netns

    from probes.filters import Filters

    deadline = time.monotonic() + 60
    peer = Peer(["ip", "netns", "exec", netns, sys.executable, __file__, "pingpong"])
    traced = None
    try:
        ready = peer.read(deadline)

        def phase(name: str) -> float:
            peer.proc.stdin.write(name + "\n")
            peer.proc.stdin.flush()
            return peer.read(deadline)["s"]

        bare_s = phase("traced")
        rss0 = rss_mib()
        traced = Traced(Filters.build(netns=[netns], ports=[ready["traced_port"]]), tmp_path)
        rss1 = rss_mib()
        set_stats(True)
        s0 = prog_stats(traced.prog)
        decoy_s = phase("decoy")
        s1 = prog_stats(traced.prog)
        traced_s = phase("traced")
        s2 = prog_stats(traced.prog)
        set_stats(False)
        traced.prog.poll(10)
        counters = traced.prog.counters()["netstack"]
    finally:
        set_stats(False)
        peer.stop()
        if traced:
            traced.close()

    rows = []
    for label, d in (("decoy (filtered out)", delta(s1, s0)), ("traced", delta(s2, s1))):
        for fn, (cnt, ns) in sorted(d.items()):
            if cnt:
                rows.append((label, fn, cnt, ns / cnt))
    print(f"\n{'phase':22} {'program':22} {'hits':>8} {'ns/hit':>8}")
    for label, fn, cnt, per in rows:
        print(f"{label:22} {fn:22} {cnt:8d} {per:8.0f}")
    rt_us = lambda s: s / ROUND_TRIPS * 1e6  # noqa: E731
    print(f"round trip: {rt_us(bare_s):.1f} us without the probe, {rt_us(traced_s):.1f} us traced, "
          f"{rt_us(decoy_s):.1f} us decoy; RSS {rss0:.0f} -> {rss1:.0f} MiB with the program loaded; "
          f"counters {counters}")

    per_hit = {(label, fn): per for label, fn, _, per in rows}
    hits = {(label, fn): cnt for label, fn, cnt, _ in rows}
    # Every packet passes the TX and RX hooks; 4 packets per round trip at
    # least (2 data, ACKs may be delayed/merged).
    assert hits[("traced", "ns_start_xmit")] >= 2 * ROUND_TRIPS
    assert hits[("decoy (filtered out)", "ns_netif_receive")] >= 2 * ROUND_TRIPS
    assert counters["lost"] == 0
    # Loose bounds: the reject path is one or two map lookups; traced hits
    # scan rings of at most 64 entries.
    for fn in ("ns_start_xmit", "ns_netif_receive", "ns_dev_queue", "ns_data_ready"):
        assert per_hit[("decoy (filtered out)", fn)] < 2_000, fn
    for (label, fn), per in per_hit.items():
        assert per < 20_000, (label, fn, per)
