"""agent.netrows: the sub-component inputs of DESIGN.md per message, from the walker's
SCHED (receives) and WINDOW (sends) items and the netstack TX times, on timelines
built here (each case of the estimate, and each reason for a null); the item
layouts against the probe's ctypes mirrors."""
from __future__ import annotations

import ctypes

from agent import calls, netrows
from agent.netrows import SchedHistory, sock_wait_split, tx_stages_of, window_split
from probes.events import NsSched, NsWindow, SockcallItemKind

TID = 77


def test_item_layouts_match_the_probe():
    assert netrows.NS_SCHED.size == ctypes.sizeof(NsSched)
    assert netrows.NS_WINDOW.size == ctypes.sizeof(NsWindow)
    assert calls._ITEM_SCHED == SockcallItemKind.SCHED and calls._ITEM_WINDOW == SockcallItemKind.WINDOW


def _sched(wake=0, sw_in=0, runq=0, nr=0, tracked=1, flags=netrows.NS_SCHED_F_TRACKED) -> bytes:
    s = NsSched(ts_wakeup_ns=wake, ts_switch_in_ns=sw_in, oncpu_ns=0, runq_ns=runq, ts_tracked_ns=tracked,
                nr_switch_in=nr, flags=flags)
    return bytes(s)


def _split(hist: SchedHistory, d, r, **kw) -> dict:
    return sock_wait_split(d, r, hist.snapshot(TID, r, _sched(**kw)))


def test_thread_on_cpu_since_before_data_ready_is_all_busy():
    h = SchedHistory()
    # switched in at 1000, data ready at 5000, recv exit at 9000: it never left the CPU
    got = _split(h, 5000, 9000, wake=900, sw_in=1000, runq=300, nr=4)
    assert got == {"runq_wait_ns": 0, "busy_wait_ns": 4000}


def test_one_switch_in_since_the_previous_receive_is_exact():
    h = SchedHistory()
    h.snapshot(TID, 2000, _sched(wake=100, sw_in=200, runq=1000, nr=5))   # previous recv exit at 2000
    # slept; woken at 4000 (before data-ready at 4500: another socket's data), switched
    # in at 7000: one run-queue period of 3000 ns, 2500 of it after data-ready
    got = _split(h, 4500, 8000, wake=4000, sw_in=7000, runq=4000, nr=6)
    assert got == {"runq_wait_ns": 2500, "busy_wait_ns": 1000}
    # the period began after data-ready: all of it
    h.snapshot(TID, 9000, _sched(wake=4000, sw_in=7000, runq=4000, nr=6))
    got = _split(h, 10_000, 14_000, wake=10_500, sw_in=12_000, runq=5500, nr=7)
    assert got == {"runq_wait_ns": 1500, "busy_wait_ns": 2500}


def test_wake_up_after_data_ready_to_switch_in():
    h = SchedHistory()
    h.snapshot(TID, 1000, _sched(sw_in=500, runq=0, nr=1))
    # three switch-ins since the previous receive: only the latest wake-up (after
    # data-ready) -> switch-in is separable
    got = _split(h, 3000, 9000, wake=5000, sw_in=5600, runq=2000, nr=4)
    assert got == {"runq_wait_ns": 600, "busy_wait_ns": 5400}


def test_nulls_say_why():
    h = SchedHistory()
    h.snapshot(TID, 1000, _sched(sw_in=500, nr=1))
    mixed = _split(h, 3000, 9000, wake=2000, sw_in=5600, runq=2000, nr=4)
    assert mixed["runq_wait_ns"] is None and mixed["busy_wait_ns"] is None
    assert mixed["runq_wait_ns:null"] == netrows.R_RUNQ_MIXED
    late = _split(SchedHistory(), 3000, 9000, wake=8000, sw_in=9100, runq=2000, nr=4)
    assert late["runq_wait_ns:null"] == netrows.R_SCHED_AFTER_EXIT
    first = sock_wait_split(3000, 9000, SchedHistory().snapshot(TID, 9000, _sched(flags=0)))
    assert first["busy_wait_ns:null"] == netrows.R_SCHED_UNTRACKED
    assert sock_wait_split(3000, 9000, None)["runq_wait_ns:null"] == netrows.R_NO_SCHED
    assert sock_wait_split(None, 9000, None)["runq_wait_ns:null"] == netrows.R_NO_READY
    off = SchedHistory().snapshot(TID, 9000, _sched(flags=netrows.NS_SCHED_F_NOT_LOADED))
    assert sock_wait_split(3000, 9000, off)["runq_wait_ns:null"] == netrows.R_NOT_LOADED


def test_an_untracked_record_does_not_become_history():
    h = SchedHistory()
    h.snapshot(TID, 1000, _sched(flags=0, runq=10**9, nr=99))
    assert h.snapshot(TID, 2000, _sched())[-1] is None


def _window(end, *, una, nxt, snd_wnd=1 << 20, cwnd=10, packets_out=2, flags=netrows.NS_WIN_F_VALID) -> bytes:
    return bytes(NsWindow(snd_cwnd=cwnd, snd_ssthresh=0, packets_out=packets_out, retrans_out=0,
                          snd_wnd=snd_wnd, snd_una=una, snd_nxt=nxt, write_seq=end, mss_cache=1448,
                          wmem_queued_bytes=0, sndbuf_bytes=1 << 20, flags=flags))


def test_end_sent_inside_the_syscall_waited_for_no_window():
    end = 0xFFFF_FF00 + 500 & 0xFFFFFFFF   # across the 2**32 wrap
    st = tx_stages_of(0, 1500, 1600)
    assert window_split(end, 1000, _window(end, una=end - 3000 & 0xFFFFFFFF, nxt=end), st) == \
        {"cwnd_wait_ns": 0, "rwnd_wait_ns": 0}


def test_end_held_by_the_congestion_window():
    end = 100_000
    st = tx_stages_of(0, 50_000, 50_300)   # left TCP at 50 us, driver at 50.3 us
    got = window_split(end, 20_000, _window(end, una=80_000, nxt=90_000, cwnd=7, packets_out=7), st)
    assert got == {"cwnd_wait_ns": 30_000, "rwnd_wait_ns": 0}
    assert st["qdisc_wait_ns"] == 300


def test_end_held_by_the_receive_window():
    end = 100_000
    st = tx_stages_of(0, 70_000, 70_100)
    # the end lies 20000 bytes past snd_una, the peer offers 8192: rwnd holds it
    got = window_split(end, 20_000, _window(end, una=80_000, nxt=88_192, snd_wnd=8192, cwnd=10, packets_out=10), st)
    assert got == {"cwnd_wait_ns": 0, "rwnd_wait_ns": 50_000}


def test_held_by_neither_window_stays_in_stack_tx():
    end = 100_000
    st = tx_stages_of(0, 70_000, 70_100)
    assert window_split(end, 20_000, _window(end, una=99_000, nxt=99_000), st) == \
        {"cwnd_wait_ns": 0, "rwnd_wait_ns": 0}


def test_no_queue_record_uses_the_driver_handoff():
    end = 100_000
    st = tx_stages_of(netrows.NS_TX_F_NO_QUEUE, 0, 70_100)
    assert "qdisc_wait_ns" not in st
    got = window_split(end, 20_000, _window(end, una=80_000, nxt=90_000, cwnd=7, packets_out=7), st)
    assert got == {"cwnd_wait_ns": 50_100, "rwnd_wait_ns": 0}


def test_window_nulls_say_why():
    end = 100_000
    st = tx_stages_of(0, 70_000, 70_100)
    assert window_split(end, 20_000, None, st)["cwnd_wait_ns:null"] == netrows.R_NO_WINDOW
    off = _window(end, una=0, nxt=0, flags=netrows.NS_WIN_F_NOT_LOADED)
    assert window_split(end, 20_000, off, st)["rwnd_wait_ns:null"] == netrows.R_NOT_LOADED
    held = _window(end, una=80_000, nxt=90_000, cwnd=7, packets_out=7)
    none = tx_stages_of(netrows.NS_TX_F_OVERWRITTEN, 0, 0)
    assert window_split(end, 20_000, held, none)["cwnd_wait_ns:null"] == netrows.R_NO_LEFT_TCP
