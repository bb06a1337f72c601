"""Key skew from the agents' key samples (PAPER.md question 4).

What the agent keeps: for each request message, the keys of its keys frame with
the k smallest hashes (a bottom-k sample, k = 16; all keys when the message has
k or fewer; parsers/keysample.py). A key is in a message's sample iff
its hash is at most that message's threshold tau (the k-th smallest hash of the
message's keys; unbounded when every key was kept). Hashes do not depend on how
often a key is used, so:

- per key: count(x) ~= seen(x) / cover(h(x)), where cover(h) is the share of
  sampled messages whose tau >= h: the messages that would have shown x had they
  carried it (unbiased when carrying x is independent of the other keys' hashes);
  keys with a small hash are seen almost every time they are used;
- the keys whose hash is below T, the largest hash still covered by at least
  COVER_MIN of the messages, are a uniform random subset of the key space (a
  fraction p = T / 2**64) with nearly exact counts: ranks and shares over the
  whole key space are estimated from it (the i-th hottest of the subset stands
  at rank ~ i / p), as the number of distinct keys used (|subset| / p);
- the hottest keys themselves (for in-network aggregation) are ranked over all
  keys that can be estimated: covered by MIN_COVER_MSGS messages, or seen
  MIN_SEEN times (a hot key with a large hash is seen rarely, each sighting
  standing for 1/cover updates: relative error ~ 1/sqrt(seen)).
When every message's keys fit in its sample, all of this is exact (p = 1).

In-network aggregation of key x (a switch sums the pushes of x from the W_x
workers that push it, as Libra does) turns W_x updates into one: the server
receives count(x) / W_x of them. The share of push bytes removed by aggregating
the top-k keys is sum over them of count(x) (1 - 1/W_x) bytes_per_key over all
push bytes: an upper bound, reached when each round's pushes of a key meet at
the switch (synchronous training); asynchronous pushes that miss each other
save less.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from parsers.protocol import key_text
from parsers.keysample import key_hash
from reports.load import release_memory, system_allocator

COVER_MIN = 0.5
MIN_COVER_MSGS = 30
MIN_SEEN = 10
AGG_K = (1, 10, 100, 1000, 10_000)
RANK_POINTS = 300            # points of the rank-frequency curve (log-spaced ranks)
KEY_BYTES = 8
COLUMNS = ["host_id", "direction", "request", "control", "op", "sender", "num_keys", "key_sample",
           "key_sample_complete", "value_bytes", "msg_bytes", "local_ip", "remote_ip"]
_U64 = float(2**64)


def request_messages(t: pa.Table) -> pa.ChunkedArray:
    """Rows of each request message once (a mask): its sender's row (tx), else its receiver's
    (rx) when the sender's host was not traced (its address is no traced host's). A mask
    rather than the rows: the key samples are copied once, by each op's filter."""
    data = pc.fill_null(pc.and_(pc.equal(t["control"], False), pc.equal(t["request"], True)), False)
    traced = pc.unique(t["local_ip"].filter(data).cast(pa.string()))
    direction = t["direction"].cast(pa.string())
    tx = pc.equal(direction, "tx")
    rx_untraced = pc.and_(pc.equal(direction, "rx"),
                          pc.invert(pc.is_in(t["remote_ip"].cast(pa.string()), value_set=traced)))
    return pc.and_(data, pc.fill_null(pc.or_(tx, rx_untraced), False))


def _thresholds(offsets: np.ndarray, hashes: np.ndarray, num_keys: np.ndarray) -> np.ndarray:
    """tau per message: the largest hash of its sample when keys were left out, else inf."""
    sizes = np.diff(offsets)
    tau = np.full(len(sizes), np.inf)
    has = sizes > 0
    if hashes.size:
        mx = np.maximum.reduceat(hashes.astype(np.float64), np.minimum(offsets[:-1], len(hashes) - 1))
        part = has & (num_keys > sizes)
        tau[part] = mx[part]
    tau[~has & (num_keys > 0)] = -1.0      # keys but an empty sample: covers nothing
    return tau


def op_skew(t: pa.Table) -> dict[str, Any] | None:
    """The skew of one op's request messages (see the module docstring)."""
    n_all = len(t)
    if n_all == 0:
        return None
    total_bytes = float(pc.sum(t["msg_bytes"]).as_py() or 0)
    value_bytes = float(pc.sum(t["value_bytes"]).as_py() or 0)
    keys_all = float(pc.sum(t["num_keys"]).as_py() or 0)
    # a message whose keys frame was not seen has an empty sample: not sampled
    ok = pc.and_(pc.and_(pc.fill_null(t["key_sample_complete"], False), pc.greater(pc.fill_null(t["num_keys"], 0), 0)),
                 pc.greater(pc.fill_null(pc.list_value_length(t["key_sample"]), 0), 0))
    s = t.filter(ok)
    m = len(s)
    out: dict[str, Any] = {"messages": n_all, "messages_sampled": m, "keys_per_message": keys_all / n_all,
                           "push_bytes": total_bytes,
                           "bytes_per_key": (value_bytes / keys_all + KEY_BYTES) if keys_all else None}
    if m == 0:
        out["why_none"] = "no message carried a key sample"
        return out
    lists = s["key_sample"].combine_chunks()
    offsets = lists.offsets.to_numpy()
    keys = lists.values.to_numpy(zero_copy_only=False).astype(np.uint64)
    num_keys = s["num_keys"].to_numpy(zero_copy_only=False).astype(np.int64)
    sender = s["sender"].to_numpy(zero_copy_only=False)
    hashes = key_hash(keys)
    tau = _thresholds(offsets, hashes, num_keys)
    out["exact"] = bool(np.isinf(tau).all())
    tau_sorted = np.sort(tau)

    def cover(h: np.ndarray) -> np.ndarray:   # share of messages whose tau >= h
        return (m - np.searchsorted(tau_sorted, h, side="left")) / m

    # factorize (hashing) rather than np.unique (sorting 16 keys per message): the same sorted keys
    inv, uk = pd.factorize(keys, sort=True)
    seen = np.bincount(inv, minlength=len(uk))
    uh = key_hash(uk).astype(np.float64)
    cov = cover(uh)
    est = np.where(cov > 0, seen / np.maximum(cov, 1e-300), 0.0) * (n_all / m)
    # workers per key: distinct (key, sender) pairs
    snd = np.repeat(np.nan_to_num(sender.astype(np.float64), nan=-1).astype(np.int64), np.diff(offsets))
    snd_codes = pd.factorize(snd, sort=True)[0]
    pairs = pd.unique(inv.astype(np.int64) * (int(snd_codes.max(initial=0)) + 1) + snd_codes)
    workers = np.bincount(pairs // (int(snd_codes.max(initial=0)) + 1), minlength=len(uk))
    # the uniform subset: hashes covered by at least COVER_MIN of the messages
    finite = tau_sorted[np.isfinite(tau_sorted)]
    if len(finite) == 0 or finite.min() >= _U64:
        t_hash = _U64
    else:
        q = np.quantile(tau_sorted, 1 - COVER_MIN)   # COVER_MIN of the taus are >= q
        t_hash = min(q, _U64) if np.isfinite(q) else _U64
    p = t_hash / _U64
    in_u = uh <= t_hash
    cu = np.sort(est[in_u])[::-1]
    out.update({"subset_fraction": float(p), "subset_keys": int(in_u.sum()),
                "distinct_keys_est": float(in_u.sum() / p) if p > 0 else None})
    out.update(_shares(cu))
    out.update(_zipf(cu, p))
    out["rank_freq"] = _rank_curve(cu, p)
    # estimable: enough messages could show it, or it was seen often (a hot key whose hash is
    # large shows up rarely, but each sighting stands for 1/cover updates)
    reliable = (cov * m >= MIN_COVER_MSGS) | (seen >= MIN_SEEN)
    order = np.argsort(-est * reliable, kind="stable")[:int(reliable.sum())]
    out["hot_keys"] = [{"key": key_text(uk[i]), "updates": float(est[i]), "workers": int(workers[i])}
                       for i in order[:10]]
    out["hot_keys_reliable"] = int(reliable.sum())
    out["aggregation"] = _aggregation(est[order], workers[order], out["bytes_per_key"], total_bytes)
    return out


def _shares(cu: np.ndarray) -> dict[str, Any]:
    tot = cu.sum()
    out: dict[str, Any] = {}
    for name, frac, need in (("top1_share", 0.01, 100), ("top10_share", 0.10, 10)):
        if len(cu) < need or tot <= 0:
            out[name] = None        # fewer keys than it takes for this share to mean anything
        else:
            out[name] = float(cu[:math.ceil(frac * len(cu))].sum() / tot)
    return out


def _zipf(cu: np.ndarray, p: float) -> dict[str, Any]:
    """Least squares of log count on log rank over the head (counts >= 5, where sampling
    noise is small), at log-spaced ranks so that the long tail does not outvote the head."""
    head = cu[cu >= 5]
    if len(head) < 5:
        return {"zipf_s": None, "zipf_ranks": None}
    idx = np.unique(np.geomspace(1, len(head), num=min(60, len(head))).astype(np.int64)) - 1
    x = np.log((idx + 1) / p)
    y = np.log(head[idx])
    slope = np.polyfit(x, y, 1)[0]
    return {"zipf_s": float(-slope), "zipf_ranks": [float(1 / p), float(len(head) / p)]}


def _rank_curve(cu: np.ndarray, p: float) -> dict[str, list]:
    if len(cu) == 0:
        return {"rank": [], "updates": []}
    idx = np.unique(np.geomspace(1, len(cu), num=min(RANK_POINTS, len(cu))).astype(np.int64)) - 1
    return {"rank": [round(float((i + 1) / p), 3) for i in idx], "updates": [round(float(cu[i]), 3) for i in idx]}


def _aggregation(est: np.ndarray, workers: np.ndarray, bytes_per_key, total_bytes: float) -> list[dict]:
    if not bytes_per_key or total_bytes <= 0 or len(est) == 0:
        return []
    saved = np.cumsum(est * (1 - 1 / np.maximum(workers, 1)) * bytes_per_key)
    return [{"k": k, "share_removed": float(min(saved[min(k, len(est)) - 1] / total_bytes, 1.0)),
             "keys_available": int(len(est))} for k in AGG_K if k <= len(est) or k == AGG_K[0]]


def key_skew(ctx) -> dict[str, Any]:
    """{"push": ..., "pull": ...} (op_skew) from the run dirs' key samples; {"why_none": ...}
    when no request message carried any."""
    with system_allocator():   # the shards' buffers given back once done (see reports.load)
        try:
            return _key_skew(ctx)
        finally:
            release_memory()


def _key_skew(ctx) -> dict[str, Any]:
    rows, parts = 0, []
    for shard in ctx.shards("messages", COLUMNS, dictionary=("host_id", "direction", "op", "local_ip", "remote_ip")):
        # only data request messages can count (a quarter of the rows): the key samples of the
        # others are not kept while the rest is read
        rows += len(shard)
        data = pc.and_(pc.equal(shard["control"].cast(pa.bool_()), False),
                       pc.equal(shard["request"].cast(pa.bool_()), True))
        parts.append(shard.filter(pc.fill_null(data, False)))
    if rows == 0:
        return {"why_none": "no run dir with messages"}
    t = pa.concat_tables(parts, promote_options="permissive")
    del parts
    mine = request_messages(t)
    out: dict[str, Any] = {}
    for op in ("push", "pull"):
        o = op_skew(t.filter(pc.and_(mine, pc.fill_null(pc.equal(t["op"].cast(pa.string()), op), False))))
        if o is not None:
            out[op] = o
    if not out:
        out["why_none"] = "no push or pull request messages"
    elif all((o.get("messages_sampled", 0) == 0) for o in out.values() if isinstance(o, dict)):
        out["why_none"] = "no request message carried a key sample (keys frame not seen)"
    return out
