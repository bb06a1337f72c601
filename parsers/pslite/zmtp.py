"""ZMTP 3.0/3.1 wire facts (rfc.zeromq.org specs 23 and 37) and the small decoders the
stream parser needs: the 64-byte greeting and command bodies (READY, ERROR, PING...).

Frame layout: a flags byte (MORE 0x01, LONG 0x02, COMMAND 0x04, the other bits
reserved and zero), then the body size in 1 octet, or in 8 octets network order
when LONG is set, then the body. A command is one frame (never MORE) whose body
is a 1-octet name length, the name, and command data.
"""
from __future__ import annotations

from dataclasses import dataclass

GREETING_BYTES = 64
SIGNATURE_BYTES = 10  # 0xFF, 8 octets of padding (libzmq puts ZMTP/1.0 compat data there), 0x7F
FLAG_MORE, FLAG_LONG, FLAG_COMMAND = 0x01, 0x02, 0x04
FLAGS_RESERVED = 0xF8
MAX_HEADER_BYTES = 9

# Every command the specs define (3.0: READY ERROR and the PLAIN/CURVE handshake;
# 3.1 adds PING PONG SUBSCRIBE CANCEL JOIN LEAVE). A frame with the COMMAND bit and
# another name is taken as garbage: libzmq sends no others.
KNOWN_COMMANDS = frozenset({
    b"READY", b"ERROR", b"HELLO", b"WELCOME", b"INITIATE", b"MESSAGE",
    b"PING", b"PONG", b"SUBSCRIBE", b"CANCEL", b"JOIN", b"LEAVE",
})
# Mechanisms whose messages travel in clear frames after the handshake. CURVE encrypts
# them (MESSAGE commands), so nothing after a CURVE greeting can be decoded.
CLEAR_MECHANISMS = frozenset({b"NULL", b"PLAIN"})


@dataclass(slots=True)
class Greeting:
    version_major: int
    version_minor: int
    mechanism: bytes  # e.g. b"NULL"
    as_server: bool


def greeting_prefix_ok(prefix: bytes | bytearray | memoryview) -> bool:
    """Whether `prefix` (any length up to 64) can still be the start of a ZMTP 3.x greeting.

    Lets the parser give up on a stream that does not start with a greeting as soon
    as the first wrong byte arrives, not after 64 bytes.
    """
    n = len(prefix)
    if n > 0 and prefix[0] != 0xFF:
        return False
    if n > 9 and prefix[9] != 0x7F:
        return False
    if n > 10 and prefix[10] < 3:  # ZMTP 1.0/2.0 peers: not what ps-lite's libzmq speaks
        return False
    return True


def parse_greeting(g: bytes | bytearray | memoryview) -> Greeting | None:
    """The 64-byte greeting, or None if it is not a well-formed ZMTP 3.x greeting."""
    if len(g) != GREETING_BYTES or not greeting_prefix_ok(g):
        return None
    mech = bytes(g[12:32])
    name = mech.rstrip(b"\x00")
    # mechanism: ASCII upper-case letters, digits, '-', '_', '.', '+' padded with zeros
    if not name or b"\x00" in name or not all(c < 0x80 and (chr(c).isalnum() or c in b"-_.+") for c in name):
        return None
    if g[32] not in (0, 1):
        return None
    if any(g[33:64]):  # filler: 31 zero octets
        return None
    return Greeting(g[10], g[11], name, bool(g[32]))


@dataclass(slots=True)
class Command:
    name: bytes
    properties: dict[bytes, bytes]  # READY/INITIATE metadata, names lower-cased; empty for others
    error_reason: bytes | None = None  # ERROR only


def parse_command(body: bytes | bytearray | memoryview) -> Command | None:
    """A command body, or None if it is malformed or names no command the specs define."""
    if len(body) < 1:
        return None
    name_len = body[0]
    if name_len == 0 or 1 + name_len > len(body):
        return None
    name = bytes(body[1:1 + name_len])
    if name not in KNOWN_COMMANDS:
        return None
    data = bytes(body[1 + name_len:])
    if name in (b"READY", b"INITIATE"):
        props = parse_properties(data)
        return Command(name, props if props is not None else {})
    if name == b"ERROR":
        reason = data[1:1 + data[0]] if data else b""
        return Command(name, {}, reason)
    return Command(name, {})


def parse_properties(data: bytes) -> dict[bytes, bytes] | None:
    """READY metadata: repeated (name-size 1 octet, name, value-size 4 octets big endian, value)."""
    props: dict[bytes, bytes] = {}
    i, n = 0, len(data)
    while i < n:
        nl = data[i]
        if nl == 0 or i + 1 + nl + 4 > n:
            return None
        key = data[i + 1:i + 1 + nl]
        i += 1 + nl
        vl = int.from_bytes(data[i:i + 4], "big")
        i += 4
        if i + vl > n:
            return None
        props[key.lower()] = data[i:i + vl]  # property names are case-insensitive
        i += vl
    return props
