"""Load shedding (issue 6): the agent samples whole host pairs by a hash of the
unordered address pair, in BPF, fixed (--sample-rate) or adapted when it cannot
keep up; meta.json says the rate; the report scales counts and every request it
shows is whole.

psbench in the virtual cluster: 2 servers x 4 workers, one host each (scheduler
beside server 0), so 8 server-worker host pairs (+ the scheduler's), one agent
for all hosts: it sees both ends of every pair. Loopback would not do: every
pair there is (127.0.0.1, 127.0.0.1).
"""
from __future__ import annotations

import ctypes
import ipaddress
import json
import random
import sys
from pathlib import Path

import pytest

from probes.filters import Filters, pair_hash16, pair_kept, shed_units_of
from probes.program import PROBES_DIR, expand_includes, kernel_constants

pytestmark = pytest.mark.privileged

HOSTS = 6
WAIT_S = 300                # another test's cluster may be up (one per machine)


# ---- the BPF hash is the Python mirror's ------------------------------------------

_HASH_PROG = r"""
struct pair_in { u16 family; u8 _pad[6]; u8 a[16]; u8 b[16]; };
BPF_ARRAY(pairs_in, struct pair_in, 64);
BPF_ARRAY(pairs_out, u32, 64);
BPF_ARRAY(trigger_tgid, u32, 1);

int hash_pairs(void *ctx)
{
	int zero = 0;
	u32 *want = trigger_tgid.lookup(&zero);
	if (!want || *want != (u32)(bpf_get_current_pid_tgid() >> 32))
		return 0;
	for (int i = 0; i < 64; i++) {
		int k = i;
		struct pair_in *p = pairs_in.lookup(&k);
		u32 *out = pairs_out.lookup(&k);
		if (p && out)
			*out = pslat_addrs_hash16(p->family, p->a, p->b);
	}
	return 0;
}
"""


def _addresses(n: int) -> list[tuple[str, str]]:
    rnd = random.Random(7)
    out = [("10.77.0.1", "10.77.0.2"), ("10.77.0.2", "10.77.0.1"), ("127.0.0.1", "127.0.0.1")]
    while len(out) < n:
        if rnd.random() < 0.5:
            out.append(tuple(str(ipaddress.IPv4Address(rnd.getrandbits(32))) for _ in range(2)))
        else:
            out.append(tuple(str(ipaddress.IPv6Address(rnd.getrandbits(128))) for _ in range(2)))
    return out


def test_bpf_pair_hash_is_the_python_mirror():
    import bcc
    from probes import btf as btfmod

    consts = {**kernel_constants([], btfmod.load()), **Filters().constants()}
    text = expand_includes(PROBES_DIR / "common.bpf.h") + _HASH_PROG
    b = bcc.BPF(text=text.encode(), cflags=[f"-D{k}={v}" for k, v in sorted(consts.items())])
    try:
        pairs = _addresses(64)
        tin = b[b"pairs_in"]
        for i, (a, c) in enumerate(pairs):
            v = tin.Leaf()
            ia, ic = ipaddress.ip_address(a), ipaddress.ip_address(c)
            v.family = 10 if ia.version == 6 else 2
            ctypes.memmove(ctypes.addressof(v.a), ia.packed, len(ia.packed))
            ctypes.memmove(ctypes.addressof(v.b), ic.packed, len(ic.packed))
            tin[ctypes.c_int(i)] = v
        b[b"trigger_tgid"][ctypes.c_int(0)] = ctypes.c_uint32(__import__("os").getpid())
        b.attach_tracepoint(tp=b"syscalls:sys_enter_getppid", fn_name=b"hash_pairs")
        __import__("os").getppid()
        got = [b[b"pairs_out"][ctypes.c_int(i)].value for i in range(len(pairs))]
    finally:
        b.cleanup()
    assert got == [pair_hash16(a, c) for a, c in pairs]
    assert got[0] == got[1]   # unordered


# ---- the agent on psbench in the cluster ------------------------------------------

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_agent_cluster import Agent  # noqa: E402  (the agent as a child process, ready on its signal)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    from workloads.cluster.cluster import Cluster

    with Cluster(HOSTS, wait_s=WAIT_S, log_dir=tmp_path_factory.mktemp("wire")) as c:
        yield c


def _traced_run(cluster, tmp_path: Path, agent_args: tuple, duration_s: float, **workload):
    from workloads.psbench.launch import launch_in_cluster

    names = [h.name for h in cluster.hosts]
    agent = Agent(tmp_path / "agent", names, extra=tuple(agent_args))
    try:
        with launch_in_cluster(cluster, tmp_path / "ps", servers=2, workers=4, duration_s=duration_s,
                               **workload) as job:
            job.wait_ready()
            job.wait()
        log = agent.stop()
    finally:
        agent.kill()
    (tmp_path / "agent.log").write_text(log)
    return log


def _read(out: Path):
    import pandas as pd
    from agent.rundir import read_run_dir

    frames, metas = [], {}
    for d in sorted(p for p in out.iterdir() if p.is_dir()):
        rd = read_run_dir(d)
        metas[rd.meta["host_id"]] = rd.meta
        if "messages" in rd.tables:
            frames.append(rd.tables["messages"])
    return pd.concat(frames, ignore_index=True), metas


def _report(out: Path) -> dict:
    from reports.dissect import dissect
    from reports.summary import summary

    return summary(dissect([out]))


def _data_pairs(msgs) -> set[frozenset]:
    d = msgs[~msgs.control & msgs.request.notna()]
    return {frozenset((a, b)) for a, b in d[["local_ip", "remote_ip"]].drop_duplicates().itertuples(index=False)}


def test_fixed_rate_keeps_exactly_the_pairs_the_hash_predicts(cluster, tmp_path):
    addrs = {h.name: h.addr for h in cluster.hosts}
    servers, workers = [addrs[h.name] for h in cluster.hosts[:2]], [addrs[h.name] for h in cluster.hosts[2:]]
    all_pairs = {frozenset((s, w)) for s in servers for w in workers}
    # The rate that keeps half of these 8 pairs by the mirror's hash (0.5 itself keeps
    # all 8 of the cluster's addresses: a 1-in-256 draw of a uniform hash).
    units = sorted(pair_hash16(*sorted(p)) for p in all_pairs)[len(all_pairs) // 2]
    rate = (65536 - units) / 65536
    assert shed_units_of(rate) == units
    predicted = {p for p in all_pairs if pair_kept(*sorted(p), units)}
    assert len(predicted) == len(all_pairs) // 2
    log = _traced_run(cluster, tmp_path, ("--sample-rate", repr(rate)), 3.0, rate=100,
                      keys_per_request=4, embedding_dim=2, lens=False)
    msgs, metas = _read(tmp_path / "agent")
    assert _data_pairs(msgs) & all_pairs == predicted, log
    for m in metas.values():
        s = m["sampling"]
        assert s["mode"] == "fixed" and s["rate"] == pytest.approx(rate, abs=1 / 65536)
        assert [r for _, r in s["history"]] == [s["rate"]]
        assert s["shed"]["calls"] > 0
        c = m["counters"]
        assert c.get("correlate_framework_shed", 0) > 0
        # framework records of shed pairs are counted as shed, not as unmatched
        assert c.get("correlate_framework_unmatched", 0) <= 0.01 * c["correlate_framework_shed"] + 5, c
    s = _report(tmp_path / "agent")
    assert s["sampling"] == {"rate": pytest.approx(rate, abs=1e-4), "scaled": True}
    u = s["unmatched"]
    assert u["requests_without_response"] + u["messages_without_request"] <= 0.01 * s["sampled_requests"] + 2, u
    assert abs(s["requests"] - s["sampled_requests"] / s["sampling"]["rate"]) <= 1


def test_flooded_agent_sheds_whole_pairs_and_accounts_for_losses(cluster, tmp_path):
    # closed loop on every worker, and small rings: the agent cannot follow everything
    log = _traced_run(cluster, tmp_path, ("--ring-pages", "64"), 12.0, rate=0.0,
                      keys_per_request=4, embedding_dim=2, lens=False)
    msgs, metas = _read(tmp_path / "agent")
    m = next(iter(metas.values()))
    s = m["sampling"]
    assert s["mode"] == "adaptive"
    rates = [r for _, r in s["history"]]
    assert rates[0] == 1.0 and min(rates) < 1.0, log
    assert 0 < s["effective_rate"] < 1.0
    lost = {p: c.get("lost", 0) for p, c in m["counters"]["probes"].items()}
    (tmp_path / "figures.json").write_text(json.dumps({"history": s["history"], "lost": lost,
                                                       "shed": s.get("shed"), "log": log[-2000:]}))
    rep = _report(tmp_path / "agent")
    assert rep["sampling"]["scaled"] and rep["sampling"]["rate"] == pytest.approx(s["effective_rate"], rel=1e-6)
    u = rep["unmatched"]
    broken = u["requests_without_response"] + u["messages_without_request"]
    # a request is broken only by a lost event or a rate change between its two messages
    events_lost = sum(lost.values())
    assert broken <= events_lost + 2 * len(rates) + 0.01 * rep["sampled_requests"], (u, lost, rates)
