"""The agent's main loop: raw events -> decode -> correlate -> one run dir per host.

    pipeline = Pipeline(out_dir, host_map, meta)      # the same for live and replay
    source.sink = pipeline.handle                    # (probe name, raw bytes)
    ... pipeline.close()

run_live() attaches the probes and traces until SIGINT/SIGTERM or the
duration; replay() feeds a recording through the same Pipeline without root.
Lost events (a full ring) are counted per probe in meta.json and printed on
stderr as they happen.
"""
from __future__ import annotations

import contextlib
import json
import math
import resource
import signal
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from agent.bypass import REPORTED_MAX as BYPASS_LISTED_MAX
from agent.clocksamples import NS_EV_CLOCK, clock_sample_row
from agent.clockskew import ClockSkew
from agent.correlate import Connections, Correlator
from agent.detach import Detacher
from agent.calls import SockcallAssembler, sockcall_format
from agent.endpoints import addr_text
from agent.framework_records import FrameworkDecoder
from agent.streams import StreamDecoder, stream_row
from core.errors import UserError, say
from agent.hosts import HostMap, boot_id, clock_discipline, clock_mapping, kernel_info
from agent.live import UnrecognisedTally
from agent.netrows import TCP_CLOSE
from agent.priority import Priority
from agent.records import CLOCK_SAMPLES_SCHEMA, CONNECTIONS_SCHEMA, MESSAGES_SCHEMA, STREAMS_SCHEMA
from agent.rundir import RunDirWriter, check_out, claim_run_dir
from agent.sources import NOTE_PROBE, LiveSource, RecordWriter, ReplaySource, Selection, agent_version
from parsers.protocol import UNRECOGNISED
from probes.events import NsEventKind

NS_EV_CONN = int(NsEventKind.CONN)   # a socket's TCP state changed (probes/events.h)
COUNTERS_INTERVAL_S = 1.0
# The consumer wakes every BATCH_INTERVAL_S and takes what the rings hold, rather
# than waking for each event: on cores shared with the job, per-event wake-ups
# preempted its threads over and over (psbench 2x4 closed loop on 2 cores: 2880
# requests in 3 s untraced; 401 with an agent at nice -10 woken per event, 1838 at
# nice 0). The rings (16 MiB each) hold far more than a batch interval's events.
BATCH_INTERVAL_S = 0.02
# On stop (_stop) the probes detach while the rings are decoded, for STOP_DECODE_S at
# most on SIGTERM (a service manager's stop: the agent ends within 2 s) and for
# FINAL_DRAIN_S on Ctrl-C or the end of --duration (a user or a test wants the whole
# record: a consumer behind at the stop holds seconds of events in the rings; a second
# Ctrl-C cuts it short). What arrives later is counted as lost, for STOP_COUNT_S at
# most once the probes are gone: no event is dropped without being counted.
# Within a SIGTERM's 2 s the consumer also settles and writes what it holds: STOP_CLOSE_S
# after the signal, what the correlator still holds is counted (unsettled_at_stop), not
# written (an agent behind its probes held 10k messages there: 1.2 s of rows; the writer,
# the count of what the rings still deliver, meta.json and the exit take 0.5-0.7 s more).
STOP_DECODE_S = 0.4
STOP_CLOSE_S = 0.9
FINAL_DRAIN_S = 10.0
STOP_COUNT_S = 0.2
SHARD_INTERVAL_S = 2.0
UNRECOGNISED_EVERY_S = 5.0   # the live view's tally of open unrecognised connections, this often
BTF_PATH = Path("/sys/kernel/btf/vmlinux")
RUN_ID = uuid.uuid4().hex   # one per agent process: its run dirs belong together


class Pipeline:
    """Raw events of every probe -> rows in DIR/<host id>/ (see the module docstring)."""

    def __init__(self, out: Path, host_map: HostMap, meta: dict, framework_on: bool = True,
                 netstack_on: bool = False, shard_interval_s: float = SHARD_INTERVAL_S,
                 hosts: tuple[str, ...] = (), warn: Callable[[str], None] | None = None,
                 sockcall_fmt: str = "prefix", skews: dict | None = None, protocols: dict | None = None,
                 walked: bool = True):
        self.out = Path(out)
        self.host_map = host_map
        self.meta = meta
        self.shard_interval_s = shard_interval_s
        self.warn = warn or (lambda m: say("pslat agent", m))
        self.decoder = StreamDecoder(on_stream=self._emit_stream, forced=protocols, walked=walked)
        if protocols:
            self.meta.setdefault("config", {})["protocols"] = {str(k): v for k, v in sorted(protocols.items())}
        self.sockcalls = SockcallAssembler(sockcall_fmt)
        self.meta.setdefault("config", {})["sockcall_format"] = sockcall_fmt
        self.framework = FrameworkDecoder()
        self.correlator = Correlator(self._emit, host_map.host_of, framework_on=framework_on,
                                     netstack_on=netstack_on)
        if netstack_on:
            self.correlator.connections = Connections(self._emit_connection, host_map.host_of)
        self._netstack_decode = None
        self._unrecognised_closed: dict[str, UnrecognisedTally] = {}   # host -> connections let go
        self._unrecognised_at = -math.inf
        self.writers: dict[str, RunDirWriter] = {}
        self.host_netns: dict[str, set[int]] = {}
        self.events: dict[str, int] = {}
        self.errors: dict[str, int] = {}
        self.rows: dict[str, int] = {}
        self.probe_counters: dict[str, dict[str, int]] = {}
        self.cpu_s = 0.0
        self._bypass_unlisted: dict[str, int] = {}   # host -> bypassing processes past its list
        self.live = None   # agent.live.LiveAggregates fed with every row, watermark and counter tick
        self.skews: dict[str, ClockSkew] = dict(skews or {})   # host -> a clock error put on on purpose (tests)
        from agent.shedding import SamplingRecord
        self.sampling = SamplingRecord(self.meta, self.correlator)   # from the agent's notes
        for h in hosts:
            self._writer(h)

    # -- events -----------------------------------------------------------------
    def handle(self, probe: str, raw: bytes) -> None:
        self.events[probe] = self.events.get(probe, 0) + 1
        try:
            if probe == "sockcalls":
                call = self.sockcalls.feed(raw)
                if call is not None:
                    for wm in self.decoder.feed(call):
                        self.correlator.on_message(wm)
            elif probe == "framework":
                fm = self.framework.feed(raw)
                if fm is not None:
                    self.correlator.on_framework(fm)
            elif probe == "netstack":
                if self._netstack_decode is None:
                    from probes.events import NetstackEvent  # exists once netstack landed
                    self._netstack_decode = NetstackEvent.decode
                ev = self._netstack_decode(raw)
                if ev.kind == NS_EV_CLOCK:
                    self._emit_clock_sample(ev)
                else:
                    self.correlator.on_netstack(ev)
                    if ev.kind == NS_EV_CONN and ev.newstate == TCP_CLOSE:
                        # the decoder drops the connection's state once its last calls came
                        self.decoder.closed(ev.netns_ino, ev.sk, (addr_text(ev.family, bytes(ev.daddr)), ev.dport),
                                            ev.ts_ns)
            elif probe == NOTE_PROBE:
                self._note(raw)
        except Exception:  # one bad event must not stop the agent: count it, say it once
            n = self.errors.get(probe, 0)
            self.errors[probe] = n + 1
            if n == 0:
                self.warn(f"could not decode a {probe} event (counted in meta.json; first one):\n"
                          + traceback.format_exc())

    def _note(self, raw: bytes) -> None:
        import json
        note = json.loads(raw)
        if "watermark_ns" in note:
            for wm in self.decoder.advance(int(note["watermark_ns"])):   # closed and idle connections' last
                self.correlator.on_message(wm)
            self.correlator.advance(int(note["watermark_ns"]))
            if self.live is not None:
                self.live.advance(int(note["watermark_ns"]))
        if "netns" in note and "host" in note:
            self.host_map.set(int(note["netns"]), str(note["host"]))
        if "sampling" in note:
            self.sampling.on_note(note["sampling"], self.live)
        if "kernel_bypass" in note:   # agent/bypass.py: a process whose messages skip the sockets
            found = note["kernel_bypass"]
            netns = found.get("netns")
            host = self.host_map.host_of(netns) if type(netns) is int else self.host_map.default
            listed = self._writer(host).meta.setdefault("kernel_bypass", [])
            if len(listed) < BYPASS_LISTED_MAX:
                listed.append({k: found.get(k) for k in ("pid", "comm", "protocol", "transport", "setting")})
            else:
                self._bypass_unlisted[host] = self._bypass_unlisted.get(host, 0) + 1

    def _emit(self, netns_ino: int, row: dict) -> None:
        host = row["host_id"]
        if host in self.skews:
            self.skews[host].apply(row)
        self._writer(host).append("messages", row)
        self.host_netns.setdefault(host, set()).add(netns_ino)
        self.rows[host] = self.rows.get(host, 0) + 1
        if self.live is not None:
            self.live.on_message(row)

    def _emit_connection(self, netns_ino: int, row: dict) -> None:
        if row["host_id"] in self.skews:
            self.skews[row["host_id"]].apply(row)
        self._writer(row["host_id"]).append("connections", row)
        if self.live is not None:
            self.live.on_connection(row)

    def _emit_stream(self, conn, end: str) -> None:
        row = stream_row(conn, self.host_map.host_of(conn.netns_ino), end)
        if row["host_id"] in self.skews:
            self.skews[row["host_id"]].apply(row)
        self._writer(row["host_id"]).append("streams", row)
        if row["protocol"] == UNRECOGNISED and end != "open_at_stop":
            self._unrecognised_closed.setdefault(row["host_id"], UnrecognisedTally()).add(
                row["local_port"], row["remote_port"], row["threads"], row["bytes_tx"] + row["bytes_rx"])

    def _tell_live_unrecognised(self) -> None:
        """The live view's traffic no parser recognised: the closed connections' tallies and a
        pass over the open ones (every UNRECOGNISED_EVERY_S: it looks at every connection)."""
        now = time.monotonic()
        if self.live is None or now - self._unrecognised_at < UNRECOGNISED_EVERY_S:
            return
        self._unrecognised_at = now
        open_: dict[str, UnrecognisedTally] = {}
        for conn, moved in self.decoder.unrecognised_open():
            open_.setdefault(self.host_map.host_of(conn.netns_ino), UnrecognisedTally()).add(
                conn.local[1], conn.remote[1], conn.threads.values(), moved)
        hosts = set(open_) | set(self._unrecognised_closed)
        empty = UnrecognisedTally()
        self.live.on_unrecognised({h: self._unrecognised_closed.get(h, empty).merged(open_.get(h, empty)).to_json()
                                   for h in hosts})

    def _emit_clock_sample(self, ev) -> None:
        row = clock_sample_row(ev, self.host_map.host_of(ev.netns_ino))
        if row["host_id"] in self.skews:
            self.skews[row["host_id"]].apply(row)
        self._writer(row["host_id"]).append("clock_samples", row)

    def _writer(self, host: str) -> RunDirWriter:
        w = self.writers.get(host)
        if w is None:
            if "/" in host or host in ("", ".", ".."):
                raise UserError(f"host id {host!r} cannot name a directory; give --host-id")
            meta = dict(self.meta, host_id=host)
            if host in self.skews:
                meta["clock"] = dict(meta["clock"], injected=self.skews[host].to_meta())
            path = claim_run_dir(self.out, host)
            if path.name != host:
                self.warn(f"{self.out / host} holds an earlier run's data: this run writes {path}")
            w = self.writers[host] = RunDirWriter(path, meta, self.shard_interval_s, warn=self.warn)
            w.set_schema("messages", MESSAGES_SCHEMA)
            w.set_schema("connections", CONNECTIONS_SCHEMA)
            w.set_schema("clock_samples", CLOCK_SAMPLES_SCHEMA)
            w.set_schema("streams", STREAMS_SCHEMA)
        return w

    # -- upkeep -----------------------------------------------------------------
    def _host_counters(self, host: str) -> dict:
        per_netns = self.decoder.stats_by_netns()
        inos = self.host_netns.get(host, set()) | {i for i in per_netns if self.host_map.host_of(i) == host}
        out: dict = {"probes": self.probe_counters, "events_consumed": dict(self.events),
                     "events_undecodable": dict(self.errors), "messages": self.rows.get(host, 0)}
        for ino in inos:
            for k, v in per_netns.get(ino, {}).items():
                out[k] = out.get(k, 0) + v
        out.update({f"correlate_{k}": v for k, v in self.correlator.counters.items()})
        out["tx_ends_retransmitted"] = self.correlator.tx_times.retransmitted_ends
        out["calls_walked_whole"] = self.decoder.calls_walked_whole   # no stream view needed (agent/streams.py)
        out["sync_hints"] = self.decoder.hints
        out["sync_hints_count_only"] = self.decoder.hints_count_only   # unrecognised after a mid-stream hunt
        out["framework_values_rejected"] = self.framework.values_rejected   # routing ids past int32
        out["consumer_cpu_s"] = round(self.cpu_s, 3)
        out["kernel_bypass_not_listed"] = self._bypass_unlisted.get(host, 0)   # past meta.json's list
        # what the bounded maps dropped (agent.bounded): per connection, process, socket
        out["correlate_ids_evicted"] = self.correlator.ids.evicted
        out["tx_ends_evicted"] = self.correlator.tx_times.evicted
        if self.correlator.connections is not None:
            out.update({f"connection_{k}": v for k, v in self.correlator.connections.counters.items()})
        if self.live is not None:
            out.update({f"live_{k}": v for k, v in self.live.bounded.items()})
        return out

    def set_probe_counters(self, counters: dict[str, dict[str, int]]) -> None:
        self.probe_counters = counters
        if self.live is not None:
            self.live.tick(counters, sum(self.events.values()))
            self._tell_live_unrecognised()

    def maybe_flush(self) -> None:
        for host, w in self.writers.items():
            if time.monotonic() - w._last_flush >= w.shard_interval_s:
                w.meta["counters"].update(self._host_counters(host))
                w.flush()

    def close(self, deadline: float = math.inf) -> None:
        """deadline: time.monotonic() by which the correlator is done (agent.correlate)."""
        for wm in self.decoder.finish():
            self.correlator.on_message(wm)
        self.correlator.close(deadline)
        self.sampling.finish(self.correlator.now_ns)
        for host, w in self.writers.items():
            w.meta["counters"].update(self._host_counters(host))
            w.close()


# ---------------------------------------------------------------- live

@dataclass
class AgentOptions:
    out: Path
    pids: tuple = ()
    comms: tuple = ()
    netns: tuple = ()
    ports: tuple = ()
    host_id: str | None = None
    duration_s: float | None = None
    record: Path | None = None
    libs: tuple = ()
    print_bpf: bool = False
    netstack: bool = True
    overrides: dict = field(default_factory=dict)
    listen: str | None = None   # ADDR:PORT of the live HTTP endpoint (agent.http)
    test_clock_skews: tuple = ()  # HOST:OFFSET_US:DRIFT_PPM (agent.clockskew), for tests only
    sample_rate: float | None = None   # share of host pairs kept; None: adapted (agent.shedding)
    nice: int | None = None            # the agent's threads' nice value once attached (agent.priority)
    cpu_budget: float | None = None    # CPU seconds per second the agent may use (agent.shedding)
    protocols: dict = field(default_factory=dict)   # {port: protocol name} forced (--protocol)
    all_call_hooks: bool = False       # never detach the read/write family's hooks (agent.callhooks)
    call_hooks_quiet_s: float | None = None   # tests: a shorter quiet window (agent.callhooks.QUIET_S)


def check_prerequisites() -> None:
    """Root, BTF, tracefs: one clear line each."""
    from core.errors import require_root
    from probes import tracefs

    require_root("pslat agent")
    if not BTF_PATH.exists():
        raise UserError(f"this kernel has no BTF ({BTF_PATH} is missing); pslat reads kernel struct "
                        "layouts from it: use a kernel built with CONFIG_DEBUG_INFO_BTF=y")
    tracefs.tracefs_root()  # UserError naming the mount command when it is missing


def _selection(o: AgentOptions) -> Selection:
    from probes.filters import Filters, shed_units_of

    f = Filters.build(pids=o.pids, comms=o.comms, ports=o.ports, netns=o.netns)
    return Selection(pids=f.tgids, comms=f.comms, netns_inos=f.netns_inos, ports=f.ports,
                     libs=tuple(Path(p) for p in o.libs),
                     shed_units=shed_units_of(o.sample_rate) if o.sample_rate is not None else 0)


def base_meta(sel: Selection, host_map: HostMap, config: dict) -> dict:
    return {
        "agent_version": agent_version(), "kernel": kernel_info(),
        "clock": clock_mapping(), "clock_discipline": clock_discipline(),
        "config": config,
        "selection": {"pids": list(sel.pids), "comms": [c.rstrip(b"\0").decode() for c in sel.comms],
                      "netns_inos": list(sel.netns_inos), "ports": list(sel.ports),
                      "libs": [str(p) for p in sel.libs]},
        "started_realtime_ns": time.time_ns(),
        "boot_id": boot_id(), "run_id": RUN_ID,
    }


def _open_files_to_hard_limit() -> None:
    """The soft limit on open files up to the hard one: a traced job's many connections
    and the endpoint's clients must not leave the run-dir writer without a descriptor
    (the endpoint also caps its own, agent/http.py)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def run_live(o: AgentOptions, log: Callable[[str], None] | None = None, aggregates=None) -> dict[str, Path]:
    """Trace until SIGINT/SIGTERM or the duration; returns {host id: run dir}.
    aggregates: an agent.live.LiveAggregates to feed (made here when o.listen is set)."""
    log = log or (lambda m: say("pslat agent", m))
    sel = _selection(o)
    skews = {k.host: k for k in (ClockSkew.parse(t, time.monotonic_ns()) for t in o.test_clock_skews)}
    if o.print_bpf:
        src = LiveSource(sel, sink=lambda p, r: None, netstack=o.netstack)
        print(src.generated().render())
        from probes.framework import SOURCE
        print(f"/* ==== framework uprobes ({SOURCE.name}): built per traced library with its "
              f"calibrated message layout as -D constants ==== */")
        print(SOURCE.read_text())
        return {}
    check_prerequisites()
    host_map = HostMap(o.host_id)
    if o.host_id and len(sel.netns_inos) == 1:
        # one traced namespace is the one host traced: --host-id names it (the README's
        # guide run on the virtual cluster's namespaces as if they were machines)
        host_map.set(sel.netns_inos[0], o.host_id)
    named_hosts = tuple(host_map.host_of(i) for i in sel.netns_inos) or (host_map.default,)
    if set(skews) - set(named_hosts):
        raise UserError(f"--test-clock-skew names {sorted(set(skews) - set(named_hosts))}, not a traced host "
                        f"({', '.join(named_hosts)})")
    check_out(o.out)   # before a probe is compiled or a port bound: a bad --out is one line, nothing attached
    _open_files_to_hard_limit()
    recorder: RecordWriter | None = None
    seen_netns: set[int] = set()
    pipeline: Pipeline | None = None

    unread: dict = {"count": None}
    hooks = None   # agent.callhooks.CallHooks, once attached

    def sink(probe: str, raw: bytes) -> None:
        if unread["count"] is not None:
            unread["count"][probe] = unread["count"].get(probe, 0) + 1
            return
        if hooks is not None and probe == "sockcalls" and len(raw) > _CALL_AT:
            hooks.seen(raw[_CALL_AT])
        if recorder is not None:
            if probe == "sockcalls" and len(raw) >= _NETNS_END:
                ino = int.from_bytes(raw[_NETNS_AT:_NETNS_END], "little")
                if ino not in seen_netns:   # the host of a namespace, before its first event
                    seen_netns.add(ino)
                    recorder.note({"netns": ino, "host": host_map.host_of(ino)})
            recorder.write(probe, raw)
        pipeline.handle(probe, raw)

    live = LiveSource(sel, sink, warn=log, overrides=o.overrides, netstack=o.netstack)
    stop = {"why": None, "at": None}

    def on_signal(signum, _frame):
        if stop["why"] is None:
            stop["why"] = signal.Signals(signum).name
            stop["at"] = time.monotonic()
            live.interrupt()   # a drain under way stops at its next record
        else:
            stop["again"] = True   # while stopping: cut the final decoding short

    server = None
    if o.listen and aggregates is None:
        from agent.live import LiveAggregates
        aggregates = LiveAggregates()
    if o.listen:   # bound before the probes attach: a port in use fails fast, and "ready" means serving
        from agent.http import serve
        server = serve(o.listen, aggregates)
        log(f"serving live aggregates on http://{server.address}/metrics and /snapshot.json")
    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    priority = Priority()
    try:
        attached_ns = time.monotonic_ns()   # no event is older: a valid first watermark
        live.start()
        config = live.config()
        netstack_on = any(p not in ("sockcalls", "framework") for p in config["probes"])
        meta = base_meta(sel, host_map, config)
        fmt = sockcall_format()
        pipeline = Pipeline(o.out, host_map, meta, framework_on=True, netstack_on=netstack_on,
                            hosts=named_hosts, warn=log, sockcall_fmt=fmt, skews=skews, protocols=o.protocols)
        pipeline.live = aggregates
        if fmt == "items":
            pipeline.decoder.on_sync_hint = live.sync_hint
        if o.record:
            recorder = RecordWriter(o.record, {**meta, "probes": config["probes"], "sockcall_format": fmt,
                                               "netns_names": {str(k): v for k, v in host_map.names().items()},
                                               "host_id": host_map.default})
        # From the first event on, time moves by watermarks only: the first drain
        # can take seconds (the backlog of the compile time, while the job runs on)
        # and must not expire what the other ring still holds.
        sink(NOTE_PROBE, b'{"watermark_ns": %d}' % attached_ns)
        from agent.shedding import Shedder, SheddingLoop
        shedding = SheddingLoop(Shedder(o.sample_rate, attached_ns, o.cpu_budget), live.program.bpf,
                                lambda note: sink(NOTE_PROBE, json.dumps(note).encode()), pipeline.sampling)
        if not o.all_call_hooks:
            from agent.callhooks import CallHooks
            hooks = CallHooks(live.program.bpf, time.monotonic(), log,
                              **({} if o.call_hooks_quiet_s is None else {"quiet_s": o.call_hooks_quiet_s}))
            for meta in (pipeline.meta, *(w.meta for w in pipeline.writers.values())):
                meta["call_hooks"] = hooks.changes   # the same list: meta.json says what was detached
        if o.nice is not None:
            priority.set(o.nice)
        log(f"ready: tracing {', '.join(named_hosts)} (compile+attach "
            f"{live.program.compile_s + live.program.attach_s:.1f} s); Ctrl-C to stop")
        deadline = time.monotonic() + o.duration_s if o.duration_s else None
        next_counters = time.monotonic() + COUNTERS_INTERVAL_S
        lost_seen: dict[str, int] = {}
        last_watermark = attached_ns
        while stop["why"] is None:
            c0 = time.thread_time()
            t0_ns = time.monotonic_ns()
            emptied = live.drain()
            if stop["why"] is not None:
                break
            shedding.drained(time.monotonic_ns() / 1e9 - t0_ns / 1e9, emptied)
            # the drain's start when it emptied the rings; when cut short, how far the
            # laggard ring got (agent/delivered.py), so groups settle while behind too
            watermark = live.delivered.watermark_ns()
            if watermark is not None and watermark > last_watermark:
                sink(NOTE_PROBE, b'{"watermark_ns": %d}' % watermark)
                last_watermark = watermark
            live.rescan()
            pipeline.cpu_s += time.thread_time() - c0
            if emptied:   # behind: go straight on draining
                time.sleep(BATCH_INTERVAL_S)
            now = time.monotonic()
            if now >= next_counters:
                next_counters = now + COUNTERS_INTERVAL_S
                counters = live.counters()
                pipeline.set_probe_counters(counters)
                rate = shedding.tick(counters, sum(pipeline.events.values()), time.monotonic_ns(),
                                     time.process_time())
                if rate is not None:
                    log(f"sampling {100 * rate:.3g}% of host pairs (load shedding)")
                if hooks is not None:
                    try:
                        hooks.tick(now, live.processes_seen, counters.get("sockcalls", {}).get("stream_gaps", 0))
                    except Exception as e:   # bcc's attach: say so; what is attached stays
                        log(f"following the read/write hooks stopped ({e}); detached now: "
                            f"{', '.join(k.name.lower() for k in hooks.detached) or 'none'}")
                        hooks = None
                for probe, c in counters.items():
                    lost = c.get("lost", 0)
                    if lost > lost_seen.get(probe, 0):
                        log(f"{probe}: {lost - lost_seen.get(probe, 0)} events lost (ring buffer full), "
                            f"{lost} so far")
                        lost_seen[probe] = lost
            pipeline.maybe_flush()
            if deadline is not None and now >= deadline:
                stop["why"] = "duration"
        priority.restore()
        if hooks is not None:
            hooks.close()   # a detach under way finishes before the probes' own
        if stop["why"] == "SIGTERM":
            decode_until, close_by = stop["at"] + STOP_DECODE_S, stop["at"] + STOP_CLOSE_S
        else:
            decode_until, close_by = time.monotonic() + FINAL_DRAIN_S, math.inf
        _stop(live, pipeline, unread, log, decode_until, close_by, lambda: stop.get("again", False))
    finally:
        priority.restore()
        live.close()   # detach every probe before anything else can fail
        if server is not None:
            server.close()
        for s, h in old.items():
            signal.signal(s, h)
        if recorder is not None:
            recorder.close()
    log(f"stopped ({stop['why']}): " + ", ".join(f"{h}: {n} messages" for h, n in sorted(pipeline.rows.items()))
        if pipeline.rows else f"stopped ({stop['why']}): no messages")
    return {h: w.path for h, w in pipeline.writers.items()}


def _stop(live: LiveSource, pipeline: Pipeline, unread: dict, log: Callable[[str], None],
          decode_until: float, close_by: float, cut_short: Callable[[], bool]) -> None:
    """Detaches the probes and closes the run dirs (within a SIGTERM's 2 s: STOP_DECODE_S
    and STOP_CLOSE_S after the signal).

    The probes detach in the background (agent.detach; RCU grace periods: 0.6 s idle,
    2-3 s on a loaded 2-vCPU machine) while the rings are decoded, until decode_until
    (time.monotonic()) at most, or until cut_short(). Then what the probes still deliver
    is counted as lost (lost_at_stop), not decoded, and the run dirs close meanwhile (the
    correlator by close_by); once the last probe is gone the count is finished
    (STOP_COUNT_S at most) and meta.json rewritten with it."""
    live.resume()
    give_up = decode_until
    decode_s = max(0.0, decode_until - time.monotonic())
    detaching = Detacher([live.program.bpf, getattr(live.framework, "_bpf", None)])
    while True:
        emptied = live.drain(budget_s=min(0.05, max(0.01, give_up - time.monotonic())))
        if (emptied and detaching.done()) or time.monotonic() >= give_up or cut_short():
            break
        if emptied:
            detaching.wait(0.005)
    if not (emptied and detaching.done()):
        unread["count"] = {}   # the sink counts from here on instead of decoding
    pipeline.set_probe_counters(live.counters())
    pipeline.close(close_by)
    unsettled = pipeline.correlator.counters.get("unsettled_at_stop", 0)
    if unsettled:
        log(f"stopping: {unsettled} messages decoded but not matched in the stop's time were counted "
            "(correlate_unsettled_at_stop), not written")
    while not detaching.done():   # keep the rings from filling while the kernel detaches
        if live.drain(budget_s=0.05):
            detaching.wait(0.005)
    if detaching.error is not None:
        log(f"detaching the probes: {detaching.error} (the rest are detached on exit)")
    if unread["count"] is None:
        return
    emptied = _drain_for(live, STOP_COUNT_S)
    counters = live.counters()
    for probe, n in unread["count"].items():
        c = counters.setdefault(probe, {})
        c["lost"] = c.get("lost", 0) + n
        c["lost_at_stop"] = n
    pipeline.set_probe_counters(counters)
    for host, w in pipeline.writers.items():   # the closed run dirs get the final counters
        w.meta["counters"].update(pipeline._host_counters(host))
        w.write_meta()
    if sum(unread["count"].values()) or not emptied:
        log(f"stopping: {sum(unread['count'].values())} events that arrived after {decode_s:.2g} s of "
            "decoding were counted as lost, not decoded"
            + ("" if emptied else " (and more were left uncounted: the count is a lower bound)"))


def _drain_for(live: LiveSource, seconds: float) -> bool:
    """Drains the rings until empty or `seconds` passed (once at least); True when emptied."""
    give_up = time.monotonic() + seconds
    emptied = live.drain(budget_s=max(seconds, 0.01))
    while not emptied and time.monotonic() < give_up:
        emptied = live.drain(budget_s=give_up - time.monotonic())
    return emptied


def _sockcall_offsets() -> tuple[int, int, int]:
    """Where a sockcalls event holds its netns inode (start, end) and its syscall."""
    from probes.events import SockcallEvent
    at = SockcallEvent.netns_ino.offset
    return at, at + 4, SockcallEvent.call.offset


_NETNS_AT, _NETNS_END, _CALL_AT = _sockcall_offsets()   # _CALL_AT: agent.callhooks follows the syscalls


# ---------------------------------------------------------------- replay

def _recorded_protocols(header: dict) -> dict[int, str]:
    """The --protocol choices a recording was made with (its header is untrusted input:
    what does not parse is ignored with the rest of the header's advice)."""
    from parsers.registry import parse_forced
    got = header.get("config", {}).get("protocols") if isinstance(header.get("config"), dict) else None
    if not isinstance(got, dict):
        return {}
    try:
        return parse_forced([f"{k}={v}" for k, v in got.items()])
    except ValueError:
        return {}


PACE_GAP_MAX_S = 1.0   # a paced replay waits at most this between two watermarks (the recording's
                       # first gap is the probes' compile time, seconds with no traffic)


def _paced(handle: Callable[[str, bytes], None], gap_max_s: float = PACE_GAP_MAX_S) -> Callable[[str, bytes], None]:
    """handle, held back at each recorded watermark until as much time has passed since the first
    as the recording says (each gap cut to gap_max_s): the traffic comes at the rate it was traced."""
    state = {"due": None, "wm": None}

    def paced(probe: str, raw: bytes) -> None:
        if probe == NOTE_PROBE and raw.startswith(b'{"watermark_ns"'):
            try:
                wm = int(json.loads(raw)["watermark_ns"])
            except (ValueError, KeyError, TypeError):
                wm = None   # the decoders count it; pacing just skips it
            if wm is not None:
                now = time.monotonic()
                if state["wm"] is None:
                    state["due"] = now
                elif wm > state["wm"]:
                    state["due"] += min(gap_max_s, (wm - state["wm"]) / 1e9)
                    if state["due"] > now:
                        time.sleep(state["due"] - now)
                state["wm"] = max(wm, state["wm"] or wm)
        handle(probe, raw)
    return paced


def replay(path: Path, out: Path, shard_interval_s: float = SHARD_INTERVAL_S,
           live=None, protocols: dict | None = None, walked: bool = True,
           paced: bool = False) -> tuple[Pipeline, float]:
    """A recording through the live decoders; returns the pipeline and the seconds it took.
    live: an agent.live.LiveAggregates to feed as the live agent would; protocols: as
    AgentOptions.protocols (default: the recording's own); walked: as StreamDecoder's;
    paced: at the recorded pace (_paced), for live views of it."""
    src = ReplaySource(path)   # a bad recording is refused before --out is made
    check_out(out)
    h = src.header
    names = {int(k): v for k, v in h.get("netns_names", {}).items()}
    host_map = HostMap(h.get("host_id"), names=names)
    meta = {k: h[k] for k in ("agent_version", "kernel", "clock", "clock_discipline", "config", "selection")
            if k in h}
    meta["replayed_from"] = str(path)
    probes = h.get("config", {}).get("probes", h.get("probes", []))
    pipeline = Pipeline(out, host_map, meta, framework_on="framework" in probes,
                        netstack_on=any(p not in ("sockcalls", "framework", NOTE_PROBE) for p in probes),
                        shard_interval_s=shard_interval_s, sockcall_fmt=h.get("sockcall_format", "prefix"),
                        protocols=protocols if protocols is not None else _recorded_protocols(h), walked=walked)
    pipeline.live = live
    t0 = time.perf_counter()
    c0 = time.process_time()
    src.run(_paced(pipeline.handle) if paced else pipeline.handle)
    pipeline.correlator.close()
    pipeline.cpu_s = time.process_time() - c0
    elapsed = time.perf_counter() - t0
    pipeline.close()
    return pipeline, elapsed


def replay_and_serve(path: Path, out: Path, listen: str, duration_s: float | None = None,
                     protocols: dict | None = None, log: Callable[[str], None] | None = None,
                     paced: bool = False) -> Pipeline:
    """A recording through the live decoders into live aggregates, then served on `listen` as a
    live agent serves them (/metrics, /snapshot.json) until SIGINT/SIGTERM or duration_s: a
    dashboard or `pslat top` tried on recorded traffic, without root. Bound before the replay, so
    a port in use fails before any work and "serving" means the totals are complete."""
    from agent.http import serve
    from agent.live import LiveAggregates

    log = log or (lambda m: say("pslat agent", m))
    live = LiveAggregates()
    stopped = threading.Event()
    server = serve(listen, live)
    log(f"serving live aggregates on http://{server.address}/metrics and /snapshot.json; replaying "
        f"{path.name}{' at its recorded pace' if paced else ''}")
    old = {s: signal.signal(s, lambda *_: stopped.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        pipeline, elapsed = replay(path, out, live=live, protocols=protocols, paced=paced)
        live.tick(pipeline.probe_counters, sum(pipeline.events.values()))
        log(f"replayed {sum(pipeline.events.values())} events in {elapsed:.2f} s; serving what they gave "
            "until Ctrl-C")
        stopped.wait(duration_s)
    finally:
        server.close()
        for s, h in old.items():
            signal.signal(s, h)
    return pipeline
