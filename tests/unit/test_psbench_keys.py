"""psbench keys: the Zipf sampler against the exact pmf, the permutation, and
ps-lite's slicing by server key range."""
import numpy as np
import pytest

from core.errors import UserError
from workloads.psbench.keys import K_MAX_KEY, KeyPermutation, KeySpace, KeyStream, ZipfSampler


@pytest.mark.parametrize("s", [0.0, 0.6, 1.0, 1.3, 2.5])
def test_zipf_matches_exact_pmf(s):
    n, draws = 200, 300_000
    z = ZipfSampler(n, s, np.random.default_rng(11))
    ranks = z.sample(draws)
    assert ranks.min() >= 1 and ranks.max() <= n
    freq = np.bincount(ranks, minlength=n + 1)[1:] / draws
    w = np.arange(1, n + 1, dtype=np.float64) ** -s
    p = w / w.sum()  # the exact bounded-Zipf pmf
    # Each frequency within 5 standard errors of its probability.
    se = np.sqrt(p * (1 - p) / draws)
    assert np.all(np.abs(freq - p) <= 5 * se + 1e-12), np.max(np.abs(freq - p) / (se + 1e-12))


def test_zipf_huge_key_space_stays_in_range():
    z = ZipfSampler(2**62, 1.1, np.random.default_rng(3))
    r = z.sample(10_000)
    assert r.min() >= 1 and r.max() <= 2**62
    assert (r == 1).mean() > 0.05  # still heavy at the head


def test_zipf_rejects_bad_parameters():
    with pytest.raises(UserError):
        ZipfSampler(0, 1.0, np.random.default_rng())
    with pytest.raises(UserError):
        ZipfSampler(10, -0.5, np.random.default_rng())


@pytest.mark.parametrize("n", [1, 2, 3, 17, 1000, 4096, 5000])
def test_permutation_is_a_seeded_bijection(n):
    p = KeyPermutation(n, seed=5)
    y = p(np.arange(n))
    assert sorted(y.tolist()) == list(range(n))
    assert np.array_equal(y, KeyPermutation(n, seed=5)(np.arange(n)))
    if n >= 1000:
        assert not np.array_equal(y, KeyPermutation(n, seed=6)(np.arange(n)))
        assert not np.array_equal(y, np.arange(n))


def test_hot_keys_spread_over_servers():
    n, servers = 1_000_000, 4
    space = KeySpace(n, servers)
    hot = space.wire_keys(KeyPermutation(n, seed=1)(np.arange(400)))  # the 400 hottest ranks
    owner = np.searchsorted(np.array(space.range_bounds[1:-1], dtype=np.uint64), hot, side="right")
    counts = np.bincount(owner, minlength=servers)
    assert counts.min() >= 60, counts  # ~100 each; contiguous ranks would give 400, 0, 0, 0


def _naive_slices(keys, bounds):
    """ps-lite's DefaultSlicer rule, written out key by key."""
    out = [[] for _ in range(len(bounds) - 1)]
    for k in keys.tolist():
        for i in range(len(bounds) - 1):
            if bounds[i] <= k < bounds[i + 1]:
                out[i].append(k)
    return out


@pytest.mark.parametrize("servers", [1, 2, 3, 7])
def test_slicing_matches_key_ranges(servers):
    space = KeySpace(10_000, servers)
    assert space.range_bounds[0] == 0 and space.range_bounds[-1] == K_MAX_KEY // servers * servers
    stream = KeyStream(space, 1.0, 64, perm_seed=1, stream_seed=2)
    for _ in range(20):
        keys = stream.next_keys()
        pos = space.slice_bounds(keys)
        assert [keys[pos[i]:pos[i + 1]].tolist() for i in range(servers)] == _naive_slices(keys, space.range_bounds)


@pytest.mark.parametrize("servers", [1, 2, 3])
def test_server_id_ranges_partition_the_key_ids(servers):
    n = 1001
    space = KeySpace(n, servers)
    ranges = [space.server_id_range(r) for r in range(servers)]
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(ranges[i][1] == ranges[i + 1][0] for i in range(servers - 1))
    ids = np.arange(n)
    pos = space.slice_bounds(space.wire_keys(ids))
    assert [(int(pos[i]), int(pos[i + 1])) for i in range(servers)] == ranges


def test_key_stream_draws_distinct_sorted_keys():
    space = KeySpace(50, 2)
    stream = KeyStream(space, 1.5, 40, perm_seed=1, stream_seed=9)  # heavy skew, 40 of 50 keys
    for _ in range(10):
        k = stream.next_keys()
        assert k.size == 40 and np.all(np.diff(k.astype(np.float64)) > 0)
        assert np.all(k % np.uint64(space.stride) == 0)


def test_key_stream_is_reproducible_per_seed():
    space = KeySpace(100_000, 2)
    a = KeyStream(space, 1.0, 8, 1, 7).next_keys()
    b = KeyStream(space, 1.0, 8, 1, 7).next_keys()
    c = KeyStream(space, 1.0, 8, 1, 8).next_keys()
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_bad_sizes_are_user_errors():
    with pytest.raises(UserError):
        KeyStream(KeySpace(10, 1), 1.0, 11, 1, 1)
    with pytest.raises(UserError):
        KeySpace(10, 0)
    with pytest.raises(UserError):
        KeySpace(2**62, 8)  # too few wire keys per key id for 8 ranges
