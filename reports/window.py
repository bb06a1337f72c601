"""Which requests a report describes: filters, a time window, and the start-up transient.

    sel = select(d, Choice(skip_warmup=True, ops=["pull"]))   # d: reports.dissect.Dissection
    sel.whole        # d with the filters applied: the whole run's figures
    sel.window       # sel.whole cut to the window: findings and headline figures
    sel.info         # since_s, until_s, warmup_s, the rule's verdict, in words too

A step after dissection and before every view, on the requests table alone
(its rows, its `start_ns` on the worker's clock and the clock models): so a
dissection that builds that table another way (Dask, issue 20) keeps it.

Times are seconds from the run's start: the first request's start, on the
reference host's clock (reports.extra.Timeline, the one the over-time charts
use). A wall-clock time (`12:30:05`, `2026-12-04T12:30:05Z`, UTC) is turned into
that through the reference host's realtime mapping (meta.json's clock).

The warm-up rule (WARMUP_RULE says it in words, every report repeats it):
requests are binned by start into BIN_S bins; the steady level is the median,
over the bins of the run's second half, of each bin's mean end-to-end; a bin is
disturbed when its mean exceeds DISTURBED_X times that level. The warm-up runs
from the start to the end of the last disturbed bin that is reached from the
start without CLEAN_GAP_S of undisturbed bins, and it lies in the run's first
half. Bins with fewer than MIN_BIN_REQUESTS requests count as undisturbed (too
few to judge), and a run shorter than MIN_RUN_S has no warm-up cut.
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from core.errors import UserError
from reports.extra import Timeline, build_timeline

BIN_S = 0.5
DISTURBED_X = 3.0
CLEAN_GAP_S = 2.0
MIN_BIN_REQUESTS = 20
MIN_RUN_S = 8.0
WARMUP_RULE = (f"{BIN_S:g} s bins by start time; a bin whose mean end-to-end exceeds {DISTURBED_X:g}x the "
               "median bin mean of the run's second half is disturbed; the warm-up ends with the last disturbed "
               f"bin reached from the start without {CLEAN_GAP_S:g} s undisturbed, in the first half")


@dataclass
class Choice:
    """What the user asked for (pslat report's options)."""
    since: str | None = None          # seconds from the start, or a wall-clock time
    until: str | None = None
    skip_warmup: bool = True
    ops: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)      # either end
    servers: list[str] = field(default_factory=list)
    workers: list[str] = field(default_factory=list)

    @property
    def filters(self) -> list[str]:
        """The filters in words, for the report's window line."""
        out = []
        for name, vals in (("op", self.ops), ("host", self.hosts), ("server", self.servers),
                           ("worker", self.workers)):
            if vals:
                out.append(f"{name} {', '.join(vals)}")
        return out


@dataclass
class Warmup:
    """The rule's verdict on one run."""
    end_s: float | None               # None: no warm-up found
    why: str                          # the verdict in words (what it found, or why none)
    requests: int = 0                 # requests in it
    share_of_requests: float = 0.0
    share_of_time: float = 0.0        # of all request time (sum of end-to-end)
    mean_us: float | None = None      # mean end-to-end in it, and after it
    steady_mean_us: float | None = None


@dataclass
class WindowInfo:
    run_s: float                      # from the first request's start to the last's
    since_s: float
    until_s: float
    warmup: Warmup
    warmup_cut: bool                  # the window starts where the warm-up ends
    filters: list[str]
    rule: str = WARMUP_RULE

    @property
    def whole(self) -> bool:
        return self.since_s <= 0 and self.until_s >= self.run_s and not self.filters

    def to_json(self) -> dict:
        """The summary's "window" object (a contract: README "Report JSON summary")."""
        return {"since_s": round(self.since_s, 3), "until_s": round(self.until_s, 3),
                "warmup_s": round(self.warmup.end_s, 3) if self.warmup_cut else None}

    def describe(self) -> str:
        """The window in one sentence, for every report."""
        what = "the whole run" if self.since_s <= 0 and self.until_s >= self.run_s else \
            f"{self.since_s:,.1f}-{self.until_s:,.1f} s of the run's {self.run_s:,.1f} s"
        if self.warmup_cut:
            what += f" (the first {self.warmup.end_s:,.1f} s cut as warm-up; --keep-warmup keeps it)"
        elif self.warmup.end_s is not None:
            what += f" (a warm-up of {self.warmup.end_s:,.1f} s detected, kept)"
        if self.filters:
            what += "; only " + "; ".join(self.filters)
        return "window: " + what


@dataclass
class Selection:
    whole: object                     # a Dissection (filters applied, every time)
    window: object                    # a Dissection (filters and the window)
    info: WindowInfo
    t0_ref_ns: int | None             # the run's start on the timeline's reference clock
    timeline: Timeline


def start_ref_ns(requests: pd.DataFrame, tl: Timeline) -> np.ndarray:
    """Each request's start on the reference host's clock (float64 ns, NaN where unknown)."""
    start = requests["start_ns"].to_numpy(dtype=np.float64, na_value=np.nan)
    out = start.copy()
    for host, rows in requests.groupby("worker_host", sort=False, observed=True).indices.items():
        ok = rows[~np.isnan(start[rows])]
        out[ok] = tl.to_ref(start[ok].astype(np.int64), str(host))
    return out


def detect_warmup(start_s: np.ndarray, e2e_us: np.ndarray) -> Warmup:
    """The module's rule on the requests' starts (s from the run's start) and end-to-end (us)."""
    ok = ~(np.isnan(start_s) | np.isnan(e2e_us))
    start_s, e2e_us = start_s[ok], e2e_us[ok]
    run_s = float(start_s.max()) if len(start_s) else 0.0
    if run_s < MIN_RUN_S:
        return Warmup(None, f"none: the run is {run_s:.1f} s, too short to tell a warm-up from the run "
                            f"(needs {MIN_RUN_S:g} s)")
    nbins = int(run_s // BIN_S) + 1
    b = np.minimum((start_s // BIN_S).astype(np.int64), nbins - 1)
    count = np.bincount(b, minlength=nbins)
    mean = np.bincount(b, weights=e2e_us, minlength=nbins) / np.maximum(count, 1)
    judged = count >= MIN_BIN_REQUESTS
    second = np.arange(nbins) * BIN_S >= run_s / 2
    ref = mean[second & judged]
    if len(ref) == 0:
        return Warmup(None, f"none: fewer than {MIN_BIN_REQUESTS} requests per {BIN_S:g} s bin in the run's "
                            "second half to set a steady level")
    level = float(np.median(ref))
    disturbed = judged & (mean > DISTURBED_X * level)
    gap_bins = int(round(CLEAN_GAP_S / BIN_S))
    end_bin, clean = None, 0
    for k in range(nbins):
        if k * BIN_S >= run_s / 2:
            break
        if disturbed[k]:
            end_bin, clean = k, 0
        else:
            clean += 1
            if clean >= gap_bins:
                break
    if end_bin is None:
        return Warmup(None, f"none: no {BIN_S:g} s bin at the start had a mean end-to-end above "
                            f"{DISTURBED_X:g}x the steady {level:,.0f} us")
    end_s = (end_bin + 1) * BIN_S
    inside = start_s < end_s
    total = float(e2e_us.sum())
    w = Warmup(end_s, "", requests=int(inside.sum()), share_of_requests=float(inside.mean()),
               share_of_time=float(e2e_us[inside].sum() / total) if total > 0 else 0.0,
               mean_us=float(e2e_us[inside].mean()),
               steady_mean_us=float(e2e_us[~inside].mean()) if (~inside).any() else None)
    w.why = (f"the first {end_s:,.1f} s: mean end-to-end {w.mean_us:,.0f} us against {w.steady_mean_us:,.0f} us "
             f"after (bins above {DISTURBED_X:g}x the steady {level:,.0f} us)")
    return w


def _seconds(text: str, what: str, t0_ref_ns: int | None, tl: Timeline) -> float:
    """--since/--until's value as seconds from the run's start."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    when = _wall_clock(text, what)
    if t0_ref_ns is None or tl.realtime_offset_ns is None:
        raise UserError(f"{what} {text}: the run dirs have no realtime mapping to place a wall-clock time; "
                        "give seconds from the start")
    t0_wall = (t0_ref_ns + tl.realtime_offset_ns) / 1e9
    if len(text) <= 8:    # a time of day: on the run's first day (UTC)
        day = datetime.fromtimestamp(t0_wall, timezone.utc).replace(hour=0, minute=0, second=0, microsecond=0)
        return day.timestamp() + when.timestamp() - t0_wall
    return when.timestamp() - t0_wall


_TIME_OF_DAY = re.compile(r"^\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?$")


def _wall_clock(text: str, what: str) -> datetime:
    try:
        if _TIME_OF_DAY.match(text):
            t = datetime.strptime(text if text.count(":") == 2 else text + ":00",
                                  "%H:%M:%S.%f" if "." in text else "%H:%M:%S")
            return datetime(1970, 1, 1, t.hour, t.minute, t.second, t.microsecond, tzinfo=timezone.utc)
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return t if t.tzinfo else t.replace(tzinfo=timezone.utc)
    except ValueError:
        raise UserError(f"{what} {text[:40]!r}: give seconds from the run's start (e.g. 2.5) or a UTC time "
                        "(12:30:05 or 2026-12-04T12:30:05Z)") from None


def _filter_rows(requests: pd.DataFrame, choice: Choice) -> np.ndarray:
    keep = np.ones(len(requests), dtype=bool)
    col = lambda c: requests[c].astype(object).astype(str).to_numpy()  # noqa: E731
    if choice.ops:
        keep &= np.isin(col("op"), choice.ops)
    if choice.servers:
        keep &= np.isin(col("server_host"), choice.servers)
    if choice.workers:
        keep &= np.isin(col("worker_host"), choice.workers)
    if choice.hosts:
        keep &= np.isin(col("server_host"), choice.hosts) | np.isin(col("worker_host"), choice.hosts)
    return keep


def _rows(d, keep: np.ndarray):
    """Dissection d with only the requests where `keep` (the same object when all are kept)."""
    if keep.all():
        return d
    return dataclasses.replace(d, requests=d.requests[keep])


def select(d, choice: Choice | None = None) -> Selection:
    choice = choice or Choice()
    tl = build_timeline(list(d.hosts), d.clocks, d.metas)
    keep = _filter_rows(d.requests, choice)
    if choice.filters and not keep.any():
        present = {c: sorted(map(str, d.requests[c].dropna().astype(str).unique()))[:12]
                   for c in ("op", "worker_host", "server_host")}
        raise UserError(f"no request matches {'; '.join(choice.filters)}: the run has ops "
                        f"{', '.join(present['op']) or 'none'}, workers {', '.join(present['worker_host']) or 'none'}, "
                        f"servers {', '.join(present['server_host']) or 'none'}")
    whole = _rows(d, keep)
    start = start_ref_ns(whole.requests, tl)
    done = whole.requests["complete"].to_numpy(dtype=bool)
    known = ~np.isnan(start)
    t0 = int(np.nanmin(start)) if known.any() else None
    start_s = (start - t0) / 1e9 if t0 is not None else np.full(len(start), np.nan)
    run_s = float(np.nanmax(start_s)) if known.any() else 0.0
    e2e_us = whole.requests["e2e"].to_numpy(dtype=np.float64, na_value=np.nan) / 1e3
    warm = detect_warmup(start_s[done], e2e_us[done])
    since = _seconds(choice.since, "--since", t0, tl) if choice.since is not None else None
    until = _seconds(choice.until, "--until", t0, tl) if choice.until is not None else None
    cut = since is None and choice.skip_warmup and warm.end_s is not None
    since = warm.end_s if cut else (since if since is not None else 0.0)
    until = until if until is not None else run_s
    if (choice.since is not None or choice.until is not None) and until <= since:   # asked for, and empty
        raise UserError(f"the window {since:g}-{until:g} s is empty: --until must come after --since "
                        f"(the run lasts {run_s:,.1f} s)")
    in_window = known & (start_s >= since) & (start_s <= until) if (since > 0 or until < run_s) else \
        np.ones(len(start_s), dtype=bool)
    info = WindowInfo(run_s=run_s, since_s=max(since, 0.0), until_s=min(until, run_s), warmup=warm,
                      warmup_cut=cut, filters=choice.filters)
    return Selection(whole=whole, window=_rows(whole, in_window), info=info, t0_ref_ns=t0, timeline=tl)
