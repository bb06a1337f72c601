"""The protocols pslat understands, by name, and which one a stream speaks.

Adding a protocol: its package under parsers/ (parsers/protocol.py says what its
parser and messages give), one line in PROTOCOLS below, and its kernel framing
(probes/). parsers/README.md walks through it with brpc.
"""
from __future__ import annotations

from parsers.brpc import BrpcStreamParser
from parsers.brpc.framework import RecordIds as BrpcRecordIds
from parsers.grpc import GrpcStreamParser
from parsers.pslite import PsliteStreamParser, legacy
from parsers.pslite import vans as byteps_vans
from parsers.pslite.framework import PsRecordIds, ZmqRecordIds
from parsers.pslite.framework import record_facts as pslite_record_facts

from .protocol import UNRECOGNISED

# name -> parser class; detection asks them in this order
PROTOCOLS = {p.PROTOCOL: p for p in (PsliteStreamParser, BrpcStreamParser, GrpcStreamParser)}
NAMES = tuple(PROTOCOLS)


# framework-record layers (probes.framework's `layer`) whose records are matched to
# wire messages by a protocol's facts: layer -> facts of a record (None: it names no
# ids); nearest the application first (a row's framework time is its first layer's).
# Records that name their wire message's ids themselves (probes.framework.KeyedMessage:
# brpc's) need none.
FRAMEWORK_LAYERS = {"ps": pslite_record_facts, "zmq": pslite_record_facts}

# framework-record layer -> what decodes the ids its records carry (a class; one
# instance per agent): fill(fields, sock_type, request) sets a record's protocol fields
# (peer and meta; call_key where keyed: the record is a KeyedMessage)
FRAMEWORK_RECORD_IDS = {"zmq": ZmqRecordIds, "ps": PsRecordIds, "brpc": BrpcRecordIds}


# protocol -> what tells from a process's environment ({variable: value}, bytes) that
# it moves the protocol's messages around the kernel's sockets (RDMA, UCX...):
# {"transport", "setting"} or None. Such traffic is invisible to every probe and capture.
KERNEL_BYPASS = {"pslite": byteps_vans.kernel_bypass}


def kernel_bypass(environ) -> list[dict]:
    """What every registered protocol says of a process's environment: a list of
    {"protocol", "transport", "setting"} (empty: nothing bypasses the kernel)."""
    out = []
    for name, judge in KERNEL_BYPASS.items():
        got = judge(environ)
        if got is not None:
            out.append(dict(got, protocol=name))
    return out


def parser_class(name: str):
    """The stream parser of a registered protocol; KeyError for any other name."""
    return PROTOCOLS[name]


def detect(prefix) -> str | None:
    """The protocol whose streams start with `prefix` (a stream's first bytes):
    its name, UNRECOGNISED when none can, or None while more bytes could decide."""
    undecided = False
    for name, cls in PROTOCOLS.items():
        got = cls.starts_stream(prefix)
        if got:
            return name
        if got is None:
            undecided = True
    return None if undecided else UNRECOGNISED


def parse_forced(specs: list[str]) -> dict[int, str]:
    """`--protocol PORT=NAME` options -> {port: name}; ValueError saying what is wrong."""
    out: dict[int, str] = {}
    for spec in specs:
        port_s, sep, name = spec.partition("=")
        if not sep or not port_s.strip().isdigit():
            raise ValueError(f"--protocol {spec!r}: expected PORT=NAME, e.g. 8500=brpc")
        port = int(port_s)
        if not 0 < port < 65536:
            raise ValueError(f"--protocol {spec!r}: the port must be 1-65535")
        name = name.strip()
        if name not in PROTOCOLS:
            raise ValueError(f"--protocol {spec!r}: unknown protocol {name!r} (known: {', '.join(NAMES)})")
        if out.get(port, name) != name:
            raise ValueError(f"--protocol: port {port} given twice ({out[port]} and {name})")
        out[port] = name
    return out


# the columns an older run-dir format's messages table had instead of today's
LEGACY_MESSAGE_COLUMNS = legacy.COLUMNS


def upgrade_messages(tbl):
    """A messages table (pyarrow) of an older run-dir format in today's columns; a
    table of today's format as it is."""
    return legacy.upgrade(tbl) if legacy.is_legacy(tbl.column_names) else tbl
