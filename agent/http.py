"""The agent's live HTTP endpoint: /metrics (Prometheus text) and /snapshot.json (`pslat top`).

    server = serve("127.0.0.1:9465", live)   # a daemon thread; server.address is "ADDR:PORT" bound
    ...
    server.close()

Loopback by default: the snapshot names hosts, peers and keys of the traced
job, so exposing it beyond the machine is the user's explicit choice
(`--listen 0.0.0.0:PORT`). The metrics come from a CollectorRegistry of our
own (not the process-global one) whose collector reads LiveAggregates' totals
at scrape time, so the agent's loop never waits on a scrape beyond one lock.
"""
from __future__ import annotations

import ipaddress
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from agent.errors import UserError
from agent.live import EDGES_NS, PER_DECADE, LiveAggregates

DEFAULT_LISTEN = "127.0.0.1:9465"
# Prometheus buckets: every 4th live edge (1 us .. 10 s, x3.16 apart): exact cumulative counts of the live histogram
PROM_EDGE_IDX = list(range(0, len(EDGES_NS), PER_DECADE // 2))


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


def registry_for(live: LiveAggregates):
    """A CollectorRegistry of our own exposing `live`."""
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    class Collector:
        def collect(self):
            with live.lock:
                totals = {g: {c: (dict(h.counts), h.sum_ns) for c, h in hs.items()} for g, hs in live.totals.items()}
                messages = dict(live.messages)
                health = live._health()
                conns = {h: len(c) for h, c in live.conns.items()}
                opened, closed = dict(live.opened_total), dict(live.closed_total)
            comp = HistogramMetricFamily("pslat_component_seconds", "Time of one request in one component, "
                                         "as seen on this host (live views: each host its own components)",
                                         labels=["host", "role", "op", "peer", "component"])
            e2e = HistogramMetricFamily("pslat_request_seconds", "Request time on this host (client: first "
                                        "to last stage it saw; server: its residence time)",
                                        labels=["host", "role", "op", "peer"])
            for (host, role, op, peer), hs in sorted(totals.items(), key=lambda kv: tuple(map(str, kv[0]))):
                for c, (counts, sum_ns) in sorted(hs.items()):
                    buckets, cum = [], 0
                    for i in PROM_EDGE_IDX:
                        cum = sum(n for b, n in counts.items() if b <= i)
                        buckets.append((f"{EDGES_NS[i] / 1e9:.9g}", cum))
                    buckets.append(("+Inf", sum(counts.values())))
                    labels = [str(host), role, str(op), str(peer)]
                    if c == "e2e":
                        e2e.add_metric(labels, buckets, sum_ns / 1e9)
                    else:
                        comp.add_metric(labels + [c], buckets, sum_ns / 1e9)
            yield comp
            yield e2e
            msg = CounterMetricFamily("pslat_messages", "ps-lite messages the agent recorded",
                                      labels=["host", "direction", "op"])
            for (h, d, op), n in sorted(messages.items(), key=lambda kv: tuple(map(str, kv[0]))):
                msg.add_metric([str(h), str(d), str(op)], n)
            yield msg
            lost = CounterMetricFamily("pslat_lost_events", "Events lost in the kernel (ring buffer full)",
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
            s = GaugeMetricFamily("pslat_sampling_rate", "Share of host pairs the agent keeps (1: all)")
            s.add_metric([], health["sampling_rate"])
            yield s
            if health["cpu_pct"] is not None:
                cpu = GaugeMetricFamily("pslat_agent_cpu_percent", "Agent CPU over the last second (% of one core)")
                cpu.add_metric([], health["cpu_pct"])
                yield cpu

    reg = CollectorRegistry(auto_describe=False)
    reg.register(Collector())
    return reg


class LiveServer:
    def __init__(self, httpd: ThreadingHTTPServer):
        self.httpd = httpd
        host, port = httpd.server_address[:2]
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.port = port
        self.thread = threading.Thread(target=httpd.serve_forever, name="pslat-http", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


def serve(listen: str, live: LiveAggregates) -> LiveServer:
    """Start the endpoint on a daemon thread; UserError when the address cannot be bound."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    host, port = parse_listen(listen)
    registry = registry_for(live)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                body, ctype = generate_latest(registry), CONTENT_TYPE_LATEST
            elif path == "/snapshot.json":
                body, ctype = json.dumps(live.snapshot()).encode(), "application/json"
            else:
                self.send_error(404, "try /metrics or /snapshot.json")
                return
            self.send_response(200)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):   # one line per scrape on stderr would drown the agent's own lines
            pass

    cls = type("Server", (ThreadingHTTPServer,), {"daemon_threads": True,
                                                   "address_family": 10 if ":" in host else 2})
    try:
        httpd = cls((host, port), Handler)
    except OSError as e:
        raise UserError(f"--listen {listen}: cannot listen there ({e.strerror}); pick another port "
                        "or stop what holds it") from None
    return LiveServer(httpd)
