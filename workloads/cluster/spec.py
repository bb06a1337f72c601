"""What a cluster is before it exists: validated host names, addresses, MACs and delays.

Pure (no root, no subprocess), so bad input is refused before anything is
created and the rules are unit-tested.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from core.errors import UserError

WIRE_NS = "pslat-wire"
SUBNET_PREFIX = "10.77.0."
PREFIX_LEN = 24
# The forwarder has 64 ports; every host also holds a static ARP entry for each
# other host, so the set-up cost grows with hosts squared.
MAX_HOSTS = 64
MAX_DELAY_MS = 10_000.0
JITTER_DISTS = ("uniform", "normal")
# A netns name is a file name under /run/netns; keep it also a safe argv word.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")


@dataclass(frozen=True)
class Host:
    """One host of the cluster: a network namespace with one interface to the wire."""

    name: str
    netns: str          # == name: the host id the agent uses
    addr: str           # IPv4, no prefix length
    ifname: str         # inside the host namespace
    mac: str
    index: int          # the forwarder's port index
    wire_ifname: str    # the other end, inside the wire namespace
    wire_mac: str


def host_mac(index: int) -> str:
    # 02: locally administered unicast; 70:73 = "ps"; then side (00 host, 01 wire).
    return f"02:70:73:00:00:{index + 1:02x}"


def wire_mac(index: int) -> str:
    return f"02:70:73:01:00:{index + 1:02x}"


def _check_ms(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{what} must be a number of milliseconds, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise UserError(f"{what} must be >= 0 ms, got {value!r}; give a delay of 0 or more")
    if v > MAX_DELAY_MS:
        raise UserError(f"{what} = {v:g} ms is more than the wire holds ({MAX_DELAY_MS:g} ms); "
                        "give a smaller delay")
    return v


def host_names(hosts: int | list[str]) -> list[str]:
    if isinstance(hosts, bool):
        raise UserError(f"hosts must be a count or a list of names, got {hosts!r}")
    if isinstance(hosts, int):
        if hosts < 1:
            raise UserError(f"a cluster needs at least 1 host, got {hosts}; give --hosts 1 or more")
        if hosts > MAX_HOSTS:
            raise UserError(f"{hosts} hosts is more than the wire's {MAX_HOSTS} ports; "
                            f"give at most {MAX_HOSTS}")
        return [f"h{i}" for i in range(hosts)]
    names = list(hosts)
    if not names:
        raise UserError("a cluster needs at least 1 host; give a non-empty list of names")
    if len(names) > MAX_HOSTS:
        raise UserError(f"{len(names)} hosts is more than the wire's {MAX_HOSTS} ports; "
                        f"give at most {MAX_HOSTS}")
    for n in names:
        if not isinstance(n, str) or not _NAME_RE.match(n):
            raise UserError(f"bad host name {n!r}: use 1-32 letters, digits, '_' or '-', "
                            "starting with a letter or digit")
        if n == WIRE_NS:
            raise UserError(f"host name {n!r} is the wire's own namespace; pick another name")
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(f"host names must be unique; repeated: {', '.join(dup)}")
    return names


@dataclass(frozen=True)
class ClusterSpec:
    hosts: tuple[Host, ...]
    delay_ms: dict[tuple[str, str], float]  # every ordered pair of distinct hosts
    jitter_ms: float
    jitter_dist: str
    seed: int

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise UserError(f"no host {name!r} in the cluster; hosts: "
                        f"{', '.join(h.name for h in self.hosts)}")


def make_spec(hosts: int | list[str], wire_delay_ms: float = 0.0, jitter_ms: float = 0.0,
              pair_delay_ms: dict[tuple[str, str], float] | None = None,
              jitter_dist: str = "uniform", seed: int = 1) -> ClusterSpec:
    names = host_names(hosts)
    base = _check_ms("wire delay", wire_delay_ms)
    jitter = _check_ms("jitter", jitter_ms)
    if jitter_dist not in JITTER_DISTS:
        raise UserError(f"unknown jitter distribution {jitter_dist!r}; use one of "
                        f"{', '.join(JITTER_DISTS)}")
    delays = {(a, b): base for a in names for b in names if a != b}
    for key, ms in (pair_delay_ms or {}).items():
        if not (isinstance(key, tuple) and len(key) == 2):
            raise UserError(f"pair delay key {key!r} must be a (source, destination) pair of names")
        src, dst = key
        for n in key:
            if n not in names:
                raise UserError(f"pair delay names unknown host {n!r}; hosts: {', '.join(names)}")
        if src == dst:
            raise UserError(f"pair delay {src}->{dst}: a host does not reach itself over the wire")
        delays[(src, dst)] = _check_ms(f"delay {src}->{dst}", ms)
    host_objs = tuple(
        Host(name=n, netns=n, addr=f"{SUBNET_PREFIX}{i + 1}", ifname="eth0", mac=host_mac(i),
             index=i, wire_ifname=f"wp{i}", wire_mac=wire_mac(i))
        for i, n in enumerate(names))
    return ClusterSpec(hosts=host_objs, delay_ms=delays, jitter_ms=jitter,
                       jitter_dist=jitter_dist, seed=int(seed))


def parse_pair_delay(text: str) -> tuple[tuple[str, str], float]:
    """'h0:h1=5' -> (('h0', 'h1'), 5.0): the CLI's form of one ordered-pair delay."""
    try:
        pair, ms = text.split("=", 1)
        src, dst = pair.split(":", 1)
        return (src, dst), float(ms)
    except ValueError:
        raise UserError(f"bad pair delay {text!r}; write SRC:DST=MS, e.g. h0:h1=5") from None
