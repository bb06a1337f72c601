"""`pslat top`'s view options on the recorded snapshot (tests/data/live/psbench.snapshot.json):
--sort orders the rows, --op/--host keep some, --interval/--count/--once and plain text blocks
when the output is not a terminal; `top --agent ... --once` into a pipe against a served
snapshot (golden)."""
from __future__ import annotations

import http.server
import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.live import merge_snapshots, quantile_ns
from agent.top import View, keep_rows, plain_loop, render_text

ROOT = Path(__file__).resolve().parents[2]
LIVE = ROOT / "tests" / "data" / "live"
SNAP = LIVE / "psbench.snapshot.json"
UPDATE = os.environ.get("PSLAT_UPDATE_GOLDEN") == "1"
ANSI = re.compile(r"\x1b\[")


def _snap() -> dict:
    return merge_snapshots([json.loads(SNAP.read_text())])


def _rows(text: str) -> list[list[str]]:
    # the table's rows: a host, then cli/srv (the sections below name hosts too)
    return [w for w in (line.split() for line in text.splitlines()) if len(w) > 2 and w[1] in ("cli", "srv")]


def _p99_us(g: dict) -> float:
    return quantile_ns({int(i): c for i, c in g["hists"]["e2e"]["counts"]}, 0.99)


def test_sort_by_p99_puts_the_slowest_rows_first():
    snap = _snap()
    text = render_text(snap, 140, 60, sort="p99")
    rows = _rows(text)
    want = sorted(snap["groups"], key=lambda g: (-_p99_us(g), g["host"], g["role"], g["op"]))
    assert [(r[0], r[2]) for r in rows] == [(g["host"], g["op"]) for g in want][:len(rows)] and len(rows) >= 4


def test_op_and_host_keep_their_rows():
    snap = _snap()
    host = snap["groups"][0]["host"]
    kept = keep_rows(snap, ops=("pull",), hosts=(host,))
    assert kept["groups"] and all(g["op"] == "pull" and g["host"] == host for g in kept["groups"])
    assert len(kept["groups"]) < len(snap["groups"])
    assert {r[2] for r in _rows(render_text(kept, 140, 60))} == {"pull"}


def test_plain_blocks_to_a_pipe():
    out = io.StringIO()     # not a tty
    calls = []

    def get():
        calls.append(1)
        return _snap()
    plain_loop(get, View(interval_s=0.05, count=3), out=out)
    text = out.getvalue()
    blocks = text.split("\n\n")
    assert len(calls) == 3 and len(blocks) == 3 and not ANSI.search(text)
    for b in blocks:
        stamp, head = b.splitlines()[:2]
        assert re.fullmatch(r"\d\d:\d\d:\d\d", stamp) and head.startswith("pslat top")
        assert len(_rows(b)) == len(_snap()["groups"])   # a block is not cut to a screen


@pytest.mark.parametrize("bad, why", [(["--interval", "0"], "--interval"), (["--count", "0"], "--count"),
                                      (["--once", "--count", "2"], "--once"), (["--sort", "size"], "--sort")])
def test_bad_view_options_are_one_line(bad, why):
    r = subprocess.run([sys.executable, "-m", "pslat.cli", "top", "--snapshot", str(SNAP), *bad], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith(f"pslat: error: {why}") and len(r.stderr.splitlines()) == 1


class _Serve(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *a):
        pass


def test_once_into_a_pipe_against_a_served_snapshot():
    _Serve.body = SNAP.read_bytes()
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Serve)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        r = subprocess.run([sys.executable, "-m", "pslat.cli", "top", "--agent", f"127.0.0.1:{srv.server_port}",
                            "--once", "--interval", "0.5"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    finally:
        srv.shutdown()
    assert r.returncode == 0, r.stderr
    stamp, rest = r.stdout.split("\n", 1)
    assert re.fullmatch(r"\d\d:\d\d:\d\d", stamp) and not ANSI.search(r.stdout)
    # the agent's line names where it was fetched from: the port differs per run
    rest = rest.replace(f"127.0.0.1:{srv.server_port}", "127.0.0.1:PORT")
    path = LIVE / "top_once_pipe.txt"
    if UPDATE:
        path.write_text(rest)
    assert rest == path.read_text()
