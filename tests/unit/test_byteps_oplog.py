"""The BytePS job's oracle (workloads/byteps/oplog.py): ps-lite's PS_VERBOSE=2 van log
read into messages, its lines as BytePS 0.2.5.post15's ps-lite writes them; a line of
another shape counted, never interpreted; hostile text never raises. And the requests
test_benchmark.cc's arguments imply (runner.expected_requests), for every mode."""
from __future__ import annotations

import random

import pytest

from workloads.byteps import oplog
from workloads.byteps.runner import (PULL_ONLY, PUSH_ONLY, PUSH_PULL, PUSH_THEN_PULL,
                                     BenchmarkArgs, expected_requests, key_begin)

# lines from a worker's log of a real run (the meta's key is stack garbage: the
# benchmark never sets it)
LOG = """\
[12:07:24] src/postoffice.cc:25: Creating Van: zmq
[12:07:24] src/van.cc:530: zeromq\tsent: ? => 1. Meta: request=0, timestamp=0, control={ cmd=ADD_NODE, node={ [role=worker, ip=10.77.0.2, port=9200, is_recovery=0, aux_id=-1] } }. THIS IS NOT DATA MSG!
[12:07:24] src/van.cc:555: zeromq\treceived: 1 => 2147483647. Meta: request=0, timestamp=2, control={ cmd=ADD_NODE, node={ [role=worker, id=9, ip=10.77.0.3, port=9201, is_recovery=0, aux_id=-1] [role=worker, id=11, ip=10.77.0.2, port=9200, is_recovery=0, aux_id=-1] [role=server, id=8, ip=10.77.0.1, port=9100, is_recovery=0, aux_id=-1] [role=scheduler, id=1, ip=10.77.0.4, port=9000, is_recovery=0, aux_id=-1] } }. THIS IS NOT DATA MSG!
[12:07:24] src/van.cc:387: W[11] is connected to others
[12:07:24] src/van.cc:530: zeromq\tsent: ? => 8. Meta: request=1, timestamp=0, app_id=0, customer_id=0, simple_app=0, push=1, head=0, key=94484971850520, data_type={ UINT64 OTHER INT32 } Body: data_size=8 data_size=4096 data_size=4
[12:07:24] src/van.cc:555: zeromq\treceived: 8 => 11. Meta: request=0, timestamp=0, app_id=0, customer_id=0, simple_app=0, push=1, head=0, key=94484971850520
[12:07:24] src/van.cc:530: zeromq\tsent: ? => 8. Meta: request=1, timestamp=5, app_id=0, customer_id=0, simple_app=0, push=0, head=0, key=140725836893512, data_type={ UINT64 OTHER } Body: data_size=8 data_size=0
[12:07:24] src/van.cc:555: zeromq\treceived: 8 => 11. Meta: request=0, timestamp=5, app_id=0, customer_id=0, simple_app=0, push=0, head=0, key=140725836893512, data_type={ UINT64 OTHER INT32 } Body: data_size=8 data_size=4096 data_size=4
[12:07:24] src/van.cc:530: zeromq\tsent: ? => 1. Meta: request=1, timestamp=1, control={ cmd=BARRIER, barrier_group=7 }. THIS IS NOT DATA MSG!
[12:07:25] tests/test_benchmark.cc:164: Application goodput: 0.00388431 Gbps. count = 10
[12:07:25] src/van.cc:104: W[11] is stopped
"""


def _read(tmp_path, text: str) -> oplog.NodeLog:
    path = tmp_path / "worker-0.log"
    path.write_text(text)
    return oplog.read_node_log(path)


def test_a_real_log_reads_as_its_messages(tmp_path):
    log = _read(tmp_path, LOG)
    assert (log.role, log.node_id, log.stopped, log.goodput_counts) == ("worker", 11, True, [10])
    assert log.van_lines_unread == 0 and len(log.messages) == 7
    add, reply = log.messages[0], log.messages[1]
    assert (add.kind, add.sender, add.recver, add.cmd, add.data) == ("sent", None, 1, "ADD_NODE", False)
    assert [(n.role, n.node_id, n.ip, n.port) for n in reply.nodes] == [
        ("worker", 9, "10.77.0.3", 9201), ("worker", 11, "10.77.0.2", 9200),
        ("server", 8, "10.77.0.1", 9100), ("scheduler", 1, "10.77.0.4", 9000)]
    push, push_answer, pull, pull_answer = log.messages[2:6]
    assert push.summary() == {"request": True, "op": "push", "timestamp": 0, "app_id": 0,
                              "customer_id": 0, "head": 0, "data_sizes": [8, 4096, 4]}
    assert push.data_types == ("UINT64", "OTHER", "INT32") and push.meta_key == 94484971850520
    assert (push_answer.kind, push_answer.sender, push_answer.recver, push_answer.op,
            push_answer.data_sizes) == ("received", 8, 11, "push", ())
    assert (pull.op, pull.data_sizes, pull_answer.op, pull_answer.data_sizes) == (
        "pull", (8, 0), "pull", (8, 4096, 4))
    assert log.messages[6].cmd == "BARRIER" and log.messages[6].barrier_group == 7
    assert oplog.data_counts(log.sent()) == {"push": 1, "pull": 1}
    assert oplog.data_counts(log.received()) == {"push": 1, "pull": 1}
    assert oplog.control_counts(log.sent()) == {"ADD_NODE": 1, "BARRIER": 1}


def test_lines_of_another_shape_are_counted_not_read(tmp_path):
    good = LOG.splitlines()[4]
    bad = [
        good.replace("push=1", "push=2"),                         # not a bool
        good.replace(" => 8.", " => 8"),                          # no meta
        good + ". THIS IS NOT DATA MSG!",                         # a data message marked not data
        good.replace("Body:", "Body: data_size=x"),
        # two threads' pieces interleaved (what the unpatched logger writes)
        "[12:07:24] src/van.cc:555: zeromq\treceived: [12:07:24] 8 => 11. Meta: request=0",
        "[12:07:24] src/van.cc:530: zeromq\tsent: " + "x" * (oplog.MAX_LINE_CHARS + 10),
    ]
    log = _read(tmp_path, "\n".join(bad) + "\n")
    assert log.messages == [] and log.van_lines_unread == 5 and log.lines_too_long == 1


@pytest.mark.parametrize("seed", range(3))
def test_hostile_text_never_raises(tmp_path, seed):
    rng = random.Random(seed)
    lines = LOG.splitlines()
    alphabet = "[]{}=,.:?> \t0123456789-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ\x00\xff"
    out = []
    for _ in range(400):
        line = list(rng.choice(lines))
        for _ in range(rng.randint(1, 6)):
            at = rng.randrange(len(line))
            line[at:at + rng.randint(0, 3)] = rng.choice(alphabet) * rng.randint(0, 4)
        out.append("".join(line))
    log = _read(tmp_path, "\n".join(out))
    for m in log.messages:
        m.summary()
        assert m.op and len(m.nodes) <= oplog.MAX_NODES


def test_a_log_longer_than_the_bound_is_cut_and_said_so(tmp_path, monkeypatch):
    monkeypatch.setattr(oplog, "MAX_LOG_BYTES", len(LOG) // 2)
    log = _read(tmp_path, LOG)
    assert log.truncated and not log.stopped


@pytest.mark.parametrize("mode", [PUSH_THEN_PULL, PUSH_PULL, PUSH_ONLY, PULL_ONLY])
@pytest.mark.parametrize("servers", [1, 3])
def test_the_requests_the_arguments_imply(mode, servers):
    args = BenchmarkArgs(length=64, repeat=5, mode=mode, keys_per_server=2)
    reqs = expected_requests(args, servers)
    keys = servers * 2
    init = reqs[:keys]
    assert init == [("push", k % servers, key_begin(k % servers, servers) + k) for k in range(keys)]
    rest = reqs[keys:]
    n = {"push": sum(op == "push" for op, _, _ in rest), "pull": sum(op == "pull" for op, _, _ in rest)}
    assert n == {PUSH_THEN_PULL: {"push": 5 * servers, "pull": 5 * servers},
                 PUSH_PULL: {"push": 5 * keys, "pull": 5 * keys},
                 PUSH_ONLY: {"push": 5 * keys, "pull": 0},
                 PULL_ONLY: {"push": 0, "pull": 5 * keys}}[mode]
    # every key on its server's range: server s of N begins at kMaxKey / N * s
    assert all(key_begin(s, servers) <= key < key_begin(s, servers) + keys
               for _, s, key in reqs)
    assert key_begin(1, 2) == (2**64 - 1) // 2
