"""The agent's endpoint under hostile clients (issue 11, finding 4): idle connections, a
slowloris, a reader that never reads, repeated scrapes. The endpoint runs in a process of
its own (tests/unit/live_http_child.py: the recorded run's aggregates, a run-dir writer
closing a shard every 0.2 s, the soft RLIMIT_NOFILE at 512) so its threads, descriptors and
CPU are read from /proc."""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.daemon import replay
from agent.live import LiveAggregates

ROOT = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("live_http_child.py")
NOFILE_SOFT = 512
IDLE_CLIENTS = 1000
# what the endpoint may add to the agent's own threads and descriptors under any load: its
# one thread, and the connections it keeps (agent.http caps them at 64) with a few to spare
MAX_EXTRA_THREADS = 1
MAX_EXTRA_FDS = 64 + 8


class Child:
    def __init__(self, out: Path):
        self.p = subprocess.Popen([sys.executable, str(CHILD), str(out), str(NOFILE_SOFT)], cwd=ROOT,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=dict(os.environ, PYTHONPATH=str(ROOT)))
        self.address = self.p.stdout.readline().strip()   # printed once serving: the ready signal
        assert self.address, "the child agent did not start"
        self.host, port = self.address.rsplit(":", 1)
        self.port = int(port)

    def threads(self) -> int:
        return int(next(ln.split()[1] for ln in Path(f"/proc/{self.p.pid}/status").read_text().splitlines()
                        if ln.startswith("Threads:")))

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.p.pid}/fd"))

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def get(self, path: str, timeout_s: float = 5.0) -> bytes:
        with urllib.request.urlopen(f"http://{self.address}{path}", timeout=timeout_s) as r:
            return r.read()

    def finish(self) -> dict:
        out, _ = self.p.communicate(timeout=30)
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()


@pytest.fixture
def child(tmp_path):
    c = Child(tmp_path / "run")
    yield c
    c.kill()


def _dropped(metrics: bytes) -> dict[str, float]:
    fams = {f.name: f for f in text_string_to_metric_families(metrics.decode())}
    return {s.labels["reason"]: s.value for s in fams["pslat_http_connections_dropped"].samples
            if s.name.endswith("_total")}


def test_1000_idle_clients_hold_no_threads_or_descriptors_and_the_writer_writes(child, tmp_path):
    child.get("/metrics")
    base_threads, base_fds = child.threads(), child.fds()
    idle = []
    t_flood = time.monotonic()
    try:
        for _ in range(IDLE_CLIENTS):   # connect and say nothing, as a scanner or a stuck scraper does
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex((child.host, child.port))
            idle.append(s)
        max_threads = max_fds = 0
        scrapes_s, dropped = [], {}
        t_end = time.monotonic() + 30
        # until every idle client was cut (over the cap, or at the 2 s header deadline; a connect
        # past the listen backlog arrives with the SYN retried 1 s, 3 s later), with real scrapes
        # meanwhile, the 1,000 still connected on the client side
        while sum(dropped.values()) < IDLE_CLIENTS and time.monotonic() < t_end:
            for _ in range(10):
                max_threads, max_fds = max(max_threads, child.threads()), max(max_fds, child.fds())
                time.sleep(0.05)   # sampling /proc between scrapes
            t0 = time.monotonic()
            dropped = _dropped(child.get("/metrics", timeout_s=5))
            scrapes_s.append(time.monotonic() - t0)
    finally:
        for s in idle:
            s.close()
    print(f"\nthreads {base_threads} -> max {max_threads}, fds {base_fds} -> max {max_fds}, "
          f"{len(scrapes_s)} scrapes, slowest {1e3 * max(scrapes_s):.1f} ms, dropped {dropped}")
    assert max_threads <= base_threads + MAX_EXTRA_THREADS
    assert max_fds <= base_fds + MAX_EXTRA_FDS
    # a scrape that connects during the flood waits in the listen backlog behind up to 1,000 accepts
    # (each closes an idle one): 0.1-0.4 s here, 1.3 s once under the whole suite at load 15
    assert max(scrapes_s) < 3.0
    assert sum(dropped.values()) >= IDLE_CLIENTS   # each counted (over the cap, or at the header deadline)
    flood_s = time.monotonic() - t_flood
    got = child.finish()
    assert got["shards_failed"] == 0 and got["rows_dropped"] == 0 and not got["warnings"], got
    # a shard every 0.2 s all along (half of them at least: the writer's loop runs late under load)
    assert len(list((tmp_path / "run").glob("rows-*.parquet"))) >= 0.5 * flood_s / 0.2


def _closed_after(s: socket.socket, trickle: bytes, every_s: float, give_up_s: float) -> float | None:
    """Send `trickle` a byte every `every_s`; seconds until the server closed, None if it never did."""
    t0 = time.monotonic()
    for i in range(10**6):
        if time.monotonic() - t0 > give_up_s:
            return None
        if select.select([s], [], [], every_s)[0]:
            try:
                if s.recv(65536) == b"":
                    return time.monotonic() - t0
            except ConnectionResetError:
                return time.monotonic() - t0
            continue
        try:
            s.send(trickle[i % len(trickle):i % len(trickle) + 1])
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - t0


def test_a_slowloris_is_cut_at_the_header_deadline(child):
    with socket.create_connection((child.host, child.port)) as s:
        closed = _closed_after(s, b"GET /metrics HTTP/1.1\r\nX-a: " + b"b" * 10_000, 0.5, give_up_s=10)
    assert closed is not None and closed < 2.0 + 1.0, closed
    assert _dropped(child.get("/metrics"))["header_timeout"] >= 1


def _raw_get(child, path: str) -> tuple[int, bytes]:
    """(status, body) of one GET on a connection of its own (a 429 is an answer here, not an error)."""
    with socket.create_connection((child.host, child.port), timeout=5) as s:
        s.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
        data = b""
        while chunk := s.recv(1 << 20):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_repeated_scrapes_are_served_from_the_cache_and_rate_limited(child):
    from agent.http import MAX_REQUESTS_PER_S
    for path in ("/metrics", "/snapshot.json"):
        time.sleep(1.0)   # the rate's bucket refilled: each path starts with a full burst
        n = 500   # enough requests for the CPU clock's 10 ms ticks to resolve a fraction of a ms each
        cpu0, t0 = child.cpu_s(), time.monotonic()
        got = [_raw_get(child, path) for _ in range(n)]
        cpu_ms = 1e3 * (child.cpu_s() - cpu0) / n
        wall = time.monotonic() - t0
        codes = Counter(code for code, _ in got)
        bodies = {body for code, body in got if code == 200}
        print(f"\n{path}: {cpu_ms:.2f} ms of the agent's CPU per request, {n} in {wall:.2f} s, "
              f"{dict(codes)}, {len(bodies)} distinct bodies")
        # the writer's own loop (a row every 20 ms, a shard every 0.2 s) is in this figure too
        assert cpu_ms < 1.5, cpu_ms
        assert set(codes) <= {200, 429}
        assert 1 <= codes[200] <= MAX_REQUESTS_PER_S * (1 + wall) + 1   # a burst, then the rate
        assert len(bodies) <= 2 + wall / 0.5   # one render per cache period at most


class _BigLive(LiveAggregates):
    def snapshot(self):   # 16 MB: far more than the socket buffers of a reader that does not read
        return {"pad": "x" * 16_000_000}


class _BrokenLive(LiveAggregates):
    def snapshot(self):
        raise RuntimeError("a bug in a page")


def test_a_page_that_fails_costs_its_client_not_the_endpoint():
    from agent.http import serve
    server = serve("127.0.0.1:0", _BrokenLive())
    try:
        with pytest.raises(OSError):   # closed without an answer (http.client: RemoteDisconnected)
            urllib.request.urlopen(f"http://{server.address}/snapshot.json", timeout=5).read()
        body = urllib.request.urlopen(f"http://{server.address}/metrics", timeout=5).read()
        assert _dropped(body) == {"error": 1}
    finally:
        server.close()


def test_a_reader_that_never_reads_is_cut_at_the_request_deadline(monkeypatch):
    import agent.http
    from agent.http import serve
    REQUEST_TIMEOUT_S = 2.0   # the deadline, shortened for the test (10 s in the agent)
    monkeypatch.setattr(agent.http, "REQUEST_TIMEOUT_S", REQUEST_TIMEOUT_S)
    server = serve("127.0.0.1:0", _BigLive())
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", server.port))
        s.sendall(b"GET /snapshot.json HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(REQUEST_TIMEOUT_S + 1.5)   # a reader that stalls: what the endpoint does meanwhile is the test
        got = 0
        s.settimeout(5)
        try:
            while chunk := s.recv(1 << 20):
                got += len(chunk)
        except (ConnectionResetError, socket.timeout):
            pass
        s.close()
    finally:
        server.close()
    assert got < 16_000_000   # cut: the endpoint gave up on it instead of waiting for ever


def test_the_cache_is_short():
    live = LiveAggregates(agent="recorded")
    with tempfile.TemporaryDirectory() as out:
        replay(ROOT / "tests" / "data" / "agent" / "psbench.rec.gz", Path(out), live=live)
    from agent.http import CACHE_S, serve
    server = serve("127.0.0.1:0", live)
    try:
        def lost():
            body = urllib.request.urlopen(f"http://{server.address}/metrics", timeout=5).read().decode()
            fams = {f.name: f for f in text_string_to_metric_families(body)}
            return {s.labels["probe"]: s.value for s in fams["pslat_events_lost"].samples}
        assert lost() == {}
        live.tick({"sockcalls": {"lost": 7}}, 0)
        t0 = time.monotonic()
        while lost() != {"sockcalls": 7}:
            assert time.monotonic() - t0 < CACHE_S + 1.0, "a cached scrape outlived the cache period"
            time.sleep(0.05)
    finally:
        server.close()


def test_headers_too_large_or_not_http_get_an_error_not_a_wait(child):
    for req, code in ((b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n", b"431"),
                      (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"400"),
                      (b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n", b"405")):
        with socket.create_connection((child.host, child.port), timeout=5) as s:
            s.sendall(req)
            head = s.recv(64)
        assert head.startswith(b"HTTP/1.1 " + code), (req[:20], head)
