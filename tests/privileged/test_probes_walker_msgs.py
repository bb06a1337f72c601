"""The walker's fixed message records (events.h struct sockcall_msg, SOCKCALLS_MSG_RECORDS)
against the call records of the same traffic (the slow path they are to replace).

Real pyzmq traffic in a namespace of our own (test_probes_walker.py's peers): bursts
of small ps-lite messages (many per call) and large ones (many calls each), traced by
the sockcalls and netstack probes with the message records compiled in. Every
MSG_END item of every call record must have exactly one message record, in order,
with the same connection, thread, call times and range, end sequence, index and frame
count. Its items must be the call payload's slice for that message, byte for byte,
so that the ps-lite parser fed only from the slices finds the ids the app sent, and
its RX times must be the call's RX_TIMES item for that end.
"""
from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_probes_walker import (Capture, directions, expected_timestamp, make_messages,  # noqa: E402
                                netns, router_and_dealer)  # noqa: F401  (netns: a fixture)

pytestmark = pytest.mark.privileged


def _start(netns_name: str):
    from probes.events import WalkProtocol
    from probes.filters import Filters
    from probes.loader import ProbeProgram
    from probes.netstack import NETSTACK
    from probes.sockcalls import SOCKCALLS, install_walker

    prog = ProbeProgram.start([SOCKCALLS, NETSTACK], Filters.build(netns=[netns_name]),
                              overrides={"SOCKCALLS_MSG_RECORDS": 1})
    install_walker(prog, (WalkProtocol.ZMTP,))
    return prog


class RecordCapture(Capture):
    """test_probes_walker's calls, each also with its records (call.records, in order)."""

    def __init__(self, prog):
        self._records: dict[int, list] = {}
        super().__init__(prog)

    def _add(self, ev):
        from probes.events import SockcallEvent

        if not isinstance(ev, SockcallEvent):
            return   # the netstack probe's events
        mine = self._records.setdefault(ev.tid, [])
        if mine and (mine[0].enter_ts_ns, mine[0].sk) != (ev.enter_ts_ns, ev.sk):
            mine.clear()   # as CallAssembler: the rest of that call was lost
        mine.append(ev)
        call = self._asm.add(ev)
        if call is not None:
            call.records = self._records.pop(ev.tid)
            self.calls.append(call)


class MsgRing:
    """The sockcalls_msgs ring, read with the loader's RingReader."""

    def __init__(self, prog):
        from probes.events import SockcallMsg
        from probes.loader import RingReader

        self.records: list = []

        def on(data, size):
            assert size == ctypes.sizeof(SockcallMsg)
            self.records.append(SockcallMsg.from_buffer_copy(ctypes.string_at(data, size)))
            return 0

        self._reader = RingReader(prog.bpf, "sockcalls_msgs", on)

    def drain_and_close(self) -> None:
        self._reader.consume()
        self._reader.close()


def _slices(call):
    """A call's MSG_END items as [(its message's payload slice, the item, whether the call took
    several records)] and its RX_TIMES items in order. A slice runs from just past the
    previous MSG_END (or the record's first item) up to and with this MSG_END, in the record
    that holds it."""
    from probes.events import NsRxTimes, SockcallItemKind, SockcallMsgEnd, decode_items

    out, rx = [], []
    for ev in call.records:
        payload = bytes(ev.payload[:ev.payload_bytes])
        at, start = 0, 0
        for item, body in decode_items(payload):
            end = at + ctypes.sizeof(item) + item.len
            if item.kind == SockcallItemKind.MSG_END:
                out.append((payload[start:end], SockcallMsgEnd.from_buffer_copy(body), len(call.records) > 1))
                start = end
            elif item.kind == SockcallItemKind.RX_TIMES:
                rx.append(NsRxTimes.from_buffer_copy(body))
            at = end
    return out, rx


def test_every_message_end_has_its_record_with_the_calls_facts(netns):
    from parsers.pslite.meta import PBMeta
    from probes.events import (SOCKCALL_MSG_F_ITEMS_CUT, SOCKCALL_MSG_F_ITEMS_LOST, SOCKCALL_MSG_F_RX_TIMES,
                               SockcallItemKind, decode_items)

    router, dealer, pids = router_and_dealer(netns, connect=False)
    try:
        prog = _start(netns)
        with prog:
            cap, ring = RecordCapture(prog), MsgRing(prog)
            dealer.ask("connect", prog)
            small, large = make_messages("small", 1500, 3), make_messages("large", 4, 4)
            assert dealer.ask("send small 1500 3", prog)["sent"] == 1500
            assert router.ask("wait 1500", prog)["received"] == 1500
            assert dealer.ask("send large 4 4", prog)["sent"] == 4
            assert router.ask("wait 1504", prog)["received"] == 1504
            cap.drain()
            ring.drain_and_close()
            counters = prog.counters()["sockcalls"]
    finally:
        router.stop()
        dealer.stop()
    sent = small + large

    data = {k: d for k, d in directions(cap.calls).items() if d.messages}
    assert {(k[0], k[2]) for k in data} == {(pids["dealer"], True), (pids["router"], False)}
    compared = whole = with_rx = lost = named = 0
    for (tgid, _conn, is_send), d in data.items():
        recs = iter(sorted((r for r in ring.records if r.tgid == tgid and r.sk == d.event.sk),
                           key=lambda r: r.msg_index))
        ids = []
        for call in d.calls:
            slices, rx = _slices(call)
            for k, (piece, end, continued) in enumerate(slices):
                r = next(recs)
                ev = call.event
                assert (r.tid, r.netns_ino, r.call, r.enter_ts_ns, r.exit_ts_ns, r.seq_start, r.seq_end) == \
                    (ev.tid, ev.netns_ino, int(ev.call_kind), ev.enter_ts_ns, ev.exit_ts_ns, ev.seq_start, ev.seq_end)
                assert (r.end_seq, r.msg_index) == (end.end_seq, end.msg_index)
                compared += 1
                if r.flags & SOCKCALL_MSG_F_ITEMS_LOST:
                    lost += 1
                    assert continued, "a slice lost in a call of one record"
                    continue
                assert r.frames == end.frames
                got = bytes(r.items[:r.items_bytes])
                if r.flags & SOCKCALL_MSG_F_ITEMS_CUT:
                    assert got == piece[:len(got)] and len(piece) > len(got)
                else:
                    assert got == piece
                    whole += 1
                # a message whose first frame is in the slice: its PBMeta names the message sent
                for item, body in decode_items(got):
                    if item.kind == SockcallItemKind.BYTES and len(body) > 2 and body[0] in (0, 1) \
                            and body[2] == 0x08 and len(body) >= 2 + body[1]:
                        meta = PBMeta.FromString(body[2:2 + body[1]])
                        assert meta.timestamp == expected_timestamp(sent[r.msg_index])
                        ids.append(r.msg_index)
                        break
                if not is_send:
                    # (a call whose RX_TIMES items were split by a flush gives its records none)
                    assert r.flags & SOCKCALL_MSG_F_RX_TIMES or continued or k >= len(rx)
                    if r.flags & SOCKCALL_MSG_F_RX_TIMES:
                        assert bytes(r.rx) == bytes(rx[k])
                        with_rx += 1
        assert next(recs, None) is None, "a record without a MSG_END item"
        named += len(ids)
        # most messages begin in the call they end in (the rest began in an earlier call)
        assert len(ids) >= 0.9 * len(small), f"{len(ids)} of {len(sent)} slices name their message"
    # a slice is lost only when its call's items outgrew one record (16 KiB of them)
    assert compared == 2 * len(sent) and whole >= 0.99 * compared and lost <= 0.01 * compared
    assert with_rx >= 0.99 * len(sent)
    assert counters["msgs_out"] == compared and counters["msgs_lost"] == 0
    print(f"\nmessage records: {compared} compared with the calls' MSG_END items, {whole} slices whole, "
          f"{lost} lost to a flush, {named} naming their message, {with_rx} receives with RX times")
