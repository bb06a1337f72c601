"""The virtual cluster: hosts as network namespaces, joined by a wire with known delays.

Topology (N hosts, one kernel):

    netns h0                       netns pslat-wire                     netns h1
    eth0 10.77.0.1/24 ==veth== wp0 ]                           [ wp1 ==veth== eth0 10.77.0.2/24
    02:70:73:00:00:01              ]  wirefwd (AF_PACKET,     [                02:70:73:00:00:02
                                   ]  one socket per port)    [
    ... host i: eth0 10.77.0.(i+1), MAC 02:70:73:00:00:(i+1); wire end wp<i>, MAC 02:70:73:01:00:(i+1)

- A host is a network namespace named as the host (the host id the agent
  uses), with loopback up and one veth, "eth0", whose other end sits in the
  wire namespace. No link ever lives in the root namespace.
- The wire is wirefwd (wirefwd.c): it forwards each frame to the destination
  host's port after the one-way delay set for that ordered (source,
  destination) pair, plus optional jitter (uniform in [-J, +J] or normal with
  standard deviation J, clamped at 0), keeping each pair's frames in order
  (FIFO: a frame never leaves before its predecessor, so jitter adds queueing
  instead of reordering). Time in is the kernel's receive timestamp
  (SO_TIMESTAMPNS, realtime) minus real-mono read right after each receive
  (a step of the realtime clock moves no frame: wirefwd.c), so the forwarder's own
  wake-up latency is part of the delay, not added to it; a tc program at each
  host's veth egress makes the kernel take it at the sender's handoff, not in
  the wire namespace's softirq (timein.py). Time out is when the frame is
  handed to the kernel for sending (just before its send()).
- Static ARP entries for every other host (so no test needs an ARP warm-up and
  no ARP frame reaches the wire); IPv6 disabled in every namespace (no
  ND/MLD chatter in the ground truth).
- Offloads off on both ends of every veth (TSO, GSO, GRO, tx/rx checksum:
  checksum offload would leave frames with checksums the forwarder's re-sent
  copy fails), so every frame on the wire is one MTU-sized TCP segment, as on
  a real NIC's wire. What ethtool reports afterwards is recorded.

What is recorded (in log_dir):
- wire.bin: one record per frame per destination (wirelog.py reads it:
  `Cluster.wire_log()`): time in, time out (CLOCK_MONOTONIC ns), delay applied,
  source and destination host, ethertype, IPv4 addresses, TCP/UDP ports, TCP
  seq/ack/flags, payload and frame bytes, drops.
- wirefwd.conf / wirefwd.stderr / wirefwd.stats.json: the forwarder's input,
  complaints and counters (frames in/out, drops, kernel socket drops, CPU).
  The forwarder runs SCHED_FIFO (priority RT_PRIORITY): on shared cores a
  normal-priority wire woke milliseconds late whenever the hosts were busy.
- `describe()`: hosts, addresses, MACs, delays per pair, jitter, the offload
  state of every interface, MTU, ARP and IPv6 settings.

Lifetime: /run/pslat/cluster.json names everything before it is created.
Teardown (the context manager's exit, also on an exception or Ctrl-C, or
`down()`) kills the processes started in the hosts, the forwarder, and every
other process left inside the cluster's namespaces, then deletes the
namespaces (which removes the veths). A process killed before it could tear
down leaves the state file; the next `up` or `down` removes what it names.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pandas as pd

from core.errors import UserError, require_root

from . import forwarder, netns, state, timein, wirelog
from .spec import PREFIX_LEN, WIRE_NS, ClusterSpec, Host, make_spec

MTU = 1500

__all__ = ["Cluster", "Host", "down", "status"]


class Cluster:
    """A context manager that brings the cluster up on entry and removes all of it on exit."""

    def __init__(self, hosts: int | list[str], wire_delay_ms: float = 0.0, jitter_ms: float = 0.0,
                 pair_delay_ms: dict[tuple[str, str], float] | None = None,
                 log_dir: Path | None = None, jitter_dist: str = "uniform", seed: int = 1,
                 wait_s: float = 0.0):
        """wait_s: if another live process's cluster is up, wait this long for it to go
        (one cluster per machine; tests of several people share one)."""
        if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not wait_s >= 0:
            raise UserError(f"wait_s must be >= 0 seconds, got {wait_s!r}")
        self._wait_s = float(wait_s)
        self.spec: ClusterSpec = make_spec(hosts, wire_delay_ms, jitter_ms, pair_delay_ms,
                                           jitter_dist, seed)
        self._log_dir_given = Path(log_dir).resolve() if log_dir is not None else None
        self.log_dir: Path | None = self._log_dir_given
        self._forwarder: subprocess.Popen | None = None
        self._forwarder_pid: int | None = None
        self._procs: list[subprocess.Popen] = []
        self._describe: dict = {}
        self._owner = True    # False for a cluster attached to by `pslat cluster exec/status`
        self._up = False
        self._state: dict = {}
        self._final_stats: dict = {}
        self._saved_sigterm = None

    # ---- hosts ---------------------------------------------------------------
    @property
    def hosts(self) -> list[Host]:
        return list(self.spec.hosts)

    def host(self, name: str) -> Host:
        return self.spec.host(name)

    def _host(self, host: Host | str) -> Host:
        return self.host(host.name if isinstance(host, Host) else host)

    # ---- running things inside hosts ------------------------------------------
    def command(self, host: Host | str, argv: list[str]) -> list[str]:
        """The argv that runs `argv` inside the host's network namespace."""
        if not argv:
            raise UserError("no command given; say what to run inside the host")
        return netns.in_ns(self._host(host).netns, [str(a) for a in argv])

    def popen(self, host: Host | str, argv: list[str], env: dict[str, str] | None = None,
              **popen_kw) -> subprocess.Popen:
        """Start argv inside the host; killed at teardown if still running.

        env holds variables to set ON TOP of this process's environment (unlike
        Popen, where env replaces it). The process gets a session of its own
        unless start_new_session=False is passed, so a Ctrl-C reaches the owner
        first and teardown stops the host processes in order.
        """
        self._require_up()
        popen_kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(host, argv), env=_merged_env(env), **popen_kw)
        self._procs.append(proc)
        return proc

    def run(self, host: Host | str, argv: list[str], env: dict[str, str] | None = None,
            **run_kw) -> subprocess.CompletedProcess:
        """Run argv inside the host to completion (subprocess.run's arguments)."""
        self._require_up()
        return subprocess.run(self.command(host, argv), env=_merged_env(env), **run_kw)

    # ---- ground truth ----------------------------------------------------------
    @property
    def wire_log_path(self) -> Path:
        if self.log_dir is None:
            raise UserError("the cluster is not up, so it has no wire log yet; enter it first")
        return self.log_dir / "wire.bin"

    def wire_log(self, start: int = 0) -> pd.DataFrame:
        """Per-frame records so far (from record `start`), host names for src/dst."""
        return wirelog.read_wire_log(self.wire_log_path, [h.name for h in self.spec.hosts], start)

    def forwarder_stats(self) -> dict:
        """The forwarder's counters: fresh while it runs, its final ones after teardown."""
        if self.log_dir is None:
            return {}
        fwd_alive = self._forwarder_pid and netns.start_ticks(self._forwarder_pid) is not None
        if self._up and fwd_alive:
            return forwarder.request_stats(self._forwarder_pid, self.log_dir)
        return dict(self._final_stats) or forwarder.read_stats(self.log_dir)

    def describe(self) -> dict:
        return dict(self._describe)

    # ---- lifetime --------------------------------------------------------------
    def __enter__(self) -> "Cluster":
        self.up()
        if threading.current_thread() is threading.main_thread():
            # a plain `kill` of the owner tears down too (SIGKILL cannot: see down())
            self._saved_sigterm = signal.getsignal(signal.SIGTERM)
            if self._saved_sigterm in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _raise_system_exit)
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.down()
        finally:
            if self._saved_sigterm is not None:
                signal.signal(signal.SIGTERM, self._saved_sigterm)
                self._saved_sigterm = None

    def up(self, detach: bool = False) -> "Cluster":
        """Create everything. detach=True: leave it running after this process exits."""
        require_root("the virtual cluster")
        binary = forwarder.binary()
        deadline = time.monotonic() + self._wait_s
        while True:
            try:
                with state.locked():
                    _clear_leftovers_or_refuse()
                    return self._up_locked(binary, detach)
            except ClusterBusy:
                if time.monotonic() >= deadline:
                    raise
            time.sleep(0.2)  # polls the other cluster's state file, outside the lock

    def _up_locked(self, binary: Path, detach: bool) -> "Cluster":
        names = [WIRE_NS] + [h.netns for h in self.spec.hosts]
        taken = sorted(set(names) & netns.list_netns())
        if taken:
            raise UserError(f"network namespace(s) {', '.join(taken)} exist and are not a pslat "
                            "cluster's; pick other host names or remove them (`ip netns del`)")
        owned_log_dir = self._log_dir_given is None
        self.log_dir = (Path(tempfile.mkdtemp(prefix="pslat-cluster-")) if owned_log_dir
                        else self._log_dir_given)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        me = os.getpid()
        self._state = {
            "id": uuid.uuid4().hex,  # tells this cluster from a later one of the same process
            "owner": {"pid": me, "start_ticks": netns.start_ticks(me)},
            "detached": detach, "namespaces": names, "wire_ns": WIRE_NS,
            "log_dir": str(self.log_dir), "log_dir_owned": owned_log_dir,
            "forwarder": None, "describe": None,
        }
        state.write(self._state)  # before anything exists: a kill from here on is cleanable
        self._up = True
        try:
            self._build(binary)
        except BaseException:
            self._teardown_locked()
            raise
        return self

    def _build(self, binary: Path) -> None:
        offloads: dict[str, dict[str, dict[str, str]]] = {WIRE_NS: {}}
        netns.add_netns(WIRE_NS)
        ip = netns.tool("ip")
        for h in self.spec.hosts:
            netns.add_netns(h.netns)
            netns.run([ip, "link", "add", h.ifname, "netns", h.netns, "address", h.mac, "mtu", str(MTU),
                       "type", "veth", "peer", "name", h.wire_ifname, "netns", WIRE_NS,
                       "address", h.wire_mac, "mtu", str(MTU)])
            cmds = ["link set lo up", f"addr add {h.addr}/{PREFIX_LEN} dev {h.ifname}",
                    f"link set {h.ifname} up"]
            cmds += [f"neigh replace {o.addr} lladdr {o.mac} dev {h.ifname} nud permanent"
                     for o in self.spec.hosts if o is not h]
            netns.ip_batch(h.netns, cmds)
            offloads[h.netns] = {h.ifname: netns.offloads_off(h.netns, h.ifname)}
            offloads[WIRE_NS][h.wire_ifname] = netns.offloads_off(WIRE_NS, h.wire_ifname)
        netns.ip_batch(WIRE_NS, ["link set lo up"] +
                       [f"link set {h.wire_ifname} up" for h in self.spec.hosts])
        timein.clear_delivery_time([(h.netns, h.ifname) for h in self.spec.hosts])
        self._forwarder = forwarder.start(self.spec, self.log_dir)
        self._forwarder_pid = self._forwarder.pid
        self._state["forwarder"] = {"pid": self._forwarder.pid,
                                    "start_ticks": netns.start_ticks(self._forwarder.pid),
                                    "binary": str(binary)}
        self._describe = self._make_description(offloads)
        self._state["describe"] = self._describe
        state.write(self._state)

    def _make_description(self, offloads: dict) -> dict:
        return {
            "hosts": [{"name": h.name, "netns": h.netns, "addr": h.addr, "prefix_len": PREFIX_LEN,
                       "ifname": h.ifname, "mac": h.mac, "wire_ifname": h.wire_ifname,
                       "wire_mac": h.wire_mac} for h in self.spec.hosts],
            "wire_ns": WIRE_NS,
            "delay_ms": {f"{a}->{b}": ms for (a, b), ms in self.spec.delay_ms.items()},
            "jitter_ms": self.spec.jitter_ms,
            "jitter_dist": self.spec.jitter_dist,
            "jitter_seed": self.spec.seed,
            "order": "FIFO per ordered host pair (jitter never reorders a pair's frames)",
            "time_in": "kernel receive timestamp (SO_TIMESTAMPNS) mapped to CLOCK_MONOTONIC",
            "mtu": MTU,
            "offloads": offloads,
            "arp": "static (permanent neighbour entries for every other host)",
            "ipv6": "disabled",
            "forwarder_pid": self._forwarder_pid,
            "spin_ns": forwarder.SPIN_NS,
            "rt_priority": forwarder.RT_PRIORITY,
            "log_dir": str(self.log_dir),
            "wire_log": str(self.log_dir / "wire.bin"),
        }

    def down(self) -> None:
        """Remove everything this cluster made. Safe to call twice."""
        if not self._up or not self._owner:
            return
        blocked = _ignore_interrupts()
        try:
            self._stop_tracked()
            with state.locked():
                self._teardown_locked()
        finally:
            _restore_interrupts(blocked)

    def _stop_tracked(self) -> None:
        live = [p for p in self._procs if p.poll() is None]
        for p in live:
            _signal_group(p, signal.SIGTERM)
        for p in live:
            try:
                p.wait(2.0)
            except subprocess.TimeoutExpired:
                _signal_group(p, signal.SIGKILL)
                p.wait()
        self._procs.clear()

    def _teardown_locked(self) -> None:
        current = state.read()
        # `pslat cluster down` may have removed it already, and another cluster
        # may be up since: only what the state file says is ours gets removed
        mine = current is not None and current.get("id") == self._state.get("id")
        if self._forwarder is not None:
            forwarder.stop(self._forwarder)  # SIGTERM first: it flushes the log
            self._forwarder = None
        if self.log_dir is not None:
            self._final_stats = forwarder.read_stats(self.log_dir)
        if mine:
            _remove(current)  # also deletes a log dir we made ourselves (no log_dir given)
        self._up = False

    def _require_up(self) -> None:
        if not self._up:
            raise UserError("the cluster is not up; use it inside `with Cluster(...) as c:`")

    @classmethod
    def attach(cls) -> "Cluster":
        """The cluster that is up now (from its state file), for exec/status; not torn down by it."""
        data = state.read()
        if not data or not data.get("describe"):
            raise UserError("no cluster is up; start one with `pslat cluster up --hosts N`")
        d = data["describe"]
        c = cls([h["name"] for h in d["hosts"]], jitter_ms=d["jitter_ms"],
                jitter_dist=d["jitter_dist"], seed=d["jitter_seed"],
                pair_delay_ms={tuple(k.split("->")): v for k, v in d["delay_ms"].items()})
        c.log_dir = Path(d["log_dir"])
        c._describe = d
        c._forwarder_pid = d["forwarder_pid"]
        c._owner = False
        c._up = True
        return c


def _merged_env(env: dict[str, str] | None) -> dict[str, str] | None:
    return None if env is None else {**os.environ, **{k: str(v) for k, v in env.items()}}


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(p.pid, sig)  # its own session: the group is its pid
    except (ProcessLookupError, PermissionError):
        try:
            p.send_signal(sig)
        except ProcessLookupError:
            pass


def _raise_system_exit(signum, frame):
    raise SystemExit(128 + signum)


def _ignore_interrupts():
    """A second Ctrl-C must not cut teardown short; only the main thread may touch handlers."""
    if threading.current_thread() is not threading.main_thread():
        return None
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    for s in saved:
        signal.signal(s, signal.SIG_IGN)
    return saved


def _restore_interrupts(saved) -> None:
    for s, h in (saved or {}).items():
        signal.signal(s, h)


def _remove(data: dict) -> list[str]:
    """Kill every process inside the recorded namespaces, delete them, drop the state."""
    removed = []
    fwd = data.get("forwarder") or {}
    names = data.get("namespaces", [])
    hosts_first = [n for n in names if n != data.get("wire_ns")] + \
                  [n for n in names if n == data.get("wire_ns")]
    for ns in hosts_first:
        pids = netns.netns_pids(ns)
        if ns == data.get("wire_ns") and netns.alive(fwd.get("pid"), fwd.get("start_ticks")):
            pids.append(fwd["pid"])  # also when it left the namespace's pid list
        netns.terminate_pids(sorted(set(pids)))
    present = netns.list_netns()
    for ns in names:
        if ns in present:
            netns.del_netns(ns)
            removed.append(ns)
    if data.get("log_dir_owned"):
        shutil.rmtree(data.get("log_dir", ""), ignore_errors=True)
    state.remove()
    return removed


class ClusterBusy(UserError):
    """Another live cluster is up (one per machine)."""


def _clear_leftovers_or_refuse() -> None:
    data = state.read()
    if data is None:
        return
    why = state.in_use(data)
    if why:
        raise ClusterBusy(f"a cluster is already up ({why}); use it, or remove it with "
                          "`pslat cluster down`")
    _remove(data)


def down() -> list[str]:
    """Remove the cluster that is up, or what a killed run left; returns the namespaces removed."""
    require_root("pslat cluster down")
    with state.locked():
        data = state.read()
        return _remove(data) if data else []


def status() -> dict | None:
    """The description of the cluster that is up, with whether its wire runs; None if none."""
    data = state.read()
    if not data:
        return None
    fwd = data.get("forwarder") or {}
    return {"describe": data.get("describe"), "detached": data.get("detached"),
            "forwarder_running": netns.alive(fwd.get("pid"), fwd.get("start_ticks")),
            "in_use": state.in_use(data), "namespaces_present":
                sorted(set(data.get("namespaces", [])) & netns.list_netns())}
