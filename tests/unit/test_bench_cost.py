"""bench.cost's and bench.cgroups' pure parts: cgroup v1 mounts and membership,
the round bootstrap, window pairing, per-window job figures from a truth, BPF
per program with the wire namespace's runs taken out, the figures and the JSON
keys the issue asks for, and argument validation."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bench.cgroups import mount_points, own_paths, pids_of
from bench.common import json_line
from bench.cost import (CONDITIONS, PINNED, SHARED, WIRE_RUNS, Window, balanced_order, bootstrap_ci, bpf_delta, bpf_name, bpf_summary,
                        fill_job, open_rate, paired, parse_args, program_hooks, summarize, summary_lines)
from bench.floor import Hook, agent_hooks

MOUNTS = """\
tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/cpuacct cgroup rw,relatime,cpuacct 0 0
cgroup /sys/fs/cgroup/cpuset cgroup rw,relatime,cpuset 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""


def test_cgroup_v1_mounts_and_membership_are_parsed():
    m = mount_points(MOUNTS)
    assert {k: str(v) for k, v in m.items()} == {"cpuacct": "/sys/fs/cgroup/cpuacct",
                                                 "cpuset": "/sys/fs/cgroup/cpuset"}
    # cpu,cpuacct co-mounted (other distros): the same hierarchy serves cpuacct
    co = mount_points("cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,cpu,cpuacct 0 0\n")
    assert str(co["cpuacct"]) == "/sys/fs/cgroup/cpu,cpuacct" and "cpuset" not in co
    assert mount_points("cgroup2 /sys/fs/cgroup cgroup2 rw 0 0\n") == {}
    own = own_paths("4:memory:/x/y\n3:cpuset:/\n2:cpuacct:/a/b\n1:cpu:/\n0::/\n")
    assert own == {"cpuset": "/", "cpuacct": "/a/b"}
    assert own_paths("2:cpu,cpuacct:/s\n") == {"cpuacct": "/s"}
    assert pids_of("12\n345\n\n") == [12, 345]


def test_bootstrap_resamples_rounds_and_needs_two():
    assert bootstrap_ci([(0, 1.0), (0, 2.0)]) is None
    assert bootstrap_ci([(0, None), (1, 1.0)]) is None
    same = bootstrap_ci([(r, 5.0) for r in range(4) for _ in range(3)])
    assert same == [5.0, 5.0]
    pairs = [(r, float(r)) for r in range(10)]
    lo, hi = bootstrap_ci(pairs)
    assert 0.0 <= lo < 4.5 < hi <= 9.0
    assert bootstrap_ci(pairs) == [lo, hi]   # seeded: the same run, the same interval
    # one round far off moves the interval less than it would if its many windows counted alone
    skew = [(0, 100.0)] * 9 + [(r, 1.0) for r in range(1, 10)]
    lo2, hi2 = bootstrap_ci(skew)
    assert lo2 == 1.0 and hi2 == 100.0


def _w(cond, rnd, k, job_ns, msgs, tracer_ns=0, wire_ns=0, p99=1000.0, tput=100.0, phase="open",
       placement=SHARED, bpf=None, frames=None):
    w = Window(phase, placement, rnd, cond, k, 0, 1_000_000_000,
               cpu_ns={"job": job_ns, "tracer": tracer_ns, "wire": wire_ns},
               wire_frames=frames or {"in": 0, "out": 0}, bpf=bpf or {})
    w.job = {"messages_all": msgs, "p99_us": p99, "slices_per_s_window": tput, "requests_per_s": tput / 2}
    return w


def test_pairs_match_round_and_window_index_and_skip_failed_windows():
    ws = [_w("untraced", 0, 0, 1000, 10), _w("agent", 0, 0, 1500, 10), _w("agent", 0, 1, 1500, 10),
          _w("untraced", 1, 0, 2000, 10), _w("agent", 1, 0, 2600, 10)]
    ws.append(Window("open", SHARED, 1, "untraced", 1, 0, 0, error="boom"))
    ws.append(_w("agent", 1, 1, 9999, 10))
    diffs = paired(ws, "open", SHARED, "agent", lambda w: w.per_message_us("job"), "diff")
    assert diffs == [(0, pytest.approx(0.05)), (1, pytest.approx(0.06))]   # agent #1 of round 0/1: no partner
    ratios = paired(ws, "open", SHARED, "agent", lambda w: w.cpu_ns["job"], "ratio")
    assert ratios == [(0, 1.5), (1, 1.3)]
    assert paired(ws, "open", PINNED, "agent", lambda w: 1.0, "ratio") == []


def _round(rnd, drift, job_extra_ns, agent_ns, p99_agent, tput_agent_pinned, floor_extra_ns=100):
    """One round of every condition: messages 1000 per window, the job's untraced CPU
    drifting by round; the agent/floor add what is given."""
    base = 50_000_000 * drift   # 50 us/message
    ws = []
    for k in range(2):
        ws += [_w("untraced", rnd, k, base, 1000, p99=1000.0),
               _w("untraced2", rnd, k, base + (1_000_000 if k else -1_000_000), 1000, p99=1010.0 if k else 990.0),
               _w("agent", rnd, k, base + job_extra_ns, 1000, tracer_ns=agent_ns, wire_ns=2_000_000,
                  p99=p99_agent),
               _w("floor", rnd, k, base + floor_extra_ns * 1000, 1000, tracer_ns=1000, p99=1005.0)]
        for pl, t_agent in ((SHARED, 90.0), (PINNED, tput_agent_pinned)):
            ws += [_w("untraced", rnd, k, base, 1000, tput=100.0, phase="closed", placement=pl),
                   _w("untraced2", rnd, k, base, 1000, tput=101.0 if k else 99.0, phase="closed", placement=pl),
                   _w("agent", rnd, k, base, 1000, tput=t_agent, phase="closed", placement=pl),
                   _w("floor", rnd, k, base, 1000, tput=98.0, phase="closed", placement=pl)]
    return ws


def test_summary_gives_the_issues_figures_from_windows():
    ws = []
    for rnd in range(3):
        ws += _round(rnd, 1.0 + 0.1 * rnd, job_extra_ns=10_000_000, agent_ns=80_000_000, p99_agent=1200.0,
                     tput_agent_pinned=95.0)
    sessions = {"agent": [{"lost": 0, "rss_mb": 350.0}, {"lost": 7, "rss_mb": 380.0}], "floor": [{}]}
    s = summarize(ws, program_hooks(), sessions)
    c = s["cost"]
    assert c["job_extra_cpu_us_per_message"] == pytest.approx(10.0)      # 10 ms over 1000 messages
    assert c["floor_job_extra_cpu_us_per_message"] == pytest.approx(0.1)
    assert c["agent_cpu_us_per_message"] == pytest.approx(80.0)
    assert c["job_cpu_us_per_message"] == pytest.approx(55.0)            # median of 50, 55, 60
    assert c["agent_cpu_share_of_job"] == pytest.approx(80.0 / 55.0)
    assert c["job_extra_share"] == pytest.approx(10.0 / 55.0)
    assert c["aa_job_cpu_us_per_message_noise"] == pytest.approx(1.0)
    assert c["wire_extra_cpu_us_per_message"] == pytest.approx(2.0)
    assert c["open_p99_ratio"] == pytest.approx(1.2)
    assert c["aa_p99_noise"] == pytest.approx(0.01)
    assert c["pinned_throughput_loss"] == pytest.approx(0.05)
    assert c["floor_pinned_throughput_loss"] == pytest.approx(0.02)
    assert c["closed_throughput_ratio"] == pytest.approx(0.90)
    assert c["aa_pinned_throughput_noise"] == pytest.approx(0.01)
    assert c["lost_events"] == 7 and c["agent_rss_mb"] == 380.0
    assert s["open"]["pairs"] == 6 and s["open"]["aa_pairs"] == 6
    assert c["open_rounds"] == c["closed_rounds"] == 3
    text = "\n".join(summary_lines(s, 37.5))
    assert "37.5 requests/s per worker, 6 pairs (6 A/A) in 3 rounds" in text
    assert "job's extra CPU 10.0 us/message [10, 10]" in text and "throughput loss agent 0.050" in text
    lo, hi = c["job_extra_cpu_us_per_message_ci95"]
    assert lo == pytest.approx(10.0) and hi == pytest.approx(10.0)
    issue_keys = {"agent_cpu_us_per_message", "job_extra_cpu_us_per_message", "floor_job_extra_cpu_us_per_message",
                  "pinned_throughput_loss", "floor_pinned_throughput_loss", "open_p99_ratio", "aa_p99_noise",
                  "lost_events", "agent_rss_mb"}
    line = json.loads(json_line({"cost": c}))
    assert issue_keys <= set(line["cost"]) and all(line["cost"][k] is not None for k in issue_keys)


def test_a_cheaper_agent_shows_in_its_figures():
    heavy = summarize([w for r in range(3) for w in _round(r, 1.0, 20_000_000, 90_000_000, 1500.0, 80.0)],
                      program_hooks(), {})["cost"]
    light = summarize([w for r in range(3) for w in _round(r, 1.0, 2_000_000, 30_000_000, 1020.0, 99.0)],
                      program_hooks(), {})["cost"]
    assert light["job_extra_cpu_us_per_message"] < heavy["job_extra_cpu_us_per_message"]
    assert light["agent_cpu_us_per_message"] < heavy["agent_cpu_us_per_message"]
    assert light["open_p99_ratio"] < heavy["open_p99_ratio"]
    assert light["pinned_throughput_loss"] < heavy["pinned_throughput_loss"]
    assert heavy["lost_events"] is None   # no agent session reported: unmeasured, not 0


def test_open_rate_is_half_the_untraced_shared_closed_loop():
    ws = [_w("untraced", r, 0, 1, 1, tput=800.0 * (r + 1), phase="closed") for r in range(3)]
    ws.append(_w("untraced", 0, 0, 1, 1, tput=9e9, phase="closed", placement=PINNED))
    ws.append(_w("agent", 0, 0, 1, 1, tput=9e9, phase="closed"))
    # requests/s = slices/s / 2 here; median 800 requests/s over 4 workers, halved
    assert open_rate(ws) == pytest.approx(800.0 / 4 / 2)
    assert open_rate([]) is None


def _truth(t0_ns, n, period_ns, lat_ns, due_lag_ns=0):
    rows = []
    for i in range(n):
        t_due = t0_ns + i * period_ns
        t_iss = t_due + due_lag_ns
        rows.append({"role": "worker", "sender": 9, "app_id": 0, "customer_id": 0, "timestamp": i,
                     "t_scheduled_ns": t_due, "t_issued_ns": t_iss, "t_completed_ns": t_iss + lat_ns})
    rows.append({"role": "server", "sender": 8, "app_id": 0, "customer_id": 0, "timestamp": 0,
                 "t_scheduled_ns": None, "t_issued_ns": t0_ns, "t_completed_ns": None})
    return pd.DataFrame(rows).astype({"t_scheduled_ns": "Int64", "t_issued_ns": "Int64", "t_completed_ns": "Int64"})


def test_window_job_figures_count_the_slices_issued_in_the_window():
    truth = _truth(0, 300, 10_000_000, 2_000_000)   # 100 slices/s for 3 s, 2 ms each
    ws = [Window("open", SHARED, 0, "untraced", 0, 1_000_000_000, 2_000_000_000, cpu_ns={"job": 5_000_000}),
          Window("open", SHARED, 0, "agent", 0, 50_000_000_000, 51_000_000_000),
          Window("open", SHARED, 0, "floor", 0, 0, 0, error="earlier failure")]
    fill_job(ws, truth, open_loop=True)
    j = ws[0].job
    assert j["slices"] == 100 and j["messages_all"] == 200   # 100 requests and their responses
    assert j["slices_per_s_window"] == pytest.approx(100.0)
    assert j["p99_us"] == pytest.approx(2000.0)
    assert ws[0].per_message_us("job") == pytest.approx(25.0)
    assert ws[1].error and not ws[1].job                      # nothing issued then
    assert ws[2].error == "earlier failure"
    late = [Window("open", SHARED, 0, "untraced", 0, 1_000_000_000, 2_000_000_000)]
    fill_job(late, _truth(0, 300, 10_000_000, 2_000_000, due_lag_ns=3_000_000), open_loop=True)
    assert late[0].job["p99_us"] == pytest.approx(5000.0)     # counted from when each was due


def test_program_names_map_to_their_hooks():
    ph = program_hooks()
    hooks = agent_hooks()
    assert ph[bpf_name("sc_exit")] and all(h.target.startswith("syscalls:sys_exit_") for h in ph["sc_exit"])
    assert bpf_name("sc_enter_recvfrom") == "sc_enter_recvfr" and "sc_enter_recvfr" in ph
    assert ph["floor_0"] == [hooks[0]] and ph[f"floor_{len(hooks) - 1}"] == [hooks[-1]]
    assert Hook("uprobe", "zmq_msg_send") in ph[bpf_name("zmq_send_entry")]
    # every hook the forwarder's namespace adds runs on is one the agent attaches
    assert set(WIRE_RUNS) <= set(hooks)


def test_bpf_delta_sums_programs_of_one_name():
    before = {1: {"name": "a", "run_time_ns": 100, "run_cnt": 1}}
    after = {1: {"name": "a", "run_time_ns": 300, "run_cnt": 3}, 2: {"name": "a", "run_time_ns": 50, "run_cnt": 5},
             3: {"name": "b", "run_time_ns": 7, "run_cnt": 1}}
    assert bpf_delta(before, after) == {"a": {"run_time_ns": 250, "run_cnt": 7}, "b": {"run_time_ns": 7, "run_cnt": 1}}


def test_bpf_summary_takes_the_wires_runs_out_at_the_floors_cost_per_run():
    hooks = [Hook("raw_tracepoint", "netif_rx"), Hook("raw_tracepoint", "sched_switch")]
    ph = {"floor_0": [hooks[0]], "floor_1": [hooks[1]], "ns_rx_arrival": [hooks[0]], "ns_sched": [hooks[1]]}
    frames = {"in": 100, "out": 100}
    # the floor: 200 netif_rx runs (100 hosts', 100 the wire's) at 50 ns; 10 sched runs
    floor = _w("floor", 0, 0, 0, 100, frames=frames,
               bpf={"floor_0": {"run_time_ns": 10_000, "run_cnt": 200}, "floor_1": {"run_time_ns": 500, "run_cnt": 10}})
    agent = _w("agent", 0, 0, 0, 100, frames=frames,
               bpf={"ns_rx_arrival": {"run_time_ns": 60_000, "run_cnt": 200},
                    "ns_sched": {"run_time_ns": 4_000, "run_cnt": 10}})
    a = bpf_summary([floor, agent], "agent", [floor], ph)
    assert a["ns_per_message"] == pytest.approx(640.0)
    # 100 wire runs of ns_rx_arrival priced at the floor's 50 ns: 5,000 ns out
    assert a["ns_per_message_without_wire"] == pytest.approx((64_000 - 5_000) / 100)
    assert a["programs"]["ns_rx_arrival"]["wire_runs_per_message"] == pytest.approx(1.0)
    assert a["programs"]["ns_sched"]["wire_runs_per_message"] == 0
    f = bpf_summary([floor, agent], "floor", [floor], ph)
    assert f["ns_per_message_without_wire"] == pytest.approx((10_500 - 5_000) / 100)
    assert bpf_summary([floor], "agent", [floor], ph) == {}


def test_arguments():
    a = parse_args([])
    assert a.pairs >= 20 and a.rounds * a.windows >= 20
    assert a.closed_rounds == 2 and a.closed_rounds * a.closed_windows >= a.closed_pairs   # an interval needs 2
    assert parse_args(["--closed-pairs", "1"]).closed_rounds == 1
    assert parse_args(["--pairs", "5", "--windows", "2"]).rounds == 3
    assert parse_args(["--closed-pairs", "0", "--rate", "50"]).closed_rounds == 0
    for bad in (["--pairs", "0"], ["--duration-s", "0"], ["--closed-pairs", "0"], ["--settle-s", "-1"],
                ["--record", "x.rec"], ["--windows", "0"], ["--rate", "-3"]):
        with pytest.raises(SystemExit):
            parse_args(bad)


def test_window_cpu_per_message_needs_messages():
    w = _w("agent", 0, 0, 1000, 0)
    assert w.per_message_us("job") is None
    w.job = {}
    assert w.per_message_us("job") is None
    assert np.isclose(_w("agent", 0, 0, 3000, 3).per_message_us("job"), 1.0)


def test_rounds_are_balanced_so_no_condition_always_follows_the_agent():
    n = len(CONDITIONS)
    orders = [balanced_order(r, CONDITIONS) for r in range(n)]
    assert all(sorted(o) == sorted(CONDITIONS) for o in orders)
    assert {o[0] for o in orders} == set(CONDITIONS)
    follows = [(o[i], o[i + 1]) for o in orders for i in range(n - 1)]
    assert len(set(follows)) == len(follows) == n * (n - 1)   # every ordered pair once
    assert balanced_order(n, CONDITIONS) == orders[0]


def test_the_steady_state_recording_is_in_the_current_format_and_small():
    from agent.sources import RECORD_VERSION, read_recording
    from bench.consumer import STEADY, main as consumer_main  # noqa: F401  (its default file)

    assert STEADY.is_file(), "make it with: python -m bench.cost --record bench/data/production-30s.rec.gz --rate 50"
    assert STEADY.stat().st_size < 10 << 20        # committed: the issue's ~10 MB
    header, events = read_recording(STEADY)
    assert header["format"] == RECORD_VERSION and header.get("sockcall_format") == "items"
    assert {"sockcalls", "netstack", "framework"} <= set(header["probes"])
    traced = sorted(header["netns_names"][str(i)] for i in header["selection"]["netns_inos"])
    assert traced == [f"h{i}" for i in range(6)]   # the 2x4 cluster's hosts, not the wire's namespace
    seen: dict[str, int] = {}
    for probe, _raw in events:
        seen[probe] = seen.get(probe, 0) + 1
    assert all(seen.get(p, 0) > 10_000 for p in ("sockcalls", "netstack", "framework"))   # 30 s, not start-up
