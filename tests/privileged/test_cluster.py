"""The virtual cluster: known delays, truthful per-frame log, nothing left behind."""
from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from core.errors import UserError
from workloads.cluster import netns, state
from workloads.cluster.cluster import Cluster

pytestmark = pytest.mark.privileged

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]
PSLAT = Path(sys.executable).parent / "pslat"
# One cluster per machine: wait for a colleague's test cluster instead of failing.
WAIT_S = 120


def _start_server(c: Cluster, host: str, proto: str = "tcp", size: int = 64) -> subprocess.Popen:
    srv = c.popen(host, [PY, "-m", "workloads.cluster.pingpong", "server", "--proto", proto,
                         "--port", "7777", "--size", str(size)],
                  stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert srv.stdout.readline().strip() == "ready"
    return srv


def _ping(c: Cluster, host: str, addr: str, count: int, proto: str = "tcp", size: int = 64) -> list[int]:
    r = c.run(host, [PY, "-m", "workloads.cluster.pingpong", "client", "--proto", proto, "--addr", addr,
                     "--port", "7777", "--count", str(count), "--size", str(size)],
              capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["rtt_ns"]


def _low_rtt_ns(delay_ms: float) -> float:
    """The 10th percentile of 150 ping-pongs' RTTs: on an idle 2-vCPU VM the forwarder
    woke up to 2.6 ms late for a quarter of the frames (its log says so), which moved
    the median by 0.4-0.6 ms; the wire's delay is what an on-time round trip shows."""
    with Cluster(2, wire_delay_ms=delay_ms, wait_s=WAIT_S) as c:
        _start_server(c, "h1")
        return statistics.quantiles(_ping(c, "h0", c.host("h1").addr, count=150), n=10)[0]


def test_tcp_rtt_grows_by_twice_the_one_way_delay():
    base_ns = _low_rtt_ns(0.0)
    delayed_ns = _low_rtt_ns(2.0)
    growth_ms = (delayed_ns - base_ns) / 1e6
    assert growth_ms == pytest.approx(4.0, rel=0.10), (base_ns, delayed_ns)


def _wait_until(cond, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def test_wire_log_matches_a_capture_and_frames_fit_the_mtu(tmp_path):
    from scapy.all import IP, TCP, rdpcap

    pcap = tmp_path / "h1.pcap"
    with Cluster(2, wire_delay_ms=1.0, wait_s=WAIT_S) as c:
        for ns, ifs in c.describe()["offloads"].items():
            for dev, feats in ifs.items():
                for f in ("tcp-segmentation-offload", "generic-segmentation-offload",
                          "generic-receive-offload", "tx-checksumming"):
                    assert feats[f].startswith("off"), (ns, dev, f, feats[f])
        # --immediate-mode: no packet waits in a ring block; -U: each one is
        # written at once, so the file can be compared while it grows
        dump = c.popen("h1", ["tcpdump", "-Z", "root", "--immediate-mode", "-U", "-n", "-i", "eth0",
                              "-w", str(pcap), "tcp"], stderr=subprocess.PIPE, text=True)
        assert "listening on" in dump.stderr.readline()
        _start_server(c, "h1", size=5000)  # 5000-byte messages: several segments each way
        _ping(c, "h0", c.host("h1").addr, count=20, size=5000)

        def captured() -> Counter:
            try:
                pkts = rdpcap(str(pcap))
            except Exception:  # a packet being written: look again
                return Counter()
            return Counter((p[IP].src, p[IP].dst, p[TCP].sport, p[TCP].dport, p[TCP].seq,
                            len(p[TCP].payload)) for p in pkts)

        def logged() -> Counter:
            df = c.wire_log()
            df = df[(df.ip_proto == 6) & ((df.src_host == "h1") | (df.dst_host == "h1"))]
            return Counter(zip(df.ip_src, df.ip_dst, df.sport, df.dport, df.seq, df.payload_bytes))

        # the connection's last frames may still be on the wire: wait for both to agree
        assert _wait_until(lambda: logged() == captured()), (
            sorted((logged() - captured()).items())[:5], sorted((captured() - logged()).items())[:5])
        captured = captured()
        dump.send_signal(signal.SIGTERM)
        dump.wait(10)
        df = c.wire_log()
    assert sum(captured.values()) > 4 * 20  # 5000 B each way: 4 segments per message at least
    assert df.frame_bytes.max() <= 1514
    assert (df.payload_bytes > 0).any() and df.payload_bytes.max() <= 1460
    assert (df.delay_applied_ns == 1_000_000).all()
    assert not df.dropped.any()
    assert set(df.src_host) == {"h0", "h1"}


def _udp_from_h0(c: Cluster, code: str, frames: int):
    """Run `code` in h0 with `s` a UDP socket; the wire log once it holds `frames` records."""
    c.run("h0", [PY, "-c", "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n" + code],
          check=True)
    assert _wait_until(lambda: len(c.wire_log()) >= frames)
    return c.wire_log()


@pytest.mark.parametrize("dist, jitter_ms, expected_std_ms",
                         [("uniform", 0.5, 0.5 / 3 ** 0.5), ("normal", 0.2, 0.2)])
def test_jitter_has_the_distribution_asked_for(dist, jitter_ms, expected_std_ms):
    with Cluster(2, wire_delay_ms=1.0, jitter_ms=jitter_ms, jitter_dist=dist, wait_s=WAIT_S) as c:
        _start_server(c, "h1", proto="udp")
        # ping-pong: one frame per pair in flight, so FIFO never lifts a due time
        _ping(c, "h0", c.host("h1").addr, count=250, proto="udp")
        assert _wait_until(lambda: len(c.wire_log()) >= 500)
        df = c.wire_log()
    d_ms = df.delay_applied_ns / 1e6
    if dist == "uniform":
        assert d_ms.min() >= 0.5 and d_ms.max() <= 1.5
    assert d_ms.std() == pytest.approx(expected_std_ms, rel=0.2)
    assert d_ms.mean() == pytest.approx(1.0, abs=0.05)
    late_ns = df.delay_actual_ns - df.delay_applied_ns
    assert late_ns.median() < 50_000  # sent on time, not on the next millisecond tick


def test_a_burst_keeps_its_order_within_a_pair():
    with Cluster(2, wire_delay_ms=1.0, jitter_ms=0.5, wait_s=WAIT_S) as c:
        # 400 datagrams 20 us apart: many frames of one pair in flight at once,
        # and jitter (+-0.5 ms) that would reorder them if the wire let it
        df = _udp_from_h0(c, "for i in range(400):\n"
                             "  s.sendto(i.to_bytes(4,'big'),('10.77.0.2',9))\n"
                             "  t=time.monotonic_ns()+20000\n"
                             "  while time.monotonic_ns()<t: pass\n", frames=400)
    df = df[(df.src_host == "h0") & (df.dst_host == "h1") & (df.ip_proto == 17)]
    assert len(df) == 400
    by_in = df.sort_values("t_in_mono_ns")
    assert by_in.t_out_mono_ns.is_monotonic_increasing
    d_ms = by_in.delay_applied_ns / 1e6
    assert d_ms.min() >= 0.5 and d_ms.max() <= 1.5  # lifted to the predecessor's due, never past it
    assert d_ms.std() < 0.5 / 3 ** 0.5  # FIFO narrowed the spread: frames did queue behind others


def test_broadcast_goes_to_every_other_host_and_arp_is_static():
    with Cluster(3, wait_s=WAIT_S) as c:
        neigh = c.run("h0", ["ip", "neigh", "show", "dev", "eth0"], capture_output=True, text=True).stdout
        assert neigh.count("PERMANENT") == 2
        df = _udp_from_h0(c, "s.setsockopt(socket.SOL_SOCKET,socket.SO_BROADCAST,1)\n"
                             "s.sendto(b'x',('10.77.0.255',9))\n", frames=2)
    assert sorted(df.dst_host) == ["h1", "h2"] and set(df.src_host) == {"h0"}
    assert df.t_in_mono_ns.nunique() == 1  # one frame in, one copy per port


def _leftovers(names: list[str], pids: list[int]) -> list[str]:
    """What of a cluster made of `names` (plus the wire) and `pids` (its forwarder's
    first) still exists.

    Colleagues share the machine: a cluster that came up meanwhile has another
    forwarder (or none yet) in the state file and is not a leftover of ours."""
    current = state.read()
    theirs = current is not None and (current.get("forwarder") or {}).get("pid") != pids[0]
    ours = set(names) | ({"pslat-wire"} if not theirs else set())
    left = [f"netns {n}" for n in sorted(ours & netns.list_netns())]
    left += [f"pid {p}" for p in pids if netns.start_ticks(p) is not None]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    left += [f"link {ln.split(':')[1].strip()}" for ln in links.splitlines() if "02:70:73:" in ln]
    if current is not None and not theirs:
        left.append(f"{state.STATE_FILE} (owner {current.get('owner')})")
    return left


OWNER = """
import json, sys, time
from workloads.cluster.cluster import Cluster
c = Cluster(["kill-a", "kill-b"], wire_delay_ms=1.0, wait_s=%d).__enter__()
sleeper = c.popen("kill-a", ["sleep", "600"])
print(json.dumps({"forwarder": c.describe()["forwarder_pid"], "sleeper": sleeper.pid}), flush=True)
time.sleep(600)
""" % WAIT_S


def test_sigkill_of_the_owner_then_down_leaves_nothing():
    owner = subprocess.Popen([PY, "-c", OWNER], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        info = json.loads(owner.stdout.readline())
    finally:
        owner.kill()
        owner.wait()
    pids = [info["forwarder"], info["sleeper"]]
    assert all(netns.start_ticks(p) is not None for p in pids)  # it really was left running
    r = subprocess.run([str(PSLAT), "cluster", "down"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert _leftovers(["kill-a", "kill-b"], pids) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_kill_of_the_owner_tears_down(sig):
    code = OWNER.replace("c = Cluster(", "with Cluster(").replace(".__enter__()", " as c:")
    code = code.replace("\nsleeper", "\n    sleeper").replace("\nprint", "\n    print")
    code = code.replace("\ntime.sleep", "\n    time.sleep")
    # Ctrl-C as at a terminal: a runner started in the background (nohup, `cmd &`) hands
    # its children SIGINT ignored, and Python then installs no KeyboardInterrupt for it
    owner = subprocess.Popen([PY, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, cwd=ROOT, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    info = json.loads(owner.stdout.readline())
    owner.send_signal(sig)
    try:
        owner.wait(30)
    except subprocess.TimeoutExpired:
        owner.kill()   # not left holding the cluster for the tests after this one
        owner.wait()
        subprocess.run([str(PSLAT), "cluster", "down"], capture_output=True, timeout=60)
        raise
    assert owner.returncode != 0
    assert _leftovers(["kill-a", "kill-b"], [info["forwarder"], info["sleeper"]]) == []


def test_a_foreign_namespace_is_refused_not_deleted():
    foreign = f"pslat-foreign-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", foreign], check=True)
    try:
        with pytest.raises(UserError, match="not a pslat cluster"):
            with Cluster(["h0", foreign], wait_s=WAIT_S):
                pass
        assert foreign in netns.list_netns()
        assert "pslat-wire" not in netns.list_netns() and not state.STATE_FILE.exists()
    finally:
        subprocess.run(["ip", "netns", "del", foreign])


def test_cli_up_exec_status_down(tmp_path):
    up = subprocess.run([str(PSLAT), "cluster", "up", "--hosts", "2", "--wire-delay-ms", "0.5",
                         "--log-dir", str(tmp_path), "--json", "--wait-s", str(WAIT_S)],
                        capture_output=True, text=True)
    try:
        assert up.returncode == 0, up.stderr
        d = json.loads(up.stdout)
        assert [(h["netns"], h["addr"]) for h in d["hosts"]] == [("h0", "10.77.0.1"), ("h1", "10.77.0.2")]
        again = subprocess.run([str(PSLAT), "cluster", "up", "--hosts", "2"], capture_output=True, text=True)
        assert again.returncode != 0 and "already up" in again.stderr
        ex = subprocess.run([str(PSLAT), "cluster", "exec", "h1", "--", "ip", "-4", "-o", "addr", "show",
                             "eth0"], capture_output=True, text=True)
        assert ex.returncode == 0 and "10.77.0.2/24" in ex.stdout
        assert subprocess.run([str(PSLAT), "cluster", "exec", "h0", "--", "sh", "-c", "exit 3"]).returncode == 3
        st = subprocess.run([str(PSLAT), "cluster", "status"], capture_output=True, text=True)
        assert "running" in st.stdout and "10.77.0.1" in st.stdout
    finally:
        down = subprocess.run([str(PSLAT), "cluster", "down"], capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert _leftovers(["h0", "h1"], [d["forwarder_pid"]]) == []
    assert (tmp_path / "wire.bin").exists()  # a log dir the user named is kept


@pytest.mark.parametrize("args, words", [
    (["up", "--hosts", "0"], "at least 1 host"),
    (["up", "--hosts", "2", "--wire-delay-ms", "-1"], ">= 0 ms"),
    (["up", "--hosts", "2", "--jitter-dist", "pareto"], "unknown jitter distribution"),
    (["up", "--hosts", "2", "--pair-delay", "h0:h7=3"], "unknown host 'h7'"),
])
def test_bad_input_is_one_line_and_nonzero_and_leaves_nothing(args, words):
    before = netns.list_netns()
    r = subprocess.run([str(PSLAT), "cluster", *args], capture_output=True, text=True)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and lines[0].startswith("pslat: error:"), r.stderr
    # a colleague's cluster may come and go meanwhile: the state file names its
    # namespaces before they exist and until they are gone, so read it after
    # listing, then keep only what still exists
    new = netns.list_netns() - before
    others = set((state.read() or {}).get("namespaces", []))
    assert (new - others) & netns.list_netns() == set()
