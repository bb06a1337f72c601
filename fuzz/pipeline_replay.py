"""Fuzz target: the whole agent pipeline on mutated recordings, as `pslat agent
--replay` runs it (agent.daemon.replay: decoders, correlator, run-dir writer).

Byte 0 picks the recording (tests/data/agent: psbench, netstack), of which the first
EVENTS_KEPT events are replayed; the rest of the input is mutations, 6 bytes each
(event index u16, byte position u16, op, value): set the byte, xor it, write one of
a few interesting 8-byte integers there (times and ids past their columns), or cut
the event short there. The mutated events go to a recording in a temp dir, replayed
into a run dir beside it.

A crash is anything escaping replay() (the agent's per-event guard counts what one
event breaks; what escapes it stops the agent: the issue saw 4.9% of such runs die
with ArrowInvalid/OverflowError), a run dir left unclosed, or a row the writer had to
reject because a value did not fit its column (the decoders must refuse those)."""
from __future__ import annotations

import contextlib
import gc
import io
import struct
import tempfile
from pathlib import Path

import pandas  # noqa: F401  (imported here, not in the first input's time limit)
import pyarrow.parquet  # noqa: F401

from agent.daemon import replay
from agent.rundir import read_run_dir
from agent.sources import RecordWriter, read_recording

KIND = "reader"
# make test's brief run (tests/unit/test_fuzz_brief.py) gets 4 s: a replay takes 0.1-0.3 s
# on an idle machine, and 1-2 s on a loaded one (3 in 4 s seen with others' fuzzers running)
BRIEF_INPUTS_MIN = 2
_DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "agent"
RECORDINGS = ("psbench.rec.gz", "netstack.rec.gz")
# the first events of a recording: greetings, READYs, control and data messages,
# framework records and (netstack) kernel times; a replay of them takes ~0.1 s
EVENTS_KEPT = 400
_MUT = struct.Struct("<HHBB")
_INTERESTING = (2**63 - 1, 2**63, 2**64 - 1, 2**62, 2**31, 2**32 - 1, 0, 3_000_000_000)
_loaded: dict[int, tuple[dict, list]] = {}


def _recording(i: int) -> tuple[dict, list]:
    if i not in _loaded:
        header, events = read_recording(_DATA / RECORDINGS[i])
        kept = []
        for ev in events:
            kept.append(ev)
            if len(kept) == EVENTS_KEPT:
                break
        _loaded[i] = header, kept
    return _loaded[i]


def mutation(index: int, pos: int, op: int, value: int) -> bytes:
    return _MUT.pack(index, pos, op, value)


def seeds() -> list[bytes]:
    out = []
    for i in range(len(RECORDINGS)):
        header, events = _recording(i)
        out.append(bytes([i]))   # the recording as it is
        sock = [k for k, (p, _) in enumerate(events) if p == "sockcalls"]
        fw = [k for k, (p, _) in enumerate(events) if p == "framework"]
        # the exit time of 40 calls past int64 (the messages' rows take them); tgids past
        # int32; framework times past int64
        out.append(bytes([i]) + b"".join(mutation(k, 8, 2, 2) for k in sock[:40]))
        out.append(bytes([i]) + b"".join(mutation(k, 40, 2, 5) for k in sock[:40]))
        out.append(bytes([i]) + b"".join(mutation(k, 0, 2, 1) for k in fw[:40]))
        net = [k for k, (p, _) in enumerate(events) if p == "netstack"]
        if net:   # netstack records' times (their first 8-byte field after the kind)
            out.append(bytes([i]) + b"".join(mutation(k, 8, 2, 2) for k in net[:40]))
        out.append(bytes([i]) + b"".join(mutation(k * 7, k * 13, k % 4, (k * 31) % 256) for k in range(12)))
    return out


def _mutated(data: bytes) -> tuple[dict, list]:
    header, events = _recording(data[0] % len(RECORDINGS))
    events = list(events)
    for at in range(1, len(data) - _MUT.size + 1, _MUT.size):
        index, pos, op, value = _MUT.unpack_from(data, at)
        k = index % len(events)
        probe, raw = events[k]
        if not raw:
            continue
        b = bytearray(raw)
        pos %= len(b)
        op &= 3
        if op == 0:
            b[pos] = value
        elif op == 1:
            b[pos] ^= value or 1
        elif op == 2:
            word = _INTERESTING[value % len(_INTERESTING)].to_bytes(8, "little")
            b[pos:pos + 8] = word[:len(b) - pos]
        else:
            del b[pos:]
        events[k] = (probe, bytes(b))
    return header, events


def one_input(data: bytes) -> None:
    if not data:
        return
    header, events = _mutated(data)
    with tempfile.TemporaryDirectory(prefix="pslat-fuzz-replay-") as tmp:
        rec = Path(tmp) / "mutated.rec"
        w = RecordWriter(rec, {k: v for k, v in header.items() if k != "format"})
        for probe, raw in events:
            w.write(probe, raw)
        w.close()
        out = Path(tmp) / "out"
        try:
            with contextlib.redirect_stderr(io.StringIO()):   # the agent's warnings, once per run
                replay(rec, out, shard_interval_s=3600)
        finally:
            # replay freezes the heap it started with (agent.sources.settle_heap), the last
            # input's garbage too, and makes young collections rare: once per input, that
            # grew RSS 155 -> 439 MB over 586 inputs under atheris; collected here, flat
            gc.unfreeze()
            gc.collect()
        for d in sorted(p for p in out.iterdir() if p.is_dir()):
            rd = read_run_dir(d)
            assert rd.meta.get("closed") is True, d
            rejected = rd.meta.get("counters", {}).get("rows_rejected") or {}
            assert not any(rejected.values()), rejected   # a value passed the decoders that no column holds
