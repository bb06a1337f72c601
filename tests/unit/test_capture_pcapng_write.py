"""The pcapng writer of `pslat agent --pcap` (capture/pcapng_write.py) against two readers
it does not share code with in the checks that matter: tshark (Wireshark's own reader:
interface names and descriptions, ns times, directions, comments, TCP reassembly of the
recorded stream with no "previous segment not captured") and capture/read.py (the same
records back)."""
from __future__ import annotations

import subprocess
from pathlib import Path

from capture.pcapng_write import COMMENT_BYTES_MAX, PcapngWriter
from capture.read import CaptureReader

DATA = Path(__file__).resolve().parents[1] / "data" / "capture"
LINK_ETHERNET = 1


def _records(path: Path):
    with CaptureReader(path) as r:
        out = [(ts, link, bytes(data), wire) for ts, link, data, wire in r]
        assert not r.stats.truncated_tail and not r.stats.corrupt
        return out, r.stats


def test_the_recorded_capture_rewritten_with_two_interfaces_and_comments(tmp_path):
    original, _ = _records(DATA / "h1.pcap")
    out = tmp_path / "out.pcapng"
    long_comment = "é" * COMMENT_BYTES_MAX   # 2 bytes a character: cut on a character, at the bound
    with PcapngWriter(out) as w:
        ifs = [w.interface(LINK_ETHERNET, f"h{i}", f"network namespace h{i}") for i in (0, 1)]
        for n, (ts, _link, data, wire) in enumerate(original):
            comment = long_comment if n == 0 else f"pslat: packet {n} <b>not markup</b>"
            w.packet(ifs[n % 2], ts, data, wire, comment=comment, outbound=bool(n % 3))
    back, stats = _records(out)
    assert back == original and len(stats.interfaces) == 2

    fields = ["frame.interface_name", "frame.interface_description", "frame.time_epoch",
              "frame.packet_flags_direction", "frame.comment"]
    got = subprocess.run(["tshark", "-r", str(out), "-T", "fields", "-E", "separator=\t",
                          *[a for f in fields for a in ("-e", f)]],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(got) == len(original)
    for n, (line, (ts, *_)) in enumerate(zip(got, original)):
        name, desc, epoch, direction, comment = line.split("\t")
        assert (name, desc) == (f"h{n % 2}", f"network namespace h{n % 2}")
        sec, _, frac = epoch.partition(".")
        assert int(sec) * 10**9 + int(frac.ljust(9, "0")[:9]) == ts   # exact to the ns
        assert int(direction, 0) == (2 if n % 3 else 1)
        want = ("é" * (COMMENT_BYTES_MAX // 2)) if n == 0 else f"pslat: packet {n} <b>not markup</b>"
        assert comment == want
    # the streams reassemble as in the original: no segment reported missing
    lost = subprocess.run(["tshark", "-r", str(out), "-Y", "tcp.analysis.lost_segment"],
                          capture_output=True, text=True, check=True).stdout
    assert lost == ""
