"""A bounded sample of the keys of one message, chosen by a hash of the key: the rule
every protocol's parser (and the kernel's walker) samples keys by.

Parameter servers send keys sorted (ps-lite, Paddle), so "the first n keys" would
always name the same corner of an embedding table; DESIGN.md asks for a hash-chosen
sample instead. We keep the
`max_keys` keys with the smallest hash (a bottom-k sample): it is a pure function
of the set of keys, so the sender's and the receiver's agents, and any chunking of
the bytes, give the same sample, and a key that is sampled in one message is
sampled in every message that carries it (useful to follow hot keys).

The hash is the splitmix64 finalizer (xor-shift/multiply mixing of a 64-bit word),
cheap enough to run in BPF as well. Keys are little-endian uint64 (ps::Key on x86,
Paddle's feature ids).
The frame is streamed: only the current sample and up to 7 bytes of a key split
across chunks are kept, never the frame.
"""
from __future__ import annotations

import numpy as np

_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)
_S30, _S27, _S31 = np.uint64(30), np.uint64(27), np.uint64(31)
KEY_BYTES = 8




def key_hash(keys: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over a uint64 array (wraps modulo 2**64, a bijection)."""
    x = keys >> _S30  # a new array: the operations below work in place on it
    x ^= keys
    x *= _C1
    x ^= x >> _S27
    x *= _C2
    x ^= x >> _S31
    return x


def bottom_k(keys: np.ndarray, k: int) -> tuple[int, ...]:
    """The k keys of `keys` with the smallest hash, sorted by key (all of them if fewer)."""
    if len(keys) > k > 0:
        keys = keys[np.argpartition(key_hash(keys), k - 1)[:k]]
    elif k <= 0:
        return ()
    return tuple(sorted(keys.tolist()))


def sample_keys(keys, max_keys: int) -> tuple[int, ...]:
    """The bottom-k sample of a whole key list at once (for tests and small frames)."""
    s = KeySampler(max_keys)
    s.add(np.asarray(keys, dtype="<u8").tobytes())
    return s.result()


class KeySampler:
    """Streams one keys frame (`add` chunks in order, `skip` bytes lost in a gap)."""

    __slots__ = ("max_keys", "complete", "_hashes", "_keys", "_carry", "_skip_bytes")

    def __init__(self, max_keys: int):
        self.max_keys = max_keys
        self.complete = True  # False once a gap hid some keys
        self._hashes: np.ndarray | None = None
        self._keys: np.ndarray | None = None
        self._carry = b""  # the start of a key split across chunks (< 8 bytes)
        self._skip_bytes = 0  # after a gap: bytes to drop to get back to a key boundary

    def add(self, data) -> None:
        mv = memoryview(data)
        if self._skip_bytes:
            drop = min(self._skip_bytes, len(mv))
            self._skip_bytes -= drop
            mv = mv[drop:]
        if self._carry:
            need = KEY_BYTES - len(self._carry)
            self._carry += bytes(mv[:need])
            mv = mv[need:]
            if len(self._carry) < KEY_BYTES:
                return
            self._merge(np.frombuffer(self._carry, dtype="<u8"))
            self._carry = b""
        whole = len(mv) - len(mv) % KEY_BYTES
        if whole:
            self._merge(np.frombuffer(mv[:whole], dtype="<u8"))
        if whole < len(mv):
            self._carry = bytes(mv[whole:])

    def skip(self, n_bytes: int) -> None:
        """`n_bytes` of the frame were lost: keys they held are not sampled."""
        if n_bytes <= 0:
            return
        self.complete = False
        position = len(self._carry) + n_bytes  # bytes past the last key boundary we reached
        self._carry = b""
        self._skip_bytes += (-position) % KEY_BYTES

    def _merge(self, keys: np.ndarray) -> None:
        k = self.max_keys
        if k <= 0:
            return
        h = key_hash(keys)
        if self._hashes is not None:
            if len(self._hashes) >= k:
                # only keys that beat the current k-th smallest hash can enter
                keep = h < self._hashes.max()
                h, keys = h[keep], keys[keep]
                if not len(h):
                    return
            h = np.concatenate((self._hashes, h))
            keys = np.concatenate((self._keys, keys))
        if len(h) > k:
            idx = np.argpartition(h, k - 1)[:k]
            h, keys = h[idx], keys[idx]
        else:
            keys = keys.copy()  # do not keep a view of the caller's buffer
        self._hashes, self._keys = h, keys

    def result(self) -> tuple[int, ...]:
        """The sampled keys, sorted by key value."""
        if self._keys is None:
            return ()
        return tuple(sorted(self._keys.tolist()))
