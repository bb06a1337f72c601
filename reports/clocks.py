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
  bound U = t_A,in - t_B,out. The tightest bounds (minimum-delay samples) per
  time window give window midpoints; a Theil-Sen line through them gives the
  drift; with the drift removed, offset = (max L + min U) / 2 and the
  uncertainty is (min U - max L) / 2: half the smallest round trip on the
  wire. That is exactly what cannot be told apart: an asymmetric path (one way
  slower than the other) looks like an offset; the round-trip sum is exact,
  the split between directions is known only within this uncertainty.
- none: traffic in one direction only, nothing else known: the pair's
  requests keep their server side out (`network_and_remote`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

MAX_WINDOWS = 64
MIN_SAMPLES_PER_WINDOW = 8
MAX_DRIFT = 1e-3    # 1000 ppm: far beyond any quartz clock (+-100 ppm); the slope search range


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
        # t_A = t_B (1 + drift) + const: solve for t_B (drift << 1, so one step is exact to << 1 ns)
        guess = t_a - np.rint(self.offset_ns).astype(np.int64)
        d = (guess - self.ref_ns).astype(np.float64)
        return t_a - np.rint(self.offset_ns + self.drift * d).astype(np.int64)

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


class _Band:
    """Lines o(t) = o0 + k t that respect every bound: o(t_l) >= lo and o(t_u) <= hi.
    For a slope k the feasible o0 lie in [low(k), up(k)]; low is convex and up
    concave in k, so their gap is concave and every search below is a ternary one."""

    def __init__(self, t_l, lo, t_u, hi):
        self.t_l, self.lo, self.t_u, self.hi = t_l, lo, t_u, hi

    def low(self, k: float) -> float:
        return float(np.max(self.lo - k * self.t_l))

    def up(self, k: float) -> float:
        return float(np.min(self.hi - k * self.t_u))

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
    n_windows = int(np.clip(min(len(lo), len(hi)) // MIN_SAMPLES_PER_WINDOW, 1, MAX_WINDOWS))
    drift = 0.0
    for _ in range(2):   # the second pass fits what the first left (windows of a drifting clock)
        x, y = _window_mids(t_l, lo - drift * t_l, t_u, hi - drift * t_u, n_windows)
        if len(x) < 3:
            break
        drift += _theil_sen(x, y)
    band = _Band(t_l, lo, t_u, hi)
    k_best = _ternary(band.gap, drift - MAX_DRIFT, drift + MAX_DRIFT)
    if band.gap(k_best) < 0:
        return _crossing(a, b, band, drift, ref, n, n_windows, -band.gap(k_best))
    # the slopes the samples allow; the robust fit's, if it is one of them
    k_lo = _edge(band.gap, k_best, k_best - MAX_DRIFT)
    k_hi = _edge(band.gap, k_best, k_best + MAX_DRIFT)
    k = min(max(drift, k_lo), k_hi)
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
                      uncertainty_ns=float(worst), samples=n)


def _crossing(a, b, band: _Band, drift, ref, n, n_windows, cross) -> ClockModel:
    """No line respects every bound: a clock that steps or drifts unevenly, or a stage time
    that is not causal. Offset from the median window, uncertainty covering every window."""
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
