"""A request/response ping-pong to measure round-trip time through the cluster.

    python -m workloads.cluster.pingpong server --proto tcp --port 7777
    python -m workloads.cluster.pingpong client --proto tcp --addr 10.77.0.2 --port 7777 --count 200

The server prints "ready" once it listens (the signal to start the client) and
echoes every message. The client sends `--size` bytes, waits for all of them
back, and prints one JSON line: {"rtt_ns": [...]} (CLOCK_MONOTONIC deltas).
TCP_NODELAY on both ends, so each message is one segment each way.
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed")
        buf += chunk
    return bytes(buf)


def serve(proto: str, port: int, size: int) -> None:
    if proto == "tcp":
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind(("0.0.0.0", port))
        ls.listen(1)
        print("ready", flush=True)
        conn, _ = ls.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                conn.sendall(_recv_exact(conn, size))
        except ConnectionError:
            return
    us = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    us.bind(("0.0.0.0", port))
    print("ready", flush=True)
    while True:
        data, peer = us.recvfrom(65536)
        if data == b"":
            return
        us.sendto(data, peer)


def ping(proto: str, addr: str, port: int, count: int, size: int, warmup: int) -> list[int]:
    msg = b"p" * size
    rtts = []
    if proto == "tcp":
        s = socket.create_connection((addr, port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for i in range(warmup + count):
            t0 = time.monotonic_ns()
            s.sendall(msg)
            _recv_exact(s, size)
            if i >= warmup:
                rtts.append(time.monotonic_ns() - t0)
        s.close()
        return rtts
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((addr, port))
    s.settimeout(2.0)  # a lost datagram fails the run instead of hanging it
    for i in range(warmup + count):
        t0 = time.monotonic_ns()
        s.send(msg)
        s.recv(65536)
        if i >= warmup:
            rtts.append(time.monotonic_ns() - t0)
    s.send(b"")  # tells the server to stop
    return rtts


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["server", "client"])
    ap.add_argument("--proto", choices=["tcp", "udp"], default="tcp")
    ap.add_argument("--addr", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=7777)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--size", type=int, default=64, help="message bytes")
    a = ap.parse_args(argv)
    if a.role == "server":
        serve(a.proto, a.port, a.size)
    else:
        print(json.dumps({"rtt_ns": ping(a.proto, a.addr, a.port, a.count, a.size, a.warmup)}))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
