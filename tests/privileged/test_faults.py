"""Faults the agent must survive (issue 6 "Faults", issue 3 "Bad input and faults"),
each against the real `pslat agent` (a child process) and real traffic on loopback:

- kill -9 mid-run: the closed shards read, `pslat report` builds from them, nothing of
  the agent's stays loaded in the kernel, and the next agent starts;
- the traced processes killed and restarted: traced again, and the report names the gap;
- the output disk fills up (a tmpfs): one line on stderr, bounded memory, rows dropped
  and counted, the job unharmed, what was written readable;
- SIGTERM under closed-loop load: exit within 2 s, nothing left loaded, meta.json final;
- random bytes on a traced connection between valid ps-lite messages: counted as
  unparsed, the messages after them found with their ids.

psbench runs under its own process name (COMM, psbench --proc-name) so that --comm
selects it and nothing else on this shared machine. The agent attaches
no TC filter (probes/ has none): what a killed agent could leave behind is BPF
programs, links and tracefs uprobe events, and those are checked.

Run as a script (`python test_faults.py recv|send ...`) it is the plain-TCP peer of
the unparsed-bytes test.
"""
from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))   # script mode: the peers import parsers.pslite

COMM = "psb-faults"            # the psbench processes' name, selected by --comm
SIGTERM_BUDGET_S = 2.0
# tests that need no kernel stage times leave the netstack probe out: its compile is
# the agent's longest start-up step (the kill -9 and SIGTERM tests keep every probe)
LIGHT = ("--no-netstack",)
GARBAGE_BYTES = 4096
MSGS_BEFORE, MSGS_AFTER = 20, 30


# ---------------------------------------------------------------- plain-TCP peers

def _peer_recv(recv_bytes: int, bulk: bool) -> None:
    """Accepts one connection, reads to EOF in reads of at most `recv_bytes`, prints
    {"port"} then {"bytes"}. bulk: waits for a line on stdin (the sender has sent
    everything) before the first read, so that reads cut messages anywhere and one
    read may hold garbage and messages on both sides of it. Once the first request
    has begun to arrive it answers it as node 8 (greeting, READY with identity ps8,
    the response), so that the receiver has a node id: the report pairs messages by
    sender and recver."""
    from parsers.pslite.encode import MessageSpec, greeting_bytes, message_bytes, ready_bytes

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    print(json.dumps({"port": srv.getsockname()[1]}), flush=True)
    conn, _ = srv.accept()
    if bulk:
        sys.stdin.readline()
    n, answered = 0, False
    while chunk := conn.recv(recv_bytes):
        n += len(chunk)
        if not answered and n > 128:   # past the greeting and READY: request 0 is arriving
            conn.sendall(greeting_bytes(as_server=True) + ready_bytes(b"ROUTER", b"ps8")
                         + message_bytes(MessageSpec(request=False, push=True, timestamp=0).frames()))
            answered = True
    conn.close()
    print(json.dumps({"bytes": n}), flush=True)


def _sender_chunks(seed: int) -> list[bytes]:
    """What the sender sends, one send each: ZMTP greeting + READY, MSGS_BEFORE push
    requests, GARBAGE_BYTES random bytes, MSGS_AFTER more."""
    from parsers.pslite.encode import MessageSpec, greeting_bytes, message_bytes, ready_bytes

    rnd = random.Random(seed)

    def msg(ts: int) -> bytes:
        keys = sorted(rnd.sample(range(1 << 20), 8))
        spec = MessageSpec(request=True, push=True, app_id=0, customer_id=0, timestamp=ts,
                           keys=keys, vals=rnd.randbytes(4 * len(keys)))
        return message_bytes(spec.frames())

    before = [msg(ts) for ts in range(MSGS_BEFORE)]
    garbage = rnd.randbytes(GARBAGE_BYTES)
    after = [msg(ts) for ts in range(MSGS_BEFORE, MSGS_BEFORE + MSGS_AFTER)]
    return [greeting_bytes() + ready_bytes(b"DEALER", b"ps9"), *before, garbage, *after]


def _garbage_end(seed: int) -> int:
    """Stream offset of the first byte after the garbage."""
    return sum(map(len, _sender_chunks(seed)[:MSGS_BEFORE + 2]))


def _peer_send(port: int, seed: int) -> None:
    """Sends _sender_chunks(seed), one send each. Prints what it sent once it is sent,
    then waits for the receiver's answer and EOF."""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for chunk in _sender_chunks(seed):
        s.sendall(chunk)
    s.shutdown(socket.SHUT_WR)
    print(json.dumps({"sent": MSGS_BEFORE + MSGS_AFTER, "garbage_bytes": GARBAGE_BYTES}), flush=True)
    while s.recv(65536):   # the receiver's answer, until it closes
        pass
    s.close()


if __name__ == "__main__":
    if sys.argv[1] == "recv":
        _peer_recv(int(sys.argv[2]), sys.argv[3] == "bulk")
    else:
        _peer_send(int(sys.argv[2]), int(sys.argv[3]))
    sys.exit(0)


# ---------------------------------------------------------------- the tests

import pytest  # noqa: E402

from agent.child import AgentProcess  # noqa: E402
from agent.rundir import RunDirWriter, read_run_dir  # noqa: E402
from workloads.psbench.launch import Job, launch_local  # noqa: E402

pytestmark = pytest.mark.privileged

def psbench(out: Path, duration_s: float, servers: int = 1, workers: int = 2, **opts) -> Job:
    """A psbench job on loopback whose processes (and threads) are named COMM."""
    return launch_local(out, servers, workers, duration_s, proc_name=COMM, **opts)


def agent(out: Path, *args: str) -> AgentProcess:
    return AgentProcess(out, list(args), ready_timeout_s=120)


def wait_for(what: str, check, timeout_s: float, poll_s: float = 0.05):
    """check() until it returns something true; its value. Fails saying what was awaited."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout_s:g} s for {what}")
        time.sleep(poll_s)


def shards(out: Path) -> list[Path]:
    return sorted(out.glob("*/messages-*.parquet"))


def host_dir(out: Path) -> Path:
    dirs = [p for p in out.iterdir() if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def _bpftool(*args: str) -> list[dict]:
    return json.loads(subprocess.run(["bpftool", *args, "--json"], capture_output=True, text=True,
                                     check=True).stdout or "[]")


def bpf_objects(pid: int) -> dict[str, set[int]]:
    """The BPF programs and links a live process holds (its fds), and the programs it
    attached through perf events (tracepoints, uprobes)."""
    progs, links = set(), set()
    for f in Path(f"/proc/{pid}/fdinfo").iterdir():
        try:
            fields = dict(line.split(":", 1) for line in f.read_text().splitlines() if ":" in line)
        except OSError:
            continue   # closed meanwhile
        if "link_id" in fields:
            links.add(int(fields["link_id"]))
        elif "prog_id" in fields:
            progs.add(int(fields["prog_id"]))
    perf = {e["prog_id"] for e in _bpftool("perf", "show") if e.get("pid") == pid and "prog_id" in e}
    return {"progs": progs | perf, "links": links, "perf_progs": perf}


def left_behind(pid: int, objs: dict[str, set[int]]) -> dict[str, list]:
    """What of a gone process's BPF objects the kernel still has."""
    uprobes = Path("/sys/kernel/tracing/uprobe_events")
    return {k: v for k, v in {
        "progs": sorted(objs["progs"] & {p["id"] for p in _bpftool("prog", "show")}),
        "links": sorted(objs["links"] & {lk["id"] for lk in _bpftool("link", "show")}),
        "perf": [e for e in _bpftool("perf", "show") if e.get("pid") == pid],
        # bcc names a tracefs uprobe event it had to create after its pid
        "uprobe_events": [ln for ln in (uprobes.read_text().splitlines() if uprobes.exists() else [])
                          if f"bcc_{pid}" in ln],
    }.items() if v}


def assert_nothing_left(pid: int, objs: dict[str, set[int]]) -> None:
    assert objs["progs"] and objs["perf_progs"], f"found none of the agent's BPF programs: {objs}"
    # links and programs are freed from a workqueue after the last fd closes: wait for it
    deadline = time.monotonic() + 10
    while (left := left_behind(pid, objs)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"the agent (pid {pid}) left BPF objects behind: {left}"


def report(*args) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "report", *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def figure(name: str, value) -> None:
    """Measured figures, for the note (pytest -s shows them)."""
    print(f"FIGURE {name} = {value}")


# ---------------------------------------------------------------- 1. kill -9

def test_kill9_keeps_closed_shards_and_leaves_nothing_loaded(tmp_path):
    out = tmp_path / "agent"
    a = agent(out, "--comm", COMM)
    try:
        with psbench(tmp_path / "ps", duration_s=60, rate=100) as job:
            job.wait_ready()
            wait_for("a closed messages shard", lambda: shards(out), 30)
            objs = bpf_objects(a.pid)
            a.kill()   # SIGKILL
            assert a.proc.returncode == -signal.SIGKILL
            assert_nothing_left(a.pid, objs)

            rd = read_run_dir(host_dir(out))
            assert rd.problems == []
            assert "closed" not in rd.meta        # it never got to close: the kill was real
            msgs = rd.tables["messages"]
            assert len(msgs) > 0 and set(msgs["pid"]) <= set(sum(job.pids.values(), []))
            summary = json.loads(report(host_dir(out), "-f", "json").stdout)
            assert summary["requests"] > 0, summary
            term = report(host_dir(out)).stdout
            assert f"{summary['requests']:,} requests paired" in term, term[:2000]

            # the next agent starts, traces the job that still runs, and stops cleanly
            out2 = tmp_path / "agent2"
            b = agent(out2, "--comm", COMM, *LIGHT)
            wait_for("the next agent's first shard", lambda: shards(out2), 30)
            assert b.stop() == 0, b.log_tail()
    finally:
        a.kill()
    assert len(read_run_dir(host_dir(out2)).tables["messages"]) > 0


# ---------------------------------------------------------------- 4. SIGTERM under load

def test_sigterm_under_closed_loop_load_detaches_within_2s(tmp_path):
    out = tmp_path / "agent"
    a = agent(out, "--comm", COMM)
    try:
        with psbench(tmp_path / "ps", duration_s=60, servers=1, workers=2, rate=0) as job:
            job.wait_ready()
            wait_for("a closed messages shard", lambda: shards(out), 30)
            objs = bpf_objects(a.pid)
            rc, took_s = a.terminate()
            figure("sigterm_to_exit_s", round(took_s, 3))
            assert rc == 0, a.log_tail()
            assert took_s < SIGTERM_BUDGET_S, f"SIGTERM to exit took {took_s:.2f} s: {a.log_tail()}"
            assert_nothing_left(a.pid, objs)
    finally:
        a.kill()
    rd = read_run_dir(host_dir(out))
    assert rd.problems == [] and rd.meta["closed"] is True
    probes = rd.meta["counters"]["probes"]
    # what the stop could not decode is counted as lost, by name, never dropped silently
    at_stop = {p: c.get("lost_at_stop", 0) for p, c in probes.items()}
    figure("lost_at_stop", at_stop)
    # what was decoded but not matched by the stop's deadline is counted too, and said
    unsettled = rd.meta["counters"].get("correlate_unsettled_at_stop", 0)
    figure("unsettled_at_stop", unsettled)
    assert (unsettled > 0) == ("correlate_unsettled_at_stop" in a.log_tail()), a.log_tail()
    consumed = rd.meta["counters"]["events_consumed"]
    for p, c in probes.items():
        if "seen" not in c:
            continue
        # every event the kernel handed to a ring was decoded, counted at the stop, or
        # dropped as another process's: nothing left in a ring uncounted ("seen" counts
        # ring-full losses too in some probes, not in others: both are accepted)
        ring_lost = c.get("lost", 0) - c.get("lost_at_stop", 0)
        delivered = consumed.get(p, 0) + c.get("lost_at_stop", 0) + c.get("other_process", 0)
        assert delivered in (c["seen"], c["seen"] - ring_lost), (p, c, consumed.get(p))
    assert len(rd.tables["messages"]) > 0


# ---------------------------------------------------------------- 5. random bytes mid-stream

SEED = 7
# How the receiver reads: (pacing, bytes per read). "paced": as the bytes arrive (a
# read per message, the garbage in reads of its own); "bulk": once everything is sent,
# so that every read is full and cuts the stream anywhere: one 64 KiB read holds it
# all (walk, garbage, hunt and walk again inside one call, ~150 frames); a read that
# ends 1 byte into the first message after the garbage (inside its first header); two
# reads whose second ends ~60 bytes into it (inside its meta frame).
_G = _garbage_end(SEED)
READS = [("paced", 2048), ("bulk", 65536), ("bulk", _G + 1), ("bulk", (_G + 60) // 2)]


@pytest.fixture(scope="module")
def garbage_run(tmp_path_factory):
    """Every case of READS on a connection of its own, one after the other, under one
    agent (one compile, not four): {case: (port, sent, got)} and the agent's out dir."""
    out = tmp_path_factory.mktemp("garbage") / "agent"
    recvs = {case: subprocess.Popen([sys.executable, __file__, "recv", str(case[1]), case[0]],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for case in READS}
    procs, cases = list(recvs.values()), {}
    try:
        ports = {case: json.loads(r.stdout.readline())["port"] for case, r in recvs.items()}
        a = agent(out, *[w for port in ports.values() for w in ("--port", str(port))], *LIGHT)
        try:
            for case, recv in recvs.items():
                send = subprocess.Popen([sys.executable, __file__, "send", str(ports[case]), str(SEED)],
                                        stdout=subprocess.PIPE, text=True)
                procs.append(send)
                sent = json.loads(send.stdout.readline())   # all of it is in the socket buffers
                recv.stdin.write("go\n")
                recv.stdin.flush()
                got = json.loads(recv.stdout.readline())
                assert send.wait(timeout=60) == 0
                cases[case] = (ports[case], sent, got)
            assert a.stop() == 0, a.log_tail()
        finally:
            a.kill()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return cases, out


@pytest.mark.parametrize("pacing,recv_bytes", READS)
def test_random_bytes_between_messages_the_parser_resyncs_and_finds_every_message(garbage_run, pacing,
                                                                                 recv_bytes):
    cases, out = garbage_run
    port, sent, got = cases[(pacing, recv_bytes)]
    assert got["bytes"] > GARBAGE_BYTES
    rd = read_run_dir(host_dir(out))
    assert rd.problems == []
    msgs = rd.tables["messages"]
    conn = msgs[(msgs.local_port == port) | (msgs.remote_port == port)]
    after = set(range(MSGS_BEFORE, sent["sent"]))
    for direction in ("tx", "rx"):   # the sender's copy and the receiver's, both traced here
        side = conn[(conn.direction == direction) & conn.request]
        ts = set(side["call_id"].dropna().astype(int))
        assert ts <= set(range(sent["sent"])), f"{direction}: invented messages {sorted(ts - set(range(sent['sent'])))}"
        missing = sorted(set(range(sent["sent"])) - ts)
        figure(f"{pacing}_{recv_bytes}_{direction}_messages_missed_after_garbage",
               f"{len(after & set(missing))} of {len(after)}")
        # the walker resyncs at the first message after the garbage, on both ends,
        # whatever the reads' sizes; nothing before the garbage is lost either
        assert not missing, f"{direction}: missing {missing}"
        assert (side["op"] == "push").all()
        assert (side.loc[side.call_id.isin(after), "num_keys"] == 8).all()
    answer = conn[~conn.request]
    assert set(answer.direction) == {"tx", "rx"} and (answer.call_id == 0).all(), answer


def test_random_bytes_between_messages_counted_unparsed(garbage_run):
    """The host's counters, over every case's connection."""
    _cases, out = garbage_run
    rd = read_run_dir(host_dir(out))
    c = rd.meta["counters"]
    sc = c["probes"]["sockcalls"]
    garbage = 2 * GARBAGE_BYTES * len(READS)   # both ends of each connection saw it
    figure("garbage_bytes_accounting",
           f"{garbage} written (both ends, {len(READS)} connections) -> {c['unparsed_bytes']} unparsed + "
           f"{c['lost_bytes']} unread; kernel: {sc['hunted_bytes']} hunted, {sc['desyncs']} desyncs, "
           f"{sc['self_syncs']} self-syncs, {sc['walk_budget']} over the frame budget")
    assert c["desyncs"] >= 2 * len(READS) and c["resyncs"] >= len(READS) and sc["self_syncs"] >= 2 * len(READS), c
    assert sc["walk_budget"] == 0 and sc["walk_aborted"] == 0, sc
    # the garbage, and only it, is unparsed: the kernel searched it for frames and
    # rejected it (a random "header" may pass for a frame or two before the walk
    # desyncs, but no byte is unread and no message is lost)
    assert c["lost_bytes"] == 0, c
    assert garbage <= c["unparsed_bytes"] <= garbage + 2 * 512 * len(READS), c
    assert sc["hunted_bytes"] <= c["unparsed_bytes"], sc
    # the report: the garbage made no message without ids, and the unparsed bytes are named
    summary = json.loads(report(host_dir(out), "-f", "json").stdout)
    assert summary["unmatched"]["messages_unparsed"] == 0, summary["unmatched"]
    term = " ".join(report(host_dir(out)).stdout.split())   # undo the terminal's line wrapping
    assert f"{c['unparsed_bytes']:,} unparsed, {c['lost_bytes']:,} unread" in term, term


# ---------------------------------------------------------------- 3. the output disk fills up

class Tmpfs:
    """A tmpfs of `size_kb` mounted at `path` for the test, with `free_kb` left free
    (the rest taken by a filler file)."""

    def __init__(self, path: Path, size_kb: int):
        self.path = path
        path.mkdir(parents=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)], check=True)

    def leave_free(self, free_kb: int) -> None:
        st = os.statvfs(self.path)
        take = st.f_bavail * st.f_frsize - free_kb * 1024
        with open(self.path / "filler", "ab") as f:
            f.write(b"\0" * max(0, take))

    def __enter__(self) -> "Tmpfs":
        return self

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


def test_rundir_on_a_full_disk_drops_counts_and_recovers(tmp_path):
    """The writer alone, on a real full tmpfs: a shard that does not fit is dropped and
    counted, meta.json still fits (the half shard is freed first); with no byte free at
    all meta.json keeps its last whole version; with space back the counters land."""
    lines = []
    with Tmpfs(tmp_path / "disk", 1024) as disk:
        w = RunDirWriter(disk.path / "h0", {"host_id": "h0"}, shard_interval_s=3600, warn=lines.append)
        rows = [{"i": i, "payload": os.urandom(16).hex()} for i in range(2000)]
        for r in rows:
            w.append("messages", r)
        w.flush()
        disk.leave_free(48)   # a shard of 2000 rows (~80 KB) no longer fits; meta.json does
        for r in rows:
            w.append("messages", r)
        w.flush()
        assert w.rows_dropped == 2000 and w.shards_failed == 1
        assert not list((disk.path / "h0").glob(".*.tmp")), "a half shard was left behind"
        assert read_run_dir(disk.path / "h0").meta["counters"]["rows_dropped"] == 2000
        disk.leave_free(0)    # nothing fits: meta.json stays as it was, whole
        w.append("messages", rows[0])
        w.flush()
        rd = read_run_dir(disk.path / "h0")
        assert w.meta_write_failures >= 1 and rd.meta["counters"]["rows_dropped"] == 2000
        assert len(rd.tables["messages"]) == 2000 and rd.problems == []
        (disk.path / "filler").unlink()   # space is back: the next flush writes it all
        w.append("messages", rows[0])
        w.close()
        rd = read_run_dir(disk.path / "h0")
        assert rd.meta["closed"] is True and rd.meta["counters"]["rows_dropped"] == 2001
        assert len(rd.tables["messages"]) == 2001
    assert len(lines) == 2 and "dropping rows" in lines[0] and "again" in lines[1], lines


def test_agent_with_a_full_output_disk_goes_on_and_says_so(tmp_path):
    with Tmpfs(tmp_path / "disk", 4096) as disk:
        disk.leave_free(256)
        out = disk.path / "agent"
        a = agent(out, "--comm", COMM, *LIGHT)
        try:
            rss = []
            # Open loop at a rate the agent follows: closed loop outruns it, and while it
            # sheds load its RSS climbs with the backlog it decodes (to 400-560 MB here since
            # the rings are read in step, 470-810 MB before; then flat), full disk or not;
            # that climb is not what this test is about.
            with psbench(tmp_path / "ps", duration_s=8, servers=1, workers=2, rate=300) as job:
                job.wait_ready()
                full = wait_for("the agent to say the disk is full",
                                lambda: [ln for ln in a.lines if "dropping rows" in ln], 30)
                rss.append(rss_mb(a.pid))
                while job.procs[-1].popen.poll() is None:   # sample while the job runs on
                    rss.append(rss_mb(a.pid))
                    time.sleep(0.25)
                job.wait()   # the job ends well: the agent did not take it down
            assert a.proc.poll() is None, a.log_tail()
            assert a.stop() == 0, a.log_tail()
        finally:
            a.kill()
        figure("agent_rss_mb_with_full_disk", f"{rss[0]:.0f} when it filled, max {max(rss):.0f}")
        assert max(rss) - rss[0] < 50, f"RSS grew from {rss[0]:.0f} to {max(rss):.0f} MB with the disk full"
        assert len(full) == 1 and "Traceback" not in "".join(a.lines), a.log_tail(20)
        rd = read_run_dir(host_dir(out))
        assert rd.problems == []
        c = rd.meta["counters"]
        figure("rows_dropped_full_disk", c["rows_dropped"])
        assert c["rows_dropped"] > 0 and c["shards_failed"] > 0, c
        written = sum(len(t) for t in rd.tables.values())   # messages and connections rows
        # every message row is in a shard or counted as dropped (with the connections rows)
        assert len(rd.tables.get("messages", ())) <= c["messages"] <= written + c["rows_dropped"], (written, c)
    assert len(job.truth()) > 0


# ---------------------------------------------------------------- 2. traced processes restarted

def test_traced_job_killed_and_restarted_is_traced_again_and_the_gap_reported(tmp_path):
    import re

    out = tmp_path / "agent"
    a = agent(out, "--comm", COMM, *LIGHT)
    try:
        with psbench(tmp_path / "ps1", duration_s=60, servers=1, workers=1, rate=200) as first:
            first.wait_ready()
            wait_for("a closed messages shard", lambda: shards(out), 30)
            for p in first.procs:
                p.popen.kill()
            killed_ns = time.monotonic_ns()
            for p in first.procs:
                p.popen.wait()
        time.sleep(1.0)   # the outage itself (a restart here takes < 1 s), not a wait on anything
        with psbench(tmp_path / "ps2", duration_s=3, servers=1, workers=1, rate=200) as second:
            second.wait_ready()
            restarted_ns = time.monotonic_ns()
            second.wait()
        assert a.stop() == 0, a.log_tail()
    finally:
        a.kill()
    rd = read_run_dir(host_dir(out))
    msgs = rd.tables["messages"]
    new_pids = set(sum(second.pids.values(), []))
    again = msgs[msgs.pid.isin(new_pids)]
    t = again.ts_send_first_enter_ns.fillna(again.ts_recv_last_exit_ns)
    # traced again: the new processes' messages, sent after they started, with their
    # framework-boundary times (the uprobes reach processes that start later)
    assert len(again) > 100 and (t > killed_ns).all(), len(again)
    assert again.ts_framework_ns.notna().mean() > 0.9
    assert set(again.op) >= {"push", "pull"}

    start_ns = rd.meta["started_realtime_ns"] - rd.meta["clock"]["offset_ns"]
    term = " ".join(report(host_dir(out)).stdout.split())
    found = re.findall(rf"no messages on {re.escape(rd.meta['host_id'])} from ([\d.]+) s to ([\d.]+) s", term)
    assert found, term
    gaps = [(float(x), float(y)) for x, y in found]
    kill_s, back_s = (killed_ns - start_ns) / 1e9, (restarted_ns - start_ns) / 1e9
    figure("restart_gap_s", f"reported {gaps}; killed at {kill_s:.2f} s, new job ready at {back_s:.2f} s")
    # the reported gap spans the kill, and ends with the new job's first messages
    assert any(x - 0.1 <= kill_s <= y and y <= back_s + 2.0 for x, y in gaps), (gaps, kill_s, back_s)
