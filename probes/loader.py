"""Compiles a generated program with bcc, fills its filters, attaches it, and
hands its events to user space.

    with ProbeProgram.start([SOCKCALLS], Filters.build(pids=[pid])) as prog:
        prog.on_events(lambda probe, ev: ...)
        prog.poll(100)
        prog.counters()   # {"sockcalls": {"seen": .., "lost": .., ...}}

Only this module (and agent's live source) imports bcc.
"""
from __future__ import annotations

import ctypes
import os
import time
from typing import Callable

from core.errors import UserError
from probes.filters import Filters
from probes.program import GeneratedProgram, generate

EventHandler = Callable[[str, ctypes.Structure], None]


def _bcc():
    try:
        import bcc  # the distro's python3-bpfcc
    except ImportError:
        raise UserError("cannot import bcc; install the distro package python3-bpfcc "
                        "(scripts/setup.sh does) and use the venv it made") from None
    return bcc


class RingReader:
    """One of a program's ring buffers, read through a libbpf ring_buffer of its own.

    bcc puts every ring of a program in one ring_buffer, and libbpf consumes those
    one after the other, each until it is empty, and gives up at the first whose
    callback says stop. A consumer with a time budget then never reached the second
    ring while the first stayed busy (measured: netstack's ring 1-3.5 s behind
    sockcalls' in a closed loop). Alone, each ring gets its own share. (libbpf 1.3's
    ring__consume would do it on bcc's; Debian 12 has 1.1.)

    callback(data pointer, size) returns 0 to go on, < 0 to stop after this record."""

    def __init__(self, bpf, ring: str, callback: Callable[[int, int], int]):
        from bcc.libbcc import _RINGBUF_CB_TYPE, lib

        self._lib = lib
        self._fn = _RINGBUF_CB_TYPE(lambda _ctx, data, size: callback(data, size))   # kept alive here
        self._rb = lib.bpf_new_ringbuf(bpf[ring.encode()].map_fd, self._fn, None)
        if not self._rb:
            raise RuntimeError(f"could not open the ring buffer {ring}")

    def consume(self) -> None:
        """Deliver what the ring holds, until it is empty or the callback says stop."""
        self._lib.bpf_consume_ringbuf(self._rb)

    def close(self) -> None:
        if self._rb:
            rb, self._rb = self._rb, None
            self._lib.bpf_free_ringbuf(rb)


class ProbeProgram:
    """One compiled bcc program holding one or more probes."""

    def __init__(self, generated: GeneratedProgram):
        self.generated = generated
        self.bpf = None
        self.compile_s: float | None = None
        self.attach_s: float | None = None
        self.decode_errors = 0
        self._rings_open = False

    @classmethod
    def start(cls, probes, filters: Filters | None = None, overrides: dict[str, int] | None = None,
              **gen_kwargs) -> "ProbeProgram":
        prog = cls(generate(probes, filters, overrides=overrides, **gen_kwargs))
        prog.load()
        return prog

    # -- life cycle ---------------------------------------------------------

    def load(self, before_attach: Callable[["ProbeProgram"], None] | None = None) -> "ProbeProgram":
        """Compile, fill the filters, run before_attach(self) (e.g. fill program arrays
        the attached programs tail-call: nothing fires before it), then attach."""
        if os.geteuid() != 0:
            raise UserError("loading BPF probes needs root; run pslat with sudo")
        bcc = _bcc()
        t0 = time.perf_counter()
        self.bpf = bcc.BPF(text=self.generated.text.encode(), cflags=self.generated.cflags)
        t1 = time.perf_counter()
        self.compile_s = t1 - t0
        try:
            self.generated.filters.fill(self.bpf)
            if before_attach is not None:
                before_attach(self)
            for probe in self.generated.probes:
                for a in probe.attach:
                    # bcc wants bytes for names (str works but warns).
                    target, fn = a.target.encode(), a.fn.encode()
                    if a.kind == "tracepoint":
                        self.bpf.attach_tracepoint(tp=target, fn_name=fn)
                    else:
                        self.bpf.attach_raw_tracepoint(tp=target, fn_name=fn)
        except BaseException:
            self.close()
            raise
        self.attach_s = time.perf_counter() - t1
        return self

    def close(self) -> None:
        """Detach everything. Safe to call twice."""
        if self.bpf is not None:
            bpf, self.bpf = self.bpf, None
            bpf.cleanup()

    def __enter__(self) -> "ProbeProgram":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- events -------------------------------------------------------------

    def on_events(self, handler: EventHandler) -> None:
        """Route every probe's ring buffer to handler(probe name, decoded event)."""
        for probe in self.generated.probes:
            decode = probe.event.from_ring

            def callback(_ctx, data, size, name=probe.name, decode=decode):
                try:
                    ev = decode(data, size)
                except ValueError:
                    self.decode_errors += 1
                    return 0
                handler(name, ev)
                return 0

            self.bpf[probe.ring.encode()].open_ring_buffer(callback)
        self._rings_open = True

    def poll(self, timeout_ms: int = 100) -> None:
        """Wait up to timeout_ms for events and deliver what arrived."""
        self.bpf.ring_buffer_poll(timeout_ms)

    def consume(self) -> None:
        """Deliver every event already in the rings, without waiting."""
        self.bpf.ring_buffer_consume()

    # -- counters -----------------------------------------------------------

    def counters(self) -> dict[str, dict[str, int]]:
        """Per probe, each counter summed over CPUs."""
        out = {}
        for probe in self.generated.probes:
            table = self.bpf[probe.counters_map.encode()]
            got = {name: int(table.sum(ctypes.c_int(i)).value) for i, name in enumerate(probe.counters)}
            for m in probe.lru_maps:
                got[f"{m.name}_evicted"] = m.evicted(got, self.generated.constants)
            out[probe.name] = got
        return out
