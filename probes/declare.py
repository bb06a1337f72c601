"""What a probe is: a declaration the loader turns into a running program.

A probe names its BPF source, where its functions attach, the kernel struct
members it reads (resolved from BTF at load time), the tracepoint fields it
reads (resolved from tracefs), its event struct (C name in events.h, ctypes
mirror in events.py), its ring buffer and its counters. Nothing in the C
source is generated; the loader only supplies integer constants.
"""
from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from pathlib import Path

PROBES_DIR = Path(__file__).resolve().parent
_CONST = re.compile(r"^[A-Z][A-Z0-9_]*$")


@dataclass(frozen=True)
class Attach:
    """One attach point: `kind` is "tracepoint" (target "category:event") or
    "raw_tracepoint" (target "event"); `fn` is the BPF function."""

    kind: str
    target: str
    fn: str

    def __post_init__(self):
        if self.kind not in ("tracepoint", "raw_tracepoint"):
            raise ValueError(f"unsupported attach kind {self.kind!r}")


@dataclass(frozen=True)
class KernelField:
    """A kernel struct member the program reads: `-D<const>=<byte offset>`.
    `size_bytes` is how many bytes the C code reads there; the loader refuses
    a kernel whose BTF says otherwise."""

    const: str
    path: str
    size_bytes: int

    def __post_init__(self):
        if not _CONST.match(self.const):
            raise ValueError(f"bad constant name {self.const!r}")


@dataclass(frozen=True)
class TracepointField:
    """A tracepoint context field: `-D<const>=<offset>`. When several
    tracepoints are listed (all syscall exits share one program), they must
    agree on the offset."""

    const: str
    tracepoints: tuple[str, ...]
    field: str
    size_bytes: int

    def __post_init__(self):
        if not _CONST.match(self.const):
            raise ValueError(f"bad constant name {self.const!r}")


@dataclass(frozen=True)
class LruMap:
    """A per-connection LRU map: bounded by its size constant, the oldest entry evicted
    when full. The kernel cannot count evictions, so the probe counts entries made and
    removed; what was evicted is at least made - removed - size (LruMap.evicted)."""

    name: str
    made: str       # counter slot names
    removed: str
    size_const: str

    def evicted(self, counters: dict[str, int], constants: dict[str, int]) -> int:
        return max(0, counters[self.made] - counters[self.removed] - constants[self.size_const])


@dataclass(frozen=True)
class Probe:
    name: str
    source: str  # file name in probes/
    attach: tuple[Attach, ...]
    event: type[ctypes.Structure]
    ring: str  # BPF_RINGBUF_OUTPUT map name
    counters_map: str  # BPF_PERCPU_ARRAY of u64 counters
    counters: tuple[str, ...]  # slot names, in slot order; "seen", "lost" first
    kernel_fields: tuple[KernelField, ...] = ()
    tracepoint_fields: tuple[TracepointField, ...] = ()
    # Integer constants with their defaults; the loader lets callers override
    # them within the given (low, high) bounds.
    constants: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    lru_maps: tuple[LruMap, ...] = ()

    def __post_init__(self):
        if self.counters[:2] != ("seen", "lost"):
            raise ValueError(f"probe {self.name}: counters must start with 'seen', 'lost'")
        for m in self.lru_maps:
            if {m.made, m.removed} - set(self.counters) or m.size_const not in self.constants:
                raise ValueError(f"probe {self.name}: map {m.name} names unknown counters or size")
        if not (PROBES_DIR / self.source).is_file():
            raise ValueError(f"probe {self.name}: no source {self.source} in {PROBES_DIR}")

    @property
    def source_path(self) -> Path:
        return PROBES_DIR / self.source


# Members every probe reads through common.bpf.h.
COMMON_KERNEL_FIELDS = (
    KernelField("OFF_TASK_FILES", "task_struct.files", 8),
    KernelField("OFF_TASK_GROUP_LEADER", "task_struct.group_leader", 8),
    KernelField("OFF_TASK_COMM", "task_struct.comm", 16),
    KernelField("OFF_FILES_FDT", "files_struct.fdt", 8),
    KernelField("OFF_FDT_MAX_FDS", "fdtable.max_fds", 4),
    KernelField("OFF_FDT_FD", "fdtable.fd", 8),
    KernelField("OFF_FILE_F_INODE", "file.f_inode", 8),
    KernelField("OFF_FILE_PRIVATE_DATA", "file.private_data", 8),
    KernelField("OFF_INODE_I_MODE", "inode.i_mode", 2),
    KernelField("OFF_SOCKET_SK", "socket.sk", 8),
    KernelField("OFF_SKC_FAMILY", "sock.__sk_common.skc_family", 2),
    KernelField("OFF_SKC_NUM", "sock.__sk_common.skc_num", 2),
    KernelField("OFF_SKC_DPORT", "sock.__sk_common.skc_dport", 2),
    KernelField("OFF_SKC_RCV_SADDR", "sock.__sk_common.skc_rcv_saddr", 4),
    KernelField("OFF_SKC_DADDR", "sock.__sk_common.skc_daddr", 4),
    KernelField("OFF_SKC_V6_RCV_SADDR", "sock.__sk_common.skc_v6_rcv_saddr", 16),
    KernelField("OFF_SKC_V6_DADDR", "sock.__sk_common.skc_v6_daddr", 16),
    KernelField("OFF_SKC_NET", "sock.__sk_common.skc_net.net", 8),
    KernelField("OFF_SKC_COOKIE", "sock.__sk_common.skc_cookie", 8),
    KernelField("OFF_SK_PROTOCOL", "sock.sk_protocol", 2),
    KernelField("OFF_SK_TYPE", "sock.sk_type", 2),
    KernelField("OFF_NET_NS_INUM", "net.ns.inum", 4),
)
