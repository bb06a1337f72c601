"""Which functions a shared library exports, read from its ELF dynamic symbol table.

A uprobe attaches by symbol name; before attaching, the probe checks that the
library defines every function it means to probe, so a library of another build
is refused with the names it lacks instead of failing half-attached. The file is
the traced process's and hostile: it is read as bytes (never loaded, nothing of it
runs), every offset and size it gives is checked against the file before use.
Only 64-bit little-endian ELF, what the probes run on (x86-64).
"""
from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Iterable

from core.errors import UserError

_ELF_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")   # e_ident .. e_shstrndx
_SECTION = struct.Struct("<IIQQQQIIQQ")            # sh_name .. sh_entsize
_SYMBOL = struct.Struct("<IBBHQQ")                 # st_name, st_info, st_other, st_shndx, st_value, st_size
SHT_STRTAB, SHT_DYNSYM = 3, 11
STT_FUNC, STT_GNU_IFUNC = 2, 10
SHN_UNDEF = 0
# A table larger than this is no library's (libpaddle.so's .dynstr: 25 MB)
TABLE_BYTES_MAX = 256 << 20


def defined_functions(library: Path, names: Iterable[str]) -> set[str]:
    """Those of `names` that library's .dynsym defines as functions (nm -D's T and W)."""
    wanted = {n.encode() for n in names}
    try:
        with open(library, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            dynsym, dynstr = _dynamic_tables(library, f, size)
    except OSError as e:
        raise UserError(f"cannot read the symbols of {library} ({e.strerror}); check the path "
                        "and run as root") from None
    # st_name offsets of the wanted names (a linker may share a string's tail with a
    # longer one, so a name need not follow a NUL)
    at_name: dict[int, bytes] = {}
    for name in wanted:
        pos = dynstr.find(name + b"\0")
        while pos >= 0:
            at_name[pos] = name
            pos = dynstr.find(name + b"\0", pos + 1)
    found = set()
    for st_name, info, _other, shndx, _value, _size in _SYMBOL.iter_unpack(dynsym):
        name = at_name.get(st_name)
        if name is not None and shndx != SHN_UNDEF and info & 0xF in (STT_FUNC, STT_GNU_IFUNC):
            found.add(name.decode())
    return found


def _dynamic_tables(library: Path, f, size: int) -> tuple[bytes, bytes]:
    """(.dynsym, its string table) of an open ELF file of `size` bytes."""
    def bad(why: str) -> UserError:
        return UserError(f"{library} is not a shared library the probes can read: {why}")

    head = f.read(_ELF_HEADER.size)
    if len(head) < _ELF_HEADER.size or head[:4] != b"\x7fELF":
        raise bad("no ELF header")
    if head[4] != 2 or head[5] != 1:
        raise bad("not 64-bit little-endian ELF")
    fields = _ELF_HEADER.unpack(head)
    shoff, shentsize, shnum = fields[6], fields[11], fields[12]
    if shentsize != _SECTION.size or shnum == 0 or shoff + shnum * shentsize > size:
        raise bad("its section headers lie outside the file")
    f.seek(shoff)
    sections = [_SECTION.unpack(b) for b in _chunks(f.read(shnum * shentsize), shentsize)]
    dynsym = next((s for s in sections if s[1] == SHT_DYNSYM), None)
    if dynsym is None:
        raise bad("no dynamic symbol table")
    link = dynsym[6]
    if link >= shnum or sections[link][1] != SHT_STRTAB:
        raise bad("its dynamic symbols name no string table")
    if dynsym[9] != _SYMBOL.size:
        raise bad(f"dynamic symbols of {dynsym[9]} bytes, not {_SYMBOL.size}")

    def read(section) -> bytes:
        offset, length = section[4], section[5]
        if length > TABLE_BYTES_MAX or offset + length > size:
            raise bad("a symbol table lies outside the file")
        f.seek(offset)
        return f.read(length)

    syms = read(dynsym)
    return syms[:len(syms) - len(syms) % _SYMBOL.size], read(sections[link])


def _chunks(buf: bytes, n: int):
    return (buf[i:i + n] for i in range(0, len(buf) - n + 1, n))
