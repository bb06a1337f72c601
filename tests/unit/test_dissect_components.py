"""Components: exact additivity, folding of stages a device lacks, negatives kept, one host only."""
import numpy as np
import pytest

from reports import components as C
from reports.dissect import dissect
from workloads.simulated.job import Sim, joined_to_truth, simulate
from reports.summary import summary




def _ns(s):
    return s.to_numpy(dtype=np.int64, na_value=0)


def _check_additive(req):
    """Components add up to the end-to-end in integer ns, for every request; so do the groups."""
    total = sum(_ns(req[c]) for c in C.COMPONENTS)
    assert np.array_equal(total, _ns(req["e2e"]))
    groups = sum(_ns(req[f"group_{g}"]) for g in C.GROUPS)
    assert np.array_equal(groups, _ns(req["e2e"]))
    for parent, parts in C.SUBCOMPONENTS.items():
        have = req[parts[-1]].notna()
        if parent == "server_user":
            assert np.array_equal(sum(_ns(req[p][have]) for p in parts), _ns(req[parent][have]))
        elif parent.endswith("kernel_rx"):
            stack, sock, runq, busy = parts
            h = req[stack].notna()
            assert np.array_equal(_ns(req[stack][h]) + _ns(req[sock][h]), _ns(req[parent][h]))
            h = req[runq].notna()
            assert np.array_equal(_ns(req[runq][h]) + _ns(req[busy][h]), _ns(req[sock][h]))
        elif parent.endswith("kernel_tx"):
            assert np.array_equal(sum(_ns(req[p][have]) for p in parts), _ns(req[parent][have]))


@pytest.mark.parametrize("nic", [False, True])
def test_shared_clock_components_exact(tmp_path, nic):
    truth = simulate(tmp_path, Sim(requests=120, nic=nic, jitter=0.4, shared_clock=True, seed=5))
    d = dissect([tmp_path])
    assert all(m.source == "shared" for m in d.clocks.values())
    j = joined_to_truth(d, truth)
    assert len(j) == len(truth["slices"])
    _check_additive(d.requests)
    for c in C.BASE:
        if not nic and "nic" in c:
            assert j[c].isna().all()   # the device lacks it: null, never faked
            continue
        assert (j[c].astype("int64") == j[f"{c}_true"]).all(), c
    for c in ("server_stack_rx", "server_runq_wait", "server_busy_wait", "client_cwnd_wait",
              "client_connect_wait", "client_stack_rx"):
        assert (j[c].astype("int64") == j[f"{c}_true"]).all(), c
    if not nic:   # the nic's time went into the wire, and the report says why
        assert (j["folded"] == "client_nic_tx+server_nic_rx>wire_req;server_nic_tx+client_nic_rx>wire_resp").all()
        assert any("no TX completion" in n for n in d.notes)
        s = summary(d)
        assert s["by_op"]["pull"]["groups_us"]["nic"] is None
        assert "client_nic_tx" not in s["by_op"]["pull"]["components_us"]


def test_negative_component_kept_and_counted(tmp_path):
    truth = simulate(tmp_path, Sim(requests=60, shared_clock=True, negative_wire_at=(3, 17), seed=2))
    d = dissect([tmp_path])
    j = joined_to_truth(d, truth)
    neg = j[j["wire_req"].astype("int64") < 0]
    assert len(neg) == 2 and (neg["wire_req"].astype("int64") == -20_000).all()
    _check_additive(d.requests)
    assert summary(d)["negative_components"] == {"wire_req": 2}


def test_only_the_worker_traced_gives_network_and_remote(tmp_path):
    truth = simulate(tmp_path, Sim(requests=80, traced=("w0",), wire_req_ns=400_000, seed=4))
    d = dissect([tmp_path / "w0"])
    assert d.hosts == ["w0"] and d.clocks == {}
    j = joined_to_truth(d, truth)
    assert len(j) == (truth["slices"]["worker_host"] == "w0").sum()
    nar = sum(j[f"{c}_true"] for c in C.BASE[2:11])   # client NIC TX .. client NIC RX
    assert (j["network_and_remote"].astype("int64") == nar).all()
    for c in ("client_user_tx", "client_kernel_tx", "client_kernel_rx", "client_user_rx"):
        assert (j[c].astype("int64") == j[f"{c}_true"]).all()
    for c in ("wire_req", "server_user", "wire_resp", "server_kernel_rx"):
        assert j[c].isna().all()
    _check_additive(d.requests)
    s = summary(d)["by_op"]["pull"]
    assert set(s["groups_us"]) == {"host", "nic", "wire", "network_and_remote"}
    assert s["groups_us"]["wire"] is None
    # the untraced server is named by its address
    assert set(s["by_server"]) <= {"10.77.0.1", "10.77.0.2"}


def test_without_netstack_host_and_network_are_not_mixed(tmp_path):
    """No device stages: what lies between the syscalls is 'unsplit', never given to the wire."""
    truth = simulate(tmp_path, Sim(requests=50, netstack=False, shared_clock=True, seed=6))
    d = dissect([tmp_path])
    j = joined_to_truth(d, truth)
    req_span = sum(j[f"{c}_true"] for c in ("client_kernel_tx", "client_nic_tx", "wire_req",
                                             "server_nic_rx", "server_kernel_rx"))
    resp_span = sum(j[f"{c}_true"] for c in ("server_kernel_tx", "server_nic_tx", "wire_resp",
                                              "client_nic_rx", "client_kernel_rx"))
    assert (j["unsplit"].astype("int64") == req_span + resp_span).all()
    assert j["wire_req"].isna().all() and j["client_kernel_tx"].isna().all()
    assert (j["server_user"].astype("int64") == j["server_user_true"]).all()
    _check_additive(d.requests)
    assert any("netstack probe not loaded" in n for n in d.notes)


def test_without_framework_probe_e2e_runs_syscall_to_syscall(tmp_path):
    truth = simulate(tmp_path, Sim(requests=40, framework=False, shared_clock=True, seed=7))
    d = dissect([tmp_path])
    j = joined_to_truth(d, truth)
    assert (j["e2e_from"] == "syscall").all() and (j["e2e_to"] == "syscall").all()
    assert j["client_user_tx"].isna().all() and j["client_user_rx"].isna().all()
    expect = j["e2e_true"] - j["client_user_tx_true"] - j["client_user_rx_true"]
    assert (j["e2e"].astype("int64") == expect).all()
    assert any("no framework time" in n for n in d.notes)


@pytest.mark.parametrize("missing, name", [
    ({3}, "client_nic_tx>wire_req"),
    ({4}, "server_nic_rx>wire_req"),
    ({3, 4}, "client_nic_tx+server_nic_rx>wire_req"),
    ({9, 10}, "server_nic_tx+client_nic_rx>wire_resp"),
    (set(range(4, 10)), "wire_req+server_nic_rx+server_kernel_rx+server_user+server_kernel_tx+server_nic_tx"
                        "+wire_resp>network_and_remote"),
    ({2}, "client_kernel_tx+client_nic_tx>unsplit"),
    ({6}, "server_kernel_rx+server_user>unsplit"),
])
def test_fold_rules(missing, name):
    present = [k not in missing for k in range(len(C.POINTS))]
    spans, folds = C.describe_pattern(present)
    assert folds == name
    # the spans tile the chain: consecutive, first to last point
    assert spans[0][0] == 0 and spans[-1][1] == len(C.POINTS) - 1
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
