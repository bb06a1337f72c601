"""Where the agent's raw events come from: the live probes, or a recording of them.

Both sources hand the same thing to the same consumer: `sink(probe name, raw
event bytes)`, in arrival order. Decoding happens downstream (agent.calls,
agent.streams, agent.framework_records), so a recording replays through exactly the code a live run uses, without root.

Live: one bcc program with the kernel probes (sockcalls, and netstack once it
exists), plus the framework-boundary uprobes (probes.framework) on libzmq /
libmxnet.so / libpaddle.so. Framework libraries are found in /proc/PID/maps of the selected
processes, at start and by a rescan every second, so a process that starts
later is picked up. When processes are selected by --comm/--netns (a set that
can grow), a library is probed in every process that maps it (one uprobe per
library, fires from a new process's first call on) and the events of other
processes are dropped here by tgid; with --pid only, each pid is probed alone.

Recording (--record FILE):

    b"PSLATREC" u32 version | u32 header bytes | header JSON
    then per event: u8 probe index (into header["probes"]), 3 zero bytes, u32 length, raw bytes

The header carries the agent version, the probes' BTF-derived constants and
event sizes, the filters and the namespace names, so a replay knows what it
reads. The pseudo-probe "agent" carries JSON notes written while running
(e.g. a namespace named after the start), so replay sees what live saw.
"""
from __future__ import annotations

import ctypes
import gc
import gzip
import json
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from agent.bypass import BypassWatch
from agent.delivered import Delivered
from core.errors import UserError, say

Sink = Callable[[str, bytes], None]

RECORD_MAGIC = b"PSLATREC"
RECORD_VERSION = 1
_REC_HEAD = struct.Struct("<B3xI")
READ_CHUNK_BYTES = 4 << 20
# A recording's header is a few KB (probe names, config, BPF constants); a length
# beyond this is damage, not a header to read into memory.
RECORD_HEADER_MAX_BYTES = 16 << 20
NOTE_PROBE = "agent"
RESCAN_INTERVAL_S = 0.25     # new processes: listing /proc costs ~1 ms; a late pickup misses messages
YOUNG_S = 10.0               # a process refused when first seen is checked again for this long,
RECHECK_S = 0.25             # at most this often (ProcessSelector.selected)
LIB_WAIT_S = 30.0
# Ring sizes: big enough to ride out a burst while the consumer is descheduled
# (the agent shares its cores with the job). 16 MiB each: ~60k sockcall events
# of ~300 bytes, ~110k framework frames of 144 bytes.
SOCKCALLS_RING_PAGES = 4096
FRAMEWORK_RING_PAGES = 4096
# netstack: one ~64-byte record per message end sent (TX), against ~360 bytes per call
# in sockcalls' ring: 4 MiB rides out as long a stall as sockcalls' 16 MiB (its 1 MiB
# default lost events under psbench 2x4 closed loop). Each ring's pages count twice in
# RSS (mapped twice so records never wrap): 16 MiB here cost 24 MB more for nothing.
NETSTACK_RING_PAGES = 1024
DRAIN_BUDGET_S = 0.25        # longest one drain() runs before the loop looks at signals and counters


def agent_version() -> str:
    try:
        from importlib.metadata import version
        return version("pslat")
    except Exception:  # not installed as a package (tests run from the tree)
        return "0.1.0+tree"


# ---------------------------------------------------------------- recordings

class RecordWriter:
    """Raw events to a file, as they arrive (buffered; flushed on close)."""

    def __init__(self, path: Path, header: dict):
        self.path = Path(path)
        self.probes: list[str] = list(header["probes"])
        if NOTE_PROBE not in self.probes:
            self.probes.append(NOTE_PROBE)
        header = dict(header, probes=self.probes, format=RECORD_VERSION)
        try:
            self._f: BinaryIO = open(self.path, "wb", buffering=1 << 20)
        except OSError as e:
            raise UserError(f"cannot write the recording {self.path} ({e.strerror}); "
                            "give a writable --record path") from None
        head = json.dumps(header, sort_keys=True).encode()
        self._f.write(RECORD_MAGIC + struct.pack("<II", RECORD_VERSION, len(head)) + head)
        self._index = {p: i for i, p in enumerate(self.probes)}
        self.events = 0

    def write(self, probe: str, raw: bytes) -> None:
        self._f.write(_REC_HEAD.pack(self._index[probe], len(raw)))
        self._f.write(raw)
        self.events += 1

    def note(self, obj: dict) -> None:
        self.write(NOTE_PROBE, json.dumps(obj, sort_keys=True).encode())

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()


def read_recording(path: Path) -> tuple[dict, Iterator[tuple[str, bytes]]]:
    """(header, iterator of (probe, raw)). A file cut short (agent killed) ends at its
    last whole event."""
    path = Path(path)
    try:
        f = gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
    except OSError as e:
        raise UserError(f"cannot read the recording {path} ({e.strerror}); check the --replay path") from None
    try:
        head = f.read(len(RECORD_MAGIC) + 8)
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        f.close()
        raise UserError(f"{path} cannot be read as a recording ({e})") from None
    if len(head) < len(RECORD_MAGIC) + 8 or not head.startswith(RECORD_MAGIC):
        f.close()
        raise UserError(f"{path} is not a pslat recording (made by `pslat agent --record`)")
    version, n = struct.unpack_from("<II", head, len(RECORD_MAGIC))
    if version != RECORD_VERSION:
        f.close()
        raise UserError(f"{path} is a recording of format {version}; this agent reads format "
                        f"{RECORD_VERSION}: replay it with the agent version that made it")
    try:
        if n > RECORD_HEADER_MAX_BYTES:
            raise ValueError(f"it claims {n} bytes")
        header = json.loads(f.read(n))
        _check_header(header)
    except (OSError, EOFError, zlib.error, ValueError, RecursionError) as e:  # JSONDecodeError: a ValueError
        f.close()
        raise UserError(f"{path}: the recording's header is corrupt ({e}); "
                        "replay a file made by `pslat agent --record`") from None
    probes = header["probes"]

    def events() -> Iterator[tuple[str, bytes]]:
        # read in chunks: a recording of minutes is hundreds of MB
        size = _REC_HEAD.size
        unpack = _REC_HEAD.unpack_from
        data, pos = b"", 0
        with f:
            while True:
                try:
                    chunk = f.read(READ_CHUNK_BYTES)
                except (OSError, EOFError, zlib.error):
                    return      # a compressed file cut short or damaged: as a file cut short
                data = data[pos:] + chunk
                pos, end = 0, len(data)
                while pos + size <= end:
                    idx, n = unpack(data, pos)
                    if pos + size + n > end:
                        break   # the rest of this event is in the next chunk
                    if idx >= len(probes):
                        return  # corrupt from here on
                    yield probes[idx], data[pos + size:pos + size + n]
                    pos += size + n
                if not chunk:
                    return      # a last event cut short (agent killed) is dropped

    return header, events()


def _check_header(h) -> None:
    """ValueError unless the header has what a replay reads from it, of its type."""
    if not isinstance(h, dict):
        raise ValueError(f"a JSON {type(h).__name__}, not an object")
    probes = h.get("probes")
    if not isinstance(probes, list) or not probes or not all(isinstance(p, str) for p in probes):
        raise ValueError("'probes' is not a list of probe names")
    if len(probes) > 255:   # an event's probe index is one byte
        raise ValueError(f"{len(probes)} probes")
    names = h.get("netns_names", {})
    if not isinstance(names, dict) or not all(
            isinstance(k, str) and k.isdigit() and len(k) <= 20 and isinstance(v, str) and v
            for k, v in names.items()):
        raise ValueError("'netns_names' is not an object of namespace inode: host id")
    if h.get("host_id") is not None and not (isinstance(h["host_id"], str) and h["host_id"]):
        raise ValueError("'host_id' is not a host id")
    for key in ("config", "selection", "clock", "kernel"):
        if key in h and not isinstance(h[key], dict):
            raise ValueError(f"{key!r} is not an object")
    if not isinstance(h.get("config", {}).get("probes", []), list):
        raise ValueError("'config.probes' is not a list")
    if h.get("sockcall_format", "prefix") not in ("prefix", "items"):
        raise ValueError(f"unknown 'sockcall_format' {h['sockcall_format']!r}")


class ReplaySource:
    """A recording fed back to a sink."""

    def __init__(self, path: Path):
        self.header, self._events = read_recording(path)

    def run(self, sink: Sink) -> int:
        settle_heap()
        n = 0
        for probe, raw in self._events:
            sink(probe, raw)
            n += 1
        return n


# ---------------------------------------------------------------- process selection

@dataclass
class Selection:
    """What the user selected (validated by probes.filters.Filters)."""
    pids: tuple[int, ...] = ()
    comms: tuple[bytes, ...] = ()      # 16-byte zero-padded, as Filters keeps them
    netns_inos: tuple[int, ...] = ()
    ports: tuple[int, ...] = ()
    libs: tuple[Path, ...] = ()        # framework libraries to probe in every process
    shed_units: int = 0                # host pairs shed from the start (probes.filters.shed_units_of)

    @property
    def dynamic(self) -> bool:
        """Can processes that start later be selected? (everything but a --pid list)"""
        return bool(self.comms or self.netns_inos or not self.pids)


def _proc_comm(pid: int) -> bytes | None:
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read().rstrip(b"\n")
    except OSError:
        return None


def _proc_netns(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


class ProcessSelector:
    """Which processes the framework probe reports (the kernel probes filter in BPF;
    this is the same rule in user space: --pid or --comm, and --netns)."""

    def __init__(self, sel: Selection):
        self.sel = sel
        self._comms = {c.rstrip(b"\0") for c in sel.comms}
        self._cache: dict[int, bool] = {}
        self._young: dict[int, tuple[float, float]] = {}   # tgid -> (first refused, last checked)

    def selected(self, tgid: int) -> bool:
        got = self._cache.get(tgid)
        if got:
            return True
        now = time.monotonic()
        if got is None:
            got = self._cache[tgid] = self._check(tgid)
            if not got:
                self._young[tgid] = (now, now)
            return got
        # Refused, but maybe too early: `ip netns exec`, nsenter and shells fork, then
        # setns or exec: the pid gets its netns and comm moments after it appears.
        # Kept refused for good, its framework events would be dropped for ever.
        seen = self._young.get(tgid)
        if seen is None or now - seen[1] < RECHECK_S:
            return False
        if now - seen[0] > YOUNG_S:
            del self._young[tgid]
            return False
        got = self._cache[tgid] = self._check(tgid)
        if got:
            del self._young[tgid]
        else:
            self._young[tgid] = (seen[0], now)
        return got

    def _check(self, tgid: int) -> bool:
        s = self.sel
        if s.pids or s.comms:
            if tgid not in s.pids and _proc_comm(tgid) not in self._comms:
                return False
        if s.netns_inos and _proc_netns(tgid) not in s.netns_inos:
            return False
        return Path(f"/proc/{tgid}").exists()

    def forget(self, tgid: int) -> None:
        self._cache.pop(tgid, None)
        self._young.pop(tgid, None)

    def running(self) -> list[int]:
        """Selected processes running now."""
        if not self.sel.dynamic:
            return [p for p in self.sel.pids if self.selected(p)]
        out = []
        alive = [int(d) for d in os.listdir("/proc") if d.isdigit()]
        for tgid in alive:
            if self.selected(tgid):
                out.append(tgid)
        if len(self._cache) > 2 * len(alive) + 1024:   # forget processes that exited
            keep = set(alive)
            self._cache = {t: v for t, v in self._cache.items() if t in keep}
            self._young = {t: v for t, v in self._young.items() if t in keep}
        return out


# ---------------------------------------------------------------- live

# The collector's first threshold (Python's default: 700). Each message leaves ~20
# containers alive for a while (calls, messages, records waiting to be matched): at 700
# the young collections walked most of them, at 20000 most are freed first. Replay of
# a psbench recording on a loaded 2-vCPU machine, CPU per message (median of 5): 139 us
# at 700, 126 at 5000, 114 at 20000, 110 with no collector at all.
GC_THRESHOLD0 = 20_000


def settle_heap() -> None:
    """Takes what start-up made (modules, the compiled probes, pyarrow and the pandas
    it imports on its first conversion) out of the garbage collector's view, and
    collects young objects less often (GC_THRESHOLD0). Left in the oldest generation,
    the start-up's ~60k objects were walked again by every full collection: 9-16 us of
    CPU per message (bench/consumer). Nothing is collected first (a full collection
    takes ~50 ms here): start-up garbage, if any, stays."""
    import pyarrow as pa
    pa.array([0])   # pyarrow's first conversion imports pandas: before the freeze
    gc.freeze()
    _, t1, t2 = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD0, t1, t2)


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc keeps them: after a bcc
    compile, LLVM's freed working memory stayed in the agent's RSS for good)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):   # not glibc: nothing to hand back this way
        pass


def kernel_probes(netstack: bool = True) -> list:
    """The kernel-side probes: sockcalls, and netstack where this tree has it."""
    from probes.sockcalls import SOCKCALLS

    probes = [SOCKCALLS]
    if not netstack:
        return probes
    try:
        from probes.netstack import NETSTACK  # the netstack engineer's probe, once it exists
    except ImportError:
        return probes
    return probes + [NETSTACK]


def latest_ts_ns(probe: str, raw: bytes) -> int | None:
    """The latest timestamp an event of `probe` carries: no later than when the probe output
    it (agent/delivered.py). None when the event cannot say."""
    if probe == "sockcalls":
        from probes.events import SockcallEvent
        at = SockcallEvent.exit_ts_ns.offset
    elif probe == "framework":
        from probes.framework import FwEvent
        at = FwEvent.ret_ts_ns.offset
    elif probe == "netstack":
        from probes.events import NetstackEvent
        try:
            ev = NetstackEvent.decode(raw)
        except ValueError:
            return None
        return max((getattr(ev, n) for n, _ in ev._fields_ if n.startswith("ts_")), default=None)
    else:
        return None
    return int.from_bytes(raw[at:at + 8], "little") if len(raw) >= at + 8 else None


def _framework_tap_class():
    """FrameworkProbe that hands raw events on (for recording and for the same
    decoders as replay) instead of assembling them itself, and can take more
    libraries after it started."""
    from probes.framework import FrameworkProbe, FwEvent

    tgid_at = FwEvent.tgid.offset

    class FrameworkTap(FrameworkProbe):
        def __init__(self, targets, sink: Sink, keep: Callable[[int], bool],
                     budget_left: Callable[[str, bytes], int], **kw):
            super().__init__(targets, **kw)
            self._sink = sink
            self._keep = keep
            self._budget_left = budget_left
            self.dropped_other_process = 0

        def _on_event(self, ctx, data, size) -> int:
            raw = ctypes.string_at(data, size)
            if len(raw) >= tgid_at + 4 and not self._keep(int.from_bytes(raw[tgid_at:tgid_at + 4], "little")):
                self.dropped_other_process += 1
            else:
                self._sink("framework", raw)
            return self._budget_left("framework", raw)

        def add_target(self, t) -> str | None:
            """Attach one more library; returns why not, or None."""
            from probes.framework import POINTS
            from probes.libtrust import refusal
            why = refusal(t.library, t.owner_pid)
            if why:
                return why
            why = self.layout_refusal(t)
            if why:
                return why
            for p in POINTS[t.layer]:
                self._attach(t, p)
            self.targets.append(t)
            return None

    return FrameworkTap


def _may_map_framework(tgid: int) -> bool:
    """False when /proc/TGID/maps names no framework library, so targets_of_pid would
    find none. A process that has not loaded its framework yet is looked at every
    RESCAN_INTERVAL_S for LIB_WAIT_S; targets_of_pid parses every line of its maps
    (a Python job's: hundreds) with pathlib: 14% of a live agent's CPU under psbench.
    True when unsure (unreadable: targets_of_pid says why)."""
    try:
        with open(f"/proc/{tgid}/maps", "rb") as f:
            maps = f.read()
    except OSError:
        return True
    from probes.framework import LIBRARY_PATH_PARTS
    return any(part in maps for part in LIBRARY_PATH_PARTS)


def _vsize(tgid: int) -> int | None:
    """The size of a process's address space (/proc/TGID/stat vsize; None: unreadable).
    Loading a library maps it: a process whose size did not change loaded none. Far
    cheaper than reading its maps (1 ms of CPU for a Python job's ~600 lines)."""
    try:
        with open(f"/proc/{tgid}/stat", "rb") as f:
            stat = f.read()
        return int(stat.rsplit(b")", 1)[1].split()[20])
    except (OSError, IndexError, ValueError):
        return None


@dataclass
class LiveSource:
    """The probes, attached. drain() delivers raw events to the sink."""
    sel: Selection
    sink: Sink
    warn: Callable[[str], None] = field(default=lambda msg: say("pslat agent", msg))
    overrides: dict[str, int] = field(default_factory=dict)
    netstack: bool = True   # False: syscalls and framework only (less overhead, no kernel stage times)

    def __post_init__(self):
        self.overrides = {"SOCKCALLS_RING_PAGES": SOCKCALLS_RING_PAGES, **self.overrides}
        self.program = None
        self.framework = None
        self.selector = ProcessSelector(self.sel)
        self._drain_deadline = float("inf")   # no budget outside drain()
        self._interrupted = False
        self._cut: tuple[str, bytes] | None = None   # (ring, last event) where a drain's budget ran out
        self.delivered = Delivered()          # how far each ring is consumed: the watermark
        self._readers: list[tuple[str, object]] = []   # (probe, probes.loader.RingReader) per kernel ring
        self._probed: set[tuple] = set()      # (library, layer, pid or None)
        self._known_tgids: set[int] = set()
        self.processes_seen = 0               # selected processes seen so far (agent.callhooks)
        self.bypass = BypassWatch()           # processes whose messages go around the sockets
        self._lib_wait: dict[int, float] = {}   # tgid -> when first seen without a framework library
        self._vsize_seen: dict[int, int] = {}    # tgid -> its address space's size at that look
        self._next_scan = 0.0
        self.framework_compile_s: float | None = None
        self.netstack_error: str | None = None
        self.hint_errors = 0
        self.walker_error: str | None = None

    # -- set-up -----------------------------------------------------------
    def generated(self, netstack: bool | None = None):
        from probes.filters import Filters
        from probes.program import generate

        flt = Filters(tgids=self.sel.pids, comms=self.sel.comms, ports=self.sel.ports,
                      netns_inos=self.sel.netns_inos, shed_units=self.sel.shed_units)
        use = self.netstack if netstack is None else netstack
        probes = kernel_probes(use)
        overrides = dict(self.overrides)
        if any(p.name == "netstack" for p in probes):
            overrides.setdefault("NS_RING_PAGES", NETSTACK_RING_PAGES)
        return generate(probes, flt, overrides=overrides)

    def _load_kernel_probes(self):
        from probes.loader import ProbeProgram

        gen = self.generated()
        try:
            return ProbeProgram(gen).load(before_attach=self._install_walker)
        except UserError:
            raise
        except Exception as e:
            if len(gen.probes) == 1:
                raise
            # the network-stack probe is new: trace the calls rather than nothing, and say so
            self.warn(f"the netstack probe did not load ({e}); tracing without it: kernel "
                      "stage times will be null")
            self.netstack_error = str(e)
            self.walker_error = None
            return ProbeProgram(self.generated(netstack=False)).load(before_attach=self._install_walker)

    def start(self) -> "LiveSource":
        try:
            # Kernel probes first, then the framework uprobes: nothing drains the rings
            # until start() returns, and the kernel probes' compile is the long one
            # (seconds on a busy machine), which would overflow the framework ring. The
            # first messages then lack their framework record (and say so).
            from probes.loader import RingReader

            loaded_ns = time.monotonic_ns()   # no kernel probe is attached before this
            self.program = self._load_kernel_probes()   # the walker installed before any probe attached
            for probe in self.program.generated.probes:
                name = probe.name

                def callback(data, size, name=name):
                    raw = ctypes.string_at(data, size)
                    self.sink(name, raw)
                    return self._budget_left(name, raw)

                self._readers.append((name, RingReader(self.program.bpf, probe.ring, callback)))
                self.delivered.add_ring(name, loaded_ns)
            for lib in self.sel.libs:
                self._probe_library(Path(lib), None)
            self.rescan(force=True)
            release_freed_memory()   # what the compiles freed (LLVM: ~100 MB) back to the OS
            settle_heap()
        except BaseException:
            self.close()
            raise
        return self

    def _install_walker(self, program) -> None:
        """Before the probes attach (ProbeProgram.load's before_attach): a call traced
        before the walker's programs are in place would end unwalked."""
        from probes import sockcalls
        install = getattr(sockcalls, "install_walker", None)
        if install is None:
            return
        try:   # the walker runs as tail calls the loader fills in
            install(program)
        except Exception as e:
            # calls are still traced, with a raw prefix each: say so, go on
            self.walker_error = str(e)
            self.warn(f"the walker's programs did not all load ({e}): calls it cannot "
                      "walk carry a payload prefix only, message ends may have no kernel times")

    def config(self) -> dict:
        """What a recording's header and meta.json say about the probes."""
        gen = self.program.generated if self.program else self.generated()
        out = {"probes": [p.name for p in gen.probes] + ["framework"],
               "constants": dict(gen.constants),
               "event_bytes": {p.name: ctypes.sizeof(p.event) for p in gen.probes}}
        if self.netstack_error:
            out["netstack_error"] = self.netstack_error
        if self.walker_error:
            out["walker_error"] = self.walker_error
        if self.framework is not None:
            out["framework_defines"] = dict(self.framework._defines)
            out["framework_targets"] = [[str(t.library), t.layer, t.pid] for t in self.framework.targets]
        return out

    # -- framework libraries ----------------------------------------------
    def rescan(self, force: bool = False) -> None:
        """Find framework libraries in selected processes (new ones only)."""
        now = time.monotonic()
        if not force and now < self._next_scan:
            return
        self._next_scan = now + RESCAN_INTERVAL_S
        from probes.framework import targets_of_pid

        running = self.selector.running()
        # processes that exited are forgotten: these maps stay as large as the processes
        # running (process churn would grow them), and a reused pid is looked at anew
        alive = set(running)
        self._known_tgids &= alive
        self.bypass.forget_exited(alive)
        for seen in (self._lib_wait, self._vsize_seen):
            for tgid in [t for t in seen if t not in alive]:
                del seen[tgid]
        for tgid in running:
            if tgid in self._known_tgids:
                continue
            if tgid not in self._lib_wait:   # a process not looked at before
                self.processes_seen += 1
            self._judge_transport(tgid)
            vsize = _vsize(tgid)
            # nothing mapped or unmapped since the last look: still no library
            unchanged = vsize is not None and self._vsize_seen.get(tgid) == vsize
            try:
                targets = [] if unchanged or not _may_map_framework(tgid) else targets_of_pid(tgid)
            except UserError:
                self._known_tgids.add(tgid)
                self._vsize_seen.pop(tgid, None)
                continue  # it exited meanwhile
            # a process seen before it loaded its framework (Python imports zmq after
            # start) is looked at again, for LIB_WAIT_S: else a job started after the
            # agent could get no framework probe at all
            first = self._lib_wait.setdefault(tgid, now)
            if targets or now - first > LIB_WAIT_S:
                self._known_tgids.add(tgid)
                self._lib_wait.pop(tgid, None)
                self._vsize_seen.pop(tgid, None)
            elif vsize is not None:
                self._vsize_seen[tgid] = vsize
            for t in targets:
                try:
                    self._probe_library(t.library, tgid if not self.sel.dynamic else None, t.layer,
                                        found_in=tgid)
                except UserError as e:
                    # a library any process maps must not stop the agent (it may be
                    # a user's decoy): say so once and trace the rest
                    self.warn(f"framework boundary not traced in process {tgid}: {e}")

    def _judge_transport(self, tgid: int) -> None:
        for found in self.bypass.note(tgid, _proc_netns):
            self.warn(f"process {found['pid']} ({found['comm']}) moves its {found['protocol']} messages "
                      f"over {found['transport']} ({found['setting']}), around the kernel's sockets: "
                      "invisible to pslat's probes (said in meta.json and the report)")
            self.sink(NOTE_PROBE, json.dumps({"kernel_bypass": found}).encode())

    def _probe_library(self, library: Path, pid: int | None, layer: str | None = None,
                       found_in: int | None = None) -> None:
        from probes.framework import LIBRARY_NAMES, Target, layer_of

        if layer is None:
            layer = layer_of(library.name)
            if layer is None:
                raise UserError(f"--lib {library}: not a {LIBRARY_NAMES}; give the path "
                                "of the framework library the job loads")
            if not library.is_file():
                raise UserError(f"--lib {library}: no such file")
        key = (os.path.realpath(library), layer, pid)
        if key in self._probed:
            return
        self._probed.add(key)
        target = Target(library, layer, pid, found_in)
        if self.framework is None:
            t0 = time.perf_counter()
            self.delivered.add_ring("framework", time.monotonic_ns())
            self.framework = _framework_tap_class()([target], self.sink, self.selector.selected,
                                                    self._budget_left, ringbuf_pages=FRAMEWORK_RING_PAGES)
            self.framework.start()
            self.framework_compile_s = time.perf_counter() - t0
            release_freed_memory()
            settle_heap()   # the framework program's objects too (it is built once a process shows up)
            return
        why = self.framework.add_target(target)
        if why:
            self.warn(f"framework boundary not traced in {library}: {why}")

    # -- running ------------------------------------------------------------
    def sync_hint(self, sk: int, tx: bool, seq: int, frame_index: int, framing) -> None:
        """Tell the kernel's walker where a frame starts, and in which framing
        (probes.sockcalls.FRAMINGS), for a direction joined mid-stream; framing
        None: the direction is in none of them, count its calls only."""
        from probes import sockcalls
        if self.program is None:
            return
        d = sockcalls.Direction.TX if tx else sockcalls.Direction.RX
        try:
            if framing is None:
                sockcalls.set_count_only(self.program, sk, d)
            else:
                sockcalls.set_sync_hint(self.program, sk, d, seq, frame_index, framing)
        except Exception as e:  # a full hint map: the walk starts later, nothing is wrong
            self.hint_errors += 1
            if self.hint_errors == 1:
                self.warn(f"could not set a sync hint ({e}); counted in meta.json")

    def drain(self, budget_s: float = DRAIN_BUDGET_S) -> bool:
        """Consumes what the rings hold, for at most about budget_s; True when
        they were emptied. A consumer slower than the job would otherwise never
        return (libbpf keeps consuming while records arrive), and signals,
        counters and live views would wait for the job to end. How far each
        ring got is in self.delivered (agent/delivered.py)."""
        start_ns = time.monotonic_ns()
        # each ring gets its own share, or a busy one would starve the others; one far
        # ahead of the laggard waits (agent/delivered.py)
        sources = [(name, reader.consume) for name, reader in self._readers]
        if self.framework is not None:
            sources.append(("framework", self.framework.drain))
        active = [(ring, consume) for ring, consume in sources if not self.delivered.ahead(ring)]
        emptied = len(active) == len(sources)
        for ring, consume in active:
            if self._interrupted:
                emptied = False
                break
            self._cut = None
            self._drain_deadline = time.monotonic() + budget_s / len(active)
            consume()
            if self._cut is None:
                self.delivered.emptied(ring, start_ns)
            else:
                self.delivered.cut(ring, start_ns, latest_ts_ns(*self._cut))
                emptied = False
        self._drain_deadline = float("inf")
        self._cut = None
        return emptied

    def interrupt(self) -> None:
        """From a signal handler: the drain under way (if any) returns at its next record,
        and drains return at once until resume()."""
        self._interrupted = True
        self._drain_deadline = 0.0

    def resume(self) -> None:
        self._interrupted = False

    def _budget_left(self, ring: str, raw: bytes) -> int:
        """0: go on; -1 stops libbpf's consume loop after this record (it is consumed)."""
        if time.monotonic() < self._drain_deadline and not self._interrupted:
            return 0
        self._cut = (ring, raw)
        return -1

    def counters(self) -> dict[str, dict[str, int]]:
        out = self.program.counters() if self.program else {}
        if "sockcalls" in out:
            out["sockcalls"]["sync_hint_errors"] = self.hint_errors   # updates of the hint map that failed
        if self.framework is not None:
            from probes.framework import COUNTERS
            got = self.framework.counters()
            out["framework"] = {k: got[k] for k in COUNTERS}
            out["framework"]["other_process"] = self.framework.dropped_other_process
        return out

    def close(self) -> None:
        if self.framework is not None:
            self.framework.close()
            self.framework = None
        for _name, reader in self._readers:
            reader.close()
        self._readers = []
        if self.program is not None:
            self.program.close()
            self.program = None
