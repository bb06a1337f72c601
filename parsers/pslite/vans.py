"""Which transport ("van") a BytePS ps-lite process moves its messages with, from its
environment: only the ZMQ van goes through the kernel's TCP sockets.

From BytePS 0.2.5.post15's sdist (3rdparty/ps-lite): Postoffice::InitEnvironment
(src/postoffice.cc) creates the van named by DMLC_ENABLE_RDMA (default "zmq"), or
"ucx" when DMLC_ENABLE_UCX is a nonzero integer (it wins); Van::Create (src/van.cc)
knows "zmq" and "0" (ZMQVan), "ibverbs" and the deprecated "1" (RDMAVan: RDMA verbs),
"fabric" (FabricVan: libfabric, e.g. AWS EFA) and "ucx" (UCXVan), each built in only
with its DMLC_USE_* flag; any other name stops the process (LOG(FATAL)). RDMA and
libfabric bypass the kernel's network stack; UCX picks its transports at run time
(UCX_TLS), RDMA where it can. Either way neither socket probes nor a packet capture
see the messages: the process's traffic is not in what pslat reports.

The environment is the traced process's (/proc/PID/environ, read by the agent): text
of its owner, so values are compared, never interpreted further.
"""
from __future__ import annotations

from collections.abc import Mapping

RDMA_VARIABLE = b"DMLC_ENABLE_RDMA"
UCX_VARIABLE = b"DMLC_ENABLE_UCX"
# van name -> what it moves messages over (the names Van::Create accepts)
BYPASSING_VANS = {b"ibverbs": "RDMA verbs", b"1": "RDMA verbs", b"fabric": "libfabric",
                  b"ucx": "UCX"}


def _atoi(value: bytes) -> int:
    """C's atoi, as ps-lite's GetEnv(name, int) reads a variable: leading blanks, a
    sign, digits up to the first other byte; 0 when there are none."""
    v = value.lstrip(b" \t\n\v\f\r")
    sign = -1 if v[:1] == b"-" else 1
    if v[:1] in (b"-", b"+"):
        v = v[1:]
    n = 0
    for c in v[:20]:
        if not 0x30 <= c <= 0x39:
            break
        n = n * 10 + c - 0x30
    return sign * n


def kernel_bypass(environ: Mapping[bytes, bytes]) -> dict | None:
    """{"transport", "setting"} when a BytePS process with this environment moves its
    ps-lite messages around the kernel's sockets; None when it uses ZMQ (or is no
    BytePS process: neither variable is set)."""
    ucx = environ.get(UCX_VARIABLE)
    if ucx is not None and _atoi(ucx) != 0:
        return {"transport": "UCX", "setting": f"{UCX_VARIABLE.decode()}={_shown(ucx)}"}
    van = environ.get(RDMA_VARIABLE)
    if van is not None and van in BYPASSING_VANS:
        return {"transport": BYPASSING_VANS[van], "setting": f"{RDMA_VARIABLE.decode()}={_shown(van)}"}
    return None


def _shown(value: bytes) -> str:
    # the owner's bytes: 16 at most, printable ASCII, the rest as "?"
    return "".join(chr(c) if 0x21 <= c < 0x7F else "?" for c in value[:16])
