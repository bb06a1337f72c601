"""Detach every probe of a bcc program at once, keeping its maps (and rings) open.

bcc's cleanup() detaches one attachment after the other, and closing a
tracepoint's or uprobe's perf event waits for an RCU grace period each: with
the agent's ~30 attachments that took 2.6 s on an idle 2-vCPU VM, longer than
a SIGTERM may take. Closed from parallel threads (ctypes releases the GIL) the
grace periods overlap (0.6 s there), and the caller goes on draining the rings
meanwhile, since events arrive until the last attachment is gone. The maps
stay, so what the rings hold can be read afterwards; cleanup() then has only
maps left, which close at once.

    d = Detacher([bpf, other_bpf])     # starts detaching in the background
    while not d.done(): ...drain...
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor


class Detacher:
    """Detaches every tracepoint, uprobe and raw tracepoint of the given bcc.BPF
    objects (None entries skipped) in background threads."""

    def __init__(self, bpfs):
        from bcc import lib

        self._lib = lib
        self._bpfs = [b for b in bpfs if b is not None]
        jobs = []
        for bpf in self._bpfs:
            for tp in list(bpf.tracepoint_fds):
                jobs.append((bpf.tracepoint_fds.pop(tp), None))
            for ev in list(bpf.uprobe_fds):
                fd = bpf.uprobe_fds[ev]
                bpf._del_uprobe_fd(ev)   # bcc's own bookkeeping (a module-wide probe count)
                jobs.append((fd, ev))
        self.attachments = len(jobs) + sum(len(b.raw_tracepoint_fds) for b in self._bpfs)
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(jobs,), name="pslat-detach", daemon=True)
        self._thread.start()

    def _close(self, job) -> None:
        fd, uprobe_ev = job
        self._lib.bpf_close_perf_event_fd(fd)
        if uprobe_ev is not None:   # a tracefs uprobe event, where bcc had to make one
            self._lib.bpf_detach_uprobe(uprobe_ev)

    def _run(self, jobs) -> None:
        try:
            if jobs:
                with ThreadPoolExecutor(max_workers=min(32, len(jobs))) as pool:
                    list(pool.map(self._close, jobs))
            for bpf in self._bpfs:
                for tp in list(bpf.raw_tracepoint_fds):   # links: closing one does not wait
                    bpf.detach_raw_tracepoint(tp)
        except BaseException as e:  # the caller's cleanup() closes what is left
            self.error = e

    def done(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout_s: float | None = None) -> bool:
        self._thread.join(timeout_s)
        return self.done()
