"""A Paddle pserver's own RPC counts, read from brpc's built-in /vars page on its port.

brpc serves its built-in HTTP services on the same port as baidu_std (Paddle's
BrpcPsServer keeps ServerOptions' defaults), so `curl http://ADDR:PORT/vars` from the
server's namespace lists its bvars, among them:
- Paddle's CostProfiler recorders (bvar::LatencyRecorder("cost_profiler", label),
  one CostTimer per handled request in BrpcPsService): cost_profiler_pserver_server_
  {pull,push}_{sparse,dense}_count, the requests of each table op the server handled;
- brpc's per-method status: rpc_server_<port>_paddle_distributed_ps_service_service_
  count, every PsService request whatever its command.

These counts come from the job itself, not from pslat: the test oracle. The page is
treated as untrusted text: only `name : integer` lines with names of the shapes above
are kept, names and sizes bounded.
"""
from __future__ import annotations

import re
import subprocess
from typing import Any

from core.errors import UserError

CURL_TIMEOUT_S = 5.0
PAGE_MAX_BYTES = 4 << 20
# Paddle's handler recorders, by the op they count
OP_RECORDERS = {
    "PS_PULL_SPARSE_TABLE": "cost_profiler_pserver_server_pull_sparse_count",
    "PS_PUSH_SPARSE_TABLE": "cost_profiler_pserver_server_push_sparse_count",
    "PS_PULL_DENSE_TABLE": "cost_profiler_pserver_server_pull_dense_count",
    "PS_PUSH_DENSE_TABLE": "cost_profiler_pserver_server_push_dense_count",
}
_KEEP = re.compile(r"^(cost_profiler_pserver_[a-z_]{1,64}_count"
                   r"|rpc_server_\d{1,5}_paddle_distributed_ps_service_service_[a-z_]{1,32})$")
_LINE = re.compile(r"^([A-Za-z0-9_]{1,160}) : (-?\d{1,19})$")


def parse_vars(page: str) -> dict[str, int]:
    """The counters we keep from a /vars page (see _KEEP), by bvar name."""
    out: dict[str, int] = {}
    for line in page[:PAGE_MAX_BYTES].splitlines():
        m = _LINE.match(line.strip())
        if m and _KEEP.match(m.group(1)):
            out[m.group(1)] = int(m.group(2))
    return out


def service_requests(bvars: dict[str, int], port: int) -> int | None:
    """Every PsService request the server took (brpc's own count for the method)."""
    return bvars.get(f"rpc_server_{port}_paddle_distributed_ps_service_service_count")


def op_counts(bvars: dict[str, int]) -> dict[str, int]:
    """Requests handled per table op, from Paddle's CostProfiler recorders."""
    return {op: bvars[name] for op, name in OP_RECORDERS.items() if name in bvars}


def read_server_vars(cluster: Any, host: Any, port: int) -> dict[str, int]:
    """curl the server's /vars from inside its host; UserError if it does not answer."""
    url = f"http://{host.addr}:{port}/vars"
    try:
        proc = cluster.run(host, ["curl", "-sS", "--max-time", str(CURL_TIMEOUT_S), url],
                           capture_output=True, timeout=CURL_TIMEOUT_S + 5)
    except subprocess.TimeoutExpired as e:
        raise UserError(f"brpc's /vars on {url} did not answer in {CURL_TIMEOUT_S:.0f} s") from e
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip()[:200]
        raise UserError(f"cannot read brpc's /vars on {url} from {host.name}: {why}")
    return parse_vars(proc.stdout[:PAGE_MAX_BYTES].decode("utf-8", "replace"))
