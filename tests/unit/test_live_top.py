"""`pslat top` drawn from saved snapshots (tests/data/live/psbench.snapshot.json, the recorded
psbench run's without the netstack probe, and netstack.snapshot.json, with every probe): golden
screens at 80x24 and 140 columns, without colour.
PSLAT_UPDATE_GOLDEN=1 rewrites the golden files (look at the diff before committing)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import UserError
from agent.live import merge_snapshots
from agent.top import _agent_addr, fetch, render_text

ROOT = Path(__file__).resolve().parents[2]
LIVE = ROOT / "tests" / "data" / "live"
SNAP = LIVE / "psbench.snapshot.json"
SNAP_NETSTACK = LIVE / "netstack.snapshot.json"
UPDATE = os.environ.get("PSLAT_UPDATE_GOLDEN") == "1"


def _golden(name: str, text: str) -> None:
    path = LIVE / name
    if UPDATE:
        path.write_text(text)
    assert text == path.read_text()


def _is_host_row(line: str) -> bool:
    return line.startswith("pslat") and not line.startswith("pslat top")


def _fits(text: str, width: int, height: int) -> None:
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= height, len(lines)
    assert max(len(x) for x in lines) <= width


def test_cli_snapshot_at_80x24():
    env = dict(os.environ, COLUMNS="80", LINES="24")
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "top", "--snapshot", str(SNAP)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    _fits(r.stdout, 80, 24)
    assert "█ host  ▓ NIC  ░ network+remote  · unsplit" in r.stdout   # the legend is whole at 80
    for word in ("pull", "push", "cli", "srv", "8.0", "hot keys", "25 open", "recorded"):
        assert word in r.stdout
    _golden("top_80x24.txt", r.stdout)


@pytest.mark.parametrize("detail", [False, True])
def test_wide_terminal_gets_more_columns_and_a_longer_bar(detail):
    snap = json.loads(SNAP.read_text())
    text = render_text(snap, 140, 40, detail=detail)
    _fits(text, 140, 40)
    assert "MEAN" in text and "pslat-rec-13751" in text     # the full host name fits at 140
    bar_chars = "u~UkKnNS·" if detail else "█▓░·"
    bars = [ln for ln in text.splitlines() if _is_host_row(ln)]
    assert len(bars) == 4 and all(sum(ln.count(c) for c in bar_chars) >= 60 for ln in bars)
    assert ("S server user" in text) == detail
    _golden(f"top_140{'_detail' if detail else ''}.txt", text)


def test_host_and_network_split_with_every_probe():
    """With the netstack probe the bar splits this host's time: the client's host part and the
    network-and-remote part (on loopback the server's time is in it), the server's all host; `d`'s
    detail names kernel, user and server parts."""
    snap = json.loads(SNAP_NETSTACK.read_text())
    text = render_text(snap, 80, 24)
    _fits(text, 80, 24)
    rows = [ln.split() for ln in text.splitlines() if _is_host_row(ln)]
    assert len(rows) == 4
    for row in rows:
        bar = row[-1]
        if row[1] == "cli":
            assert "█" in bar and "░" in bar and "·" not in bar, text
        else:
            assert set(bar) == {"█"}, text
    assert "connects 26, accepts 25, closed 56" in text
    _golden("top_80x24_netstack.txt", text)
    detail = render_text(snap, 140, 40, detail=True)
    _fits(detail, 140, 40)
    bars = [ln.split()[-1] for ln in detail.splitlines() if _is_host_row(ln)]
    assert all(set("u~KU") <= set(b) for b in bars[:2]) and all(set(b) == set("KS") for b in bars[2:]), detail
    _golden("top_140_detail_netstack.txt", detail)


def test_many_groups_fit_24_lines_with_a_more_row():
    snap = json.loads(SNAP.read_text())
    many = []
    for i in range(12):
        s = json.loads(json.dumps(snap))
        for g in s["groups"]:
            g["host"] = f"h{i}"
        s["keys"] = {f"h{i}": v for v in s["keys"].values()}
        s["connections"] = {}
        many.append(s)
    text = render_text(merge_snapshots(many), 80, 24)
    _fits(text, 80, 24)
    assert "more" in text and "12 agents" in text and "12 hosts" in text


def test_unreachable_agent_is_shown_not_fatal():
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))          # bound, never listening: connection refused
        addr = f"127.0.0.1:{s.getsockname()[1]}"
        merged = fetch([addr], timeout_s=1)
    assert merged["agents"][0]["agent"] == addr and "error" in merged["agents"][0]
    assert "unreachable" in render_text(merged, 80, 24)


def test_bad_inputs_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="HOST:PORT"):
        _agent_addr("localhost")
    bad = tmp_path / "x.json"
    bad.write_text("{}")
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "top", "--snapshot", str(bad)], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a pslat /snapshot.json" in r.stderr


def test_two_agents_of_similar_names_at_80x24_read_apart():
    """Host names are cut in the middle, never to two identical ones: pslat-rec-13751 and
    pslat-rec-23751 differ in the middle only, so the column widens until they read apart."""
    snap = json.loads(SNAP.read_text())
    other = json.loads(json.dumps(snap).replace("pslat-rec-13751", "pslat-rec-23751"))
    text = render_text(merge_snapshots([snap, other]), 80, 24)
    _fits(text, 80, 24)
    hosts = {ln.split()[0] for ln in text.splitlines() if _is_host_row(ln)}
    assert len(hosts) == 2 and all("…" in h for h in hosts), hosts
    _golden("top_80x24_two_agents.txt", text)
