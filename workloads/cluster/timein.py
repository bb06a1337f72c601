"""The wire's time in at the sending host's driver handoff, not at the forwarder's softirq.

The forwarder's time in is the kernel's receive timestamp of the frame. The
kernel takes it when the sending veth hands the frame to the wire namespace
(netif_rx) only if the frame carries no timestamp yet; TCP's frames carry
their departure time (EDT, a monotonic delivery time, which veth keeps across
namespaces), and the receive timestamp is then taken when the wire
namespace's softirq hands the frame to the forwarder's socket. That softirq
waits for a CPU like any task: on the 2-vCPU test machines the forwarder's log
then missed 16 us (median) to 600 us of each frame's time on the wire, which
the tests' accuracy bounds counted as the agent's error.

So every host's veth gets a tc egress program that clears the delivery time
(bpf_skb_set_tstamp(skb, 0, UNSPEC)). It runs before the driver handoff and
changes nothing the agent reads (its probes stamp with bpf_ktime_get_ns) nor
what TCP does (pacing reads the socket's own clock, and veth has no fq).
"""
from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from core.errors import UserError
from . import netns

_PROGRAM = r"""
#include <uapi/linux/bpf.h>
#include <uapi/linux/pkt_cls.h>

int clear_delivery_time(struct __sk_buff *skb)
{
	bpf_skb_set_tstamp(skb, 0, BPF_SKB_TSTAMP_UNSPEC);
	return TC_ACT_OK;
}
"""


def clear_delivery_time(devices: list[tuple[str, str]]) -> None:
    """Attach the program at the egress of each (netns, device)."""
    # the distro's bcc (system site-packages); only the cluster's set-up needs it
    from bcc import BPF
    from bcc.libbcc import lib

    bpf = BPF(text=_PROGRAM)
    fn = bpf.load_func("clear_delivery_time", BPF.SCHED_CLS)
    tc = netns.tool("tc")
    # tc takes a program by a pinned path: a private bpffs, gone once every filter holds it
    with tempfile.TemporaryDirectory(prefix="pslat-bpffs-") as d:
        subprocess.run(["mount", "-t", "bpf", "bpf", d], check=True, capture_output=True)
        try:
            pin = Path(d) / "clear_delivery_time"
            if lib.bpf_obj_pin(fn.fd, str(pin).encode()) != 0:
                raise UserError(f"cannot pin the cluster's tc program at {pin}")
            for ns, dev in devices:
                netns.run(netns.in_ns(ns, [tc, "qdisc", "add", "dev", dev, "clsact"]))
                netns.run(netns.in_ns(ns, [tc, "filter", "add", "dev", dev, "egress", "bpf",
                                           "direct-action", "object-pinned", str(pin)]))
        finally:
            subprocess.run(["umount", d], capture_output=True)
    bpf.cleanup()
