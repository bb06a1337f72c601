"""A sparse parameter server over gRPC (grpcio's C core, as TensorFlow ships it), run
by the TensorFlow venv's python. No protobuf: the messages are raw bytes through
grpcio's generic handlers, so this file needs nothing generated.

  server --port P [--delay-ms D]      serves /pslat.ps.PS/Pull and /pslat.ps.PS/Push
  client --target H:P --requests N    alternates pulls and pushes of random key sets
         [--pause-after K --resume-file F]  after K calls says {"paused": K} and waits
                                            for F to exist (a tracer joins meanwhile)

Pull: request = u32 key count + u64 keys; response = 8 float32 values per key.
Push: request = u32 key count + u64 keys + 8 float32 values per key; response = empty.
The client writes one JSON line per call (its own log: the tests' oracle) and a
last line {"done": ...}; the server one line per call it served.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
import threading
import time
from concurrent import futures

import grpc

SERVICE = "pslat.ps.PS"
VALUE_BYTES = 32          # 8 float32 per key
KEY_SPACE = 1 << 20


def _ident(b: bytes) -> bytes:
    return b


def _keys_of(req: bytes) -> int:
    return struct.unpack_from("<I", req)[0] if len(req) >= 4 else 0


def serve(port: int, delay_ms: float, log) -> None:
    lock = threading.Lock()

    def record(method: str, req: bytes, resp: bytes) -> None:
        with lock:
            log.write(json.dumps({"method": method, "keys": _keys_of(req), "request_bytes": len(req),
                                  "response_bytes": len(resp)}) + "\n")
            log.flush()

    def pull(req: bytes, ctx) -> bytes:
        time.sleep(delay_ms / 1000)
        resp = b"\0" * (VALUE_BYTES * _keys_of(req))
        record("Pull", req, resp)
        return resp

    def push(req: bytes, ctx) -> bytes:
        time.sleep(delay_ms / 1000)
        record("Push", req, b"")
        return b""

    handlers = {"Pull": grpc.unary_unary_rpc_method_handler(pull, _ident, _ident),
                "Push": grpc.unary_unary_rpc_method_handler(push, _ident, _ident)}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    server.add_insecure_port(f"0.0.0.0:{port}")
    server.start()
    print(json.dumps({"listening": port}), flush=True)
    server.wait_for_termination()


def run_client(target: str, requests: int, seed: int, keys_max: int, log, pause_after: int | None = None,
               resume_file: str | None = None) -> None:
    rng = random.Random(seed)
    channel = grpc.insecure_channel(target)
    grpc.channel_ready_future(channel).result(timeout=30)
    calls = {m: channel.unary_unary(f"/{SERVICE}/{m}", request_serializer=_ident, response_deserializer=_ident)
             for m in ("Pull", "Push")}
    counts = {"Pull": 0, "Push": 0}
    for i in range(requests):
        if i == pause_after:
            log.write(json.dumps({"paused": i}) + "\n")
            log.flush()
            while not os.path.exists(resume_file):
                time.sleep(0.01)
        method = "Pull" if i % 2 == 0 else "Push"
        keys = sorted(rng.sample(range(KEY_SPACE), rng.randint(1, keys_max)))
        req = struct.pack(f"<I{len(keys)}Q", len(keys), *keys)
        if method == "Push":
            req += b"\1" * (VALUE_BYTES * len(keys))
        t0 = time.time_ns()
        resp = calls[method](req, timeout=30)
        t1 = time.time_ns()
        counts[method] += 1
        log.write(json.dumps({"method": method, "keys": len(keys), "request_bytes": len(req),
                              "response_bytes": len(resp), "start_ns": t0, "end_ns": t1}) + "\n")
    log.write(json.dumps({"done": counts}) + "\n")
    log.flush()
    channel.close()


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="grpcps")
    sub = ap.add_subparsers(dest="role", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--delay-ms", type=float, default=0.0)
    c = sub.add_parser("client")
    c.add_argument("--target", required=True)
    c.add_argument("--requests", type=int, default=200)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--keys-max", type=int, default=64)
    c.add_argument("--pause-after", type=int)
    c.add_argument("--resume-file")
    a = ap.parse_args(argv)
    if a.role == "server":
        serve(a.port, a.delay_ms, sys.stdout)
    else:
        if (a.pause_after is None) != (a.resume_file is None):
            ap.error("--pause-after and --resume-file go together")
        run_client(a.target, a.requests, a.seed, a.keys_max, sys.stdout, a.pause_after, a.resume_file)


if __name__ == "__main__":
    main(sys.argv[1:])
