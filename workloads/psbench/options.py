"""psbench's settings: the workload (identical for every process of a job) and
one node's place in the job (read from ps-lite's DMLC_* variables).

Workload is declared once, with help text, and the CLI, the launcher (which
passes it to each process as flags) and validation all read that declaration.
"""
from __future__ import annotations

import dataclasses
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from core.errors import UserError
from workloads.psbench.wire import VALUE_DTYPES

ROLES = ("scheduler", "server", "worker")


def _opt(default, help: str, **check):
    return field(default=default, metadata={"help": help, **check})


@dataclass
class Workload:
    key_space: int = _opt(1_000_000, "Number of distinct keys (embedding rows).", min=1)
    zipf_exponent: float = _opt(1.0, "Zipf exponent of key popularity (0 = uniform).", min=0.0)
    keys_per_request: int = _opt(16, "Distinct keys per push/pull request.", min=1)
    embedding_dim: int = _opt(8, "Values per key (embedding dimension).", min=1)
    dtype: str = _opt("float32", "Value type: float32 or float64.", choices=tuple(VALUE_DTYPES))
    lens: bool = _opt(True, "Send a lens frame (int32 per key) with pushes and pull responses.")
    seed: int = _opt(1, "Seed of the key permutation and key draws.", min=0)
    compute_ms: float = _opt(0.0, "Worker compute time between pull and push (closed loop).", min=0.0)
    rate: float = _opt(0.0, "Open loop: requests/s per worker (0 = closed loop).", min=0.0)
    server_delay_ms: float = _opt(0.0, "Server processing delay per request slice.", min=0.0)
    server_jitter_ms: float = _opt(0.0, "Uniform 0..J ms added to the server delay.", min=0.0)
    reconnect_every: int = _opt(0, "Worker reopens its connections to servers every K requests (0 = never).", min=0)
    duration_s: float = _opt(10.0, "Workers issue requests for this long, then the job ends.", min=0.0)
    heartbeat_interval_s: float = _opt(0.0, "Heartbeat period to the scheduler (0 = off, as ps-lite).", min=0.0)
    start_timeout_s: float = _opt(60.0, "Give up if the job has not formed within this time.", min=0.1)
    proc_name: str = _opt("", "Name every thread of every process this (comm, at most 15 bytes; "
                              "empty: psbench's own names).", max_bytes=15)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), f.metadata
            flag = "--" + f.name.replace("_", "-")
            if "min" in meta and not value >= meta["min"]:
                raise UserError(f"{flag} must be >= {meta['min']}, got {value}; pass a valid value")
            if "max_bytes" in meta and (len(value.encode()) > meta["max_bytes"] or "\n" in value or "\0" in value):
                raise UserError(f"{flag} takes at most {meta['max_bytes']} bytes and no newline or NUL, "
                                f"got {value!r}; pass a shorter name")
            if "choices" in meta and value not in meta["choices"]:
                raise UserError(f"{flag} must be one of {', '.join(meta['choices'])}, got {value!r}")
        if self.keys_per_request > self.key_space:
            raise UserError(f"--keys-per-request ({self.keys_per_request}) exceeds --key-space "
                            f"({self.key_space}); lower one or raise the other")

    @classmethod
    def from_kwargs(cls, **kw) -> "Workload":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kw) - known)
        if unknown:
            raise UserError(f"unknown psbench option(s): {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(**kw)

    def to_argv(self) -> list[str]:
        argv = []
        for f in dataclasses.fields(self):
            flag, value = f.name.replace("_", "-"), getattr(self, f.name)
            if isinstance(value, bool):
                argv.append(f"--{flag}" if value else f"--no-{flag}")
            else:
                argv += [f"--{flag}", str(value)]
        return argv


@dataclass
class NodeConfig:
    """One process's place in the job, as ps-lite reads it from DMLC_* (flags override)."""
    role: str
    root_uri: str
    root_port: int
    num_servers: int
    num_workers: int
    node_host: str
    port: int = 0
    host_id: str = ""
    out_dir: Path = Path("psbench-out")
    die_with_parent: bool = False

    @classmethod
    def resolve(cls, *, role=None, root_uri=None, root_port=None, num_servers=None, num_workers=None,
                node_host=None, port=None, host_id=None, out_dir=None, die_with_parent=False,
                env=None) -> "NodeConfig":
        env = os.environ if env is None else env

        def pick(value, var, what):
            if value is not None and value != "":
                return value
            if env.get(var):
                return env[var]
            raise UserError(f"{what} is not set; set {var} or pass --{what}")

        role = str(pick(role, "DMLC_ROLE", "role")).lower()
        if role not in ROLES:
            raise UserError(f"role must be one of {', '.join(ROLES)}, got {role!r}; fix --role or DMLC_ROLE")
        root_uri = str(pick(root_uri, "DMLC_PS_ROOT_URI", "root-uri"))
        ints = {}
        for name, value, var in (("root-port", root_port, "DMLC_PS_ROOT_PORT"),
                                 ("num-servers", num_servers, "DMLC_NUM_SERVER"),
                                 ("num-workers", num_workers, "DMLC_NUM_WORKER")):
            raw = pick(value, var, name)
            try:
                ints[name] = int(raw)
            except ValueError:
                raise UserError(f"{name} must be an integer, got {raw!r}; fix --{name} or {var}") from None
        if not 0 < ints["root-port"] < 65536:
            raise UserError(f"root port must be in 1..65535, got {ints['root-port']}; fix --root-port or DMLC_PS_ROOT_PORT")
        if ints["num-servers"] < 1 or ints["num-workers"] < 1:
            raise UserError("a job needs at least 1 server and 1 worker; fix DMLC_NUM_SERVER / DMLC_NUM_WORKER")
        if port is None:
            port = int(env.get("PORT", 0)) if role != "scheduler" else ints["root-port"]
        if role == "scheduler":
            port = ints["root-port"]
        node_host = node_host or env.get("DMLC_NODE_HOST") or _route_addr(root_uri, ints["root-port"])
        return cls(role=role, root_uri=root_uri, root_port=ints["root-port"], num_servers=ints["num-servers"],
                   num_workers=ints["num-workers"], node_host=node_host, port=int(port),
                   host_id=host_id or env.get("PSLAT_HOST_ID") or socket.gethostname(),
                   out_dir=Path(out_dir or "psbench-out"), die_with_parent=die_with_parent)


def _route_addr(root_uri: str, root_port: int) -> str:
    """The local address that routes to the scheduler (ps-lite instead guesses
    an interface). A UDP connect() picks the route and sends nothing."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((root_uri, root_port))
            return s.getsockname()[0]
    except OSError as e:
        raise UserError(f"cannot find a local address towards the scheduler {root_uri}: {e}; "
                        "set DMLC_NODE_HOST or pass --node-host") from None
