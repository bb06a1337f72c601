"""The stream decoder's fast way for calls the kernel walked whole (agent/calls.py
whole_messages, parsers/pslite/walked.py) on live traffic it was not tuned on: psbench
with 400 keys per request (slices of about 200 keys: the walker samples them by hash,
so the parser samples what it kept) and 64 values per key (pushes and pull answers of
about 50 KB, over several calls each), recorded by a real agent. Replayed with and
without the fast way, every table and counter is the same, and the fast way took the
calls that held whole messages."""
from __future__ import annotations

import pytest
from walked_tables import assert_same_tables, replayed_tables

pytestmark = pytest.mark.privileged

PSBENCH = ["--servers", "2", "--workers", "2", "--duration-s", "2", "--rate", "100",
           "--keys-per-request", "400", "--key-space", "100000", "--embedding-dim", "64"]


def test_walked_calls_give_the_tables_of_the_stream_view_on_sampled_keys_and_large_messages(tmp_path):
    from bench.consumer import record

    rec = tmp_path / "live.rec"
    record(rec, PSBENCH, out=tmp_path / "agent", psbench_out=tmp_path / "ps")
    slow, _ = replayed_tables(rec, tmp_path / "slow", walked=False)
    fast, p_fast = replayed_tables(rec, tmp_path / "fast", walked=True)
    assert_same_tables(slow, fast)
    messages = [df for (host, table), df in slow.items() if table == "messages"]
    assert sum(map(len, messages)) > 1000
    sampled = pd_any(messages, lambda df: (df["key_sample_complete"] == "False") & (df["num_keys"].astype(int) > 16))
    assert sampled > 200   # requests whose keys the walker sampled
    large = pd_any(messages, lambda df: df["msg_bytes"].astype(int) > 16384)
    assert large > 200     # messages over several calls
    # most calls here are inside a large message (614 of 5,145 were whole in one run):
    # the pull requests and push answers, each in one call
    assert p_fast.decoder.calls_walked_whole > 400


def pd_any(frames, pick) -> int:
    return sum(int(pick(df).sum()) for df in frames)
