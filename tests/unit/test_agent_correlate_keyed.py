"""agent.correlate with keyed framework records (probes.framework.KeyedMessage: brpc's
RPC ends, which carry the wire's correlation id): matched to their wire message by
(process, direction, call_space, call_id, request), in causal order with its calls; one id
that two clients both used is told apart by time, or else by the thread of its syscall,
never by arrival order."""
from __future__ import annotations

from agent.calls import SockcallAssembler
from agent.correlate import Correlator
from agent.streams import StreamDecoder
from parsers.brpc.encode import RpcSpec, message_bytes
from probes.framework import KeyedMessage
from test_agent_decode import ISN_C, ISN_S, record

SERVER = ("10.0.0.2", 9000)
TRAINER_A, TRAINER_B = ("10.0.0.1", 40000), ("10.0.0.3", 40001)
SERVER_PID, TRAINER_PID = 200, 100


class Rig:
    def __init__(self):
        self.rows = []
        self.asm, self.dec = SockcallAssembler("prefix"), StreamDecoder()
        self.cor = Correlator(lambda ino, row: self.rows.append(row), lambda ino: f"h{ino}")

    def wire(self, spec: RpcSpec, *, tx, local, remote, ts, tgid, sk, isns=(ISN_C, ISN_S), tid=None):
        """One call moving one whole message; the call enters at ts and exits at ts + 500."""
        data = message_bytes(spec)
        r = record(tx, (isns[0] if tx else isns[1]) + 1, len(data), data[:256], ts=ts, tgid=tgid,
                   tid=tgid + 1 if tid is None else tid, local=local, remote=remote, sk=sk, isns=isns)
        for wm in self.dec.feed(self.asm.feed(r)):
            self.cor.on_message(wm)

    def fw(self, direction, request, cid, ts, tgid, done=None, tid=None):
        self.cor.on_framework(KeyedMessage(
            layer="brpc", direction=direction, tgid=tgid, tid=tgid + 1 if tid is None else tid, sock=cid, ts_ns=ts,
            call_ts_ns=ts, ret_ts_ns=done or ts, first_ret_ts_ns=ts, total_bytes=0, frames=None,
            call_key=(None, cid, request)))

    def close(self):
        self.cor.close()
        return self.rows


def test_client_ends_match_by_correlation_id():
    rig = Rig()
    rig.fw("send", True, 7, 900, TRAINER_PID)            # PackRpcRequest, before the write
    rig.fw("send", True, 8, 950, TRAINER_PID)            # another RPC: no wire message of it
    rig.wire(RpcSpec(correlation_id=7), tx=True, local=TRAINER_A, remote=SERVER, ts=1_000,
             tgid=TRAINER_PID, sk=1)
    rig.wire(RpcSpec(request=False, correlation_id=7), tx=False, local=TRAINER_A, remote=SERVER,
             ts=3_000, tgid=TRAINER_PID, sk=1)
    rig.fw("recv", False, 7, 3_600, TRAINER_PID)         # OnVersionedRPCReturned, after the read
    rows = {r["direction"]: r for r in rig.close()}
    assert rows["tx"]["ts_framework_ns"] == 900 and rows["tx"]["framework_layer"] == "brpc"
    assert rows["rx"]["ts_framework_ns"] == 3_600
    assert rig.cor.counters["framework_matched"] == 2


def test_a_record_out_of_causal_order_is_not_taken():
    rig = Rig()
    rig.wire(RpcSpec(correlation_id=7), tx=True, local=TRAINER_A, remote=SERVER, ts=1_000,
             tgid=TRAINER_PID, sk=1)
    rig.fw("send", True, 7, 1_200, TRAINER_PID)   # after the write began: not this message's
    (row,) = rig.close()
    assert row["ts_framework_ns"] is None and "ts_framework_ns=" in row["null_reasons"]
    assert rig.cor.counters["framework_unmatched"] == 1 and rig.cor.counters["framework_matched"] == 0


def test_one_id_from_two_clients_is_told_apart_by_time():
    """Two trainers run the same program: their bthread ids, so their correlation ids,
    coincide. The server's records of both come in the opposite order from the wire."""
    rig = Rig()
    rig.fw("recv", True, 7, 6_000, SERVER_PID, done=6_400)   # ProcessRpcRequest of B's
    rig.fw("recv", True, 7, 2_000, SERVER_PID, done=2_400)   # ... of A's
    rig.wire(RpcSpec(correlation_id=7), tx=False, local=SERVER, remote=TRAINER_A, ts=1_000,
             tgid=SERVER_PID, sk=1)
    rig.wire(RpcSpec(correlation_id=7), tx=False, local=SERVER, remote=TRAINER_B, ts=5_000,
             tgid=SERVER_PID, sk=2, isns=(ISN_C + 9, ISN_S + 9))
    rows = {r["remote_ip"]: r["ts_framework_ns"] for r in rig.close()}
    assert rows == {"10.0.0.1": 2_000, "10.0.0.3": 6_000}


def test_ps_lite_records_without_ids_are_still_counted():
    from probes.framework import FrameworkMessage
    rig = Rig()
    rig.cor.on_framework(FrameworkMessage(
        layer="ps", direction="send", tgid=1, tid=2, sock=3, ts_ns=1, call_ts_ns=1, ret_ts_ns=2,
        first_ret_ts_ns=2, total_bytes=10, frames=None, meta=None))
    assert rig.cor.counters["framework_without_ids"] == 1 and not rig.cor._fws



def test_one_id_in_flight_from_two_clients_is_told_apart_by_thread():
    """Both requests read before either is handed to the service: time cannot tell
    them apart; the thread that read each one's last byte handed it over."""
    rig = Rig()
    rig.wire(RpcSpec(correlation_id=7), tx=False, local=SERVER, remote=TRAINER_A, ts=1_000,
             tgid=SERVER_PID, sk=1, tid=501)
    rig.wire(RpcSpec(correlation_id=7), tx=False, local=SERVER, remote=TRAINER_B, ts=1_100,
             tgid=SERVER_PID, sk=2, isns=(ISN_C + 9, ISN_S + 9), tid=502)
    rig.fw("recv", True, 7, 2_050, SERVER_PID, done=2_200, tid=502)
    rig.fw("recv", True, 7, 2_000, SERVER_PID, done=2_100, tid=501)
    rows = {r["remote_ip"]: r["ts_framework_ns"] for r in rig.close()}
    assert rows == {"10.0.0.1": 2_000, "10.0.0.3": 2_050}
