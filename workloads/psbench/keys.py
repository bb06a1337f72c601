"""Which keys a request touches, and which server holds them.

Three pieces, each checkable on its own:
- ZipfSampler: ranks 1..K with P(r) proportional to r**-s (bounded Zipf), for any
  s >= 0 and K up to 2**62, in O(1) memory, by rejection-inversion (Hoermann and
  Derflinger, "Rejection-inversion to generate variates from monotone discrete
  distributions", 1996). numpy's own zipf is unbounded and needs s > 1.
- KeyPermutation: a seeded bijection of [0, K) (a Feistel network with cycle
  walking), so the hottest ranks land on scattered key ids and therefore on
  different servers, without a K-sized table.
- KeySpace: maps key ids to ps-lite's uint64 keys and slices a sorted key list
  by server key ranges exactly as ps-lite's DefaultSlicer does (one slice per
  server that holds at least one of the keys).
"""
from __future__ import annotations

import numpy as np

from core.errors import UserError

# ps-lite: kMaxKey = std::numeric_limits<Key>::max(); server i owns
# [kMaxKey / M * i, kMaxKey / M * (i + 1))  (Postoffice::GetServerKeyRanges).
K_MAX_KEY = (1 << 64) - 1
MAX_KEY_SPACE = 1 << 62


def _log1p_over_x(x: np.ndarray) -> np.ndarray:
    """log(1+x)/x, continuous at 0 (Taylor series where x is tiny)."""
    small = np.abs(x) < 1e-8
    safe = np.where(small, 1.0, x)
    return np.where(small, 1.0 - x / 2.0 + x * x / 3.0, np.log1p(safe) / safe)


def _expm1_over_x(x: np.ndarray) -> np.ndarray:
    """(exp(x)-1)/x, continuous at 0."""
    small = np.abs(x) < 1e-8
    safe = np.where(small, 1.0, x)
    return np.where(small, 1.0 + x / 2.0 + x * x / 6.0, np.expm1(safe) / safe)


class ZipfSampler:
    """Bounded Zipf over ranks 1..n with exponent s (s = 0 is uniform)."""

    def __init__(self, n: int, s: float, rng: np.random.Generator):
        if n < 1:
            raise UserError(f"key space must be at least 1, got {n}; pass --key-space >= 1")
        if not s >= 0:
            raise UserError(f"Zipf exponent must be >= 0, got {s}; pass --zipf-exponent 0 (uniform) or more")
        self.n, self.s, self._rng = n, float(s), rng
        one = np.float64(1.0)
        self._h_x1 = float(self._H(np.float64(1.5)) - one)
        self._h_n = float(self._H(np.float64(n + 0.5)))
        self._squeeze = float(2.0 - self._H_inv(self._H(np.float64(2.5)) - self._h(np.float64(2.0))))

    # H is an antiderivative of h(x) = x**-s; written with the helpers so that
    # s = 1 (log) needs no special case.
    def _H(self, x):
        lx = np.log(x)
        return _expm1_over_x((1.0 - self.s) * lx) * lx

    def _H_inv(self, u):
        t = np.maximum(u * (1.0 - self.s), -1.0)
        return np.exp(_log1p_over_x(t) * u)

    def _h(self, x):
        return np.exp(-self.s * np.log(x))

    def sample(self, size: int) -> np.ndarray:
        """`size` ranks in 1..n as int64."""
        out = np.empty(size, dtype=np.int64)
        filled = 0
        while filled < size:
            want = size - filled
            u = self._h_n + self._rng.random(want) * (self._h_x1 - self._h_n)
            x = self._H_inv(u)
            k = np.clip(np.floor(x + 0.5), 1, self.n)
            accept = (k - x <= self._squeeze) | (u >= self._H(k + 0.5) - self._h(k))
            got = k[accept].astype(np.int64)
            out[filled:filled + got.size] = got
            filled += got.size
        return out


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a cheap, well-mixing uint64 -> uint64 hash."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class KeyPermutation:
    """A seeded bijection of [0, n): 4-round balanced Feistel on 2*half bits,
    cycle-walked back into [0, n) (the domain is < 4n, so few walks)."""

    ROUNDS = 4

    def __init__(self, n: int, seed: int):
        if not 1 <= n <= MAX_KEY_SPACE:
            raise UserError(f"key space must be in 1..2**62, got {n}; pass a smaller --key-space")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._half = np.uint64((bits + 1) // 2)
        self._mask = np.uint64((1 << int(self._half)) - 1)
        base = (seed * 0x9E3779B97F4A7C15) & (2**64 - 1)
        keys = _mix64(np.array([(base + i) & (2**64 - 1) for i in range(1, self.ROUNDS + 1)], dtype=np.uint64))
        self._round_keys = [np.uint64(k) for k in keys]

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for rk in self._round_keys:
            left, right = right, left ^ (_mix64(right ^ rk) & self._mask)
        return (left << self._half) | right

    def __call__(self, ids: np.ndarray) -> np.ndarray:
        y = self._encrypt(np.asarray(ids, dtype=np.uint64))
        out_of_range = y >= np.uint64(self.n)
        while out_of_range.any():
            y[out_of_range] = self._encrypt(y[out_of_range])
            out_of_range = y >= np.uint64(self.n)
        return y


class KeySpace:
    """Key ids 0..n-1 spread evenly over ps-lite's uint64 key space, and the
    servers' key ranges over it."""

    def __init__(self, n: int, num_servers: int):
        if num_servers < 1:
            raise UserError(f"need at least 1 server, got {num_servers}; pass --servers >= 1")
        if not 1 <= n <= MAX_KEY_SPACE:
            raise UserError(f"key space must be in 1..2**62, got {n}; pass a smaller --key-space")
        self.n, self.num_servers = n, num_servers
        self.stride = K_MAX_KEY // n  # wire key = key id * stride
        if self.stride < num_servers:
            # kMaxKey - kMaxKey/M*M < M: keys above the last range would belong to no server.
            raise UserError(f"key space {n} is too large for {num_servers} servers; pass a smaller --key-space")
        step = K_MAX_KEY // num_servers
        # Python ints: the last bound is kMaxKey/M*M, which may be 2**64-1.
        self.range_bounds = [step * i for i in range(num_servers + 1)]
        self._inner_bounds = np.array(self.range_bounds[1:-1], dtype=np.uint64)

    def wire_keys(self, key_ids: np.ndarray) -> np.ndarray:
        # (n-1) * stride < n * stride <= kMaxKey: never overflows.
        return np.asarray(key_ids, dtype=np.uint64) * np.uint64(self.stride)

    def key_ids(self, wire_keys: np.ndarray) -> np.ndarray:
        return np.asarray(wire_keys, dtype=np.uint64) // np.uint64(self.stride)

    def server_id_range(self, rank: int) -> tuple[int, int]:
        """Key ids [lo, hi) whose wire keys fall in server `rank`'s key range."""
        lo = -(-self.range_bounds[rank] // self.stride)
        hi = min(self.n, -(-self.range_bounds[rank + 1] // self.stride))
        return lo, hi

    def slice_bounds(self, sorted_keys: np.ndarray) -> np.ndarray:
        """Positions p (len M+1) so that sorted_keys[p[i]:p[i+1]] is server i's
        slice (lower_bound on each range end, as ps-lite's DefaultSlicer)."""
        inner = np.searchsorted(sorted_keys, self._inner_bounds, side="left")
        return np.concatenate(([0], inner, [len(sorted_keys)])).astype(np.int64)


class KeyStream:
    """The keys of successive requests of one worker: `per_request` distinct
    keys (the first distinct ones of a Zipf draw, as a mini-batch's unique
    features), as sorted uint64 wire keys."""

    _POOL = 1 << 16

    def __init__(self, space: KeySpace, exponent: float, per_request: int, perm_seed: int, stream_seed: int):
        if not 1 <= per_request <= space.n:
            raise UserError(
                f"keys per request must be in 1..key space ({space.n}), got {per_request}; "
                "lower --keys-per-request or raise --key-space")
        self.space, self.per_request = space, per_request
        self._zipf = ZipfSampler(space.n, exponent, np.random.default_rng(stream_seed))
        self._perm = KeyPermutation(space.n, perm_seed)
        self._pool = np.empty(0, dtype=np.uint64)
        self._at = 0

    def _take(self, count: int) -> np.ndarray:
        if self._at + count > self._pool.size:
            fresh = self._perm(self._zipf.sample(max(self._POOL, count)) - 1)
            self._pool = np.concatenate((self._pool[self._at:], fresh))
            self._at = 0
        got = self._pool[self._at:self._at + count]
        self._at += count
        return got

    def next_ids(self) -> np.ndarray:
        """The next request's distinct key ids (unsorted: draw order)."""
        n = self.per_request
        chosen = np.empty(0, dtype=np.uint64)
        for _ in range(10_000):
            merged = np.concatenate((chosen, self._take(2 * (n - chosen.size) + 8)))
            uniq, first = np.unique(merged, return_index=True)
            chosen = uniq[np.argsort(first, kind="stable")][:n]
            if chosen.size == n:
                return chosen
        raise UserError(
            f"could not draw {n} distinct keys from a key space of {self.space.n} at this skew; "
            "lower --keys-per-request or --zipf-exponent, or raise --key-space")

    def next_keys(self) -> np.ndarray:
        return np.sort(self.space.wire_keys(self.next_ids()))
