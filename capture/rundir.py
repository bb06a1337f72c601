"""Capture files -> run dirs, one per capture point, in the format agents write
(agent/rundir.py), so that `pslat report` reads them with the same code.

    points = parse_points(files, ["client=w0.pcap", ...])        # [(name, path)]
    dirs, problems = write_run_dirs(points, out_dir)            # problems: sentences naming the file

A capture point's run dir says where it came from in meta.json (`source`:
"capture", the file's format, link types and every counter of reading, decoding
and reassembly). It has no clock mapping and no boot id: a capture's times are the
capturing host's CLOCK_REALTIME, related to other points and agents only through
the traffic (reports/clocks.py estimates it). Each capture is read once, unless its
local addresses judged early turn out wrong at the end (write_run_dir).
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from agent.records import CLOCK_SAMPLES_SCHEMA, MESSAGES_SCHEMA, STREAMS_SCHEMA
from agent.rundir import RunDirWriter
from capture.decode import COUNTERS, LINK_NAMES, decode
from capture.point import CapturePoint, LocalVotes
from capture.read import CaptureError, CaptureReader
from core.errors import UserError
from core.safetext import safe_text

SCHEMAS = {"messages": MESSAGES_SCHEMA, "streams": STREAMS_SCHEMA, "clock_samples": CLOCK_SAMPLES_SCHEMA}
FLUSH_ROWS = 100_000         # rows per shard at most (the writer's buffer holds 200,000)
DECIDE_AFTER_SEGMENTS = 20_000   # segments whose rows wait for the judgement of the local addresses
NAME_CHARS_MAX = 200


def parse_points(files: list[Path], specs: list[str]) -> list[tuple[str, Path]]:
    """Capture files (named by their file name without extension) and `--capture NAME=FILE`
    options -> [(name, path)]; UserError for a spec without NAME= or a name given twice."""
    out: list[tuple[str, Path]] = [(Path(f).name.split(".")[0] or Path(f).name, Path(f)) for f in files]
    for spec in specs:
        name, sep, path = spec.partition("=")
        name = name.strip()
        if not sep or not name or not path:
            raise UserError(f"--capture {spec!r}: expected NAME=FILE, e.g. --capture worker0=w0.pcap")
        if len(name) > NAME_CHARS_MAX:
            raise UserError(f"--capture: a name of at most {NAME_CHARS_MAX} characters")
        out.append((name, Path(path)))
    seen: dict[str, Path] = {}
    for name, path in out:
        if name in seen:
            raise UserError(f"two captures are named {name!r} ({seen[name]} and {path}); name them apart with "
                            "--capture NAME=FILE")
        seen[name] = path
    return out


def _segments(path: Path, counts: dict):
    """The TCP segments of a capture file, and its reader (for its stats once read)."""
    reader = CaptureReader(path)

    def gen():
        with reader:
            for ts_ns, link_type, data, wire_len in reader:
                seg = decode(link_type, data, wire_len, ts_ns, counts)
                if seg is not None:
                    yield seg
    return reader, gen()


def write_run_dir(name: str, path: Path, out: Path, forced: dict[int, str] | None = None) -> tuple[dict, list[str]]:
    """One capture point's run dir at `out`; returns its meta.json and what was wrong with
    the capture (sentences naming it). CaptureError when it is no capture at all.

    Read once: the local addresses are judged from the first DECIDE_AFTER_SEGMENTS
    segments (capture/point.py: LocalVotes; the rows wait for it) and again at the end
    with every connection's addresses (the votes of handshakes and ACKs are those of
    the first segments); when the two disagree, the capture is read again with the
    final judgement (`reads`: 2 in meta.json)."""
    started = time.time_ns()
    local = None
    for reads in (1, 2):
        meta, problems, final = _read_once(name, path, out, forced, started, local)
        if final == set(meta["capture"]["local_ips"]):
            break
        shutil.rmtree(out, ignore_errors=True)
        local = final
    meta["capture"]["reads"] = reads
    return meta, problems


def _read_once(name, path, out, forced, started, local):
    counts = dict.fromkeys(COUNTERS, 0)
    reader, segs = _segments(path, counts)
    meta = {"host_id": name, "source": "capture", "started_realtime_ns": started,
            "capture": {"format": reader.stats.format}}
    w = RunDirWriter(out, meta, shard_interval_s=1e9)
    for table, schema in SCHEMAS.items():
        w.set_schema(table, schema)
    rows = 0

    def emit(table: str, row: dict) -> None:
        nonlocal rows
        w.append(table, row)
        rows += 1
        if rows % FLUSH_ROWS == 0:
            w.flush()

    votes = LocalVotes()
    point = CapturePoint(name, emit, local, forced=forced)
    first_ns = last_ns = None
    n = 0
    for s in segs:
        if first_ns is None:
            first_ns = s.ts_ns
        last_ns = s.ts_ns
        votes.segment(s)
        point.segment(s)
        n += 1
        if n == DECIDE_AFTER_SEGMENTS and point.local is None:
            point.decide(votes.local())
            votes.timing = False   # the votes are cast; every connection's addresses still count
    final = votes.local()
    if point.local is None:
        point.decide(final)
    point.finish()
    st, ps, rs = reader.stats, point.stats, point.stats.directions
    c = w.meta["counters"]
    c.update({"messages": ps.rows, "unparsed_bytes": ps.unparsed_bytes, "lost_bytes": ps.lost_bytes,
              "records": st.records, "tcp_segments": ps.segments, "connections": ps.connections,
              "connections_evicted": ps.connections_evicted, "connections_reused": ps.connections_reused,
              "unrecognised_connections": ps.unrecognised_connections,
              "unrecognised_bytes": ps.unrecognised_bytes,
              "records_without_time": st.records_without_time,
              "records_unknown_interface": st.records_unknown_interface,
              **{f"packets_{k}": v for k, v in counts.items()},
              **{f"stream_{k}": getattr(rs, k) for k in ("captured_bytes", "bytes", "retransmitted_bytes",
                                                         "ahead_segments", "lost_bytes", "truncated_bytes",
                                                         "out_of_window_segments")}})
    if first_ns is not None and 0 <= first_ns < 1 << 63:
        # the run it belongs to is when it was captured (reports/load.py groups run dirs by time)
        w.meta["started_realtime_ns"] = first_ns
    w.meta["capture"].update({
        "local_ips": sorted(point.local), "point": "host" if point.local else "tap",
        "link_types": sorted(st.link_types), "interfaces": len(st.interfaces),
        "truncated_tail": st.truncated_tail, "corrupt": st.corrupt, "protocols": dict(point.protocols),
        "first_packet_realtime_ns": first_ns, "last_packet_realtime_ns": last_ns})
    w.close()
    return w.meta, _problems(name, path, w.meta), final


def _problems(name: str, path: Path, meta: dict) -> list[str]:
    """What the report should say of this capture (each names the file)."""
    c, cap = meta["counters"], meta["capture"]
    where = f"capture {name} ({path})"
    out = []
    if cap["truncated_tail"]:
        out.append(f"{where}: the file ends inside a packet record (cut off while written?): the rest is lost")
    if cap["corrupt"]:
        out.append(f"{where}: reading stopped at a record that cannot be right ({cap['corrupt']})")
    unknown = [t for t in cap["link_types"] if t not in LINK_NAMES]
    if unknown:
        out.append(f"{where}: {c['packets_unknown_link_type']:,} packets of link type "
                   f"{', '.join(map(str, unknown))}, which pslat does not decode (known: "
                   f"{', '.join(f'{v} ({k})' for k, v in sorted(LINK_NAMES.items()))})")
    if c["stream_truncated_bytes"]:
        out.append(f"{where}: {c['stream_truncated_bytes']:,} TCP payload bytes cut off by the snap length "
                   "(capture with -s 0): their messages may be lost or lack their ids")
    if c["stream_lost_bytes"]:
        out.append(f"{where}: {c['stream_lost_bytes']:,} TCP payload bytes not in the capture (dropped by "
                   "the capture or before it): the parsers resynchronised after each hole")
    if c["stream_out_of_window_segments"]:
        out.append(f"{where}: {c['stream_out_of_window_segments']:,} TCP segments far outside their stream "
                   "(more than any receive window away: garbage or forged sequence numbers): dropped")
    if c["unrecognised_connections"]:
        out.append(f"{where}: {c['unrecognised_connections']:,} connections ({c['unrecognised_bytes']:,} bytes) "
                   "in no protocol pslat parses: counted as unrecognised")
    if not c["tcp_segments"]:
        out.append(f"{where}: no TCP segment among its {c['records']:,} packet records")
    if cap["point"] == "tap" and c["tcp_segments"]:
        out.append(f"{where}: no address is an end of every connection, so it is taken as a tap between "
                   "hosts: requests as their client sent them, responses as it received them")
    return [safe_text(p, max_chars=2000) for p in out]


def write_run_dirs(points: list[tuple[str, Path]], out: Path,
                   forced: dict[int, str] | None = None) -> tuple[list[Path], list[str]]:
    """A run dir per capture point under `out` (out/capture-<n>: a name is never a path);
    UserError when no capture can be read at all."""
    dirs, problems = [], []
    for i, (name, path) in enumerate(points):
        d = Path(out) / f"capture-{i}"
        try:
            _, why = write_run_dir(name, path, d, forced)
        except CaptureError as e:
            problems.append(safe_text(str(e), max_chars=2000))
            continue
        dirs.append(d)
        problems += why
    if not dirs and points:
        raise UserError(problems[0] if len(problems) == 1 else "no capture could be read: " + "; ".join(problems))
    return dirs, problems
