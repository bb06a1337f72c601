"""Files from outside (run dirs and snapshots from other hosts) opened so that they cannot
hang or exhaust the reader.

    with open_regular(path, max_bytes=MAX) as f: ...   # a binary file object
    data = read_regular(path, max_bytes=MAX)          # its bytes
    value = parse_json(data, max_depth=64)            # ValueError when not JSON or too deep

Only regular files are read: a FIFO in a run dir would block open() or read() for
good, a link to /dev/urandom or /dev/zero would be read until memory runs out, a
directory or a socket is no file to parse. The file is opened with O_NONBLOCK (so
that opening a FIFO returns at once) and judged by fstat of what was opened, not by
a stat of the path before (which another process could swap in between). Sizes are
capped by the caller's limit, checked against fstat and again while reading (a file
may grow meanwhile). Every refusal is an OSError whose message says what the file is.
"""
from __future__ import annotations

import json
import os
import re
import stat
from typing import Any, BinaryIO

import numpy as np

_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"), (stat.S_ISSOCK, "a socket"))


class NotRegularFile(OSError):
    """Not a regular file, or larger than the reader takes; str() says which, naming the path."""


class JsonTooDeep(ValueError):
    """JSON nested deeper than the reader takes."""


def kind_of(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path, max_bytes: int | None = None) -> BinaryIO:
    """The file at `path` opened for reading when it is a regular file (after links) of at most
    max_bytes; else NotRegularFile. OSError as open() gives it when it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{path} is not a regular file ({kind_of(st.st_mode)})")
        if max_bytes is not None and st.st_size > max_bytes:
            raise NotRegularFile(f"{path} is larger than {max_bytes:,} bytes ({st.st_size:,})")
        os.set_blocking(fd, True)   # a regular file never blocks; pyarrow's reads expect blocking
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most max_bytes (see open_regular)."""
    with open_regular(path, max_bytes) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:   # it grew after fstat
        raise NotRegularFile(f"{path} is larger than {max_bytes:,} bytes")
    return data


# A JSON string literal (escapes included): brackets inside strings do not nest.
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_OPEN, _CLOSE = np.zeros(256, np.int8), np.zeros(256, np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_CLOSE[[ord("]"), ord("}")]] = 1


def json_depth(data: bytes) -> int:
    """How deep the arrays and objects of a JSON text nest (0 for a scalar), counted without
    parsing: json.loads recurses once per level, so 100k levels end in RecursionError at best."""
    b = np.frombuffer(_JSON_STRING.sub(b'""', data), dtype=np.uint8)
    if not len(b):
        return 0
    level = np.cumsum(_OPEN[b].astype(np.int64) - _CLOSE[b])
    return int(level.max(initial=0))


def parse_json(data: bytes, max_depth: int) -> Any:
    """JSON text (UTF-8) -> its value; ValueError saying why when it is not JSON or nests
    deeper than max_depth (JsonTooDeep). NaN and Infinity parse (as Python's json does): the caller's
    checks of each field refuse them where a number must be finite."""
    depth = json_depth(data)
    if depth > max_depth:
        raise JsonTooDeep(f"nested deeper than {max_depth} ({depth} levels)")
    try:
        return json.loads(data)
    except RecursionError:   # cannot happen below max_depth; kept so no input ends in a traceback
        raise JsonTooDeep(f"nested deeper than {max_depth}") from None
    except ValueError as e:   # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"not JSON: {type(e).__name__}: {str(e)[:200]}") from None
