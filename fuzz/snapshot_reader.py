"""Fuzz target: `pslat top`'s reader of a snapshot from outside (agent.snapshots.read_snapshot)
and its renderer, on mutated /snapshot.json bytes.

An input is the bytes of an HTTP body or a saved file: parsed, validated, merged as
`top --agent` merges agents, and drawn at 80x24 (odd lengths: the detail view at 140x40).
The one refusal meant is SnapshotError (no snapshot at all); wrong parts are skipped. The
drawn screen must hold no control character: a name from outside never reaches the
terminal as an escape sequence. Seeds leave out the 57 histogram edges and the target puts
them back into an object that lacks them, so mutations go to the fields, not to a list
whose every change is refused whole (inputs that carry edges of their own are read as they are)."""
from __future__ import annotations

import json
from pathlib import Path

from agent.live import EDGES_NS, merge_snapshots
from agent.snapshots import SnapshotError, parse_json, read_snapshot, skipped_text
from agent.top import render_text

KIND = "reader"
_DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "live"


def seeds() -> list[bytes]:
    """Each recorded snapshot cut to one group with two histograms and two keys (compact: under
    the 2 KiB inputs `make fuzz` gives atheris), so most mutants still pass the format checks."""
    out = []
    for path in sorted(_DATA.glob("*.snapshot.json")):
        snap = json.loads(path.read_text())
        host = next(iter(snap["keys"]))
        for g in snap["groups"]:
            g = dict(g, hists={c: g["hists"][c] for c in sorted(g["hists"])[:2] if c != "e2e"}
                     | {"e2e": g["hists"]["e2e"]})
            small = dict(snap, groups=[g], keys={host: dict(snap["keys"][host], top=snap["keys"][host]["top"][:2])})
            del small["edges_ns"]
            out.append(json.dumps(small, separators=(",", ":")).encode())
    return out


def one_input(data: bytes) -> None:
    try:
        value = parse_json(data)
        if type(value) is dict and "edges_ns" not in value:
            value["edges_ns"] = EDGES_NS
        snap, skipped = read_snapshot(value)
    except SnapshotError:
        return
    view = dict(merge_snapshots([snap]), problems=[skipped_text(skipped)] if skipped else [])
    width, height, detail = (140, 40, True) if len(data) % 2 else (80, 24, False)
    text = render_text(view, width, height, detail)
    bad = [ch for ch in text if (ord(ch) < 32 and ch != "\n") or 0x7f <= ord(ch) <= 0x9f]
    assert not bad, bad[:5]
