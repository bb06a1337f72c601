"""Which processes and sockets the probes trace, as validated integers.

Semantics (common.bpf.h): a process is selected when its pid is in --pid or
its comm in --comm (either; all processes when neither is given); a socket is
selected when its netns is in --netns and one of its ports in --port (each
only when given). Everything reaches BPF as map entries of integers or
fixed 16-byte names, plus 0/1 constants saying which filters are active.

Host-pair sampling (load shedding, common.bpf.h): the share of host pairs
shed lives in the map `pslat_sampling` as an integer in 1/SAMPLE_UNITS, which
the agent changes at run time (write_shed_units); pair_hash16 is the Python
mirror of the BPF hash, so user space and reports know which pairs a rate keeps.
"""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError

COMM_BYTES = 16  # TASK_COMM_LEN, NUL included
NETNS_DIR = Path("/run/netns")  # where `ip netns add` puts named namespaces

# Map sizes: generous, and checked so a too-long list is an error, not a
# silently partial filter.
MAX_TGIDS = 4096
MAX_COMMS = 256
MAX_PORTS = 1024
MAX_NETNS = 1024

SAMPLE_UNITS = 65536           # the rate's resolution: pair hashes are 16 bits
PAIR_SEED = 0x2545F4914F6CDD1D  # < 2**63: a plain decimal -D literal
_M64 = (1 << 64) - 1
SHED_KINDS = ("calls", "netstack")   # pslat_shed_counters slots (PSLAT_SHED_*)


@dataclass(frozen=True)
class Filters:
    tgids: tuple[int, ...] = ()
    comms: tuple[bytes, ...] = ()  # each exactly COMM_BYTES, zero-padded
    ports: tuple[int, ...] = ()
    netns_inos: tuple[int, ...] = ()
    shed_units: int = 0   # share of host pairs shed from the start, in 1/SAMPLE_UNITS

    @classmethod
    def build(cls, pids=(), comms=(), ports=(), netns=(), check_pids: bool = True) -> "Filters":
        """From user options. `netns` entries are `ip netns` names, paths to a
        netns file (/proc/PID/ns/net), or inode numbers."""
        tgids = tuple(sorted({_pid(p, check_pids) for p in pids}))
        comm_keys = tuple(sorted({_comm(c) for c in comms}))
        port_set = tuple(sorted({_port(p) for p in ports}))
        inos = tuple(sorted({netns_inode(n) for n in netns}))
        for what, items, limit in (("--pid", tgids, MAX_TGIDS), ("--comm", comm_keys, MAX_COMMS),
                                   ("--port", port_set, MAX_PORTS), ("--netns", inos, MAX_NETNS)):
            if len(items) > limit:
                raise UserError(f"{what} given {len(items)} times, at most {limit} are supported; "
                                "select fewer, or trace everything and filter the report")
        return cls(tgids, comm_keys, port_set, inos)

    def constants(self) -> dict[str, int]:
        """-D constants: which filters are active, and the map sizes."""
        return {
            "FILTER_TGIDS": int(bool(self.tgids)), "FILTER_TGIDS_MAX": MAX_TGIDS,
            "FILTER_COMMS": int(bool(self.comms)), "FILTER_COMMS_MAX": MAX_COMMS,
            "FILTER_PORTS": int(bool(self.ports)), "FILTER_PORTS_MAX": MAX_PORTS,
            "FILTER_NETNS": int(bool(self.netns_inos)), "FILTER_NETNS_MAX": MAX_NETNS,
            "PSLAT_PAIR_SEED": PAIR_SEED,
        }

    def fill(self, bpf) -> None:
        """Put the sets into the compiled program's filter maps."""
        import ctypes as ct

        one = ct.c_uint8(1)
        for map_name, values, key_type in ((b"filter_tgids", self.tgids, ct.c_uint32),
                                           (b"filter_ports", self.ports, ct.c_uint16),
                                           (b"filter_netns", self.netns_inos, ct.c_uint32)):
            if values:  # the map exists only when its filter is on
                m = bpf[map_name]
                for v in values:
                    m[key_type(v)] = one
        if self.comms:
            m = bpf[b"filter_comms"]
            for c in self.comms:
                key = m.Key()
                ct.memmove(ct.addressof(key), c, COMM_BYTES)
                m[key] = one
        if self.shed_units:   # before the probes attach: no event escapes the first rate
            write_shed_units(bpf, self.shed_units)


# ---- host-pair sampling ---------------------------------------------------------

def shed_units_of(rate: float) -> int:
    """Units shed (1/SAMPLE_UNITS) for a kept share `rate` (0 < rate <= 1)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate <= 1:
        raise UserError(f"sampling rate {rate!r} is out of range; give a share 0 < R <= 1")
    return SAMPLE_UNITS - max(1, round(rate * SAMPLE_UNITS))


def rate_of(shed_units: int) -> float:
    return (SAMPLE_UNITS - shed_units) / SAMPLE_UNITS


def write_shed_units(bpf, units: int) -> None:
    import ctypes as ct

    if isinstance(units, bool) or not isinstance(units, int) or not 0 <= units < SAMPLE_UNITS:
        raise ValueError(f"shed units {units!r} not in 0..{SAMPLE_UNITS - 1}")
    bpf[b"pslat_sampling"][ct.c_int(0)] = ct.c_uint32(units)


def shed_counts(bpf) -> dict[str, int]:
    """What the probes shed on purpose, per kind, summed over CPUs."""
    import ctypes as ct

    table = bpf[b"pslat_shed_counters"]
    return {k: int(table.sum(ct.c_int(i)).value) for i, k in enumerate(SHED_KINDS)}


def _mix64(x: int) -> int:
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & _M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & _M64
    return x ^ (x >> 33)


def addr_words(addr) -> tuple[int, int]:
    """An IPv4/IPv6 address (text, bytes or ipaddress) -> the hash's two u64 words (IPv4 as v4-mapped)."""
    ip = addr if isinstance(addr, (ipaddress.IPv4Address, ipaddress.IPv6Address)) else ipaddress.ip_address(addr)
    n = int(ip) | (0xFFFF << 32) if ip.version == 4 else int(ip)
    return n >> 64, n & _M64


def pair_hash16(a, b) -> int:
    """The 16-bit hash of the unordered address pair {a, b}: the mirror of pslat_pair_hash16."""
    wa, wb = addr_words(a), addr_words(b)
    lo, hi = min(wa, wb), max(wa, wb)
    h = PAIR_SEED
    for w in (*lo, *hi):
        h = _mix64(h ^ w)
    return h >> 48


def pair_kept(a, b, shed_units: int) -> bool:
    """Does the probe keep host pair {a, b} while shedding `shed_units`?"""
    return shed_units <= 0 or pair_hash16(a, b) >= shed_units


def _int(value, what: str) -> int:
    if isinstance(value, bool):
        raise UserError(f"{what} {value!r} is not a number")
    try:
        return int(str(value), 10)
    except ValueError:
        raise UserError(f"{what} {value!r} is not a number; give a decimal integer") from None


def _pid(value, check: bool) -> int:
    pid = _int(value, "--pid")
    if not 0 < pid < 2**22 + 1:
        raise UserError(f"--pid {pid} is out of range; give a process id from `ps`")
    if check and not Path(f"/proc/{pid}").exists():
        raise UserError(f"--pid {pid}: no such process; check the id with `ps -e`")
    return pid


def _comm(value) -> bytes:
    raw = value.encode() if isinstance(value, str) else bytes(value)
    if not raw or b"\0" in raw:
        raise UserError(f"--comm {value!r} is empty or contains NUL; give a process name as `ps -o comm` shows it")
    if len(raw) > COMM_BYTES - 1:
        raise UserError(f"--comm {value!r} is {len(raw)} bytes but the kernel keeps only "
                        f"{COMM_BYTES - 1}; give the first {COMM_BYTES - 1}: {raw[:COMM_BYTES - 1].decode(errors='replace')!r}")
    return raw.ljust(COMM_BYTES, b"\0")


def _port(value) -> int:
    port = _int(value, "--port")
    if not 0 < port < 65536:
        raise UserError(f"--port {port} is out of range; give a TCP port 1-65535")
    return port


def netns_inode(value) -> int:
    """Inode number of a network namespace given by `ip netns` name, path, or number."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        ino = _int(value, "--netns")
        if ino <= 0 or ino >= 2**32:
            raise UserError(f"--netns {ino} is not a namespace inode; give a name from `ip netns list`")
        return ino
    text = str(value)
    if not text or "\0" in text:
        raise UserError(f"--netns {value!r} is empty; give a name from `ip netns list`")
    path = Path(text) if "/" in text else NETNS_DIR / text
    try:
        return os.stat(path).st_ino
    except FileNotFoundError:
        raise UserError(f"--netns {text}: no such network namespace ({path} is missing); "
                        "see `ip netns list`") from None
    except PermissionError:
        raise UserError(f"--netns {text}: cannot read {path}; run as root") from None
