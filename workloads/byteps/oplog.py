"""The oracle of a BytePS ps-lite job: each node's own log of the messages its van sent
and received, as ps-lite writes it with PS_VERBOSE=2 (independent of pslat).

ps-lite's van logs every message it hands to its transport and every one it takes from
it (src/van.cc, Van::Send and Van::Receiving):

    [12:00:01] src/van.cc:530: zeromq\tsent: ? => 8. Meta: request=1, timestamp=3, app_id=0,
        customer_id=0, simple_app=0, push=0, head=0, key=..., data_type={ UINT64 OTHER } Body:
        data_size=8 data_size=0
    [12:00:01] src/van.cc:555: zeromq\treceived: 8 => 9. Meta: request=0, timestamp=3, ...

(one line each; Message::DebugString and Meta::DebugString in
include/ps/internal/message.h). A sent message has no sender ("?"): the van fills in
neither; a received one has the sender its transport read from the identity frame and
the receiver's own id. The van does not log the TERMINATE it sends itself at the stop
(SendMsg, not Send). The meta's `key` is not the message's key: test_benchmark.cc
never sets it, so it is whatever the stack held (the keys travel in the data frames).

The log is the traced job's output: read as untrusted text, at most MAX_LOG_BYTES of a
file and MAX_LINE_CHARS of a line, by anchored regular expressions; a line of another
shape is counted, never interpreted. scripts/byteps_logging.patch makes each line one
write, so that the lines of a node's threads do not interleave.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_LOG_BYTES = 64 << 20
MAX_LINE_CHARS = 16 << 10
MAX_NODES = 256          # nodes one control message may list
KIND_SENT, KIND_RECEIVED = "sent", "received"

_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\] [\w./-]{1,200}:\d{1,6}: ")
_VAN = re.compile(r"[a-z]{1,16}\t(sent|received): (.*)")
_INT = r"-?\d{1,10}"
_META = re.compile(
    rf"(?P<sender>\?|{_INT}) => (?P<recver>{_INT})\. Meta: request=(?P<request>[01])"
    rf"(?:, timestamp=(?P<timestamp>{_INT}))?"
    r"(?:, control=\{ cmd=(?P<cmd>[A-Z_]{1,20})(?P<ctrl>.*) \}"
    rf"|, app_id=(?P<app_id>{_INT}), customer_id=(?P<customer_id>{_INT}), "
    r"simple_app=(?P<simple_app>[01]), push=(?P<push>[01]))"
    rf"(?:, head=(?P<head>{_INT}))?"
    r"(?:, key=(?P<key>\d{1,20}))?"
    r"(?:, data_type=\{(?P<data_types>(?: [A-Z0-9]{1,8}){0,16}) \})?"
    r"(?P<not_data>\. THIS IS NOT DATA MSG!)?"
    r"(?: Body:(?P<sizes>(?: data_size=\d{1,12}){1,16}))?")
_NODE = re.compile(rf"\[role=(?P<role>server|worker|scheduler)(?:, id=(?P<id>{_INT}))?, "
                   r"ip=(?P<ip>[0-9A-Za-z.:-]{0,64}), port=(?P<port>-?\d{1,6}),")
_BARRIER = re.compile(rf", barrier_group=({_INT})")
_ME = re.compile(r"([WSH])\[(\d{1,10})\] is (connected to others|stopped)")
_GOODPUT = re.compile(r"Application goodput: \S{1,40} Gbps\. count = (\d{1,10})")
_ROLES = {"W": "worker", "S": "server", "H": "scheduler"}


@dataclass(frozen=True)
class LoggedNode:
    """A node a control message lists (ADD_NODE): its id once the scheduler gave one."""
    role: str
    node_id: int | None
    ip: str
    port: int


@dataclass(frozen=True)
class LoggedMessage:
    """One message as a node's van logged it."""
    kind: str                  # KIND_SENT or KIND_RECEIVED
    sender: int | None         # None: "?" (every sent message, and a node without an id yet)
    recver: int
    request: bool
    timestamp: int | None
    cmd: str | None            # a control message's command (ADD_NODE, BARRIER, ...), else None
    nodes: tuple[LoggedNode, ...] = ()
    barrier_group: int | None = None
    app_id: int | None = None
    customer_id: int | None = None
    simple_app: bool = False
    push: bool = False
    head: int | None = None
    meta_key: int | None = None   # the meta's key field (not the keys frame: see the module)
    data_types: tuple[str, ...] = ()
    data_sizes: tuple[int, ...] = ()   # bytes of each data frame: keys, vals, lens

    @property
    def data(self) -> bool:
        return self.cmd is None and not self.simple_app

    @property
    def op(self) -> str:
        """push or pull for a data message (its answer too), else its command."""
        if self.cmd is not None:
            return self.cmd
        return "simple_app" if self.simple_app else ("push" if self.push else "pull")

    def summary(self) -> dict:
        """The fields a wire parser can check, as JSON (recording.json's oracle lists)."""
        return {"request": self.request, "op": self.op, "timestamp": self.timestamp,
                "app_id": self.app_id, "customer_id": self.customer_id, "head": self.head,
                "data_sizes": list(self.data_sizes)}


@dataclass
class NodeLog:
    """What one node's log says: its id and role, its messages in order, how it ended."""
    path: Path
    role: str | None = None
    node_id: int | None = None
    messages: list[LoggedMessage] = field(default_factory=list)
    stopped: bool = False              # "X[id] is stopped": Finalize's van stop ran
    goodput_counts: list[int] = field(default_factory=list)   # a worker's rounds logged
    van_lines_unread: int = 0          # "sent:"/"received:" lines of no known shape
    lines_too_long: int = 0
    truncated: bool = False            # the file was longer than MAX_LOG_BYTES

    def sent(self, data: bool | None = None) -> list[LoggedMessage]:
        return [m for m in self.messages if m.kind == KIND_SENT and (data is None or m.data == data)]

    def received(self, data: bool | None = None) -> list[LoggedMessage]:
        return [m for m in self.messages if m.kind == KIND_RECEIVED
                and (data is None or m.data == data)]


def _int(s: str | None) -> int | None:
    return None if s is None else int(s)


def parse_van_line(text: str) -> LoggedMessage | None:
    """One van line's message (what follows "sent: " or "received: "), or None."""
    m = _VAN.fullmatch(text)
    if not m:
        return None
    d = _META.fullmatch(m.group(2))
    if not d:
        return None
    nodes: tuple[LoggedNode, ...] = ()
    barrier = None
    if d["cmd"] is not None:
        ctrl = d["ctrl"]
        nodes = tuple(LoggedNode(n["role"], _int(n["id"]), n["ip"], int(n["port"]))
                      for _, n in zip(range(MAX_NODES), _NODE.finditer(ctrl)))
        b = _BARRIER.search(ctrl)
        barrier = int(b.group(1)) if b else None
    if (d["not_data"] is not None) != (d["cmd"] is not None or d["simple_app"] == "1"):
        return None     # ps-lite marks every control and SimpleApp message NOT DATA, only them
    sizes = tuple(int(s) for s in re.findall(r"\d+", d["sizes"] or ""))
    return LoggedMessage(
        kind=m.group(1), sender=None if d["sender"] == "?" else int(d["sender"]),
        recver=int(d["recver"]), request=d["request"] == "1", timestamp=_int(d["timestamp"]),
        cmd=d["cmd"], nodes=nodes, barrier_group=barrier, app_id=_int(d["app_id"]),
        customer_id=_int(d["customer_id"]), simple_app=d["simple_app"] == "1",
        push=d["push"] == "1", head=_int(d["head"]), meta_key=_int(d["key"]),
        data_types=tuple((d["data_types"] or "").split()), data_sizes=sizes)


def read_node_log(path: Path) -> NodeLog:
    """A node's log file (bounded: MAX_LOG_BYTES, MAX_LINE_CHARS a line)."""
    log = NodeLog(Path(path))
    with open(path, "rb") as f:
        raw = f.read(MAX_LOG_BYTES + 1)
    if len(raw) > MAX_LOG_BYTES:
        log.truncated, raw = True, raw[:MAX_LOG_BYTES]
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if len(line) > MAX_LINE_CHARS:
            log.lines_too_long += 1
            continue
        prefix = _PREFIX.match(line)
        if not prefix:
            continue
        text = line[prefix.end():]
        if "\tsent: " in text[:40] or "\treceived: " in text[:40]:
            msg = parse_van_line(text)
            if msg is None:
                log.van_lines_unread += 1
            else:
                log.messages.append(msg)
            continue
        me = _ME.fullmatch(text)
        if me:
            log.role, log.node_id = _ROLES[me.group(1)], int(me.group(2))
            log.stopped = log.stopped or me.group(3) == "stopped"
            continue
        g = _GOODPUT.fullmatch(text)
        if g:
            log.goodput_counts.append(int(g.group(1)))
    return log


def data_counts(msgs: list[LoggedMessage]) -> dict[str, int]:
    """Data messages by op: {"push": n, "pull": n} (both keys always there)."""
    out = {"push": 0, "pull": 0}
    for m in msgs:
        if m.data:
            out[m.op] += 1
    return out


def control_counts(msgs: list[LoggedMessage]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in msgs:
        if m.cmd is not None:
            out[m.cmd] = out.get(m.cmd, 0) + 1
    return dict(sorted(out.items()))
