"""Bounded agent memory under connection churn (issue 11, finding 3).

A network namespace of the test's own (not the virtual cluster: one per machine,
and this needs none of its wire) holds a server on two ports and a client that
opens CONNECTIONS connections at RATE_PER_S: each sends a few bytes, gets a few
back and closes (health checks, `--reconnect-every`). Every SCAN_EVERY-th tick
the client also scans: a connect closed at once without data (an RST: SO_LINGER
0) on a listening port, or a connect to the traced port nobody listens on
(refused). The real agent traces all of it (`pslat agent --netns`, with the live
endpoint, whose bookkeeping keeps connections too); its RSS is read from
/proc/PID/status every second. Connection state is dropped when the close is
seen, so the RSS must be flat: its slope over the second half under
GROWTH_MAX_BYTES_PER_S. Where the agent cannot keep up and its rings lose close events
(on a loaded 2-vCPU machine the netstack ring lost 87% of them), the caps bound
what stays. Before the fix the RSS grew by 420 MB over the run (322 -> 744 MB),
68 MB of it in the second half; after it, 322 -> 405 MB while the caps filled
(91% of the close events lost), then flat: +0.2 MB over the second half.

Run time: 60 s of traffic at best, plus the agent's start-up (compiling its
probes). With 100,000 connections (100 s) it took 185-325 s on a 2-vCPU machine at
load 10-15 (start-up 53-105 s, traffic 114-198 s: the client could not keep
1,000/s), 119.5 s in CI; with 60,000, 81 s. 40,000 were too few: the caps were
still filling in the second half (+8.9 MB over 20 s in a fresh-clone run). Judged by
the floors of the first and last 10 s of the second half (growth under 5 MB), a CI run
at 60,000 failed at 5.8 MB while its slope was 0.06 MB/s: the floors of a 10 s window of
the saw-tooth differ by several MB from run to run, so the slope is what is judged.
"""
from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.privileged

CONNECTIONS = 60_000
RATE_PER_S = 1_000
SCAN_EVERY = 4               # one scan connect per 4 data connections (on top of them)
PORTS = (5001, 5002)         # listening
CLOSED_PORT = 5003           # traced, nothing listens: what a scan mostly finds
# about half the unfixed agent's growth (1.36 MB/s); the fixed one measured 0.06, 0.35 and
# (after every cap had filled, 71-100 s of 100,000 connections) 0.37 MB/s: a creep of a
# few hundred bytes per connection that is not explained yet
GROWTH_MAX_BYTES_PER_S = 768 << 10
NETNS = f"pslat-churn-{os.getpid()}"
PING, PONG = b"ping\n", b"pong\n"


# ---- the peers (run as `python this_file serve|client` inside the namespace) -----------

def _serve() -> None:
    def loop(s: socket.socket) -> None:
        while True:
            c, _ = s.accept()
            try:
                if c.recv(64):
                    c.sendall(PONG)
            except OSError:
                pass   # a scan's RST
            c.close()  # the server closes first, as an HTTP/1.0 health check does

    listeners = []
    for port in PORTS:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(1024)
        listeners.append(s)
    for s in listeners[1:]:
        threading.Thread(target=loop, args=(s,), daemon=True).start()
    print("listening", flush=True)
    loop(listeners[0])


def _client(n: int, rate: float) -> None:
    rst = struct.pack("ii", 1, 0)
    failed = 0
    t0 = time.monotonic()
    for i in range(n):
        delay = t0 + i / rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            with socket.create_connection(("127.0.0.1", PORTS[i % 2]), timeout=5) as c:
                c.sendall(PING)
                c.recv(64)
        except OSError:
            failed += 1
        if i % SCAN_EVERY == 0:
            s = socket.socket()
            try:
                if (i // SCAN_EVERY) % 2:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, rst)
                    s.connect(("127.0.0.1", PORTS[0]))
                else:
                    s.connect_ex(("127.0.0.1", CLOSED_PORT))
            finally:
                s.close()
    print(f"done {n} failed {failed} in {time.monotonic() - t0:.1f} s", flush=True)


# ---- the test ---------------------------------------------------------------------------

def _ns(*argv: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["ip", "netns", "exec", NETNS, *argv], **kw)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.fixture
def netns():
    subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)
    subprocess.run(["ip", "netns", "add", NETNS], check=True)
    try:
        for cmd in (["ip", "link", "set", "lo", "up"],
                    # ports for 100,000 connections in 100 s; the client's side never
                    # waits in TIME_WAIT (the server closes first), the server's does
                    ["sysctl", "-qw", "net.ipv4.ip_local_port_range=10000 65000"]):
            subprocess.run(["ip", "netns", "exec", NETNS, *cmd], check=True)
        yield NETNS
    finally:
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True)


def test_agent_rss_flat_under_connection_churn_and_a_port_scan(tmp_path, netns):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from test_agent_cluster import Agent   # the agent as a child process, ready on its signal
    from agent.rundir import read_run_dir

    t_start = time.monotonic()
    server = _ns(sys.executable, __file__, "serve", stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        assert server.stdout.readline().strip() == "listening"
        ports = [a for p in (*PORTS, CLOSED_PORT) for a in ("--port", str(p))]
        agent = Agent(tmp_path / "agent", [netns], extra=("--sample-rate", "1", "--listen", "127.0.0.1:0", *ports))
        pid = agent.proc.pid
        t_ready = time.monotonic()
        client = _ns(sys.executable, __file__, "client", str(CONNECTIONS), str(RATE_PER_S),
                     stdout=subprocess.PIPE, text=True)
        samples: list[tuple[float, int]] = []
        t0 = time.monotonic()
        while client.poll() is None:
            samples.append((time.monotonic() - t0, _rss_bytes(pid)))
            time.sleep(1.0)
        done = client.stdout.read()
        assert client.returncode == 0, done
        t_done = time.monotonic()
        # SIGTERM: a service manager's stop, the rings' rest counted as lost, not decoded
        # (SIGINT decodes for up to 10 s more); the counters are final either way
        agent.proc.send_signal(signal.SIGTERM)
        log = "".join(agent.log) + agent.proc.stderr.read()
        assert agent.proc.wait(60) == 0, log
        print(f"start-up {t_ready - t_start:.1f} s, traffic {t_done - t_ready:.1f} s, "
              f"stop {time.monotonic() - t_done:.1f} s")
    finally:
        if agent is not None:
            agent.kill()
        server.kill()
        server.wait()
    (tmp_path / "rss.txt").write_text("".join(f"{t:.1f} {r}\n" for t, r in samples))
    print(done.strip(), f"agent RSS (MB): {[round(r / 2**20) for _, r in samples]}")

    failed = int(done.split()[3])
    assert failed < CONNECTIONS // 100, done
    # the slope of the second half, as the median of the slopes between every two samples
    # (Theil-Sen): the RSS is a saw-tooth of the rows buffered between shard flushes (2 s:
    # +-10 MB at 1,000 rows/s), which the median ignores (a CI run at 60,000: 0.06 MB/s,
    # where the floors of its first and last 10 s differed by 5.8 MB); a leak grows at its
    # rate per connection times RATE_PER_S (1.36 MB/s before the fix)
    t, rss = (np.array(v, dtype=float) for v in zip(*samples[len(samples) // 2:]))
    i, j = np.triu_indices(len(t), 1)
    slope = float(np.median((rss[j] - rss[i]) / (t[j] - t[i])))
    assert slope < GROWTH_MAX_BYTES_PER_S, (
        f"agent RSS grew by {slope / 2**20:.2f} MB/s over the second half "
        f"({len(samples)} s, {CONNECTIONS} connections)")

    # the churn was traced: the decoder saw the data connections and dropped them at
    # their close (a close event the full ring lost leaves its connection to the cap)
    rd = read_run_dir(tmp_path / "agent" / netns)
    c = rd.meta["counters"]
    ns = c["probes"]["netstack"]
    print({k: v for k, v in c.items() if k.endswith(("_closed", "_evicted", "_expired", "_reused"))
           or k in ("connections", "events_consumed")}, "netstack", ns)
    delivered = 1 - ns.get("lost", 0) / max(1, ns["seen"])   # seen: what the probe made, lost or not
    assert c.get("connections", 0) >= CONNECTIONS * 0.5, (c, log[-2000:])
    # 0.7: the decoder holds CONNS_MAX (8,192) connections, and the netstack ring (3.3x the
    # sockcalls ring's events here) is read after the sockcalls ring, so a close can come
    # after its connection was evicted for a newer one: a fresh-clone run with 0 events lost
    # closed 93,961 of 120,000 (78%), evicted 17,704 and held 8,049 at the stop; an agent
    # that never drops a connection at its close closes none
    assert c.get("decoder_conns_closed", 0) >= 0.7 * c["connections"] * delivered, c
    assert c.get("connection_rows_evicted", 0) <= c["connections"] * (1 - delivered) + 100, c

    # every connection the decoder let go is a row of the streams table; ping/pong is no
    # protocol pslat knows: said as unrecognised, with what it moved (5 bytes each way)
    s = rd.tables["streams"]
    dropped = sum(c.get(f"decoder_conns_{why}", 0) for why in ("closed", "idle_expired", "evicted", "reused"))
    assert len(s[s.end != "open_at_stop"]) == dropped, (len(s), c)   # and the still open ones, at the stop
    assert set(s.protocol) <= {"unrecognised", "none"}, s.protocol.value_counts()
    whole = s[(s.calls_tx == 1) & (s.calls_rx == 1)]
    assert len(whole) >= 0.5 * CONNECTIONS * delivered, (len(whole), len(s))
    client = whole.remote_port.isin(PORTS)
    # bytes are sequence space: the server's FIN, read with the pong, counts one
    assert ((whole.bytes_tx == len(PING)) & whole.bytes_rx.isin((len(PONG), len(PONG) + 1)))[client].all()
    assert ((whole.bytes_tx == len(PONG)) & (whole.bytes_rx == len(PING)))[~client].all()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        _serve()
    else:
        _client(int(sys.argv[2]), float(sys.argv[3]))
