"""bench.floor without root: its hooks are the agent's declared attach points, and
its program is generated from a count alone."""
from __future__ import annotations

import re

import pytest

from core.errors import UserError
from agent.sources import kernel_probes
from bench.floor import Floor, Hook, agent_hooks, hits_report, program_text
from probes.framework import POINTS


def test_hooks_are_every_attach_point_the_agent_declares():
    hooks = agent_hooks()
    kernel = [(a.kind, a.target) for p in kernel_probes(True) for a in p.attach]
    assert [(h.kind, h.target) for h in hooks[:len(kernel)]] == kernel
    uprobes = hooks[len(kernel):]
    assert {h.target for h in uprobes} == {p.symbol for p in POINTS["zmq"]}
    assert sorted(h.kind for h in uprobes) == sorted(["uprobe"] * len(POINTS["zmq"])
                                                     + ["uretprobe"] * sum(p.return_fn is not None for p in POINTS["zmq"]))
    # the hooks the issue names are among them
    targets = {h.target for h in hooks}
    assert {"syscalls:sys_enter_sendto", "syscalls:sys_exit_recvfrom", "net_dev_start_xmit",
            "netif_receive_skb", "zmq_msg_send"} <= targets


def test_hooks_follow_the_agents_options():
    assert len(agent_hooks(netstack=False, framework=False)) == len(kernel_probes(False)[0].attach)
    assert not any(h.kind.startswith("u") for h in agent_hooks(framework=False))


def test_program_has_one_counting_function_per_hook_and_nothing_else():
    text = program_text(3)
    assert re.findall(r"int (floor_\d+)\(", text) == ["floor_0", "floor_1", "floor_2"]
    assert "BPF_PERCPU_ARRAY(floor_hits, u64, 3)" in text
    for bad in (0, -1, 5000, 2.0, True, "3"):
        with pytest.raises(ValueError):
            program_text(bad)


def test_uprobes_need_the_library(tmp_path):
    with pytest.raises(UserError, match="--lib"):
        Floor([Hook("uprobe", "zmq_msg_send")], None)
    with pytest.raises(UserError, match="no such file"):
        Floor([Hook("uprobe", "zmq_msg_send")], tmp_path / "missing.so")


def test_hits_report_sums_programs_sharing_a_hook():
    hooks = [Hook("tracepoint", "a:b"), Hook("raw_tracepoint", "c"), Hook("tracepoint", "a:b")]
    assert hits_report(hooks, [1, 2, 3]) == {"hooks": 3, "hits_total": 6,
                                             "hits": {"tracepoint:a:b": 4, "raw_tracepoint:c": 2}}
