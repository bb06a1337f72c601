"""agent.callhooks' rules, on a stand-in for bcc's attach bookkeeping: when the read/write
family's hooks are detached, and what brings them back."""
from __future__ import annotations

from agent.callhooks import KINDS, QUIET_MIN_CALLS, QUIET_S, RECHECK_S, CallHooks, _tracepoints
from probes.events import SockCall


class FakeBpf:
    """bcc.BPF's tracepoint_fds and attach_tracepoint, as CallHooks uses them."""

    def __init__(self):
        self.tracepoint_fds = {tp: i for i, (tp, _) in enumerate(t for k in SockCall for t in _tracepoints(k))}
        self.attached: list[tuple[bytes, bytes]] = []

    def attach_tracepoint(self, tp: bytes, fn_name: bytes) -> None:
        assert tp not in self.tracepoint_fds
        self.tracepoint_fds[tp] = 1000 + len(self.attached)
        self.attached.append((tp, fn_name))


def make(t0=0.0):
    bpf, closed, logs = FakeBpf(), [], []
    return bpf, closed, logs, CallHooks(bpf, t0, logs.append, close_fd=closed.append)


def traffic(h, kind, n):
    for _ in range(n):
        h.seen(int(kind))


def test_quiet_kinds_are_detached_only_after_the_window_and_enough_other_calls():
    bpf, closed, logs, h = make()
    h.tick(0.0, 5, 0)
    traffic(h, SockCall.SENDTO, QUIET_MIN_CALLS)
    h.tick(QUIET_S - 0.1, 5, 0)
    assert not h.detached                     # the window is not over
    h2 = make()[3]
    traffic(h2, SockCall.SENDTO, QUIET_MIN_CALLS - 1)
    h2.tick(QUIET_S + 1, 0, 0)
    assert not h2.detached                    # too few calls to tell
    traffic(h, SockCall.READ, 1)              # read carries traced TCP: a new window for it
    h.tick(QUIET_S, 5, 0)
    h.close()
    assert set(h.detached) == set(KINDS) - {SockCall.READ}
    fds = FakeBpf().tracepoint_fds
    assert sorted(closed) == sorted(fds[tp] for k in KINDS if k != SockCall.READ for tp, _ in _tracepoints(k))
    assert all(tp not in bpf.tracepoint_fds for k in h.detached for tp, _ in _tracepoints(k))
    assert h.changes[-1]["detached"] == ["write", "readv", "writev"] and logs


def test_a_new_process_a_stream_gap_or_the_recheck_attach_them_again():
    for trigger in ("process", "gap", "recheck"):
        bpf, _closed, _logs, h = make()
        h.tick(0.0, 5, 0)
        traffic(h, SockCall.RECVFROM, QUIET_MIN_CALLS)
        h.tick(QUIET_S, 5, 0)
        assert set(h.detached) == set(KINDS)
        at = QUIET_S + (RECHECK_S if trigger == "recheck" else 1.0)
        h.tick(at, 6 if trigger == "process" else 5, 1 if trigger == "gap" else 0)
        assert not h.detached, trigger
        assert {tp for tp, _ in bpf.attached} == {tp for k in KINDS for tp, _ in _tracepoints(k)}
        assert (b"syscalls:sys_exit_read", b"sc_exit") in bpf.attached
        why = h.changes[-1]["why"]
        assert why == {"process": "a new traced process", "gap": "a stream gap", "recheck": "the re-check"}[trigger]
        # ...and they wait for a whole new quiet window before going again
        traffic(h, SockCall.RECVFROM, QUIET_MIN_CALLS)
        h.tick(at + QUIET_S - 0.1, 6, 1)
        assert not h.detached
        h.tick(at + QUIET_S, 6, 1)
        assert set(h.detached) == set(KINDS)


def test_nothing_detached_before_a_window_without_traffic():
    _bpf, _closed, _logs, h = make()
    for t in range(100):
        h.tick(float(t), 0, 0)
    assert not h.detached and h.changes == []
