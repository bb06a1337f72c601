"""Calls the kernel walked whole go to the ps-lite parser without a stream view
(agent/calls.py whole_messages, parsers/pslite/walked.py): on recorded traffic, every
table and counter is the same as through the view, and most calls went that way."""
from __future__ import annotations

from pathlib import Path

import pytest

from walked_tables import assert_same_tables, replayed_tables

DATA = Path(__file__).resolve().parents[1] / "data" / "agent"


@pytest.mark.parametrize("name", ["psbench.rec.gz", "netstack.rec.gz"])
def test_walked_calls_give_the_tables_of_the_stream_view(name, tmp_path):
    slow, p_slow = replayed_tables(DATA / name, tmp_path / "slow", walked=False)
    fast, p_fast = replayed_tables(DATA / name, tmp_path / "fast", walked=True)
    assert_same_tables(slow, fast)
    assert sum(len(v) for k, v in slow.items() if k[1] == "messages") > 300
    assert p_slow.decoder.calls_walked_whole == 0
    # these 2 s recordings are mostly start-up: greetings, commands and each direction's
    # first message (which fixes its meta variant) go through the view (in 30 s of steady
    # state, bench/data/production-30s.rec.gz, 46,650 of 47,296 calls took the fast way)
    assert p_fast.decoder.calls_walked_whole > 0.4 * p_fast.decoder.calls
