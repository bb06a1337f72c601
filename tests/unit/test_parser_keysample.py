"""The hash-chosen key sample (parsers/keysample.py)."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers.keysample import KeySampler, bottom_k, key_hash, sample_keys

M64 = (1 << 64) - 1


def splitmix64_finalizer(x: int) -> int:
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & M64
    return x ^ (x >> 31)


def test_hash_matches_a_scalar_reference():
    keys = [0, 1, 2, 12345, 2**63, M64] + list(np.random.default_rng(0).integers(0, M64, 200, dtype=np.uint64))
    got = key_hash(np.array(keys, dtype=np.uint64)).tolist()
    assert got == [splitmix64_finalizer(int(k)) for k in keys]


def test_sorted_keys_are_not_sampled_from_the_front():
    keys = np.arange(10_000, dtype="<u8")
    s = sample_keys(keys, 16)
    assert len(s) == 16 and s != tuple(range(16))
    assert max(s) > 5_000  # spread over the range, not the first n
    assert s == tuple(sorted(sorted(range(10_000), key=splitmix64_finalizer)[:16]))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, M64), max_size=300, unique=True), st.integers(0, 20),
       st.lists(st.integers(0, 2400), max_size=12))
def test_sample_does_not_depend_on_chunking(keys, k, cuts):
    raw = np.array(keys, dtype="<u8").tobytes()
    s = KeySampler(k)
    prev = 0
    for c in sorted(set(c % (len(raw) + 1) for c in cuts)) + [len(raw)]:
        s.add(raw[prev:c])
        prev = c
    want = tuple(sorted(sorted(keys, key=splitmix64_finalizer)[:k]))
    assert s.result() == want == bottom_k(np.array(keys, dtype="<u8"), k)
    assert s.complete


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 799), st.integers(1, 400))
def test_skip_keeps_alignment_and_marks_the_sample_partial(at, n):
    keys = list(range(1000, 1100))
    raw = np.array(keys, dtype="<u8").tobytes()
    n = min(n, len(raw) - at)
    s = KeySampler(200)
    s.add(raw[:at])
    s.skip(n)
    s.add(raw[at + n:])
    seen = set(s.result())
    # exactly the keys not touched by the lost bytes are sampled (k is large here)
    untouched = {k for i, k in enumerate(keys) if i * 8 + 8 <= at or i * 8 >= at + n}
    assert seen == untouched and not s.complete
