"""What the views need beyond the dissection: other tables and columns of the run
dirs, each host's meta.json, and one timeline for all hosts.

reports.load reads the messages columns the dissection needs and drops the
rest (key samples are the heaviest column). The HTML, terminal and trace views
also want the key samples, the `connections` table, thread ids and names, and
the agents' counters: read here, per host, only the columns asked for, and only
for the hosts the dissection used (a run dir it left out stays out).

    ctx = RunContext.open(run_dirs, d)        # d: reports.dissect.Dissection
    ctx.metas["ps0"]["counters"]              # meta.json per used host
    ctx.table("connections", ["host_id", "handshake_ns"])
    tl = ctx.timeline                         # host clock -> the reference host's clock
    tl.to_ref(t_ns, "w0"); tl.realtime_offset_ns
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa

from agent.rundir import SHARD_SUFFIX
from reports.load import host_shards, nullable


@dataclass
class Timeline:
    """Each host's CLOCK_MONOTONIC -> the reference host's, through the dissection's
    clock models (a chain of them when two hosts never talked directly, e.g. two
    workers through a server). A host with no path keeps its own clock, and is named
    in `unaligned` so that a view can say so."""
    ref: str | None
    paths: dict[str, list[tuple]] = field(default_factory=dict)   # host -> [(model, frm, to), ...]
    unaligned: list[str] = field(default_factory=list)
    realtime_offset_ns: int | None = None   # the reference host's realtime - monotonic (meta.json)
    uncertainty_ns: dict[str, float] = field(default_factory=dict)   # per host, summed along its path

    def to_ref(self, t_ns: np.ndarray, host: str) -> np.ndarray:
        t = np.asarray(t_ns, dtype=np.int64)
        for model, frm, to in self.paths.get(host, []):
            t = model.convert(t, frm, to)
        return t


def build_timeline(hosts: list[str], clocks: dict, metas: dict[str, dict]) -> Timeline:
    usable = [m for m in clocks.values() if m.usable]
    if not hosts:
        return Timeline(ref=None)
    degree = {h: 0 for h in hosts}
    for m in usable:
        for h in (m.a, m.b):
            degree[h] = degree.get(h, 0) + 1
    # the best connected host (a server, usually): the shortest chains
    ref = max(hosts, key=lambda h: (degree.get(h, 0), -hosts.index(h)))
    adj: dict[str, list[tuple]] = {}
    for m in usable:
        adj.setdefault(m.a, []).append((m, m.b))
        adj.setdefault(m.b, []).append((m, m.a))
    paths: dict[str, list[tuple]] = {ref: []}
    unc: dict[str, float] = {ref: 0.0}
    todo = deque([ref])
    while todo:
        h = todo.popleft()
        for m, other in adj.get(h, []):
            if other in paths:
                continue
            # other's times reach ref by converting other -> h, then h's own path
            paths[other] = [(m, other, h)] + paths[h]
            unc[other] = unc[h] + m.uncertainty_ns
            todo.append(other)
    off = (metas.get(ref, {}).get("clock") or {}).get("offset_ns")
    return Timeline(ref=ref, paths=paths, unaligned=[h for h in hosts if h not in paths],
                    realtime_offset_ns=int(off) if isinstance(off, (int, float)) else None,
                    uncertainty_ns=unc)


@dataclass
class RunContext:
    dirs: dict[str, Path]                # host id -> its run dir
    metas: dict[str, dict]
    timeline: Timeline

    @classmethod
    def open(cls, run_dirs: list[Path] | None, d) -> "RunContext":
        """The run dirs of the hosts that dissection `d` used, as reports.load read them
        (no run dirs given: none, and metas are empty)."""
        dirs, metas = (dict(d.dirs), dict(d.metas)) if run_dirs else ({}, {})
        return cls(dirs=dirs, metas=metas, timeline=build_timeline(list(d.hosts), d.clocks, metas))

    def arrow(self, table: str, columns: list[str]) -> pa.Table:
        """Rows of `table` of every used host with these columns, as Arrow (a column an
        older agent did not write is all null); shards that cannot be read are skipped
        (reports.load already named them)."""
        parts = list(self.shards(table, columns))
        if not parts:
            return pa.table({c: pa.nulls(0) for c in columns})
        return pa.concat_tables(parts, promote_options="permissive")

    def shards(self, table: str, columns: list[str], dictionary: tuple[str, ...] = ()) -> Iterator[pa.Table]:
        """arrow()'s rows one shard at a time (to keep only some rows of a large column); the
        text columns named in `dictionary` dictionary-encoded (faster to read and compare)."""
        for host, p in self.dirs.items():
            yield from host_shards(p, host, table, columns, dictionary)

    def table(self, table: str, columns: list[str]) -> pd.DataFrame:
        """The same as a DataFrame (nullable integers keep int64 ns exact)."""
        return self.arrow(table, columns).to_pandas(types_mapper=nullable)

    def has_table(self, table: str) -> bool:
        return any(any(p.glob(f"{table}-*{SHARD_SUFFIX}")) for p in self.dirs.values())


def request_times_ref(req: pd.DataFrame, tl: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each request on the reference host's clock (int64 ns; end = start +
    e2e). Requests of a worker the timeline cannot place keep that worker's clock."""
    start = req["start_ns"].to_numpy(dtype=np.int64, na_value=0).copy()
    for host, rows in req.groupby("worker_host", sort=False, observed=True).indices.items():
        start[rows] = tl.to_ref(start[rows], host)
    return start, start + req["e2e"].to_numpy(dtype=np.int64, na_value=0)
