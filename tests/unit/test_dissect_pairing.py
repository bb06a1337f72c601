"""Pairing across hosts: each message's two ends, each request with its response.

The run dirs are simulated with a known truth (workloads.simulated.job): with one
shared clock every component of every request must equal the truth exactly,
which a wrong pairing (of ends, or of request and response) cannot do when
the delays jitter.
"""
import numpy as np
import pandas as pd
import pytest

from reports.dissect import dissect
from reports.pairing import pair_ends, pair_requests
from workloads.simulated.job import TRUTH_KEY, Sim, joined_to_truth, simulate

KEY = TRUTH_KEY



@pytest.fixture(scope="module")
def jittery(tmp_path_factory):
    """Shared clock, jittery wires and server, 2 slices per request, reconnects, some losses."""
    out = tmp_path_factory.mktemp("jittery")
    sim = Sim(workers=3, servers=3, requests=150, slices=2, jitter=0.5, wire_req_ns=300_000,
              wire_resp_ns=200_000, server_user_ns=150_000, shared_clock=True, reconnect_every=7,
              lose_request=0.02, lose_response=0.02, lose_end=0.01, seed=3)
    truth = simulate(out, sim)
    return dissect([out]), truth, sim


def test_every_request_equals_its_truth(jittery):
    d, truth, sim = jittery
    j = joined_to_truth(d, truth)
    assert len(j) > 0.9 * len(truth["slices"])
    for c in ("client_user_tx", "client_kernel_tx", "wire_req", "server_kernel_rx", "server_user",
              "server_kernel_tx", "wire_resp", "client_kernel_rx", "client_user_rx", "e2e"):
        bad = j[j[c].isna() | (j[c].astype("float64") != j[f"{c}_true"])]
        # only the requests that lost a server end may lack a server-side component
        if c in ("wire_req", "server_kernel_rx", "server_user", "server_kernel_tx", "wire_resp"):
            bad = bad[bad["folded"].str.contains(">unsplit", regex=False) == False]  # noqa: E712
        assert bad.empty, f"{c}: {len(bad)} requests differ from the truth\n{bad[KEY + [c, c + '_true']].head()}"


def test_counts_of_what_could_not_be_paired(jittery):
    d, truth, sim = jittery
    n = len(truth["slices"])
    st = d.stats
    assert st.messages_unparsed == 0
    # each lost whole message leaves its partner alone; lost single ends do not unpair a request
    assert 0 < st.requests_without_response < 0.06 * n
    assert 0 < st.messages_without_request < 0.06 * n
    assert st.requests + st.requests_without_response <= n
    assert st.requests + st.messages_without_request <= n
    # control messages are paired as message ends (clock samples) but are never requests
    assert d.ends.paired > 2 * st.requests


def test_ends_refused_when_ids_disagree():
    """Same 4-tuple and sequence range but other ps-lite ids: not one message (no guess)."""
    base = dict(local_port=1, remote_port=2, conn_id="a:1#5-b:2#9", seq_first=10, seq_end=20,
                control=False, request=True, op="push", protocol="pslite", pair_scope="nodes", call_space=0, sender=9, recver=8,
                num_keys=1, value_bytes=1, msg_bytes=10, pid=1, null_reasons="")
    tx = dict(base, host_id="w0", direction="tx", local_ip="a", remote_ip="b", call_id=1)
    rx = dict(base, host_id="ps0", direction="rx", local_ip="b", remote_ip="a", local_port=2, remote_port=1,
              call_id=2)
    rx_ok = dict(rx, call_id=1, seq_first=20, seq_end=30)
    tx_ok = dict(tx, seq_first=20, seq_end=30)
    m = _frame([tx, rx, tx_ok, rx_ok])
    msgs, st = pair_ends(m)
    assert (st.paired, st.refused, st.tx_only, st.rx_only) == (1, 1, 1, 1)
    assert len(msgs) == 3


def test_reconnect_with_new_isns_is_another_connection():
    """A conn_id with other ISNs on both ends (known) refuses the pair even if seq matches."""
    base = dict(local_port=1, remote_port=2, seq_first=10, seq_end=20, control=False, request=True,
                op="push", protocol="pslite", pair_scope="nodes", call_space=0, sender=9, recver=8, call_id=1, pid=1, null_reasons="")
    tx = dict(base, host_id="w0", direction="tx", local_ip="a", remote_ip="b", conn_id="a:1#5-b:2#9")
    rx = dict(base, host_id="ps0", direction="rx", local_ip="b", remote_ip="a", local_port=2, remote_port=1,
              conn_id="a:1#6-b:2#7")
    _, st = pair_ends(_frame([tx, rx]))
    assert st.paired == 0 and st.refused == 1
    # an end that did not know its ISNs ('?') can still pair
    _, st = pair_ends(_frame([tx, dict(rx, conn_id="a:1#?-b:2#?")]))
    assert st.paired == 1


def test_repeated_ids_pair_in_time_order():
    """A worker that restarted counts timestamps from 0 again: the n-th request with the n-th response."""
    rows = []
    for k, t in enumerate((1_000, 9_000)):
        ids = dict(control=False, protocol="pslite", pair_scope="nodes", call_space=0, call_id=0, op="pull")
        rows.append(dict(ids, request=True, sender=9, recver=8, tx_ts_send_first_enter_ns=t,
                         rx_ts_recv_last_exit_ns=t + 100, tag=f"q{k}"))
        rows.append(dict(ids, request=False, sender=8, recver=9, tx_ts_send_first_enter_ns=t + 200,
                         rx_ts_recv_last_exit_ns=t + 300, tag=f"p{k}"))
    msgs = pd.DataFrame(rows[::-1])   # order of the rows must not matter
    for c in ("tx_ts_send_first_enter_ns", "rx_ts_recv_last_exit_ns"):
        msgs[c] = msgs[c].astype("Int64")
    req, st = pair_requests(msgs)
    assert st.requests == 2
    assert sorted(zip(req["q_tag"], req["p_tag"])) == [("q0", "p0"), ("q1", "p1")]


def test_messages_without_ids_are_counted_not_paired():
    ids = dict(control=False, protocol="pslite", pair_scope="nodes", call_space=0, op="pull", tx_ts_send_first_enter_ns=1,
               rx_ts_recv_last_exit_ns=2)
    msgs = pd.DataFrame([dict(ids, request=True, call_id=0, sender=9, recver=None),
                         dict(ids, request=False, call_id=0, sender=8, recver=9)])
    msgs["recver"] = msgs["recver"].astype("Int64")
    _, st = pair_requests(msgs)
    assert (st.requests, st.messages_unparsed, st.messages_without_request) == (0, 1, 1)


def _frame(rows):
    from reports.load import _categorical, _wanted_schema, to_frame
    import pyarrow as pa

    want = _wanted_schema()
    cols = {f.name: [r.get(f.name) for r in rows] for f in want}
    plain = pa.schema([pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                       for f in want])
    tbl = pa.table(cols, schema=plain).cast(want)
    return _categorical(to_frame(tbl))


def test_sim_ends_are_all_paired_without_losses(tmp_path):
    simulate(tmp_path, Sim(requests=40, shared_clock=True, seed=1))
    d = dissect([tmp_path])
    assert d.ends.tx_only == d.ends.rx_only == d.ends.refused == d.ends.ambiguous == 0
    assert d.stats.requests == 80 and d.complete.shape[0] == 80
    assert np.all(d.requests["worker_host"].str.startswith("w"))
    assert np.all(d.requests["server_host"].str.startswith("ps"))
