"""Readers of live snapshots from outside (`pslat top --agent` and `--snapshot`): an agent's
/snapshot.json comes from another host, a saved file from anyone, so neither is trusted.

    body = fetch_body("h1:9465")            # FetchError past FETCH_TIMEOUT_S or MAX_SNAPSHOT_BYTES
    snap, skipped = read_snapshot(parse_json(body))   # SnapshotError when it is no snapshot at all
    snap, skipped = read_snapshot_file(path)          # the same for a saved file (regular files only)

read_snapshot type-checks every field it keeps and rebuilds the snapshot from
what passed, in the shape agent.live makes (so merge_snapshots and the renderer
see only well-formed values: ints that are ints, finite numbers, strings cut to
MAX_NAME_CHARS, lists cut to their caps). A part that is wrong is left out and
counted in `skipped` ({"groups": 2, ...}) for the status line; only a value that
is no snapshot at all (not an object, other histogram edges) is refused whole.
Strings are kept as sent: control characters and markup are the renderer's to
neutralise (core.safetext, rich Text), as they would be in the agent's own
snapshot, which carries traced names too.
"""
from __future__ import annotations

import math
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agent import safefile
from agent.live import EDGES_NS, N_BUCKETS, SUBS, CLIENT_COMPONENTS, SERVER_COMPONENTS, THREADS_SHOWN, UNSPLIT

FORMAT = "pslat-live/1"
FETCH_TIMEOUT_S = 2.0              # connect to last byte, whatever the server's pace
MAX_SNAPSHOT_BYTES = 16 * 2**20    # a 40-host job's agent serves well under 1 MiB
MAX_HEADER_BYTES = 16 * 1024
MAX_JSON_DEPTH = 16                # a snapshot nests 6 deep (groups, group, hists, hist, counts, pair)
MAX_NAME_CHARS = 256               # host ids, peers, ops, agent and probe names
MAX_GROUPS = 10_000
MAX_HOSTS = 10_000                 # entries of keys, connections, ip_hosts, unrecognised
MAX_AGENTS = 1_000
MAX_TOP_KEYS = 100
MAX_PROBES = 64
INT_MAX = 2**63 - 1
HIST_NAMES = frozenset(["e2e", UNSPLIT, *CLIENT_COMPONENTS, *SERVER_COMPONENTS,
                        *(s for subs in SUBS.values() for s in subs)])
CONNECTION_FIELDS = ("open", "opened_per_s", "closed_per_s", "opened_total", "closed_total", "connects",
                     "accepts")


class SnapshotError(ValueError):
    """Not a pslat snapshot at all; the message says why, in a few words."""


class FetchError(OSError):
    """No answer in time, too big, not HTTP 200; the message says which."""


# ---------------------------------------------------------------- values

def _int(v: Any, lo: int = 0, hi: int = INT_MAX) -> int:
    if type(v) is not int or not lo <= v <= hi:   # bool is an int subclass: refused too
        raise TypeError
    return v


def _num(v: Any, lo: float = 0.0, hi: float = 1e18) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or not lo <= v <= hi:
        raise TypeError
    return v


def _opt_num(v: Any, lo: float = 0.0, hi: float = 1e18) -> float | None:
    return None if v is None else _num(v, lo, hi)


def _name(v: Any) -> str:
    if type(v) is not str:
        raise TypeError
    return v[:MAX_NAME_CHARS]


def _dict(v: Any) -> dict:
    if type(v) is not dict:
        raise TypeError
    return v


def _list(v: Any) -> list:
    if type(v) is not list:
        raise TypeError
    return v


def _hist(d: Any) -> dict:
    d = _dict(d)
    counts = []
    for pair in _list(d["counts"])[:N_BUCKETS]:
        i, c = _list(pair)
        counts.append([_int(i, 0, N_BUCKETS - 1), _int(c)])
    return {"counts": counts, "n": _int(d["n"]), "sum_ns": _int(d["sum_ns"], -INT_MAX, INT_MAX),
            "negative": _int(d.get("negative", 0))}


def _group(g: Any, skipped: Counter) -> dict:
    g = _dict(g)
    role = g["role"]
    if role not in ("client", "server"):
        raise TypeError
    hists = {}
    for c, h in _dict(g["hists"]).items():
        try:
            if c not in HIST_NAMES:
                raise TypeError
            hists[c] = _hist(h)
        except (TypeError, KeyError, ValueError):
            skipped["histograms"] += 1
    if "e2e" not in hists:   # a row is drawn from its end-to-end histogram
        raise TypeError
    return {"host": _name(g["host"]), "role": role, "op": _name(g["op"]), "peer": _name(g["peer"]),
            "requests": _int(g["requests"]), "rate_per_s": _num(g["rate_per_s"]), "hists": hists}


def _keys(k: Any) -> dict:
    k = _dict(k)
    top = []
    for pair in _list(k["top"])[:MAX_TOP_KEYS]:
        key, n = _list(pair)
        if type(key) is str:   # agent.live sends keys as decimal strings (JSON numbers lose 64-bit ints)
            if not key.isascii() or not key.isdigit() or len(key) > 20:
                raise TypeError
            key = int(key)
        top.append([str(_int(key, 0, 2**64 - 1)), _int(n)])
    return {"sampled": _int(k["sampled"]), "top": top}


def _connections(c: Any) -> dict:
    c = _dict(c)
    return {f: _num(c[f]) for f in CONNECTION_FIELDS if f in c}


def _unrecognised(u: Any) -> dict:
    u = _dict(u)
    port = u.get("port")
    return {"connections": _int(u["connections"]), "bytes": _int(u["bytes"]),
            "port": None if port is None else _int(port, 0, 65535),
            "threads": [_name(t) for t in _list(u.get("threads", []))[:THREADS_SHOWN]]}


def _agent(a: Any) -> dict:
    a = _dict(a)
    out: dict[str, Any] = {"agent": _name(a["agent"])}
    if "error" in a:
        out["error"] = _name(a["error"])
        return out
    lost = {}
    for p, n in list(_dict(a.get("lost", {})).items())[:MAX_PROBES]:
        lost[_name(p)] = _int(n)
    out.update(events_per_s=_opt_num(a.get("events_per_s")), cpu_pct=_opt_num(a.get("cpu_pct")),
               sampling_rate=_num(a.get("sampling_rate", 1.0), 0.0, 1.0), lost=lost)
    for f in ("uptime_s", "events_total", "pending_requests", "unpaired_expired", "messages"):
        if f in a:
            out[f] = _num(a[f])
    return out


_WRONG = (TypeError, KeyError, ValueError, AttributeError)


def _each(items, cap: int, one, section: str, skipped: Counter) -> list:
    out = []
    for i, x in enumerate(items):
        if i >= cap:
            skipped[section] += len(items) - cap
            break
        try:
            out.append(one(x))
        except _WRONG:
            skipped[section] += 1
    return out


def read_snapshot(value: Any) -> tuple[dict, Counter]:
    """A parsed /snapshot.json -> (the snapshot rebuilt from its valid parts, what was skipped)."""
    if type(value) is not dict:
        raise SnapshotError(f"a JSON {type(value).__name__}, not an object")
    fmt = value.get("format", FORMAT)
    if fmt != FORMAT:
        raise SnapshotError(f"format {fmt[:40]!r}, not {FORMAT}" if type(fmt) is str
                            else f"format a JSON {type(fmt).__name__}, not {FORMAT}")
    if value.get("edges_ns") != EDGES_NS:
        raise SnapshotError("no histogram edges or other ones (not a snapshot of this pslat version)")
    skipped: Counter = Counter()
    try:
        window_s = _num(value.get("window_s", 0), 0, 10**6)
    except TypeError:
        window_s, skipped["window"] = 0, 1

    def section(name: str, kind):
        v = value.get(name, kind())
        if type(v) is not kind:
            skipped[name] += 1
            return kind()
        return v

    groups = _each(section("groups", list), MAX_GROUPS, lambda g: _group(g, skipped), "groups", skipped)
    pairs = {}
    for name, one in (("keys", _keys), ("connections", _connections), ("ip_hosts", _name),
                      ("unrecognised", _unrecognised)):
        items = list(section(name, dict).items())
        pairs[name] = dict(_each(items, MAX_HOSTS, lambda kv, one=one: (_name(kv[0]), one(kv[1])), name, skipped))
    agents = _each(section("agents", list), MAX_AGENTS, _agent, "agents", skipped)
    return {"format": FORMAT, "window_s": window_s, "edges_ns": EDGES_NS, "groups": groups, **pairs,
            "agents": agents}, skipped


def skipped_text(skipped: Counter) -> str:
    """"skipped 2 groups, 1 agents (wrong types or values)", or "" when nothing was."""
    if not skipped:
        return ""
    return "skipped " + ", ".join(f"{n} {what}" for what, n in sorted(skipped.items())) + \
        " (wrong types or values)"


def parse_json(body: bytes) -> Any:
    try:
        return safefile.parse_json(body, max_depth=MAX_JSON_DEPTH)
    except ValueError as e:   # not JSON, not UTF-8, nested too deep
        raise SnapshotError(str(e)[:80]) from None


# ---------------------------------------------------------------- sources

def read_snapshot_file(path: Path, max_bytes: int = MAX_SNAPSHOT_BYTES) -> tuple[dict, Counter]:
    """A saved /snapshot.json; OSError (unreadable, not a regular file, too big) or SnapshotError."""
    return read_snapshot(parse_json(safefile.read_regular(path, max_bytes)))


def _host_port(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def fetch_body(addr: str, path: str = "/snapshot.json", timeout_s: float = FETCH_TIMEOUT_S,
               max_bytes: int = MAX_SNAPSHOT_BYTES) -> bytes:
    """GET http://addr/path under one deadline for the whole exchange (not per read: a server
    trickling a byte at a time is cut at timeout_s) and a size cap; FetchError otherwise."""
    deadline = time.monotonic() + timeout_s

    def left() -> float:
        t = deadline - time.monotonic()
        if t <= 0:
            raise FetchError(f"no complete answer within {timeout_s:g} s")
        return t

    host, port = _host_port(addr)
    try:
        sock = socket.create_connection((host, port), timeout=left())
    except socket.timeout:
        raise FetchError(f"no connection within {timeout_s:g} s") from None
    with sock:
        try:
            sock.settimeout(left())
            sock.sendall(f"GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n".encode())
            buf = bytearray()
            head_end, length = -1, None
            while True:
                sock.settimeout(left())
                chunk = sock.recv(256 * 1024)
                if not chunk:
                    break
                buf += chunk
                if head_end < 0:
                    head_end = buf.find(b"\r\n\r\n")
                    if head_end < 0:
                        if len(buf) > MAX_HEADER_BYTES:
                            raise FetchError("answer headers too large")
                        continue
                    length = _check_head(bytes(buf[:head_end]), max_bytes)
                body_len = len(buf) - head_end - 4
                if body_len > max_bytes:
                    raise FetchError(f"answer larger than {max_bytes // 2**20} MiB")
                if length is not None and body_len >= length:
                    break
        except socket.timeout:
            raise FetchError(f"no complete answer within {timeout_s:g} s") from None
    if head_end < 0:
        raise FetchError("no HTTP answer")
    body = bytes(buf[head_end + 4:])
    if length is not None and len(body) < length:
        raise FetchError(f"answer cut short ({len(body)} of {length} bytes)")
    return body[:length] if length is not None else body


def _check_head(head: bytes, max_bytes: int) -> int | None:
    """The Content-Length of an HTTP 200 answer (None: read to the end); FetchError otherwise."""
    lines = head.decode("latin-1").split("\r\n")
    status = lines[0].split(" ", 2)
    if len(status) < 2 or not status[0].startswith("HTTP/"):
        raise FetchError("not an HTTP answer")
    if status[1] != "200":
        raise FetchError(f"HTTP {status[1][:3]}")
    length = None
    for ln in lines[1:]:
        name, _, v = ln.partition(":")
        name, v = name.strip().lower(), v.strip()
        if name == "transfer-encoding" and v.lower() != "identity":
            raise FetchError(f"transfer-encoding {v[:20]} (an HTTP/1.0 request gets none from an agent)")
        if name == "content-length":
            if not v.isdigit():
                raise FetchError("bad content-length")
            length = int(v)
            if length > max_bytes:
                raise FetchError(f"answer larger than {max_bytes // 2**20} MiB")
    return length
