"""Capture files are outside data (DESIGN.md, "What the agent trusts"): a file that is no
capture, one cut short, an unknown link type, a forged length, a FIFO or a device, and
100 MB of random TCP each end in a clear sentence or a count, never a traceback, in
bounded time and memory."""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import capture_craft as cc
from capture.rundir import write_run_dir, write_run_dirs
from core.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "capture"


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pslat.cli", "report", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def test_a_file_that_is_no_capture_is_one_line(tmp_path):
    f = tmp_path / "notes.pcap"
    f.write_text("hello, not a capture\n")
    r = _cli(str(f))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "not a pcap or pcapng capture" in r.stderr and "notes.pcap" in r.stderr


@pytest.mark.parametrize("make, why", [
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: os.symlink("/dev/zero", p), "a character device"),
])
def test_only_regular_files_are_opened(tmp_path, make, why):
    f = tmp_path / "cap"
    make(f)
    with pytest.raises(UserError, match=f"not a regular file \\({why}\\)"):
        write_run_dirs([("x", f)], tmp_path / "out")


def test_a_file_cut_short_in_its_header(tmp_path):
    f = tmp_path / "short.pcap"
    f.write_bytes((DATA / "h1.pcap").read_bytes()[:10])
    meta, problems = write_run_dir("short", f, tmp_path / "rd")
    assert meta["counters"]["messages"] == 0
    assert any("ends inside a packet record" in p for p in problems)
    assert any("no TCP segment" in p for p in problems)


def test_an_unknown_link_type_is_named(tmp_path):
    data = bytearray((DATA / "h1.pcap").read_bytes())
    data[20:24] = struct.pack("<I", 147)   # LINKTYPE_USER0
    f = tmp_path / "user0.pcap"
    f.write_bytes(data)
    meta, problems = write_run_dir("u", f, tmp_path / "rd")
    assert meta["counters"]["packets_unknown_link_type"] == meta["counters"]["records"] > 200
    assert any("link type 147, which pslat does not decode" in p for p in problems)


def test_forged_lengths_stop_the_reading_and_say_where(tmp_path):
    recs = cc.read(DATA / "h1.pcap")
    good = cc.write(tmp_path / "g.pcap", recs[:50]).read_bytes()
    forged = good + struct.pack("<IIII", 1, 0, 1 << 30, 1 << 30) + b"x" * 100   # a record of 1 GiB
    f = tmp_path / "forged.pcap"
    f.write_bytes(forged)
    meta, problems = write_run_dir("f", f, tmp_path / "rd")
    assert meta["counters"]["records"] == 50
    assert any("record at byte" in p and "cannot be right" in p for p in problems)
    # pcapng: a block whose length points past the end of the file, and one of a forged size
    ng = (DATA / "h0.pcapng").read_bytes()
    for tail, what in ((struct.pack("<II", 6, 1 << 20) + b"\0" * 64, "ends inside"),
                       (struct.pack("<II", 6, 13) + b"\0" * 64, "cannot be right")):
        f.write_bytes(ng + tail)
        meta, problems = write_run_dir("n", f, tmp_path / what.replace(" ", "_"))
        assert meta["counters"]["records"] > 300 and any(what in p for p in problems), problems


def test_100_mb_of_random_tcp_is_counted_as_unrecognised_in_bounded_memory(tmp_path):
    """Random payload on 1,000 connections under random sequence numbers: no parser recognises
    it, reassembly drops what lies outside any window; the report says so. Peak RSS of the
    whole report against a report of the small real capture: the 100 MB are not held."""
    f = cc.random_tcp(tmp_path / "random.pcap", 100 * 10**6)
    probe = ("import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], capture_output=True, text=True); "
             "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); "
             "sys.stderr.write(r.stderr)")
    rss = {}
    for name, cap in (("small", DATA / "h1.pcap"), ("random", f)):
        r = subprocess.run([sys.executable, "-c", probe, sys.executable, "-m", "pslat.cli", "report", str(cap), "-o",
                            str(tmp_path / f"{name}.json")], capture_output=True, text=True, cwd=ROOT, timeout=120)
        rc, rss[name] = map(int, r.stdout.split())
        assert rc == 0 and "Traceback" not in r.stderr, r.stderr
    assert "1,000 connections (95,3" in r.stderr and "in no protocol pslat parses" in r.stderr
    assert "far outside their stream" in r.stderr
    assert rss["random"] - rss["small"] < 150 * 1024, rss   # KiB
