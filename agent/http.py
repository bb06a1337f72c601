"""The agent's live HTTP endpoint: /metrics (Prometheus text) and /snapshot.json (`pslat top`).

    server = serve("127.0.0.1:9465", live)   # a daemon thread; server.address is "ADDR:PORT" bound
    ...
    server.close()

Loopback by default: the snapshot names hosts, peers and keys of the traced
job, so exposing it beyond the machine is the user's explicit choice
(`--listen 0.0.0.0:PORT`). The metrics come from a CollectorRegistry of our
own (not the process-global one) whose collector reads LiveAggregates' totals
at scrape time, so the agent's loop never waits on a scrape beyond one lock.

Anyone who can reach the port is a client, so the endpoint is built to cost the
agent little whatever they do: one thread runs a selector loop (not a thread
per connection); at most MAX_CONNECTIONS are open at once (a descriptor each,
far below RLIMIT_NOFILE, so a flood cannot take the run-dir writer's); a
connection must finish its request headers within HEADER_TIMEOUT_S of its
accept (a slowloris trickling bytes is cut) and take its whole answer within
REQUEST_TIMEOUT_S (a reader that stops reading is cut); one request per
connection; each page is rendered at most once per CACHE_S, so scrapes at any
rate cost the agent a cached copy; past MAX_REQUESTS_PER_S (over all clients,
with a burst as large) a request gets a 429, so a client asking flat out cannot
keep the endpoint's thread, and with it the agent's GIL, busy. Connections closed without an answer are
counted by reason in pslat_http_connections_dropped_total.
"""
from __future__ import annotations

import errno
import ipaddress
import json
import selectors
import socket
import threading
import time
from collections import Counter
from http import HTTPStatus
from typing import Callable

from core.errors import UserError
from agent.live import EDGES_NS, PARENT_OF, PER_DECADE, LiveAggregates, cpu_seconds_self

DEFAULT_LISTEN = "127.0.0.1:9465"
# Prometheus buckets, 1 us .. 10 s, at live edges (so their counts are exact): every edge (12 a decade,
# 21% apart: histogram_quantile within 21%) for end-to-end and the groups; every 3rd (4 a decade, x1.78)
# for components and sub-components, which are many: docs/metrics.md counts the series
FINE_EDGE_IDX = list(range(len(EDGES_NS)))
COARSE_EDGE_IDX = list(range(0, len(EDGES_NS), PER_DECADE // 4))
MAX_CONNECTIONS = 64        # open at once: a Prometheus server or two and a few `pslat top`s need far fewer
HEADER_TIMEOUT_S = 2.0      # accept to the end of the request headers (a scraper sends them at once)
REQUEST_TIMEOUT_S = 10.0    # accept to the answer's last byte sent (snapshots of big jobs are MBs)
MAX_REQUEST_BYTES = 8192    # request line and headers; a GET has no body
CACHE_S = 0.5               # a page is rendered at most this often (a render costs the agent ~6-11 ms)
MAX_REQUESTS_PER_S = 50     # answered, over all clients: Prometheus scrapes every 15 s, each `pslat top` every 1 s
SEND_CHUNK_BYTES = 256 * 1024
LISTEN_BACKLOG = 1024       # connects waiting in the kernel to be accepted (no descriptor of ours yet)
ACCEPT_PAUSE_S = 0.1        # out of descriptors: accept again after this


def parse_listen(text: str) -> tuple[str, int]:
    """ "ADDR:PORT" (IPv6 as [ADDR]:PORT) -> (addr, port), or a UserError saying what to give."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
        p = int(port)
        if not sep or not 0 <= p <= 65535:
            raise ValueError
    except ValueError:
        raise UserError(f"--listen {text!r}: give ADDR:PORT with an IP address and a port 0-65535, "
                        f"e.g. {DEFAULT_LISTEN} (0 picks a free port)") from None
    return host, p


def _buckets(counts: dict[int, int], edge_idx: list[int]) -> list[tuple[str, int]]:
    """Cumulative (le, count) pairs at these live edges (exact: every edge is a live bucket's)."""
    out, cum, it = [], 0, iter(sorted(counts.items()))
    pending = next(it, None)
    for i in edge_idx:
        while pending is not None and pending[0] <= i:
            cum += pending[1]
            pending = next(it, None)
        out.append((f"{EDGES_NS[i] / 1e9:.9g}", cum))
    return out + [("+Inf", sum(counts.values()))]


def registry_for(live: LiveAggregates, http_dropped: Callable[[], dict[str, int]] | None = None):
    """A CollectorRegistry of our own exposing `live`, the agent's process_* metrics and the
    endpoint's own drops (when given). docs/metrics.md lists every metric: keep it current."""
    from prometheus_client import CollectorRegistry, ProcessCollector
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, \
        InfoMetricFamily

    from agent.sources import agent_version

    version = agent_version()

    class Collector:
        def collect(self):
            with live.lock:
                totals = {g: {c: dict(h.counts) for c, h in hs.items()} for g, hs in live.totals.items()}
                sums = {g: {c: h.sum_ns for c, h in hs.items()} for g, hs in live.totals.items()}
                groups = {g: {c: (dict(h.counts), h.sum_ns) for c, h in hs.items()}
                          for g, hs in live.group_totals.items()}
                messages = dict(live.messages)
                health = live._health()
                conns = {h: len(c) for h, c in live.conns.items()}
                opened, closed = dict(live.opened_total), dict(live.closed_total)
            labels = ["host", "role", "op", "peer"]
            e2e = HistogramMetricFamily("pslat_request_seconds", "Request time on this host (client: first "
                                        "to last stage it saw; server: its residence time)", labels=labels)
            grp = HistogramMetricFamily("pslat_group_seconds", "Time of one request in one group of this "
                                        "host's components (host, nic, network_and_remote, unsplit); a "
                                        "request's groups add up to its pslat_request_seconds",
                                        labels=labels + ["group"])
            comp = HistogramMetricFamily("pslat_component_seconds", "Time of one request in one component of "
                                         "the chain, as seen on this host; a request's components add up to "
                                         "its pslat_request_seconds", labels=labels + ["component"])
            sub = HistogramMetricFamily("pslat_subcomponent_seconds", "Time of one request in a "
                                        "sub-component: a part of its parent (a component or a larger "
                                        "sub-component); those of one parent add up to at most it",
                                        labels=labels + ["parent", "subcomponent"])
            for key in sorted(totals, key=lambda k: tuple(map(str, k))):
                ls = [str(x) for x in key]
                for c, counts in sorted(totals[key].items()):
                    if c == "e2e":
                        e2e.add_metric(ls, _buckets(counts, FINE_EDGE_IDX), sums[key][c] / 1e9)
                    elif c in PARENT_OF:
                        sub.add_metric(ls + [PARENT_OF[c], c], _buckets(counts, COARSE_EDGE_IDX), sums[key][c] / 1e9)
                    else:
                        comp.add_metric(ls + [c], _buckets(counts, COARSE_EDGE_IDX), sums[key][c] / 1e9)
                for g, (counts, sum_ns) in sorted(groups.get(key, {}).items()):
                    grp.add_metric(ls + [g], _buckets(counts, FINE_EDGE_IDX), sum_ns / 1e9)
            yield from (e2e, grp, comp, sub)
            msg = CounterMetricFamily("pslat_messages", "Protocol messages the agent recorded",
                                      labels=["host", "direction", "op"])
            for (h, d, op), n in sorted(messages.items(), key=lambda kv: tuple(map(str, kv[0]))):
                msg.add_metric([str(h), str(d), str(op)], n)
            yield msg
            lost = CounterMetricFamily("pslat_events_lost", "Events lost in the kernel (ring buffer full)",
                                       labels=["probe"])
            for p, n in health["lost"].items():
                lost.add_metric([p], n)
            yield lost
            ev = CounterMetricFamily("pslat_events", "Events the agent consumed (all probes)")
            ev.add_metric([], health["events_total"])
            yield ev
            g = GaugeMetricFamily("pslat_connections_open", "Connections seen carrying messages, not closed",
                                  labels=["host"])
            for h, n in sorted(conns.items()):
                g.add_metric([str(h)], n)
            yield g
            for name, doc, d in (("pslat_connections_opened", "Connections first seen", opened),
                                 ("pslat_connections_closed", "Connections closed (TCP_CLOSE)", closed)):
                c = CounterMetricFamily(name, doc, labels=["host"])
                for h, n in sorted(d.items()):
                    c.add_metric([str(h)], n)
                yield c
            s = GaugeMetricFamily("pslat_sampling_ratio", "Share of host pairs the agent keeps (1: all)")
            s.add_metric([], health["sampling_rate"])
            yield s
            cpu = CounterMetricFamily("pslat_agent_cpu_seconds", "CPU time of the agent process, user and "
                                      "system, all threads (the same as process_cpu_seconds_total: kept "
                                      "under pslat_ for dashboards that select pslat_*)")
            cpu.add_metric([], cpu_seconds_self())
            yield cpu
            info = InfoMetricFamily("pslat_agent", "The agent's version")
            info.add_metric([], {"version": version})
            yield info
            if http_dropped is not None:
                d = CounterMetricFamily("pslat_http_connections_dropped", "Connections to this endpoint closed "
                                        "without an answer (over the cap, past a deadline, not a GET)",
                                        labels=["reason"])
                for reason, n in sorted(http_dropped().items()):
                    d.add_metric([reason], n)
                yield d

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector())
    ProcessCollector(registry=reg)   # process_cpu_seconds_total, process_resident_memory_bytes, open fds ...
    return reg


class LiveServer:
    """The endpoint: one thread running a selector loop over the listening socket and at most
    MAX_CONNECTIONS connections, each under a header and a whole-request deadline (module
    docstring). `dropped` counts, by reason, the connections closed without an answer."""

    def __init__(self, sock: socket.socket, pages: dict[str, tuple[Callable[[], bytes], str]]):
        self.sock = sock
        host, port = sock.getsockname()[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.port = port
        self.pages = pages
        self.dropped: Counter = Counter()
        self._cache: dict[str, tuple[float, bytes]] = {}
        self._tokens, self._tokens_at = float(MAX_REQUESTS_PER_S), time.monotonic()   # the rate's bucket
        self._conns: dict[socket.socket, _Conn] = {}   # in accept order: the first is the oldest
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = False
        self._accept_resume = 0.0   # monotonic time to accept again after running out of descriptors
        sock.setblocking(False)
        self._sel.register(sock, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self.thread = threading.Thread(target=self._run, name="pslat-http", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self._stop = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self.thread.join(5)
        for c in list(self._conns.values()):
            self._close(c)
        self._sel.close()
        for s in (self.sock, self._wake_r, self._wake_w):
            s.close()

    # -- the loop ------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop:
            now = time.monotonic()
            deadlines = [c.deadline for c in self._conns.values()]
            if self._accept_resume:
                deadlines.append(self._accept_resume)
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            for key, _ in self._sel.select(timeout):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    return
                elif key.fileobj in self._conns:   # not closed by an earlier event of this round
                    try:
                        self._io(key.data)
                    except Exception:   # a page that failed to render: that client goes, the loop stays
                        self.dropped["error"] += 1
                        self._close(key.data)
            now = time.monotonic()
            for c in [c for c in self._conns.values() if c.deadline <= now]:
                self.dropped["header_timeout" if c.out is None else "request_timeout"] += 1
                self._close(c)
            if self._accept_resume and now >= self._accept_resume:
                self._accept_resume = 0.0
                self._sel.register(self.sock, selectors.EVENT_READ, "listen")

    def _accept(self) -> None:
        for _ in range(MAX_CONNECTIONS):   # a burst at a time: the deadlines are checked between bursts
            try:
                s, _ = self.sock.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors (the process's, not ours: we hold at most the cap): stop
                    # accepting for a moment instead of spinning on a listener that stays readable
                    self.dropped["no_descriptors"] += 1
                    self._sel.unregister(self.sock)
                    self._accept_resume = time.monotonic() + ACCEPT_PAUSE_S
                    return
                continue   # ECONNABORTED and the like: that client is gone
            if len(self._conns) >= MAX_CONNECTIONS:
                # Over the cap: the oldest connection still sending its request makes room (a
                # scraper sends its request at once, so it is one of a flood's idle sockets that
                # goes); when every one is being answered, the new one is closed at once.
                oldest = next((c for c in self._conns.values() if c.out is None), None)
                self.dropped["cap"] += 1
                if oldest is None:
                    s.close()
                    continue
                self._close(oldest)
            s.setblocking(False)
            c = _Conn(s, time.monotonic())
            self._conns[s] = c
            self._sel.register(s, selectors.EVENT_READ, c)
            try:
                self._io(c)   # a scraper's request is usually here already: answered before a flood's next accepts
            except Exception:
                self.dropped["error"] += 1
                self._close(c)

    def _io(self, c: _Conn) -> None:
        try:
            if c.out is None:
                data = c.sock.recv(MAX_REQUEST_BYTES)
                if not data:
                    self._close(c)
                    return
                c.buf += data
                self._request(c)
            if c.out is not None:
                c.sent += c.sock.send(c.out[c.sent:c.sent + SEND_CHUNK_BYTES])
                if c.sent >= len(c.out):
                    self._close(c, answered=True)
        except BlockingIOError:
            pass
        except OSError:   # reset by the peer and the like
            self._close(c)

    def _request(self, c: _Conn) -> None:
        end = c.buf.find(b"\r\n\r\n")
        if end < 0:
            end = c.buf.find(b"\n\n")
        if end < 0:
            if len(c.buf) > MAX_REQUEST_BYTES:
                self._answer(c, 431, b"request headers too large\n", "text/plain", reason="bad_request")
            return
        now = time.monotonic()
        self._tokens = min(float(MAX_REQUESTS_PER_S), self._tokens + (now - self._tokens_at) * MAX_REQUESTS_PER_S)
        self._tokens_at = now
        if self._tokens < 1:
            self._answer(c, 429, b"too many requests: at most %d a second\n" % MAX_REQUESTS_PER_S, "text/plain",
                         reason="rate")
            return
        self._tokens -= 1
        line = bytes(c.buf[:c.buf.find(b"\n")]).rstrip(b"\r").split()
        if len(line) != 3 or not line[2].startswith(b"HTTP/"):
            self._answer(c, 400, b"not an HTTP request\n", "text/plain", reason="bad_request")
            return
        method, path = line[0], line[1].split(b"?", 1)[0].decode("latin-1")
        if method not in (b"GET", b"HEAD"):
            self._answer(c, 405, b"only GET and HEAD\n", "text/plain", reason="bad_request")
        elif path not in self.pages:
            self._answer(c, 404, b"try /metrics or /snapshot.json\n", "text/plain", head=method == b"HEAD")
        else:
            self._answer(c, 200, self._page(path), self.pages[path][1], head=method == b"HEAD")

    def _page(self, path: str) -> bytes:
        now = time.monotonic()
        hit = self._cache.get(path)
        if hit is None or now - hit[0] >= CACHE_S:
            hit = self._cache[path] = (now, self.pages[path][0]())
        return hit[1]

    def _answer(self, c: _Conn, code: int, body: bytes, ctype: str, head: bool = False,
                reason: str | None = None) -> None:
        if reason:
            self.dropped[reason] += 1
        c.out = memoryview(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                           % (code, HTTPStatus(code).phrase.encode(), ctype.encode(), len(body))
                           + (b"" if head else body))
        c.deadline = c.started + REQUEST_TIMEOUT_S
        self._sel.modify(c.sock, selectors.EVENT_WRITE, c)

    def _close(self, c: _Conn, answered: bool = False) -> None:
        self._conns.pop(c.sock, None)
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        try:
            if answered:
                c.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        c.sock.close()


class _Conn:
    __slots__ = ("sock", "started", "deadline", "buf", "out", "sent")

    def __init__(self, sock: socket.socket, now: float):
        self.sock, self.started, self.deadline = sock, now, now + HEADER_TIMEOUT_S
        self.buf = bytearray()
        self.out: memoryview | None = None   # the answer, once the request is read
        self.sent = 0


def serve(listen: str, live: LiveAggregates) -> LiveServer:
    """Start the endpoint on a daemon thread; UserError when the address cannot be bound."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    host, port = parse_listen(listen)
    stats: dict = {}
    registry = registry_for(live, http_dropped=lambda: dict(stats["server"].dropped))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
    except OSError as e:
        sock.close()
        raise UserError(f"--listen {listen}: cannot listen there ({e.strerror}); pick another port "
                        "or stop what holds it") from None
    server = stats["server"] = LiveServer(sock, {
        "/metrics": (lambda: generate_latest(registry), CONTENT_TYPE_LATEST),
        "/snapshot.json": (lambda: json.dumps(live.snapshot()).encode(), "application/json")})
    return server
