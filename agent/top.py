"""`pslat top`: a live terminal view of the agents' aggregates (agent.live), every second.

    pslat top --agent 127.0.0.1:9465 --agent h1:9465    # running agents, merged into one view
    pslat top --comm psbench                              # no agent: trace here, in this process
    pslat top --snapshot snap.json                        # draw a saved /snapshot.json once

Per host, role (cli: it sent the requests; srv: it served them), op and peer:
requests/s, p50/p99 of the time this host saw, and a bar of how that time
splits into its own components: host, NIC, network-and-remote (what it cannot
see from here), unsplit (a missing stage joined host and network time). `d` or
--detail shows the finer components. Keys: `d` detail, `q` quit.

What it draws comes from other hosts (agents' /snapshot.json) or from traced
names (its own probes), so: snapshots are read by agent.snapshots (every field
type-checked, wrong parts skipped and said on the status line), fetched in
threads of their own under a deadline and a size cap per fetch (keys are read
every KEY_POLL_S whatever an agent does), and every string from them goes into
rich Text through core.safetext (never markup, control characters replaced).
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import typer

from core.errors import UserError
from agent.live import CLIENT_COMPONENTS, GROUP_OF, GROUPS, SERVER_COMPONENTS, UNSPLIT, merge_snapshots, quantile_ns
from core.safetext import safe_text
from agent.snapshots import (FETCH_TIMEOUT_S, SnapshotError, fetch_body, parse_json, read_snapshot, read_snapshot_file,
                             skipped_text)
from agent.units import fmt_bytes
from parsers.protocol import key_text

REFRESH_S = 1.0
KEY_POLL_S = 0.1      # how long a key press may wait to be read: `q` quits within this
GROUP_GLYPH = {"host": "█", "nic": "▓", "network_and_remote": "░", UNSPLIT: "·"}
GROUP_STYLE = {"host": "red", "nic": "yellow", "network_and_remote": "blue", UNSPLIT: "bright_black"}
GROUP_LABEL = {"host": "host", "nic": "NIC", "network_and_remote": "network+remote", UNSPLIT: "unsplit"}
FINE = CLIENT_COMPONENTS + SERVER_COMPONENTS + [UNSPLIT]
# detail: one letter per layer, lower case on the way out (tx), upper case on the way in (rx);
# the ROLE column says whose side it is
FINE_GLYPH = {"client_user_tx": "u", "client_kernel_tx": "k", "client_nic_tx": "n", "network_and_remote": "~",
              "client_nic_rx": "N", "client_kernel_rx": "K", "client_user_rx": "U",
              "server_nic_rx": "N", "server_kernel_rx": "K", "server_user": "S", "server_kernel_tx": "k",
              "server_nic_tx": "n", UNSPLIT: "·"}
FINE_STYLE = {c: GROUP_STYLE[GROUP_OF[c]] for c in FINE}
DETAIL_LEGEND = [("u", "U", "user"), ("k", "K", "kernel"), ("n", "N", "NIC (tx/RX)"),
                 ("~", "", "net+remote"), ("S", "", "server user"), ("·", "", "unsplit")]


def fmt_ns(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) < 1e6:
        return f"{v / 1e3:.0f}us" if abs(v) >= 1e4 else f"{v / 1e3:.1f}us"
    if abs(v) < 1e9:
        return f"{v / 1e6:.1f}ms"
    return f"{v / 1e9:.2f}s"


def elide_middle(name: str, width: int) -> str:
    """name in at most width characters, its middle cut (host names differ at the end as often as
    at the start: h-worker-17, pslat-rec-13751)."""
    if len(name) <= width:
        return name
    head = width // 2
    return name[:head] + "…" + name[len(name) - (width - 1 - head):]


def _apart_width(names: list[str], cap: int) -> int:
    """The narrowest width from cap up at which no two of the names, cut in the middle, read the same."""
    width, longest, distinct = cap, max(map(len, names), default=0), len(set(names))
    while width < longest and len({elide_middle(n, width) for n in names}) < distinct:
        width += 1
    return width


def _peer_cell(g: dict, ip_hosts: dict) -> str:
    peer = _peer(g["peer"], ip_hosts)
    return "self" if peer == g["host"] else safe_text(peer)


def fmt_rate(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _peer(peer: str, ip_hosts: dict[str, str]) -> str:
    return ip_hosts.get(peer, peer)


def _means(g: dict, names: list[str]) -> dict[str, float]:
    n = g["hists"]["e2e"]["n"] or 1
    return {c: max(0.0, g["hists"][c]["sum_ns"] / n) for c in names if c in g["hists"]}


def bar(g: dict, width: int, detail: bool):
    """A stacked bar of this host's components (mean share per request); largest remainders fill it."""
    from rich.text import Text
    if detail:
        parts = _means(g, FINE)
        glyph, style = FINE_GLYPH, FINE_STYLE
        order = [c for c in FINE if c in parts]
    else:
        fine = _means(g, FINE)
        parts = {}
        for c, v in fine.items():
            parts[GROUP_OF[c]] = parts.get(GROUP_OF[c], 0.0) + v
        glyph, style = GROUP_GLYPH, GROUP_STYLE
        order = [x for x in GROUPS if x in parts]
    total = sum(parts.values())
    t = Text()
    if total <= 0 or width <= 0:
        return t
    exact = [parts[c] / total * width for c in order]
    cells = [int(x) for x in exact]
    for i in sorted(range(len(order)), key=lambda i: exact[i] - cells[i], reverse=True)[:width - sum(cells)]:
        cells[i] += 1
    for c, k in zip(order, cells):
        t.append(glyph[c] * k, style=style[c])
    return t


def _legend(detail: bool):
    from rich.text import Text
    t = Text()
    if detail:
        for lo, hi, label in DETAIL_LEGEND:
            t.append(lo + ("/" + hi if hi else "")).append(f" {label}  ")
    else:
        for x in GROUPS:
            t.append(GROUP_GLYPH[x], style=GROUP_STYLE[x]).append(f" {GROUP_LABEL[x]}  ")
    return t


def _e2e_q(g: dict, q: float) -> float | None:
    return quantile_ns({int(i): c for i, c in g["hists"]["e2e"]["counts"]}, q)


def _e2e_mean(g: dict) -> float | None:
    e2e = g["hists"]["e2e"]
    return e2e["sum_ns"] / e2e["n"] if e2e["n"] else None


def _biggest_first(v: float | None) -> float:
    return -v if v is not None else 1.0


# --sort: the rows' order (the biggest first), ties by host, role, op
SORTS = {"rate": lambda g: -g["rate_per_s"], "p99": lambda g: _biggest_first(_e2e_q(g, 0.99)),
         "p50": lambda g: _biggest_first(_e2e_q(g, 0.5)), "mean": lambda g: _biggest_first(_e2e_mean(g)),
         "host": lambda g: 0}


def keep_rows(snap: dict, ops: tuple = (), hosts: tuple = ()) -> dict:
    """The snapshot with only the rows of these ops and hosts (either when empty)."""
    if not ops and not hosts:
        return snap
    keep = [g for g in snap.get("groups", []) if (not ops or g["op"] in ops) and (not hosts or g["host"] in hosts)]
    return {**snap, "groups": keep}


def render(snap: dict, width: int, height: int, detail: bool = False, status: str = "", sort: str = "rate"):
    """The whole screen for one snapshot, fitted to width x height."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    wide = width >= 110
    ip_hosts = snap.get("ip_hosts", {})
    by = SORTS[sort]
    groups = sorted(snap.get("groups", []), key=lambda g: (by(g), g["host"], g["role"], g["op"]))
    hosts = sorted({g["host"] for g in groups} | set(snap.get("connections", {})) | set(snap.get("unrecognised", {})))
    agents = snap.get("agents", [])
    head = Text(no_wrap=True, overflow="ellipsis")
    head.append("pslat top", style="bold").append(
        f"  {len(agents)} agent{'s' * (len(agents) != 1)} · {len(hosts)} host{'s' * (len(hosts) != 1)}"
        f" · last {snap.get('window_s', 0)} s · {'detail' if detail else 'groups'} (d) · quit (q)")
    status = "  ".join(x for x in [status, *snap.get("problems", [])] if x)
    if status:
        head.append(f"  {safe_text(status)}", style="italic")

    keys, conns = snap.get("keys", {}), snap.get("connections", {})
    n_keys = TOP_KEYS_WIDE if wide else TOP_KEYS_NARROW
    key_lines = [_key_line(h, keys[h], n_keys) for h in hosts if h in keys and keys[h]["top"]]
    conn_lines = [_conn_line(h, conns[h]) for h in hosts if h in conns]
    unrec = snap.get("unrecognised", {})
    unrec_lines = [_unrecognised_line(h, unrec[h]) for h in sorted(unrec) if unrec[h]["connections"]]
    health_lines = [_health_line(a) for a in agents]
    sections = [("agents", health_lines), ("connections", conn_lines or [Text("  (none seen)")]),
                ("traffic not recognised (no protocol parser understood it: no requests from it)", unrec_lines),
                ("hot keys (share of sampled keys)", key_lines)]
    sections = [(title, lines) for title, lines in sections if lines]
    # height: title, table head (2), legend, then table rows first; each section keeps its title and
    # one line, and gets more lines (agents first) from what the rows leave
    room = max(1, height - 4 - 2 * len(sections))
    shown = groups if len(groups) <= room else groups[:max(1, room - 1)]
    spare = room - max(1, len(shown) + (len(shown) < len(groups)))
    budget = {}
    for title, lines in sections:
        extra = min(len(lines) - 1, spare)
        budget[title], spare = 1 + extra, spare - extra
    heads = ["HOST", "ROLE", "OP", "PEER", "REQ/S"] + (["MEAN"] if wide else []) + ["P50", "P99"]
    caps = [16 if wide else 10, 4, 8, 16 if wide else 9, 8, 8, 8, 8]
    host_names = [safe_text(g["host"]) for g in shown]
    peer_names = [_peer_cell(g, ip_hosts) for g in shown]
    caps[0], caps[3] = _apart_width(host_names, caps[0]), _apart_width(peer_names, caps[3])
    rows = []
    for g, host_name, peer_name in zip(shown, host_names, peer_names):
        row = [elide_middle(host_name, caps[0]), "cli" if g["role"] == "client" else "srv",
               safe_text(g["op"]), elide_middle(peer_name, caps[3]), fmt_rate(g["rate_per_s"])]
        if wide:
            row.append(fmt_ns(_e2e_mean(g)))
        rows.append(row + [fmt_ns(_e2e_q(g, 0.5)), fmt_ns(_e2e_q(g, 0.99))])
    widths = [min(cap, max([len(h)] + [len(r[i]) for r in rows])) for i, (h, cap) in enumerate(zip(heads, caps))]
    bar_w = max(4, width - sum(widths) - 2 * len(widths))
    # a gap of 2 between columns: the box's 1-char divider and 1 of left padding; the bar gets the rest
    t = Table(box=box.SIMPLE_HEAD, padding=(0, 0, 0, 1), pad_edge=False, show_edge=False)
    for i, h in enumerate(heads):
        t.add_column(h, no_wrap=True, overflow="ellipsis", width=widths[i], justify="right" if i >= 4 else "left")
    t.add_column("SPLIT OF THIS HOST'S TIME", no_wrap=True, overflow="crop", width=bar_w)
    def add(cells: list, last=""):   # Text, never str: a str cell would be parsed as rich markup
        t.add_row(*(Text(c) for c in cells), last if isinstance(last, Text) else Text(last))
    for g, row in zip(shown, rows):
        add(row, bar(g, bar_w, detail))
    if len(shown) < len(groups):
        add([""] * len(heads), f"+{len(groups) - len(shown)} more rows")
    if not groups:
        add([""] * len(heads), "no request paired yet")

    parts = [head, t, _legend(detail)]
    for title, lines in reversed(sections):   # keys, connections, agents from top to bottom
        n = budget[title]
        parts.append(Text(title + (f" ({len(lines) - n} more not shown)" if n < len(lines) else ""),
                          style="bold"))
        parts += lines[:n]
    return Group(*[p if not isinstance(p, Text) else _clip(p) for p in parts])


TOP_KEYS_NARROW, TOP_KEYS_WIDE = 3, 6


def _clip(t):
    t.no_wrap, t.overflow = True, "ellipsis"
    return t


def _key_line(host: str, k: dict, n: int):
    from rich.text import Text
    total = k["sampled"] or 1
    t = Text(f"  {safe_text(host)}: ")
    t.append("  ".join(f"{key_text(int(key))} {100 * c / total:.1f}%" for key, c in k["top"][:n]))
    return t


def _unrecognised_line(host: str, u: dict):
    from rich.text import Text
    by = f" by {', '.join(safe_text(t) for t in u['threads'])}" if u.get("threads") else ""
    port = f" (port {u['port']})" if u.get("port") is not None else ""
    n = u["connections"]
    return Text(f"  {safe_text(host)}: {n:,} connection{'s' * (n != 1)}, {fmt_bytes(u['bytes'])}{by}{port}")


def _conn_line(host: str, c: dict):
    from rich.text import Text
    return Text(f"  {safe_text(host)}: {c.get('open', 0):.0f} open, +{c.get('opened_per_s', 0):.1f}/s "
                f"-{c.get('closed_per_s', 0):.1f}/s; connects {c.get('connects', 0)}, "
                f"accepts {c.get('accepts', 0)}, closed {c.get('closed_total', 0)}")


def _health_line(a: dict):
    from rich.text import Text
    name = safe_text(a["agent"])
    if "error" in a:
        return Text(f"  {name}: unreachable ({safe_text(a['error'])})", style="bold red")
    ev = a.get("events_per_s")
    cpu = a.get("cpu_pct")
    lost = a.get("lost", {})
    lost_s = ", ".join(f"{safe_text(p)} {n}" for p, n in lost.items()) or "-"
    t = Text(f"  {name}: {'-' if ev is None else f'{ev:,.0f}'} ev/s, cpu "
             f"{'-' if cpu is None else f'{cpu:.1f}%'}, sampling {100 * a.get('sampling_rate', 1):.0f}%, "
             f"lost: ")
    t.append(lost_s, style="bold red" if any(lost.values()) else "")
    return t


def render_text(snap: dict, width: int, height: int, detail: bool = False, sort: str = "rate", status: str = "") -> str:
    """The screen as plain text (no colour): for pipes, --snapshot and the golden tests."""
    from rich.console import Console
    c = Console(width=width, height=height, color_system=None, record=True, file=open(os.devnull, "w"),
                legacy_windows=False)
    c.print(render(snap, width, height, detail, status, sort))
    return c.export_text()


# ---------------------------------------------------------------- sources

def _agent_addr(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--agent {text!r}: give HOST:PORT of an agent started with --listen, "
                        "e.g. 127.0.0.1:9465")
    return text


def fetch_one(addr: str, timeout_s: float = FETCH_TIMEOUT_S) -> tuple[dict | None, dict | None, str]:
    """One agent's snapshot: (snapshot, None, what was skipped) or (None, its health line's error, "")."""
    try:
        snap, skipped = read_snapshot(parse_json(fetch_body(addr, timeout_s=timeout_s)))
    except (OSError, ValueError) as e:   # FetchError is an OSError; SnapshotError, a bad name's UnicodeError ValueErrors
        why = (str(e.strerror or e) if isinstance(e, OSError) else
               f"not a snapshot: {e}" if isinstance(e, SnapshotError) else f"bad address ({e})")
        return None, {"agent": addr, "error": why[:80]}, ""
    said = skipped_text(skipped)
    return snap, None, f"{addr}: {said}" if said else ""


def merged(results: list[tuple[dict | None, dict | None, str]]) -> dict:
    """fetch_one's results as one view: the snapshots merged, the errors as agent lines, what was
    skipped on the status line."""
    out = merge_snapshots([snap for snap, _, _ in results if snap is not None])
    out["agents"] += [down for _, down, _ in results if down is not None]
    out["problems"] = [said for _, _, said in results if said]
    return out


def fetch(addrs: list[str], timeout_s: float = FETCH_TIMEOUT_S) -> dict:
    """Every agent once, one after the other (--agent's loop fetches them in the background)."""
    return merged([fetch_one(a, timeout_s) for a in addrs])


class Feeds:
    """One thread per agent fetching its snapshot every REFRESH_S; snapshot() gives the latest of
    each at once, so the screen and the keys never wait on a slow or hostile agent."""

    def __init__(self, addrs: list[str], timeout_s: float = FETCH_TIMEOUT_S, interval_s: float = REFRESH_S):
        self.addrs = addrs
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.latest: dict[str, tuple] = {a: (None, {"agent": a, "error": "no answer yet"}, "") for a in addrs}
        self.stopped = threading.Event()
        for a in addrs:   # daemons: `q` leaves at once, a fetch under way is abandoned
            threading.Thread(target=self._run, args=(a, timeout_s), name=f"pslat-top-{a}", daemon=True).start()

    def _run(self, addr: str, timeout_s: float) -> None:
        while not self.stopped.is_set():
            t0 = time.monotonic()
            try:
                got = fetch_one(addr, timeout_s)
            except Exception as e:   # a bug, not the agent's doing: said on its line, not a dead thread
                got = (None, {"agent": addr, "error": f"internal error: {type(e).__name__}: {e}"[:80]}, "")
            with self.lock:
                self.latest[addr] = got
            self.stopped.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def snapshot(self) -> dict:
        with self.lock:
            results = [self.latest[a] for a in self.addrs]
        return merged(results)

    def stop(self) -> None:
        self.stopped.set()


class Keys:
    """Single key presses from a terminal (cbreak mode), restored on exit; none when not a tty."""

    def __init__(self):
        self.fd = sys.stdin.fileno() if sys.stdin.isatty() else None
        self.old = None

    def __enter__(self):
        if self.fd is not None:
            import termios
            import tty
            self.old = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            import termios
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.old)

    def read(self, timeout_s: float) -> str | None:
        if self.fd is None:
            time.sleep(timeout_s)
            return None
        if select.select([self.fd], [], [], max(0.0, timeout_s))[0]:
            return os.read(self.fd, 1).decode(errors="replace")
        return None


@dataclass(frozen=True)
class View:
    """What the user asked to see: the options that shape every screen."""
    detail: bool = False
    sort: str = "rate"
    ops: tuple = ()
    hosts: tuple = ()
    interval_s: float = REFRESH_S
    count: int | None = None        # screens to draw, then stop (None: until q)


def loop(get_snapshot, view: View, status=lambda: "", stop=lambda: False) -> None:
    """The full screen, redrawn every interval; keys d and q. Plain text blocks instead when the
    output is not a terminal or a count was asked for."""
    if view.count is not None or not sys.stdout.isatty():
        return plain_loop(get_snapshot, view, status, stop)
    from rich.console import Console
    from rich.live import Live

    console = Console()
    detail = view.detail
    with Keys() as keys, Live(console=console, screen=True, auto_refresh=False) as live:
        while not stop():
            snap = keep_rows(get_snapshot(), view.ops, view.hosts)
            w, h = console.size
            live.update(render(snap, w, h, detail, status(), view.sort), refresh=True)
            deadline = time.monotonic() + view.interval_s
            while (left := deadline - time.monotonic()) > 0 and not stop():
                k = keys.read(min(left, KEY_POLL_S))
                if k in ("q", "Q"):
                    return
                if k in ("d", "D"):
                    detail = not detail
                    w, h = console.size
                    live.update(render(snap, w, h, detail, status(), view.sort), refresh=True)


PLAIN_HEIGHT = 1000    # a block in a pipe is not cut to a screen: every row and section line
PLAIN_WIDTH = 120      # a pipe's width (a terminal's own when --count draws on one)


def plain_loop(get_snapshot, view: View, status=lambda: "", stop=lambda: False, out=None) -> None:
    """One plain-text block per interval (like vmstat), a blank line between blocks, no colour
    and no cursor moves; `count` blocks, or until stopped."""
    out = out or sys.stdout
    width = shutil.get_terminal_size((PLAIN_WIDTH, 24)).columns if out.isatty() else PLAIN_WIDTH
    n = 0
    next_at = time.monotonic() + view.interval_s
    while not stop():
        if stop_wait(stop, next_at):
            return
        snap = keep_rows(get_snapshot(), view.ops, view.hosts)
        block = render_text(snap, width, PLAIN_HEIGHT, view.detail, view.sort, status()).rstrip("\n")
        out.write(("\n" if n else "") + f"{time.strftime('%H:%M:%S')}\n{block}\n")
        out.flush()
        n += 1
        if view.count is not None and n >= view.count:
            return
        next_at += view.interval_s


def stop_wait(stop, until: float) -> bool:
    """Sleep until `until` (monotonic) in short steps; True when stopped meanwhile."""
    while (left := until - time.monotonic()) > 0:
        if stop():
            return True
        time.sleep(min(left, KEY_POLL_S))
    return stop()


# ---------------------------------------------------------------- command

def top(
    agent: List[str] = typer.Option([], "--agent", help="HOST:PORT of a running `pslat agent --listen` "
                                    "(repeat: one cluster view)"),
    pid: List[int] = typer.Option([], "--pid", help="no agent: trace this process (repeat)", rich_help_panel="Filters"),
    comm: List[str] = typer.Option([], "--comm", help="no agent: trace processes of this name (repeat)",
                                   rich_help_panel="Filters"),
    netns: List[str] = typer.Option([], "--netns", help="no agent: trace sockets in this `ip netns` (repeat)",
                                    rich_help_panel="Filters"),
    port: List[int] = typer.Option([], "--port", help="no agent: trace TCP connections on this port (repeat)",
                                   rich_help_panel="Filters"),
    lib: List[Path] = typer.Option([], "--lib", help="no agent: a framework library the job loads (README) to probe "
                                   "(repeat)", rich_help_panel="Filters"),
    netstack: bool = typer.Option(True, "--netstack/--no-netstack", help="no agent: also probe the kernel "
                                  "network stack (NIC components; --no-netstack starts faster)",
                                  rich_help_panel="Filters"),
    sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="no agent: trace this share R "
                                                "(0 < R <= 1) of host pairs, fixed (default: all, fewer when "
                                                "it cannot keep up)", rich_help_panel="Filters"),
    detail: bool = typer.Option(False, "--detail", help="start with the finer components (key d toggles)"),
    snapshot: Optional[Path] = typer.Option(None, "--snapshot", help="draw this saved /snapshot.json once and exit"),
    interval: float = typer.Option(REFRESH_S, "--interval", help="seconds between screens", rich_help_panel="View"),
    count: Optional[int] = typer.Option(None, "--count", help="draw N screens as plain text blocks, then exit",
                                        rich_help_panel="View"),
    once: bool = typer.Option(False, "--once", help="one plain text block after one interval, then exit "
                              "(--count 1)", rich_help_panel="View"),
    sort: str = typer.Option("rate", "--sort", help=f"rows by: {', '.join(SORTS)} (the biggest first)",
                             rich_help_panel="View"),
    op: List[str] = typer.Option([], "--op", help="only rows of this op (repeat)", rich_help_panel="View"),
    host: List[str] = typer.Option([], "--host", help="only rows of this host (repeat)", rich_help_panel="View"),
) -> None:
    """Live view: per op and peer host, rate, p50/p99 and where this host's time goes. Not on a
    terminal (a pipe, a file) it writes one plain text block per interval."""
    if not (0.05 <= interval <= 3600):
        raise UserError(f"--interval {interval}: give seconds between 0.05 and 3600")
    if count is not None and count < 1:
        raise UserError(f"--count {count}: give 1 or more")
    if once and count not in (None, 1):
        raise UserError("--once is --count 1; give one of them")
    if sort not in SORTS:
        raise UserError(f"--sort {sort}: give one of {', '.join(SORTS)}")
    view = View(detail=detail, sort=sort, ops=tuple(op), hosts=tuple(host), interval_s=interval,
                count=1 if once else count)
    filters = bool(pid or comm or netns or port or lib or not netstack or sample_rate is not None)
    if snapshot is not None:
        if agent or filters:
            raise UserError("--snapshot draws a saved file; leave out --agent and the filters")
        try:
            snap, skipped = read_snapshot_file(snapshot)
        except OSError as e:
            raise UserError(f"--snapshot {snapshot}: cannot read it ({e.strerror or e}); give a saved "
                            "/snapshot.json") from None
        except SnapshotError as e:
            raise UserError(f"--snapshot {snapshot}: not a pslat /snapshot.json ({e}); save one with "
                            "curl http://ADDR:PORT/snapshot.json") from None
        snap = keep_rows(dict(merge_snapshots([snap]), problems=[skipped_text(skipped)] if skipped else []),
                      view.ops, view.hosts)
        from rich.console import Console
        c = Console(color_system=None if not sys.stdout.isatty() else "auto")
        c.print(render(snap, c.size.width, c.size.height, detail, sort=sort))
        return
    if agent:
        if filters:
            raise UserError("--agent draws running agents (they have their own filters); leave out "
                            "--pid/--comm/--netns/--port/--lib/--no-netstack/--sample-rate")
        feeds = Feeds([_agent_addr(a) for a in agent], interval_s=interval)
        try:
            loop(feeds.snapshot, view)
        finally:
            feeds.stop()
        return
    from agent.daemon import AgentOptions
    _in_process(AgentOptions(out=Path(), pids=tuple(pid), comms=tuple(comm), netns=tuple(netns),
                             ports=tuple(port), libs=tuple(lib), netstack=netstack, sample_rate=sample_rate),
                view)


def _in_process(opts, view: View) -> None:
    """No agent: run the agent's pipeline here (the main thread: it takes the signals) and draw
    from a second thread; `q` ends the tracing as Ctrl-C would. Rows go to a temp run dir."""
    import dataclasses
    import tempfile

    from agent.daemon import check_prerequisites, run_live
    from agent.live import LiveAggregates

    check_prerequisites()
    live = LiveAggregates()
    said: list[str] = ["attaching probes (compiling: a few seconds)"]
    done = threading.Event()

    def ui():
        try:
            loop(live.snapshot, view, status=lambda: said[-1], stop=done.is_set)
        finally:
            if not done.is_set():
                os.kill(os.getpid(), signal.SIGINT)   # ends run_live as Ctrl-C does

    with tempfile.TemporaryDirectory(prefix="pslat-top-") as tmp:
        th = threading.Thread(target=ui, name="pslat-top-ui", daemon=True)
        th.start()
        try:
            run_live(dataclasses.replace(opts, out=Path(tmp)),
                     log=lambda m: said.append(m.splitlines()[0][:60]), aggregates=live)
        finally:
            done.set()
            th.join(5)
