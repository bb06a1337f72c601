"""The agent detaches the read/write family's hooks while the traced TCP traffic does not use
them, and attaches them again for a process that does (agent/callhooks.py).

In a namespace of our own: a pyzmq DEALER sends ps-lite messages to a ROUTER (libzmq moves
TCP bytes with sendto and recvfrom), traced by `pslat agent` with a 2 s quiet window. Once it
says it detached the read, write, readv and writev hooks, a new process pair moves bytes
over TCP with os.write and os.read only. Their connection must be in the streams table with
every byte each way, the number the peers counted themselves: the new process made the agent
attach the hooks again before it sent. The ps-lite messages are all found, and meta.json
says what was detached and attached, and why.
"""
from __future__ import annotations

import json
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_agent_cluster import Agent, _tables  # noqa: E402
from test_probes_walker import netns, router_and_dealer  # noqa: E402,F401  (netns: a fixture)

pytestmark = pytest.mark.privileged

QUIET_S = 2.0
DETACH_TIMEOUT_S = 60.0
RAW_BYTES = 300_000

# Both ends of a TCP connection that moves its bytes with write and read only: the server
# prints its port, then what it read; the client writes RAW_BYTES in chunks and reads them back.
RAW_PEER = r'''
import os, socket, sys
n = int(sys.argv[2])
if sys.argv[1] == "server":
    lst = socket.socket(); lst.bind(("127.0.0.1", 0)); lst.listen(1)
    print(lst.getsockname()[1], flush=True)
    c, _ = lst.accept()
    got = 0
    while got < n:
        b = os.read(c.fileno(), 65536)
        if not b:
            break
        got += len(b)
        os.write(c.fileno(), b)
    print(got, flush=True)
else:
    c = socket.create_connection(("127.0.0.1", int(sys.argv[3])))
    sent = back = 0
    while sent < n:
        sent += os.write(c.fileno(), os.urandom(min(4096, n - sent)))
        while back < sent:
            back += len(os.read(c.fileno(), 65536))
    c.close()
    print(sent, back, flush=True)
'''


def _wait_for(agent: Agent, text: str, router, dealer, seed: int) -> int:
    """Keep the ps-lite traffic going until the agent's log says `text`; returns the seed reached
    (batches of 200 messages from seed 101 on)."""
    deadline = time.monotonic() + DETACH_TIMEOUT_S
    while time.monotonic() < deadline:
        seed += 1
        dealer.ask(f"send small 200 {seed}")
        router.ask(f"wait {(seed - 100) * 200}")
        while select.select([agent.proc.stderr], [], [], 0)[0]:
            line = agent.proc.stderr.readline()
            agent.log.append(line)
            if text in line:
                return seed
        time.sleep(0.05)
    pytest.fail(f"the agent never said {text!r}: " + "".join(agent.log))


def test_unused_call_hooks_are_detached_and_come_back_for_a_new_process(netns, tmp_path):
    router, dealer, _pids = router_and_dealer(netns, connect=False)
    agent = None
    try:
        agent = Agent(tmp_path / "agent", [netns], extra=("--sample-rate", "1", "--call-hooks-quiet-s", str(QUIET_S)))
        dealer.ask("connect")   # seen from its first byte
        seed = _wait_for(agent, "detached the read, write, readv, writev hooks", router, dealer, 100)
        server = subprocess.Popen(["ip", "netns", "exec", netns, sys.executable, "-c", RAW_PEER, "server",
                                   str(RAW_BYTES)], stdout=subprocess.PIPE, text=True)
        port = server.stdout.readline().strip()
        # the new process is what brings the hooks back: give the agent's rescan its time
        # before the client's first write (it rescans every second)
        seed = _wait_for(agent, "attached the read, write, readv, writev hooks: a new traced process",
                         router, dealer, seed)
        client = subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", RAW_PEER, "client",
                                 str(RAW_BYTES), port], capture_output=True, text=True, timeout=60, check=True)
        sent, back = map(int, client.stdout.split())
        assert int(server.stdout.readline()) == RAW_BYTES == sent == back
        server.wait(10)
        total = (seed - 100) * 200
        assert router.ask(f"wait {total}")["received"] == total
        time.sleep(1.0)
        log = agent.stop()
    finally:
        if agent is not None:
            agent.kill()
        router.stop()
        dealer.stop()
    msgs, metas = _tables(tmp_path / "agent")
    (meta,) = metas.values()
    changes = meta["call_hooks"]
    assert [next(k for k in c if k in ("detached", "attached")) for c in changes][:2] == ["detached", "attached"]
    assert changes[0]["detached"] == ["read", "write", "readv", "writev"]
    assert changes[1]["why"] == "a new traced process"
    # every ps-lite message the dealer sent, on both ends
    data = msgs[~msgs.control]
    assert (data.direction == "tx").sum() == total and (data.direction == "rx").sum() == total, log
    # the write/read connection: every byte each way, on both of its ends
    from agent.rundir import read_run_dir
    rd = read_run_dir(next(p for p in (tmp_path / "agent").iterdir() if p.is_dir()))
    streams = rd.tables["streams"]
    raw = streams[(streams.local_port == int(port)) | (streams.remote_port == int(port))]
    assert len(raw) == 2, streams.to_string()
    assert (raw.bytes_tx == RAW_BYTES).all() and (raw.bytes_rx == RAW_BYTES).all(), \
        raw[["local_port", "remote_port", "bytes_tx", "bytes_rx", "calls_tx", "calls_rx"]].to_string()
    print("\ncall hooks:", json.dumps(changes))
