"""Parser throughput: `python -m parsers.pslite.perf [--seconds S]`.

Prints MB/s and messages/s for: the recorded libzmq streams of tests/data/pslite
(small psbench-like requests and responses, fed with the recv() sizes that were
recorded, messages repeated to make a long stream); the psbench capture (its
busiest data stream, repeated); large messages (1 MiB of
values, 2000 keys) fed in 64 KiB and 8 KiB chunks; and a hunting parser joined
mid-stream into bytes with no message start (the cost of resync scanning).
"""
from __future__ import annotations

import argparse
import gzip
import itertools
import json
import time
from pathlib import Path

import numpy as np

from .encode import MessageSpec, encode_stream
from .parser import PsliteStreamParser

DATA = Path(__file__).resolve().parents[2] / "tests" / "data" / "pslite"


def measure(chunks: list[bytes], seconds: float, **parser_kw) -> tuple[float, float, int]:
    """Feed `chunks` to fresh parsers for `seconds` of CPU time: (MB/s, messages/s, messages
    per pass), per CPU second of this process, so that other load on the machine counts less."""
    total = sum(map(len, chunks))
    passes = msgs = 0
    t0 = time.process_time()
    while True:
        p = PsliteStreamParser(**parser_kw)
        for c in chunks:
            msgs += len(p.feed(c))
        passes += 1
        dt = time.process_time() - t0
        if dt >= seconds:
            break
    return total * passes / dt / 1e6, msgs / dt, msgs // passes


def repeated(raw: bytes, repeat: int) -> bytes:
    """A recorded DEALER stream with its messages repeated: greeting and READY once."""
    handshake = 64 + raw[65] + 2  # greeting + the READY command frame (short)
    return raw[:handshake] + raw[handshake:] * repeat


def recorded_chunks(name: str, repeat: int) -> list[bytes]:
    """A stream of tests/data/pslite, repeated, cut at its recorded recv() sizes (cycled)."""
    scenario = name.split(".")[0]
    truth = json.loads(gzip.decompress((DATA / f"{scenario}.json.gz").read_bytes()))
    sizes = truth["streams"][name]["recv_chunk_bytes"]
    stream = repeated((DATA / name).read_bytes(), repeat)
    out, pos = [], 0
    for n in itertools.cycle(sizes):
        if pos >= len(stream):
            break
        out.append(stream[pos:pos + n])
        pos += n
    return out


def psbench_stream(repeat: int) -> bytes:
    """The busiest worker -> server stream of the psbench capture, repeated."""
    doc = json.loads(gzip.decompress((DATA / "psbench.json.gz").read_bytes()))
    blob = (DATA / "psbench.streams.bin").read_bytes()
    st = max(doc["streams"], key=lambda s: s["length"] if s["dport"] != int(doc["nodes"]["1"]["port"]) else 0)
    return repeated(blob[st["offset"]:st["offset"] + st["length"]], repeat)


def cut(b: bytes, n: int) -> list[bytes]:
    return [b[i:i + n] for i in range(0, len(b), n)]


def large_stream(n_messages: int = 32) -> bytes:
    keys = np.arange(0, 2000 * 977, 977, dtype="<u8")
    vals = np.ones(1 << 18, "<f4").tobytes()  # 1 MiB
    specs = [MessageSpec(push=True, pull=False, timestamp=t, keys=keys, vals=vals)
             for t in range(n_messages)]
    return encode_stream(specs)[0]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=1.0, help="time per measurement")
    a = ap.parse_args(argv)
    rows = []
    for name in ("pslite.w2s.dealer.bin", "pslite.s2w.dealer.bin", "mxnet.w2s.dealer.bin"):
        if (DATA / name).exists():
            rows.append((f"recorded {name} (recv sizes)", measure(recorded_chunks(name, 20), a.seconds)))
    if (DATA / "psbench.streams.bin").exists():
        ps = psbench_stream(20)
        rows.append(("psbench capture, 1500 B chunks", measure(cut(ps, 1500), a.seconds)))
        rows.append(("psbench capture, 64 KiB chunks", measure(cut(ps, 1 << 16), a.seconds)))
    big = large_stream()
    rows.append(("1 MiB messages, 64 KiB chunks", measure(cut(big, 1 << 16), a.seconds)))
    rows.append(("1 MiB messages, 8 KiB chunks", measure(cut(big, 1 << 13), a.seconds)))
    noise = np.random.default_rng(1).random(1 << 20, dtype=np.float32).tobytes()
    rows.append(("hunting through float32 noise, 64 KiB chunks",
                 measure(cut(noise, 1 << 16), a.seconds, mid_stream=True)))
    for label, (mbps, mps, per_pass) in rows:
        print(f"{label:48s} {mbps:9.1f} MB/s {mps:11.0f} msg/s  ({per_pass} msgs/pass)")


if __name__ == "__main__":
    main()
