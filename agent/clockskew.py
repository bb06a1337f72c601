"""A clock offset and drift put on one host's times on purpose, for tests of
the report's clock alignment (`pslat agent --test-clock-skew`).

The virtual cluster's hosts share one kernel clock, which gives the tests
exact truth but never a clock error to recover. This gives one host a clock
that reads t + offset + (t - t0) * drift for every timestamp the agent writes
for it (every `ts_*_ns` column), and says so in its meta.json
(`clock.injected`), so the report does not take the host's clock as shared.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.errors import UserError

MAX_OFFSET_US = 3_600_000_000      # an hour: anything larger is a typo
MAX_DRIFT_PPM = 10_000.0           # 1%: real oscillators are within a few hundred ppm


@dataclass(frozen=True)
class ClockSkew:
    host: str
    offset_ns: int
    drift_ppm: float
    t0_ns: int                     # the time from which the drift accumulates

    @classmethod
    def parse(cls, text: str, t0_ns: int) -> "ClockSkew":
        """HOST:OFFSET_US:DRIFT_PPM, e.g. h1:5000:50."""
        parts = text.rsplit(":", 2)
        try:
            host, offset_us, drift_ppm = parts[0], float(parts[1]), float(parts[2])
        except (IndexError, ValueError):
            raise UserError(f"--test-clock-skew {text!r}: expected HOST:OFFSET_US:DRIFT_PPM, "
                            "e.g. h1:5000:50") from None
        if not host or abs(offset_us) > MAX_OFFSET_US or abs(drift_ppm) > MAX_DRIFT_PPM:
            raise UserError(f"--test-clock-skew {text!r}: give a host, |offset| <= {MAX_OFFSET_US} us "
                            f"and |drift| <= {MAX_DRIFT_PPM:g} ppm")
        return cls(host, round(offset_us * 1000), drift_ppm, t0_ns)

    def apply(self, row: dict) -> dict:
        """The row with every timestamp read off the skewed clock (in place)."""
        for k, v in row.items():
            if v and k.startswith("ts_") and k.endswith("_ns"):
                row[k] = v + self.offset_ns + round((v - self.t0_ns) * self.drift_ppm * 1e-6)
        return row

    def to_meta(self) -> dict:
        return {"offset_ns": self.offset_ns, "drift_ppm": self.drift_ppm, "t0_ns": self.t0_ns}
