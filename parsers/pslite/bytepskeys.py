"""BytePS's keys: what a wire key says of the tensor it belongs to.

BytePS 0.2.5.post15 (its sdist's byteps/common):
- operations.cc, InitTensor: a tensor's partitions get the keys
  `declared_key << 16`, `+ 1`, ... (its comment: up to 2^16 tensors of up to 2^16
  partitions each, and at most 2^16 servers);
- global.cc, BytePSGlobal::EncodeDefaultKey: each such key goes to one server, and
  the key on the wire is `krs[server].begin() + key`, one key per message;
- 3rdparty/ps-lite/src/postoffice.cc, Postoffice::GetServerKeyRanges: server i of N
  holds [kMaxKey / N * i, kMaxKey / N * (i + 1)), kMaxKey = 2^64 - 1;
- byteps/server/server.h, DecodeKey: the server takes its range's begin off again.

So the declared key and partition are `(wire - begin) >> 16` and its low 16 bits,
where begin needs the server's rank and the job's server count N. Neither is in a
worker's request: a request's key is decoded here only where that does not matter,
below 2^32 (BytePS's offsets are below 2^32 and server i > 0 begins at or above
kMaxKey / 2^16 > 2^47, so such a key is in server 0's range, which begins at 0 for
every N). A message that names its sending server (a response, by its sender-id
frame) gives the rank i; then N is the one count with an offset below 2^32 (for
N <= 2^16 the begins of consecutive counts differ by more than 2^32 / i), or none.

The arithmetic is BytePS's core's: a ps-lite application of its own on the fork
chooses its keys itself (the fork's tests/test_benchmark.cc sends `begin + index`),
and its "declared key" and partition are then that index's high and low 16 bits.
"""
from __future__ import annotations

KEY_MAX = 2**64 - 1          # ps::kMaxKey
OFFSET_LIMIT = 1 << 32       # declared key (< 2^16) << 16 | partition (< 2^16)
SERVERS_MAX = 1 << 16
PARTITION_BITS = 16


def server_rank(node_id: int | None) -> int | None:
    """ps::Postoffice::IDtoRank of a server's node id (8 + 2 * rank), else None."""
    if node_id is None or node_id < 8 or node_id % 2:
        return None
    return (node_id - 8) // 2


def range_begin(key: int, rank: int | None) -> int | None:
    """The begin of the server range that holds `key` (module docstring), or None when
    the key alone cannot tell it."""
    if not 0 <= key <= KEY_MAX:
        return None
    if key < OFFSET_LIMIT:
        return 0
    if not rank:
        return None
    # begin = (KEY_MAX // n) * rank <= key: n is near KEY_MAX * rank / key
    approx = KEY_MAX * rank // key
    for n in range(max(rank + 1, approx - 1), min(SERVERS_MAX, approx + 2) + 1):
        begin = KEY_MAX // n * rank
        if 0 <= key - begin < OFFSET_LIMIT:
            return begin
    return None


def split_key(key: int, rank: int | None = None) -> tuple[int, int] | None:
    """(declared key, partition) of a wire key, None where it is not determined."""
    begin = range_begin(key, rank)
    if begin is None:
        return None
    offset = key - begin
    return offset >> PARTITION_BITS, offset & ((1 << PARTITION_BITS) - 1)
