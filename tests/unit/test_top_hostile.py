"""`pslat top` against hostile agents and files (issue 11, finding 7): a local server of the
test's own on 127.0.0.1 answers each way an attacker or a broken agent might (a byte every
0.5 s, 200 MiB, `[]`, wrong types, missing fields, markup and escape sequences in names);
top must give a line saying what is wrong, draw what is valid, never raise, never hang, never
read it all, never pass markup or control sequences to the terminal."""
from __future__ import annotations

import copy
import fcntl
import io
import json
import os
import pty
import re
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from agent.snapshots import FETCH_TIMEOUT_S, MAX_SNAPSHOT_BYTES
from agent.top import fetch, render, render_text

ROOT = Path(__file__).resolve().parents[2]
SNAP = ROOT / "tests" / "data" / "live" / "psbench.snapshot.json"
HOSTILE_NAMES = ["[link=http://evil.example/]click[/link]", "x[/bold]",
                 "h\x1b[2J\x1b]8;;http://evil.example/\x07e\x1b]8;;\x07\x9b2J\r\x08"]


class Hostile:
    """A TCP server on 127.0.0.1 answering every connection with `answer(sock)` after reading the
    request's headers."""

    def __init__(self, answer):
        self.answer = answer
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.addr = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.stop.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c):
        with c:
            buf = b""
            try:
                while b"\r\n\r\n" not in buf:
                    chunk = c.recv(4096)
                    if not chunk:
                        return
                    buf += chunk
                self.answer(c, self.stop)
            except OSError:   # the client gave up on us: what the test wants
                pass

    def close(self):
        self.stop.set()
        self.sock.close()


def _json_answer(body: bytes):
    def answer(c, stop):
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                  % len(body) + body)
    return answer


def _trickle(c, stop):
    for b in b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + b" " * 10**6:
        if stop.wait(0.5):
            return
        c.send(bytes([b]))


def _huge(length_header: bool):
    def answer(c, stop):
        c.sendall(b"HTTP/1.0 200 OK\r\n" + (b"Content-Length: %d\r\n" % (200 * 2**20) if length_header else b"")
                  + b"\r\n")
        chunk = b" " * 2**20   # valid JSON whitespace: only the cap can stop a reader
        for _ in range(200):
            c.sendall(chunk)
    return answer


@pytest.fixture
def hostile():
    servers = []

    def make(answer):
        s = Hostile(answer)
        servers.append(s)
        return s
    yield make
    for s in servers:
        s.close()


def _in_thread(fn, limit_s: float):
    """fn() in a thread; (result, seconds), or an AssertionError when it is still running after limit_s."""
    out = {}

    def run():
        t0 = time.monotonic()
        out["result"] = fn()
        out["s"] = time.monotonic() - t0
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(limit_s)
    assert not th.is_alive(), f"still running after {limit_s} s"
    return out["result"], out["s"]


def test_a_trickling_agent_is_cut_at_the_fetch_deadline(hostile):
    s = hostile(_trickle)
    merged, took = _in_thread(lambda: fetch([s.addr]), FETCH_TIMEOUT_S + 8)
    assert took < FETCH_TIMEOUT_S + 0.5, took
    assert "within" in merged["agents"][0]["error"]
    assert "unreachable" in render_text(merged, 80, 24)


@pytest.mark.parametrize("length_header", [True, False])
def test_a_200_mib_answer_is_not_read_whole(hostile, length_header):
    s = hostile(_huge(length_header))
    tracemalloc.start()
    try:
        merged, took = _in_thread(lambda: fetch([s.addr], timeout_s=20), 30)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * MAX_SNAPSHOT_BYTES + 8 * 2**20, peak   # the cap and a copy of it, not 200 MiB
    assert "larger than" in merged["agents"][0]["error"], merged["agents"]


def _snap() -> dict:
    return json.loads(SNAP.read_text())


def _damaged(fn) -> bytes:
    s = _snap()
    fn(s)
    return json.dumps(s).encode()


def _set(path, value):
    def fn(s):
        obj = s
        for k in path[:-1]:
            obj = obj[k]
        if value is KeyError:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value
    return fn


NOT_A_SNAPSHOT = {
    "empty list": b"[]",
    "a string": b'"x"',
    "empty object": b"{}",
    "not json": b"{\"groups\": [",
    "nested 100k deep": b"[" * 100_000 + b"]" * 100_000,
    "bytes not utf-8": b"\xff\xfe{}",
    "other edges": _damaged(_set(["edges_ns"], [1, 2, 3])),
    "format a list": _damaged(_set(["format"], [[["x"]]])),
}

# (what is wrong, the damage, the skipped part the status line names, the group rows left of 4)
DAMAGED = [
    ("groups an object", _set(["groups"], {"a": 1}), "1 groups", 0),
    ("a group a list", _set(["groups", 0], [1, 2]), "1 groups", 3),
    ("a count a string", _set(["groups", 0, "hists", "e2e", "n"], "many"), "1 groups", 3),
    ("a bucket out of range", _set(["groups", 1, "hists", "e2e", "counts", 0], [10**6, 1]), "1 groups", 3),
    ("counts a dict", _set(["groups", 1, "hists", "e2e", "counts"], {"0": 1}), "1 groups", 3),
    ("a rate NaN", _set(["groups", 2, "rate_per_s"], float("nan")), "1 groups", 3),
    ("a rate a bool", _set(["groups", 2, "rate_per_s"], True), "1 groups", 3),
    ("a role unknown", _set(["groups", 3, "role"], "x"), "1 groups", 3),
    ("a host a number", _set(["groups", 3, "host"], 7), "1 groups", 3),
    ("no host", _set(["groups", 0, "host"], KeyError), "1 groups", 3),
    ("no hists", _set(["groups", 0, "hists"], KeyError), "1 groups", 3),
    ("no e2e", _set(["groups", 0, "hists", "e2e"], KeyError), "1 groups", 3),
    ("a component histogram wrong", _set(["groups", 0, "hists", "client_user_rx", "sum_ns"], "x"),
     "1 histograms", 4),
    ("a component unknown", _set(["groups", 0, "hists", "nonsense"], {"counts": [], "n": 0, "sum_ns": 0}),
     "1 histograms", 4),
    ("a key not a number", lambda s: s["keys"][next(iter(s["keys"]))]["top"].append(["0x1", 1]), "1 keys", 4),
    ("a key of 2^64", lambda s: s["keys"][next(iter(s["keys"]))]["top"].append([str(2**64), 1]), "1 keys", 4),
    ("keys a list", _set(["keys"], [1]), "1 keys", 4),
    ("connections open a string", lambda s: s["connections"][next(iter(s["connections"]))].update(open="x"),
     "1 connections", 4),
    ("agents ints", _set(["agents"], [1, 2]), "2 agents", 4),
    ("an agent without a name", _set(["agents", 0, "agent"], KeyError), "1 agents", 4),
    ("a sampling rate a string", _set(["agents", 0, "sampling_rate"], "all"), "1 agents", 4),
    ("lost a list", _set(["agents", 0, "lost"], [1]), "1 agents", 4),
    ("ip_hosts values ints", _set(["ip_hosts"], {"127.0.0.1": 5}), "1 ip_hosts", 4),
    ("window a string", _set(["window_s"], "10"), "1 window", 4),
]


@pytest.mark.parametrize("name", sorted(NOT_A_SNAPSHOT))
def test_what_is_no_snapshot_is_an_agent_line(hostile, name):
    s = hostile(_json_answer(NOT_A_SNAPSHOT[name]))
    merged = fetch([s.addr])
    assert merged["agents"][0]["agent"] == s.addr and "not a snapshot" in merged["agents"][0]["error"]
    assert "unreachable (not a snapshot" in render_text(merged, 80, 24)


@pytest.mark.parametrize("name,damage,said,rows", DAMAGED, ids=[d[0] for d in DAMAGED])
def test_wrong_parts_are_skipped_and_said(hostile, name, damage, said, rows):
    s = hostile(_json_answer(_damaged(damage)))
    merged = fetch([s.addr])
    text = render_text(merged, 140, 40)
    head = text.splitlines()[0]
    assert f"{s.addr}: skipped {said}" in head, head
    assert len(re.findall(r"^pslat-rec\S*\s+(cli|srv)\s", text, re.M)) == rows, text


def _named(names: list[str]) -> dict:
    s = _snap()
    for g, n in zip(s["groups"], names + names):
        g["host"] = n
    s["agents"][0]["agent"] = names[2]
    s["agents"][0]["lost"] = {names[1]: 1}
    s["keys"] = {n: s["keys"][next(iter(s["keys"]))] for n in names}
    s["connections"] = {n: s["connections"][next(iter(s["connections"]))] for n in names}
    return s


def _terminal_output(snap: dict, width: int = 140) -> str:
    from rich.console import Console
    out = io.StringIO()
    c = Console(file=out, width=width, height=40, force_terminal=True, color_system="truecolor",
                legacy_windows=False)
    c.print(render(snap, width, 40))
    return out.getvalue()


def _only_sgr(out: str) -> None:
    """The only escape sequences are rich's own colours (SGR: ESC [ ... m); no other control byte."""
    rest = re.sub(r"\x1b\[[0-9;]*m", "", out)
    bad = [ch for ch in rest if (ord(ch) < 32 and ch != "\n") or 0x7f <= ord(ch) <= 0x9f]
    assert not bad, bad[:10]


def test_markup_and_escapes_in_names_are_text(hostile):
    s = hostile(_json_answer(json.dumps(_named(HOSTILE_NAMES)).encode()))
    merged = fetch([s.addr])
    out = _terminal_output(merged)
    _only_sgr(out)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", out)
    assert "[link=http://evil.example/]click[/link]" in plain     # shown as the text it is
    assert "x[/bold]" in plain
    assert "\x1b]8" not in out and "\x1b[2J" not in out
    assert "h\ufffd[2J\ufffd]8;;http://evil.example/\ufffde" in plain   # each control a visible U+FFFD


def _cli_top(*args, timeout_s=60):
    return subprocess.run([sys.executable, "-m", "pslat.cli", "top", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout_s, env=dict(os.environ, COLUMNS="140", LINES="40"))


def test_snapshot_file_with_hostile_names_prints_no_control_bytes(tmp_path):
    f = tmp_path / "evil.json"
    f.write_text(json.dumps(_named(HOSTILE_NAMES)))
    r = _cli_top("--snapshot", str(f))
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "x[/bold]" in r.stdout


@pytest.mark.parametrize("name", ["empty list", "nested 100k deep", "other edges"])
def test_snapshot_file_that_is_no_snapshot_is_one_line_and_exit_2(tmp_path, name):
    f = tmp_path / "bad.json"
    f.write_bytes(NOT_A_SNAPSHOT[name])
    r = _cli_top("--snapshot", str(f))
    assert r.returncode == 2 and r.stderr.startswith("pslat: error: ") and len(r.stderr.splitlines()) == 1, \
        r.stderr


def test_snapshot_file_with_wrong_parts_draws_the_rest_and_says_so(tmp_path):
    f = tmp_path / "damaged.json"
    f.write_bytes(_damaged(_set(["groups", 0, "hists", "e2e", "n"], "many")))
    r = _cli_top("--snapshot", str(f))
    assert r.returncode == 0, r.stderr
    assert "skipped 1 groups" in r.stdout.splitlines()[0] and r.stdout.count("pslat-rec-13751  ") >= 3


@pytest.mark.parametrize("kind", ["fifo", "device", "huge"])
def test_snapshot_file_that_is_no_regular_file_or_too_big_is_refused(tmp_path, kind):
    f = tmp_path / "snap.json"
    if kind == "fifo":
        os.mkfifo(f)            # nobody writes: opening it for reading alone would wait for ever
    elif kind == "device":
        f.symlink_to("/dev/zero")   # endless
    else:
        with open(f, "wb") as out:
            out.truncate(MAX_SNAPSHOT_BYTES + 1)
    r = _cli_top("--snapshot", str(f), timeout_s=30)
    assert r.returncode == 2 and "cannot read it" in r.stderr, r.stderr


def test_q_quits_at_once_while_an_agent_trickles(hostile):
    """In a terminal (a pty): the screen is drawn and `q` read while every fetch trickles."""
    s = hostile(_trickle)
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    p = subprocess.Popen([sys.executable, "-m", "pslat.cli", "top", "--agent", s.addr], cwd=ROOT,
                         stdin=slave, stdout=slave, stderr=slave, env=dict(os.environ, TERM="xterm-256color"),
                         start_new_session=True)
    os.close(slave)
    screen = bytearray()
    left_screen = []   # when top gave the terminal back (left the alternate screen, rich's Live)

    def drain():
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                return
            if not chunk:
                return
            screen.extend(chunk)
            if b"\x1b[?1049l" in chunk:
                left_screen.append(time.monotonic())
    threading.Thread(target=drain, daemon=True).start()
    try:
        deadline = time.monotonic() + 30
        # the agent's line says the fetch was cut: drawn while the agent trickles
        while b"no complete answer within" not in screen:
            assert time.monotonic() < deadline and p.poll() is None, f"not drawn:\n{bytes(screen[-2000:])!r}"
            time.sleep(0.05)   # polling the screen for a condition
        t0 = time.monotonic()
        os.write(master, b"q")
        p.wait(10)
        exit_s = time.monotonic() - t0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        os.close(master)
    quit_s = left_screen[0] - t0
    # the process's exit adds the interpreter's teardown (0.3-1.2 s here on a loaded machine)
    print(f"\nq -> terminal back in {1e3 * quit_s:.0f} ms, exit in {1e3 * exit_s:.0f} ms, while the agent trickles")
    assert p.returncode == 0 and quit_s < 0.5, quit_s
