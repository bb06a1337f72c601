"""How two hosts' CLOCK_MONOTONIC relate, per pair of hosts (DESIGN.md "Clocks").

For the pair "A~B" (A < B by name) the model is

    t_A = t_B + offset_ns + drift * (t_B - ref_ns)       (ref_ns: a time of B)

so `offset_us` is what to add to B's times to get A's (issue 4's contract), at
B's time `ref_ns` (the middle of the samples), and `drift_ppm` is drift * 1e6.

Sources, in order:
- shared: both run dirs come from one kernel (the same boot_id in meta.json,
  or, for agents that do not write it, one agent process: the same start time
  and clock mapping, as when one agent traces the virtual cluster's
  namespaces). Offset 0, drift 0, uncertainty 0: exact.
- disciplined: both hosts' realtime clocks are disciplined (meta.json's
  clock_discipline.synced) so the monotonic->realtime mappings relate them;
  the uncertainty is both mappings' plus both clocks' estimated errors. If
  the traffic proves that offset impossible (outside the causality bounds
  below, beyond both uncertainties), the traffic's estimate is used instead
  and the report says so.
- estimated, from the traffic: a message from A to B leaves A (driver
  handoff, else the first send syscall: times no later than its departure) and
  reaches B (NIC/netif, else later stages: no earlier than its arrival), so
  offset >= t_A,out - t_B,in (a lower bound L); one from B to A gives an upper
  bound U = t_A,in - t_B,out. Samples of two kinds (traffic_samples): per
  message, the times of its last segment (one_way_samples), and per segment
  that starts a burst, its driver handoff and its arrival, which the agents
  report apart (the `clock_samples` table: segment_samples). The second kind is
  what keeps the estimate unbiased with large messages: a 78 KB message's last
  segment queues behind the other 50 of its burst on the way (measured: that
  direction's minimum one-way delay 50-110 us above the wire's), its first
  segment does not; without them the band's middle was off by half of that.
  The lines offset + drift * t that respect every bound form a convex set
  (only the minimum-delay samples bind). The drift is the slope of the widest
  band between the bounds (a ternary search; a run too short to tell the
  drift, judged by the scatter of per-window midpoints, or a slope within
  three standard errors of 0, gets 0, or the nearest slope allowed), the
  offset the middle of that band: with the drift removed, (max L + min U) / 2.
  The uncertainty is how far any line the samples allow strays from ours
  anywhere in the run: at least half the smallest round trip on the wire,
  (min U - max L) / 2, plus what the slope leaves open at the ends of the
  run. That is exactly what cannot be told apart: an asymmetric path (one way
  slower than the other) looks like an offset; the round-trip sum is exact,
  the split between directions is known only within this uncertainty.
- none: traffic in one direction only, nothing else known: the pair's
  requests keep their server side out (`network_and_remote`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from reports.load import host_shards

MAX_WINDOWS = 64
MIN_SAMPLES_PER_WINDOW = 8
MAX_DRIFT = 500e-6         # the slopes searched: far beyond two quartz clocks (+-100 ppm each)
UNRESOLVED_DRIFT = 25e-6   # a slope known no better than this (standard error): drift not measured
DRIFT_SIGNIFICANCE = 3.0   # a slope within this many standard errors of 0: not told from none


@dataclass
class ClockModel:
    a: str
    b: str
    source: str                      # shared | disciplined | estimated | none
    offset_ns: float = 0.0
    drift: float = 0.0
    ref_ns: int = 0
    uncertainty_ns: float = 0.0
    samples: int = 0
    note: str | None = None
    drift_se: float | None = None    # the measured drift's standard error (None: not measured)

    @property
    def key(self) -> str:
        return f"{self.a}~{self.b}"

    @property
    def usable(self) -> bool:
        return self.source != "none"

    def b_to_a(self, t_b: np.ndarray) -> np.ndarray:
        """B's int64 ns -> A's int64 ns (rounded: the components then add up exactly)."""
        if self.source == "shared":
            return t_b
        d = (t_b - self.ref_ns).astype(np.float64)
        return t_b + np.rint(self.offset_ns + self.drift * d).astype(np.int64)

    def a_to_b(self, t_a: np.ndarray) -> np.ndarray:
        if self.source == "shared":
            return t_a
        # t_A = t_B + offset + drift (t_B - ref): fixed point on t_B; each step shrinks the
        # error by the factor drift (<< 1), three leave far less than 1 ns
        t_b = t_a - self.offset_ns
        for _ in range(3):
            t_b = t_a - self.offset_ns - self.drift * (t_b - self.ref_ns)
        return np.rint(t_b).astype(np.int64)

    def convert(self, t: np.ndarray, frm: str, to: str) -> np.ndarray:
        if frm == to:
            return t
        if (frm, to) == (self.b, self.a):
            return self.b_to_a(t)
        if (frm, to) == (self.a, self.b):
            return self.a_to_b(t)
        raise ValueError(f"clock {self.key} does not relate {frm} and {to}")

    def to_json(self) -> dict[str, Any]:
        """The contract's object (issue 4), plus `samples` and `ref_ns` (B's time of offset_us)."""
        if not self.usable:
            return {"offset_us": None, "drift_ppm": None, "uncertainty_us": None, "source": "none",
                    "samples": self.samples, "ref_ns": None}
        return {"offset_us": round(self.offset_ns / 1e3, 3), "drift_ppm": round(self.drift * 1e6, 4),
                "uncertainty_us": round(self.uncertainty_ns / 1e3, 3), "source": self.source,
                "samples": self.samples, "ref_ns": int(self.ref_ns)}


# ---------------------------------------------------------------- samples

def _coalesce(df: pd.DataFrame, cols: list[str]) -> pd.Series:
    out = df[cols[0]]
    for c in cols[1:]:
        out = out.fillna(df[c])
    return out


def one_way_samples(msgs: pd.DataFrame) -> pd.DataFrame:
    """Per message seen at both ends on two hosts: tx_host, rx_host, t_out (sender's clock,
    no later than its departure), t_in (receiver's clock, no earlier than its arrival)."""
    t_out = _coalesce(msgs, ["tx_ts_xmit_last_ns", "tx_ts_send_first_enter_ns"])
    t_in = _coalesce(msgs, ["rx_ts_nic_rx_last_ns", "rx_ts_netif_rx_last_ns", "rx_ts_data_ready_ns",
                            "rx_ts_recv_last_exit_ns"])
    s = pd.DataFrame({"tx_host": msgs["tx_host_id"], "rx_host": msgs["rx_host_id"],
                      "t_out": t_out, "t_in": t_in})
    s = s.dropna()
    s = s[s["tx_host"] != s["rx_host"]]
    return s.astype({"t_out": np.int64, "t_in": np.int64}).reset_index(drop=True)


CLOCK_SAMPLES_TABLE = "clock_samples"   # agent/records.py CLOCK_SAMPLES_SCHEMA
_FLOW_SEQ = ["src_ip", "src_port", "dst_ip", "dst_port", "seq"]


def _read_clock_samples(run_dir: Path, host_id: str) -> pd.DataFrame | None:
    # a shard the agent could not finish is skipped: fewer samples, the estimate says how many
    parts = [t.to_pandas() for t in host_shards(run_dir, host_id, CLOCK_SAMPLES_TABLE,
                                                ["host_id", "direction", *_FLOW_SEQ, "ts_ns"])]
    if not parts:
        return None
    df = pd.concat(parts, ignore_index=True)
    return df[df["ts_ns"].notna()]


def matched_segments(run_dirs: list[tuple[str, Path]]) -> pd.DataFrame:
    """The `clock_samples` tables of the run dirs ((host id, path) each) paired: a
    segment's driver handoff on one host (tx_host, t_out) with its arrival on another
    (rx_host, t_in), by flow and seq (the _FLOW_SEQ columns). The sender leaves
    re-sends out; a segment that arrived twice keeps its first arrival (still after
    the first departure: a valid bound, if a loose one)."""
    frames = [f for f in (_read_clock_samples(p, h) for h, p in run_dirs) if f is not None and len(f)]
    if not frames:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in ("tx_host", "rx_host", *_FLOW_SEQ)}
                            | {"t_out": pd.Series(dtype=np.int64), "t_in": pd.Series(dtype=np.int64)})
    df = pd.concat(frames, ignore_index=True)
    tx = df[df["direction"] == "tx"].drop_duplicates(_FLOW_SEQ, keep=False)   # the same seq twice: ambiguous
    rx = df[df["direction"] == "rx"].sort_values("ts_ns").drop_duplicates(_FLOW_SEQ, keep="first")
    m = tx.merge(rx, on=_FLOW_SEQ, suffixes=("_tx", "_rx"))
    m = m[m["host_id_tx"] != m["host_id_rx"]]
    return pd.DataFrame({"tx_host": m["host_id_tx"].to_numpy(object), "rx_host": m["host_id_rx"].to_numpy(object),
                         **{c: m[c].to_numpy() for c in _FLOW_SEQ},
                         "t_out": m["ts_ns_tx"].to_numpy(np.int64), "t_in": m["ts_ns_rx"].to_numpy(np.int64)})


def segment_samples(run_dirs: list[tuple[str, Path]]) -> pd.DataFrame:
    """One-way samples (as one_way_samples) from the agents' `clock_samples` tables."""
    return matched_segments(run_dirs)[["tx_host", "rx_host", "t_out", "t_in"]]


def traffic_samples(msgs: pd.DataFrame, run_dirs: list[tuple[str, Path]]) -> pd.DataFrame:
    """Every one-way sample the traffic gives: per message (one_way_samples) and per
    burst-starting segment (segment_samples). Both are valid bounds; only the
    minimum-delay ones bind."""
    per_msg = one_way_samples(msgs)
    per_seg = segment_samples(run_dirs)
    if not len(per_seg):
        return per_msg
    return pd.concat([per_msg.astype({"tx_host": object, "rx_host": object}), per_seg], ignore_index=True)


# ---------------------------------------------------------------- fit

def _theil_sen(x: np.ndarray, y: np.ndarray) -> float:
    i, j = np.triu_indices(len(x), k=1)
    dx = x[j] - x[i]
    ok = dx != 0
    return float(np.median((y[j] - y[i])[ok] / dx[ok])) if ok.any() else 0.0


def _window_mids(t_l, lo, t_u, hi, n_windows):
    """Per time window: the tightest lower and upper bound, and their midpoint."""
    t0 = min(t_l.min(), t_u.min())
    t1 = max(t_l.max(), t_u.max())
    width = max((t1 - t0) / n_windows, 1.0)
    wl = np.minimum(((t_l - t0) / width).astype(np.int64), n_windows - 1)
    wu = np.minimum(((t_u - t0) / width).astype(np.int64), n_windows - 1)
    max_l = np.full(n_windows, -np.inf)
    min_u = np.full(n_windows, np.inf)
    np.maximum.at(max_l, wl, lo)
    np.minimum.at(min_u, wu, hi)
    ok = np.isfinite(max_l) & np.isfinite(min_u)
    centres = t0 + (np.arange(n_windows) + 0.5) * width
    return centres[ok], (max_l[ok] + min_u[ok]) / 2


def _binding(t: np.ndarray, v: np.ndarray) -> list[tuple[float, float]]:
    """The samples (t, v) that can be the maximum of v - k t for some slope k: the upper convex
    hull, peeled in vectorised rounds (a sample below the chord of its two neighbours by >= 2 ns
    goes; at any k one of them beats it by >= 1 ns, far beyond float rounding here, so the
    maximum over those kept is the maximum over all, to the bit)."""
    o = np.argsort(t, kind="stable")
    ts, vs = t[o], v[o]
    for _ in range(64):   # a round removes every local dent; what is left after the cap is kept
        if len(ts) < 3:
            break
        ta, tb, tc = ts[:-2], ts[1:-1], ts[2:]
        va, vb, vc = vs[:-2], vs[1:-1], vs[2:]
        span = tc - ta
        with np.errstate(divide="ignore", invalid="ignore"):
            below = ((vc - va) * (tb - ta) - (vb - va) * span) / span
        # same t as a neighbour: the lower one goes (span 0 gives no chord)
        below = np.where(span > 0, below, np.where((tb == ta) & (va >= vb + 2) | (tb == tc) & (vc >= vb + 2), 2.0, 0.0))
        gone = below >= 2.0
        if not gone.any():
            break
        keep = np.concatenate([[True], ~gone, [True]])
        ts, vs = ts[keep], vs[keep]
    return list(zip(ts.tolist(), vs.tolist()))


class _Band:
    """Lines o(t) = o0 + k t that respect every bound: o(t_l) >= lo and o(t_u) <= hi.
    For a slope k the feasible o0 lie in [low(k), up(k)]; low is convex and up
    concave in k, so their gap is concave and every search below is a ternary one."""

    def __init__(self, t_l, lo, t_u, hi):
        self.t_l, self.lo, self.t_u, self.hi = t_l, lo, t_u, hi
        # the searches evaluate low/up a few hundred times per pair: over the few samples
        # that can bind (as Python floats: the same IEEE operations as numpy's, no call overhead)
        self._low_pts = _binding(t_l, lo)
        self._up_pts = [(t, -h) for t, h in _binding(t_u, -hi)]

    def low(self, k: float) -> float:
        return max([v - k * t for t, v in self._low_pts])

    def up(self, k: float) -> float:
        return min([v - k * t for t, v in self._up_pts])

    def gap(self, k: float) -> float:
        return self.up(k) - self.low(k)


def _ternary(f, a: float, b: float, iters: int = 60) -> float:
    """The argmax of a concave f on [a, b]."""
    for _ in range(iters):
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        if f(m1) < f(m2):
            a = m1
        else:
            b = m2
    return (a + b) / 2


def _edge(f, inside: float, outside: float, iters: int = 60) -> float:
    """Where a concave f, >= 0 at `inside`, falls below 0 towards `outside`."""
    if f(outside) >= 0:
        return outside
    for _ in range(iters):
        mid = (inside + outside) / 2
        if f(mid) >= 0:
            inside = mid
        else:
            outside = mid
    return inside


def _slope_error(band: _Band, k: float) -> float:
    """Standard error of the slope: the scatter of per-window midpoints around the line
    (robust: MAD), over the time the windows span. inf when there are too few windows."""
    n_windows = int(np.clip(min(len(band.lo), len(band.hi)) // MIN_SAMPLES_PER_WINDOW, 1, MAX_WINDOWS))
    x, y = _window_mids(band.t_l, band.lo - k * band.t_l, band.t_u, band.hi - k * band.t_u, n_windows)
    if len(x) < 3 or x.max() == x.min():
        return float("inf")
    sigma = 1.4826 * np.median(np.abs(y - np.median(y)))
    return float(max(sigma, 1.0) * np.sqrt(12 / len(x)) / (x.max() - x.min()))


def estimate(a: str, b: str, ab: pd.DataFrame, ba: pd.DataFrame) -> ClockModel:
    """The traffic's estimate for A~B (see the module docstring) from the one-way samples
    of messages A -> B (`ab`) and B -> A (`ba`)."""
    n = len(ab) + len(ba)
    if len(ab) == 0 or len(ba) == 0:
        one = f"{a}->{b}" if len(ab) else f"{b}->{a}"
        return ClockModel(a, b, "none", samples=n,
                          note=f"{a}~{b}: messages seen at both ends only {one}; the clock offset "
                               "cannot be bounded from one direction")
    ref = int(np.median(np.concatenate([ab["t_in"].to_numpy(), ba["t_out"].to_numpy()])))
    # relative to ref, in float64 ns: exact for runs shorter than ~100 days
    t_l = (ab["t_in"].to_numpy() - ref).astype(np.float64)
    lo = (ab["t_out"].to_numpy() - ab["t_in"].to_numpy()).astype(np.float64)
    t_u = (ba["t_out"].to_numpy() - ref).astype(np.float64)
    hi = (ba["t_in"].to_numpy() - ba["t_out"].to_numpy()).astype(np.float64)
    band = _Band(t_l, lo, t_u, hi)
    k_best = _ternary(band.gap, -MAX_DRIFT, MAX_DRIFT)
    if band.gap(k_best) < 0:
        return _crossing(a, b, band, ref, n, -band.gap(k_best))
    # the slopes the samples allow
    k_lo = _edge(band.gap, k_best, -MAX_DRIFT)
    k_hi = _edge(band.gap, k_best, MAX_DRIFT)
    note = None
    se = _slope_error(band, k_best)
    if se > UNRESOLVED_DRIFT or abs(k_best) < DRIFT_SIGNIFICANCE * se:
        # a run too short (or too noisy) to tell the drift, or a slope within the noise:
        # the band's slope would wander (measured on 3 s runs with 1 ms +-20% wires and
        # no drift at all: -29..+36 ppm, moving the offset up to 30 us); take the
        # plausible one (0, if the bounds allow it)
        k = min(max(0.0, k_lo), k_hi)
        if se > UNRESOLVED_DRIFT:
            known = "too few samples" if np.isinf(se) else f"known only to +-{se * 1e6:.0f} ppm"
            why = f"run too short to measure the clocks' drift ({known})"
        else:
            why = f"the drift the traffic shows, {k_best * 1e6:.0f} +-{se * 1e6:.0f} ppm, is not told from none"
        note = (f"{a}~{b}: {why}; taken as {k * 1e6:.0f} ppm, the uncertainty covers any from "
                f"{k_lo * 1e6:.0f} to {k_hi * 1e6:.0f} ppm")
    else:
        # the slope of the widest band: as far from the tightest bounds on both sides as
        # can be (in simulation 1.7 ppm rms, against 4.0 for a Theil-Sen fit of window midpoints)
        k = k_best
    offset = (band.low(k) + band.up(k)) / 2
    # uncertainty: how far any line the samples allow is from ours, anywhere in the run
    worst = 0.0
    for tau in (min(t_l.min(), t_u.min()), 0.0, max(t_l.max(), t_u.max())):
        est = offset + k * tau
        q_top = _ternary(lambda q: band.up(q) + q * tau, k_lo, k_hi)
        q_bot = _ternary(lambda q: -(band.low(q) + q * tau), k_lo, k_hi)
        top = band.up(q_top) + q_top * tau
        bot = band.low(q_bot) + q_bot * tau
        worst = max(worst, top - est, est - bot)
    return ClockModel(a, b, "estimated", offset_ns=float(offset), drift=float(k), ref_ns=ref,
                      uncertainty_ns=float(worst), samples=n, note=note,
                      drift_se=None if note else float(se))


def _crossing(a, b, band: _Band, ref, n, cross) -> ClockModel:
    """No line respects every bound: a clock that steps or drifts unevenly, or a stage time
    that is not causal. A robust fit instead: Theil-Sen through the midpoints of time
    windows, the offset their median, the uncertainty covering every window."""
    n_windows = int(np.clip(min(len(band.lo), len(band.hi)) // MIN_SAMPLES_PER_WINDOW, 1, MAX_WINDOWS))
    drift = 0.0
    for _ in range(2):   # the second pass fits what the first left (windows of a drifting clock)
        x, y = _window_mids(band.t_l, band.lo - drift * band.t_l, band.t_u, band.hi - drift * band.t_u, n_windows)
        if len(x) < 3:
            break
        drift += float(np.clip(_theil_sen(x, y), -MAX_DRIFT, MAX_DRIFT))
    x, y = _window_mids(band.t_l, band.lo - drift * band.t_l, band.t_u, band.hi - drift * band.t_u, n_windows)
    offset = float(np.median(y))
    half = (band.up(drift) - band.low(drift)) / 2
    unc = float(abs(half) + np.max(np.abs(y - offset)))
    return ClockModel(a, b, "estimated", offset_ns=offset, drift=float(drift), ref_ns=ref, uncertainty_ns=unc,
                      samples=n, note=f"{a}~{b}: no straight clock line fits the traffic's bounds (they "
                                      f"cross by {cross / 1e3:.1f} us: a clock step, uneven drift, or a "
                                      "stage time that is not causal); offset from the median window, "
                                      "uncertainty widened to cover every window")


# ---------------------------------------------------------------- from meta.json

def clock_identity(meta: dict) -> str | None:
    """Run dirs with the same identity read the same CLOCK_MONOTONIC."""
    clock = meta.get("clock") or {}
    if clock.get("injected"):
        return None   # a test offset/drift was put on this host's times on purpose
    boot = meta.get("boot_id") or (meta.get("kernel") or {}).get("boot_id")
    if boot:
        return f"boot:{boot}"
    if "started_realtime_ns" in meta and "offset_ns" in clock:
        # one agent process (one kernel) writes one run dir per traced namespace
        return f"agent:{meta['started_realtime_ns']}:{clock['offset_ns']}:{clock.get('taken_monotonic_ns')}"
    return None


def _disciplined(a: str, b: str, ma: dict, mb: dict) -> ClockModel | None:
    da, db = ma.get("clock_discipline") or {}, mb.get("clock_discipline") or {}
    ca, cb = ma.get("clock") or {}, mb.get("clock") or {}
    if not (da.get("synced") is True and db.get("synced") is True and "offset_ns" in ca and "offset_ns" in cb):
        return None
    # realtime = monotonic + offset on each host: t_A = t_B + (off_B - off_A)
    unc = (ca.get("uncertainty_ns", 0) + cb.get("uncertainty_ns", 0)
           + 1e3 * (float(da.get("esterror_us") or 0) + float(db.get("esterror_us") or 0)))
    return ClockModel(a, b, "disciplined", offset_ns=float(cb["offset_ns"] - ca["offset_ns"]),
                      uncertainty_ns=float(unc))


def _contradicts(disc: ClockModel, est: ClockModel) -> bool:
    if not est.usable:
        return False
    at_ref = disc.offset_ns   # disciplined: no drift between the mappings
    return abs(at_ref - est.offset_ns) > est.uncertainty_ns + disc.uncertainty_ns


def clock_models(pairs: list[tuple[str, str]], metas: dict[str, dict], samples: pd.DataFrame,
                 force_estimate: bool = False) -> dict[tuple[str, str], ClockModel]:
    """A model for each (a, b) pair, a < b (see the module docstring for the order of sources)."""
    out: dict[tuple[str, str], ClockModel] = {}
    by_dir = {k: g for k, g in samples.groupby(["tx_host", "rx_host"], sort=False, observed=True)}
    none = samples.iloc[:0]
    for a, b in pairs:
        ma, mb = metas.get(a, {}), metas.get(b, {})
        ab, ba = by_dir.get((a, b), none), by_dir.get((b, a), none)
        n = len(ab) + len(ba)
        ia, ib = clock_identity(ma), clock_identity(mb)
        if not force_estimate and ia is not None and ia == ib:
            out[(a, b)] = ClockModel(a, b, "shared", samples=n)
            continue
        est = estimate(a, b, ab, ba)
        disc = None if force_estimate else _disciplined(a, b, ma, mb)
        if disc is not None:
            disc.samples = n
            if _contradicts(disc, est):
                est.note = (f"{a}~{b}: the disciplined clocks say offset {disc.offset_ns / 1e3:.1f} us, "
                            f"which the traffic rules out ({est.offset_ns / 1e3:.1f} +- "
                            f"{est.uncertainty_ns / 1e3:.1f} us); the traffic's estimate is used")
                out[(a, b)] = est
            else:
                out[(a, b)] = disc
            continue
        out[(a, b)] = est
    return out
