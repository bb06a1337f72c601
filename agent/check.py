"""`pslat check`: whether this host can run the agent, one line per prerequisite.

Each check looks at the thing itself where it can (a ring buffer map is created and
closed, every kernel member and tracepoint field the probes read is resolved, every
attach point is looked up), and says what its absence costs: the agent cannot start,
or which stages go null. The exit status is 0 when the agent can start, 1 when not.
"""
from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import typer

from core.errors import UserError

REQUIRED, OPTIONAL = "required", "optional"
UPROBE_PMU = Path("/sys/bus/event_source/devices/uprobe/type")
KHEADERS = Path("/sys/kernel/kheaders.tar.xz")
# capability numbers (linux/capability.h), whether the agent needs each, what it does with it
CAPABILITIES = {
    "CAP_BPF": (39, "required", "load BPF programs and create maps"),
    "CAP_PERFMON": (38, "required", "attach tracepoints and uprobes"),
    "CAP_NET_ADMIN": (12, "required", "read socket and skb state in BPF"),
    "CAP_SYS_PTRACE": (19, "optional", "other users' processes: their /proc/PID/maps and libraries"),
    "CAP_SYS_ADMIN": (21, "optional", "--netns (setns) and mounting tracefs"),
}
# what the agent loses without a netstack hook (it can then run with --no-netstack)
NETSTACK_COSTS = {
    "net_dev_queue": "*_qdisc_wait",
    "net_dev_start_xmit": "the driver hand-off: *_kernel_tx and *_nic_tx not split",
    "consume_skb": "TX completion: *_nic_tx folds into the wire",
    "kfree_skb": "TX completion: *_nic_tx folds into the wire",
    "napi_gro_receive_entry": "NIC arrival on NAPI devices: *_nic_rx folds into the wire",
    "netif_rx": "NIC arrival on veth and loopback: *_nic_rx folds into the wire",
    "netif_receive_skb": "netif_receive: *_nic_rx and *_kernel_rx not split",
    "sk_data_ready": "*_stack_rx and *_sock_wait",
    "tcp_retransmit_skb": "retransmission counts",
    "inet_sock_set_state": "connection life-cycle (client_connect_wait, the connections table)",
    "sched_switch": "*_runq_wait and *_busy_wait",
    "sched_wakeup": "*_runq_wait and *_busy_wait",
    "sched_wakeup_new": "*_runq_wait and *_busy_wait",
}
BPF_MAP_CREATE, BPF_MAP_TYPE_RINGBUF = 0, 27
SYS_BPF = {"x86_64": 321, "aarch64": 280}


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    need: str = REQUIRED      # required: the agent cannot start without it
    cost: str = ""            # what its absence costs

    def line(self) -> str:
        mark = "ok     " if self.ok else ("MISSING" if self.need == REQUIRED else "absent ")
        tail = "" if self.ok or not self.cost else f"; without it: {self.cost}"
        return f"{mark} {self.name}: {self.detail}{tail}"


def effective_capabilities(status: Path = Path("/proc/self/status")) -> int:
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def check_root_and_capabilities(euid: int | None = None, cap_eff: int | None = None) -> list[Check]:
    euid = os.geteuid() if euid is None else euid
    cap_eff = effective_capabilities() if cap_eff is None else cap_eff
    out = [Check("root", euid == 0, "euid 0" if euid == 0 else f"euid {euid}",
                 cost="the agent checks for root (run it with sudo)")]
    for name, (bit, need, what) in CAPABILITIES.items():
        has = bool(cap_eff >> bit & 1)
        out.append(Check(name, has, "effective" if has else "not effective", need, what))
    return out


def check_kernel(release: str | None = None) -> Check:
    release = release or platform.release()
    try:
        major, minor = (int(x) for x in release.split(".")[:2])
    except ValueError:
        return Check("kernel", False, f"{release}: cannot read its version", cost="unknown support")
    ok = (major, minor) >= (5, 8)
    return Check("kernel", ok, f"{release} ({'5.8 or later' if ok else 'before 5.8'})",
                 cost="BPF ring buffers (5.8) and raw tracepoint programs the probes need")


def check_ring_buffer() -> Check:
    """Creates a BPF ring buffer map and closes it: the kernel and the caller's privileges at once."""
    nr = SYS_BPF.get(platform.machine())
    if nr is None:
        return Check("BPF ring buffer", False, f"not checked on {platform.machine()}", cost="the probes' output")
    attr = (ctypes.c_uint32 * 30)()
    attr[0], attr[1], attr[2], attr[3] = BPF_MAP_TYPE_RINGBUF, 0, 0, 4096
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.syscall(nr, BPF_MAP_CREATE, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        return Check("BPF ring buffer", False, f"cannot create one: {os.strerror(err)}",
                     cost="the probes' output (needs CAP_BPF or root, and kernel 5.8)")
    os.close(fd)
    return Check("BPF ring buffer", True, "created and closed a 4 KiB ring buffer map")


def check_btf(path: Path | None = None) -> list[Check]:
    """The kernel's BTF, and every kernel member the probes read resolved in it."""
    from probes import btf as btfmod
    from probes.netstack import NETSTACK
    from probes.program import kernel_constants
    from probes.sockcalls import SOCKCALLS

    path = path or btfmod.VMLINUX_BTF_PATH
    try:
        b = btfmod.load(path)
    except (OSError, btfmod.BtfError, UserError) as e:
        return [Check("BTF", False, f"{path}: {e}", cost="every kernel struct layout the probes read")]
    out = [Check("BTF", True, str(path))]
    for probe in (SOCKCALLS, NETSTACK):
        try:
            n = len(kernel_constants([probe], b))
            out.append(Check(f"kernel members ({probe.name})", True, f"{n} resolved in BTF"))
        except (btfmod.BtfError, ValueError, KeyError) as e:
            out.append(Check(f"kernel members ({probe.name})", False, str(e), cost=f"the {probe.name} probe"))
    return out


def _available_events(root: Path) -> set[str]:
    try:
        return {line.strip().split(":", 1)[-1] for line in (root / "available_events").read_text().splitlines()}
    except OSError:
        return set()


def check_tracefs(roots=None) -> list[Check]:
    """tracefs, every attach point of the probes, and the tracepoint fields they read."""
    from probes import tracefs
    from probes.netstack import NETSTACK
    from probes.program import tracepoint_constants
    from probes.sockcalls import SOCKCALLS

    try:
        root = tracefs.tracefs_root(roots) if roots is not None else tracefs.tracefs_root()
    except (UserError, OSError) as e:    # OSError: not readable by this user
        return [Check("tracefs", False, str(e), cost="every tracepoint the probes attach to")]
    out = [Check("tracefs", True, str(root))]
    events = _available_events(root)
    for probe, need in ((SOCKCALLS, REQUIRED), (NETSTACK, OPTIONAL)):
        missing = []
        for a in probe.attach:
            if a.kind == "tracepoint":
                cat, _, ev = a.target.partition(":")
                found = (root / "events" / cat / ev).is_dir()
            else:
                found = a.target in events
            if not found:
                missing.append(a.target)
        n = len({a.target for a in probe.attach})
        if probe is NETSTACK:
            for t in sorted(set(missing)):
                out.append(Check(f"tracepoint {t}", False, "not in this kernel", OPTIONAL,
                                 f"{NETSTACK_COSTS.get(t, 'its stage')} (run the agent with --no-netstack)"))
            if not missing:
                out.append(Check("tracepoints (netstack)", True, f"all {n} attach points present"))
        else:
            out.append(Check(f"tracepoints ({probe.name})", not missing,
                             f"all {n} attach points present" if not missing else f"missing: {', '.join(missing)}",
                             need, "every message: the syscalls are where messages are found"))
        try:
            k = len(tracepoint_constants([probe], root))
            out.append(Check(f"tracepoint fields ({probe.name})", True, f"{k} resolved", need))
        except (UserError, OSError) as e:
            out.append(Check(f"tracepoint fields ({probe.name})", False, str(e), need, f"the {probe.name} probe"))
    return out


def check_uprobes(pmu: Path = UPROBE_PMU) -> Check:
    ok = pmu.is_file()
    return Check("uprobes", ok, "the uprobe PMU is there" if ok else f"{pmu} is missing", OPTIONAL,
                 "the framework boundary (--lib): client_user_tx/rx, server_user's split")


def check_headers(release: str | None = None, kheaders: Path = KHEADERS, modules: Path = Path("/lib/modules")) -> Check:
    """The kernel headers bcc compiles the probes against."""
    release = release or platform.release()
    build, source = modules / release / "build", modules / release / "source"
    # what bcc reads (and scripts/setup.sh checks): the generated config, and kconfig.h
    # in the common tree (source/ in Debian's split packages)
    if (build / "include/generated/autoconf.h").is_file() and any(
            (d / "include/linux/kconfig.h").is_file() for d in (source, build)):
        where = build.resolve()
        other = "" if release in str(where) else (
            "; another kernel's, the nearest available: safe, the probes read kernel structs through BTF")
        return Check("kernel headers", True, f"{where} (bcc compiles against them{other})")
    if kheaders.is_file():
        return Check("kernel headers", True, f"{kheaders} (the kernel's own, bcc unpacks them)")
    return Check("kernel headers", False, f"neither {build}/include/generated nor {kheaders}",
                 cost="bcc cannot compile the probes (`make setup` installs the nearest headers)")


def check_bcc() -> Check:
    try:
        import bcc  # noqa: F401  (only whether it imports)
    except ImportError as e:
        return Check("bcc", False, f"cannot import bcc: {e}", cost="the probes (install python3-bpfcc)")
    return Check("bcc", True, f"bcc {getattr(bcc, '__version__', '?')}")


def run_checks() -> list[Check]:
    out = check_root_and_capabilities()
    out += [check_kernel(), check_ring_buffer()]
    out += check_btf()
    out += check_tracefs()
    out += [check_uprobes(), check_headers(), check_bcc()]
    return out


def can_start(checks: list[Check]) -> bool:
    return all(c.ok for c in checks if c.need == REQUIRED)


def check() -> None:
    """Whether this host can run the agent: kernel, BTF, ring buffers, tracefs, every
    tracepoint the probes need, uprobes, capabilities, kernel headers, bcc."""
    checks = run_checks()
    for c in checks:
        typer.echo(c.line())
    ok = can_start(checks)
    typer.echo("the agent can start here" if ok else "the agent cannot start here: see MISSING above")
    raise typer.Exit(0 if ok else 1)
