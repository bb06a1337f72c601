"""The sockcalls probe on real TCP traffic in network namespaces we create.

A server and a client (separate processes, in namespace A) exchange a known
script of messages over three connections (one made before the probe
attached, one after, one over IPv6) with every call of the family, and log
each call they make. The probe is filtered by --pid (server), --comm (client,
whose I/O runs in a thread with another name) and --netns A. It must report
exactly the logged TCP calls -- byte counts, payload prefixes (the bytes are
no protocol's, so the walker hands over the first bytes of each direction's
first call raw, and only counts the calls after it), 4-tuples,
consecutive sequence ranges, ISNs that agree across the two ends -- and
nothing from: the same processes' non-TCP I/O, a process that is not
selected (namespace A), and a selected pid whose sockets are in namespace B.

This file is also the peer program: `python test_probes_sockcalls.py ROLE ...`.
"""
from __future__ import annotations

import ctypes
import json
import os
import random
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

IOV_WALK_MAX = 8  # SOCKCALLS_IOV_WALK_MAX default
PAYLOAD_MAX = 256
PEER_TIMEOUT_S = 60

# conn, sender, send call, iovec sizes, receive call
SCRIPT = [
    ("A", "client", "sendto", [11], "recvfrom"),
    ("A", "server", "sendmsg", [10, 300], "recvmsg"),
    ("A", "client", "writev", [3, 5, 400], "readv"),
    ("A", "server", "write", [1000], "read"),
    ("B", "client", "sendmsg", [64, 200_000], "recvfrom"),  # several receives
    ("B", "server", "writev", [1] * 9 + [300], "recvmsg"),   # more iovecs than the walk covers
    ("B", "client", "write", [5000], "readv"),
    ("C", "client", "sendto", [40], "read"),
    ("C", "server", "sendmsg", [700], "recvfrom"),
]
CLIENT_COMM = "pslat-tclient"   # the client process (group leader) name, selected by --comm
CLIENT_IO_THREAD = "pslat-tio"  # the thread that does the client's I/O


# ---------------------------------------------------------------- peer side

def set_thread_name(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME


def message(step: int, sizes: list[int]) -> list[bytes]:
    data = random.Random(step).randbytes(sum(sizes))
    out, at = [], 0
    for n in sizes:
        out.append(data[at:at + n])
        at += n
    return out


def walked(buffers, ret: int) -> str:
    """What the probe copies: the first bytes moved, through the first
    IOV_WALK_MAX buffers only, at most PAYLOAD_MAX."""
    if ret <= 0:
        return ""
    return b"".join(bytes(b) for b in buffers[:IOV_WALK_MAX])[:min(ret, PAYLOAD_MAX)].hex()


class Peer:
    def __init__(self):
        self.log = []

    def record(self, call, sock, buffers, ret):
        self.log.append({"call": call, "fd": sock.fileno(), "ret": ret, "payload": walked(buffers, ret)})

    def send(self, sock, call, buffers):
        """Send all of `buffers` with `call`, logging every syscall."""
        buffers = [memoryview(b) for b in buffers]
        while buffers:
            if call == "sendto":
                ret = sock.send(buffers[0])
            elif call == "write":
                ret = os.write(sock.fileno(), buffers[0])
            elif call == "sendmsg":
                ret = sock.sendmsg(buffers)
            elif call == "writev":
                ret = os.writev(sock.fileno(), buffers)
            self.record(call, sock, buffers if call in ("sendmsg", "writev") else buffers[:1], ret)
            while ret and buffers:  # drop what was sent
                n = min(ret, len(buffers[0]))
                ret -= n
                buffers[0] = buffers[0][n:]
                if not len(buffers[0]):
                    buffers.pop(0)

    def recv(self, sock, call, total: int) -> bytes:
        got = bytearray()
        while len(got) < total:
            rem = total - len(got)
            if call in ("recvfrom", "read"):
                if call == "recvfrom":
                    data = sock.recv(rem)
                else:
                    data = os.read(sock.fileno(), rem)
                bufs, ret = [data], len(data)
            else:
                bufs = [bytearray(min(7, rem))] + ([bytearray(rem - 7)] if rem > 7 else [])
                if call == "readv":
                    ret = os.readv(sock.fileno(), bufs)
                else:
                    ret = sock.recvmsg_into(bufs)[0]
            assert ret > 0, "peer closed early"
            self.record(call, sock, bufs, ret)
            got += b"".join(bytes(b) for b in bufs)[:ret]
        return bytes(got)

    def run_script(self, role: str, conns: dict[str, socket.socket]):
        for step, (conn, sender, send_call, sizes, recv_call) in enumerate(SCRIPT):
            bufs = message(step, sizes)
            if sender == role:
                self.send(conns[conn], send_call, bufs)
            else:
                assert self.recv(conns[conn], recv_call, sum(sizes)) == b"".join(bufs)


def emit(obj) -> None:
    print(json.dumps(obj), flush=True)


def wait_go() -> None:
    assert sys.stdin.readline().strip() == "go"


def non_tcp_noise() -> None:
    """I/O of a selected process that is not TCP: must produce no events."""
    r, w = os.pipe()
    os.write(w, b"pipe")
    os.read(r, 4)
    os.writev(w, [b"a", b"b"])
    os.readv(r, [bytearray(2)])
    u1 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u1.bind(("127.0.0.1", 0))
    u2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u2.sendto(b"udp", u1.getsockname())
    u1.recvfrom(10)
    a, b = socket.socketpair()
    a.sendmsg([b"unix"])
    b.recv(10)
    with tempfile.TemporaryFile() as f:
        os.write(f.fileno(), b"file")
        os.lseek(f.fileno(), 0, 0)
        os.read(f.fileno(), 4)


def peer_server() -> None:
    l4 = socket.create_server(("127.0.0.1", 0))
    l6 = socket.create_server(("::1", 0), family=socket.AF_INET6)
    emit({"ready": True, "pid": os.getpid(), "port4": l4.getsockname()[1], "port6": l6.getsockname()[1]})
    wait_go()
    peer = Peer()
    conns = {"A": l4.accept()[0], "B": l4.accept()[0], "C": l6.accept()[0]}
    peer.run_script("server", conns)
    non_tcp_noise()
    eof = conns["C"].recv(1)  # the client's shutdown: lets it finish first
    peer.record("recvfrom", conns["C"], [eof], len(eof))
    emit({"done": True, "log": peer.log, "ports": {k: c.getsockname()[1] for k, c in conns.items()}})


def peer_client(port4: int, port6: int) -> None:
    set_thread_name(CLIENT_COMM)
    a = socket.create_connection(("127.0.0.1", port4))  # before the probe attaches
    emit({"ready": True, "pid": os.getpid()})
    wait_go()
    peer = Peer()
    result = {}

    def io():
        set_thread_name(CLIENT_IO_THREAD)
        result["tid"] = threading.get_native_id()
        conns = {"A": a, "B": socket.create_connection(("127.0.0.1", port4)),
                 "C": socket.create_connection(("::1", port6))}
        peer.run_script("client", conns)
        non_tcp_noise()
        try:  # nothing to read: EAGAIN, counted but not emitted
            conns["C"].recv(10, socket.MSG_DONTWAIT)
            raise AssertionError("expected EAGAIN")
        except BlockingIOError:
            pass
        conns["C"].shutdown(socket.SHUT_WR)
        try:  # a failed send is still an event, with -EPIPE
            conns["C"].send(b"late")
        except BrokenPipeError:
            peer.record("sendto", conns["C"], [b"late"], -32)
        result["ports"] = {k: c.getsockname()[1] for k, c in conns.items()}

    t = threading.Thread(target=io)
    t.start()
    t.join()
    emit({"done": True, "log": peer.log, "tid": result["tid"], "ports": result["ports"]})


def peer_solo() -> None:
    """Both ends in one process: traffic the probe must not report."""
    emit({"ready": True, "pid": os.getpid()})
    wait_go()
    srv = socket.create_server(("127.0.0.1", 0))
    c = socket.create_connection(srv.getsockname())
    s = srv.accept()[0]
    calls = 0
    for send_call, recv_call in [("sendto", "recvfrom"), ("sendmsg", "recvmsg"), ("write", "read"),
                                 ("writev", "readv")]:
        peer = Peer()
        peer.send(c, send_call, [b"x" * 100, b"y" * 50])
        peer.recv(s, recv_call, 150)
        calls += len(peer.log)
    emit({"done": True, "calls": calls})


def peer_two_ports() -> None:
    """Two connections to two listeners, in one process: --port selects one."""
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    ports = [lst.getsockname()[1] for lst in listeners]
    emit({"ready": True, "pid": os.getpid(), "ports": ports})
    wait_go()
    calls = {}
    for lst, port in zip(listeners, ports):
        c = socket.create_connection(("127.0.0.1", port))
        s = lst.accept()[0]
        peer = Peer()
        for n in (10, 20, 30):
            peer.send(c, "sendto", [b"p" * n])
            peer.recv(s, "recvfrom", n)
        calls[port] = len(peer.log)
    emit({"done": True, "calls": calls})


def peer_main(argv) -> None:
    role = argv[0]
    if role == "server":
        peer_server()
    elif role == "client":
        peer_client(int(argv[1]), int(argv[2]))
    elif role == "solo":
        peer_solo()
    elif role == "two-ports":
        peer_two_ports()
    else:
        raise SystemExit(f"unknown role {role}")


if __name__ == "__main__":
    peer_main(sys.argv[1:])
    sys.exit(0)


# ---------------------------------------------------------------- test side

class PeerProc:
    """A peer process in a namespace, talking JSON lines over its pipes."""

    def __init__(self, netns: str, *args):
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, __file__, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def read(self, deadline: float) -> dict:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        if not sel.select(max(0.0, deadline - time.monotonic())):
            raise AssertionError(f"peer {self.proc.args[5:]} said nothing in time")
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"peer {self.proc.args[5:]} exited: {self.proc.wait()}")
        return json.loads(line)

    def go(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def namespaces():
    names = [f"pslat-tp-{os.getpid()}-{x}" for x in "ab"]
    for n in names:
        subprocess.run(["ip", "netns", "add", n], check=True)
        subprocess.run(["ip", "-n", n, "link", "set", "lo", "up"], check=True)
    yield names
    for n in names:
        subprocess.run(["ip", "netns", "del", n], check=False)


@pytest.mark.privileged
def test_sockcalls_sees_exactly_the_selected_tcp_calls(namespaces):
    from probes.events import AF_INET, AF_INET6, SOCKCALL_F_ISN_DERIVED, SOCKCALL_F_ISN_EXACT, SockCall
    from probes.filters import Filters
    from probes.loader import ProbeProgram
    from probes.sockcalls import SOCKCALLS, install_walker

    ns_a, ns_b = namespaces
    deadline = time.monotonic() + PEER_TIMEOUT_S
    peers = []
    try:
        server = PeerProc(ns_a, "server")
        peers.append(server)
        s_ready = server.read(deadline)
        client = PeerProc(ns_a, "client", s_ready["port4"], s_ready["port6"])
        peers.append(client)
        unselected = PeerProc(ns_a, "solo")
        other_ns = PeerProc(ns_b, "solo")
        peers += [unselected, other_ns]
        c_ready, u_ready, o_ready = (p.read(deadline) for p in (client, unselected, other_ns))

        filters = Filters.build(pids=[s_ready["pid"], o_ready["pid"]], comms=[CLIENT_COMM],
                                netns=[ns_a])
        events = []
        with ProbeProgram.start([SOCKCALLS], filters) as prog:
            install_walker(prog, ())   # no framing walks these bytes: the netstack lookups only
            prog.on_events(lambda _probe, ev: events.append(ev))
            for p in peers:
                p.go()
            done = {p: p.read(deadline) for p in peers}
            # Every event was emitted at a syscall exit before the peers said
            # "done": nothing more can arrive.
            prog.consume()
            counters = prog.counters()["sockcalls"]
    finally:
        for p in peers:
            p.stop()

    pid_server, pid_client = s_ready["pid"], c_ready["pid"]
    s_done, c_done = done[server], done[client]
    assert done[unselected]["calls"] >= 8 and done[other_ns]["calls"] >= 8  # the decoys did talk

    # Nothing from anyone else: not the unselected process, not the selected
    # pid in the other namespace.
    assert {ev.tgid for ev in events} == {pid_server, pid_client}

    netns_a = os.stat(f"/run/netns/{ns_a}").st_ino
    by_pid = {pid: sorted((e for e in events if e.tgid == pid), key=lambda e: e.enter_ts_ns)
              for pid in (pid_server, pid_client)}

    # Exactly the logged calls, in order, with their byte counts and payloads.
    for pid, log in ((pid_server, s_done["log"]), (pid_client, c_done["log"])):
        seen = [{"call": e.call_kind.name.lower(), "fd": e.fd, "ret": e.ret, "payload": raw_prefix(e).hex()}
                for e in by_pid[pid]]
        assert seen == first_calls_copied(log)
        evs = by_pid[pid]
        for e in evs:
            assert e.enter_ts_ns <= e.exit_ts_ns
            assert e.netns_ino == netns_a
            assert e.flags & ~(SOCKCALL_F_ISN_EXACT | SOCKCALL_F_ISN_DERIVED) == 0  # no payload faults
        for a, b in zip(evs, evs[1:]):
            assert a.exit_ts_ns <= b.enter_ts_ns  # one I/O thread per process
    # --comm matched the process; the event names the thread that made the call.
    assert {(e.tid, e.comm.decode()) for e in by_pid[pid_client]} == {(c_done["tid"], CLIENT_IO_THREAD)}

    # 4-tuples, per connection.
    for conn in "ABC":
        fam, addr = (AF_INET6, "::1") if conn == "C" else (AF_INET, "127.0.0.1")
        sport, cport = s_done["ports"][conn], c_done["ports"][conn]
        s_evs = [e for e in by_pid[pid_server] if e.sport == sport and e.dport == cport]
        c_evs = [e for e in by_pid[pid_client] if e.sport == cport and e.dport == sport]
        assert s_evs and c_evs
        for e in s_evs + c_evs:
            assert (e.family, e.local_addr, e.remote_addr) == (fam, addr, addr)
        assert len({e.sk for e in s_evs}) == 1 and len({e.sk for e in c_evs}) == 1

        # ISNs: the two ends agree; A existed before the probe (derived), B and C after (exact).
        flag = SOCKCALL_F_ISN_DERIVED if conn == "A" else SOCKCALL_F_ISN_EXACT
        assert {e.flags & (SOCKCALL_F_ISN_DERIVED | SOCKCALL_F_ISN_EXACT) for e in s_evs + c_evs} == {flag}
        assert len({(e.isn_local, e.isn_remote) for e in s_evs}) == 1
        assert len({(e.isn_local, e.isn_remote) for e in c_evs}) == 1
        assert (s_evs[0].isn_local, s_evs[0].isn_remote) == (c_evs[0].isn_remote, c_evs[0].isn_local)

        # Sequence ranges: each direction's sends are consecutive from ISN+1,
        # each range is the bytes the call returned, and the receiver's
        # ranges tile exactly the same span.
        for tx, rx in ((c_evs, s_evs), (s_evs, c_evs)):
            sends = [e for e in tx if e.call_kind.is_send and e.ret > 0]
            recvs = [e for e in rx if not e.call_kind.is_send and e.ret > 0]
            if not sends:
                continue
            assert sends[0].seq_start == (sends[0].isn_local + 1) & 0xFFFFFFFF
            for evs in (sends, recvs):
                for e in evs:
                    assert e.seq_bytes == e.ret
                for a, b in zip(evs, evs[1:]):
                    assert b.seq_start == a.seq_end
            assert (recvs[0].seq_start, recvs[-1].seq_end) == (sends[0].seq_start, sends[-1].seq_end)
            assert sum(e.ret for e in sends) == sum(e.ret for e in recvs)

    # End of stream: the receive that returns 0 consumed the FIN, one
    # sequence number right after the data.
    eof = by_pid[pid_server][-1]
    assert (eof.ret, eof.seq_bytes) == (0, 1)
    assert eof.seq_start == max((e for e in by_pid[pid_server] if e.fd == eof.fd and e.ret > 0
                                 and not e.call_kind.is_send), key=lambda e: e.enter_ts_ns).seq_end

    # The failed send is an event; the EAGAIN receive only a count.
    assert by_pid[pid_client][-1].ret == -32 and by_pid[pid_client][-1].call_kind is SockCall.SENDTO
    assert {k: counters[k] for k in ("seen", "lost", "eagain", "inflight_full")} == {
        "seen": len(events), "lost": 0, "eagain": 1, "inflight_full": 0}
    # Each direction of each connection, at each end, started with bytes that
    # are no ZMTP greeting: the walker said so once, and never walked them.
    assert counters["not_zmtp"] == 3 * 2 * 2
    assert counters["walk_bytes"] == counters["frames"] == counters["messages"] == counters["desyncs"] == 0


def first_calls_copied(log: list[dict]) -> list[dict]:
    """The log as the probe reports it: every connection here starts with bytes no
    framing knows, so only the first call of each direction carries its bytes."""
    sends = {"send", "sendto", "sendmsg", "write", "writev"}
    seen, out = set(), []
    for e in log:
        d = (e["fd"], e["call"] in sends)
        out.append(e if d not in seen else {**e, "payload": ""})
        seen.add(d)
    return out


def raw_prefix(ev) -> bytes:
    """The call's bytes the probe carried, contiguous from its first byte."""
    from oracles.walker import WalkedCall

    out = b""
    for off, data, _what in WalkedCall(ev, ev.items()).pieces():
        if off != len(out):
            break
        out += data
    return out


@pytest.mark.privileged
def test_sockcalls_port_filter_without_process_filter(namespaces):
    """--port alone: every process, only connections with that port (either end)."""
    from probes.filters import Filters
    from probes.loader import ProbeProgram
    from probes.sockcalls import SOCKCALLS

    ns_a, _ = namespaces
    deadline = time.monotonic() + PEER_TIMEOUT_S
    peer = PeerProc(ns_a, "two-ports")
    try:
        ready = peer.read(deadline)
        selected, other = ready["ports"]
        events = []
        with ProbeProgram.start([SOCKCALLS], Filters.build(ports=[selected], netns=[ns_a])) as prog:
            prog.on_events(lambda _probe, ev: events.append(ev))
            peer.go()
            done = peer.read(deadline)
            prog.consume()
            counters = prog.counters()["sockcalls"]
    finally:
        peer.stop()
    assert done["calls"][str(other)] == 6  # the other connection did talk
    assert len(events) == done["calls"][str(selected)] == 6
    assert all(selected in (e.sport, e.dport) and other not in (e.sport, e.dport) for e in events)
    assert {e.tgid for e in events} == {ready["pid"]}
    assert (counters["seen"], counters["lost"]) == (6, 0)
