"""Kernel struct member offsets, read from the running kernel's BTF.

Why: the kernel headers installed on our machines are not this kernel's
(DESIGN.md, "Kernel facts"), so a probe never reads a kernel struct through
header offsets. It asks this module for `sock.__sk_common.skc_daddr` and gets
the byte offset and size this kernel really uses; the loader passes them to
the BPF program as -D constants.

This is a small reader of the kernel's BTF format
(Documentation/bpf/btf.rst, include/uapi/linux/btf.h): a header, a type
section (records of variable length, type ids counted from 1), a string
section. One pass indexes where each type record starts and the names of
structs and unions; members are decoded only when asked for. Anonymous
nested structs/unions are searched through, so a path names only the members
a C programmer would write (`sock.__sk_common.skc_daddr`, `sk_buff.len`).
Pointers are never followed: each pointer hop is a separate read in BPF, so
it is a separate path here (`task_struct.files`, then `files_struct.fdt`).
"""
from __future__ import annotations

import os
import struct
from array import array
from dataclasses import dataclass
from pathlib import Path

from core.errors import UserError

VMLINUX_BTF_PATH = Path("/sys/kernel/btf/vmlinux")
BTF_MAGIC = 0xEB9F

# BTF kinds (include/uapi/linux/btf.h).
KIND_INT, KIND_PTR, KIND_ARRAY, KIND_STRUCT, KIND_UNION, KIND_ENUM = 1, 2, 3, 4, 5, 6
KIND_FWD, KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT = 7, 8, 9, 10, 11
KIND_FUNC, KIND_FUNC_PROTO, KIND_VAR, KIND_DATASEC, KIND_FLOAT = 12, 13, 14, 15, 16
KIND_DECL_TAG, KIND_TYPE_TAG, KIND_ENUM64 = 17, 18, 19

# Bytes that follow the 12-byte common record: (fixed, per vlen item).
_TAIL_BYTES = {
    KIND_INT: (4, 0), KIND_PTR: (0, 0), KIND_ARRAY: (12, 0), KIND_STRUCT: (0, 12),
    KIND_UNION: (0, 12), KIND_ENUM: (0, 8), KIND_FWD: (0, 0), KIND_TYPEDEF: (0, 0),
    KIND_VOLATILE: (0, 0), KIND_CONST: (0, 0), KIND_RESTRICT: (0, 0), KIND_FUNC: (0, 0),
    KIND_FUNC_PROTO: (0, 8), KIND_VAR: (4, 0), KIND_DATASEC: (0, 12), KIND_FLOAT: (0, 0),
    KIND_DECL_TAG: (4, 0), KIND_TYPE_TAG: (0, 0), KIND_ENUM64: (0, 12),
}
# Kinds that only qualify or rename another type: looked through when asking
# "what is this member really".
_TRANSPARENT = (KIND_TYPEDEF, KIND_VOLATILE, KIND_CONST, KIND_RESTRICT, KIND_TYPE_TAG)
_COMPOSITE = (KIND_STRUCT, KIND_UNION)


class BtfError(UserError):
    """BTF missing, unreadable, or without a member a probe needs."""


@dataclass(frozen=True)
class Member:
    """Where a (possibly nested) member lives inside its outermost struct."""

    path: str
    offset_bits: int
    size_bytes: int
    bitfield_bits: int  # 0 unless the member is a bitfield
    type_name: str

    @property
    def is_bitfield(self) -> bool:
        return self.bitfield_bits != 0 or self.offset_bits % 8 != 0

    @property
    def offset_bytes(self) -> int:
        if self.is_bitfield:
            raise BtfError(
                f"{self.path} is a bitfield ({self.bitfield_bits} bits at bit {self.offset_bits}); "
                "a probe cannot read it as a whole field: read the containing word instead"
            )
        return self.offset_bits // 8


class Btf:
    """A parsed BTF blob: `member('tcp_sock.write_seq')`, `sizeof('sock')`."""

    def __init__(self, data: bytes, source: str = "<bytes>"):
        self.source = source
        if len(data) < 24:
            raise BtfError(f"{source} is too short to be BTF ({len(data)} bytes); "
                           "point pslat at the kernel's BTF (/sys/kernel/btf/vmlinux)")
        magic_le = struct.unpack_from("<H", data, 0)[0]
        if magic_le == BTF_MAGIC:
            self._e = "<"
        elif magic_le == 0x9FEB:
            self._e = ">"
        else:
            raise BtfError(f"{source} is not BTF (magic {magic_le:#06x}, expected {BTF_MAGIC:#06x}); "
                           "point pslat at the kernel's BTF (/sys/kernel/btf/vmlinux)")
        hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from(self._e + "5I", data, 4)
        self._data = data
        self._types_at = hdr_len + type_off
        self._types_end = self._types_at + type_len
        self._strs_at = hdr_len + str_off
        self._strs_end = self._strs_at + str_len
        if self._types_end > len(data) or self._strs_end > len(data):
            raise BtfError(f"{source} is truncated (sections end past {len(data)} bytes); "
                           "the BTF file is damaged: check the kernel's /sys/kernel/btf/vmlinux")
        self._index()

    # -- loading ---------------------------------------------------------------

    @classmethod
    def open(cls, path: str | os.PathLike = VMLINUX_BTF_PATH) -> "Btf":
        path = Path(path)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BtfError(
                f"no BTF at {path}: this kernel was built without CONFIG_DEBUG_INFO_BTF; "
                "pslat reads kernel struct layouts from BTF, so run it on a kernel that has it"
            ) from None
        except PermissionError:
            raise BtfError(f"cannot read {path} (permission denied); run pslat as root") from None
        return cls(data, str(path))

    def _index(self) -> None:
        """One pass over the type section: where each record starts, and the ids of
        named structs/unions. Everything else is decoded on demand."""
        data, e = self._data, self._e
        unpack = struct.Struct(e + "III").unpack_from
        pos = self._types_at
        end = self._types_end
        starts = array("I", [0])  # type id 0 is void: no record
        tail = _TAIL_BYTES
        composite_ids: list[int] = []
        tid = 0
        while pos < end:
            tid += 1
            _, info, _ = unpack(data, pos)
            kind = (info >> 24) & 0x1F
            try:
                fixed, per = tail[kind]
            except KeyError:
                raise BtfError(f"{self.source}: unknown BTF kind {kind} at type {tid}; "
                               "this BTF is newer than pslat's reader: please report it") from None
            starts.append(pos)
            if kind == KIND_STRUCT or kind == KIND_UNION:
                composite_ids.append(tid)
            pos += 12 + fixed + per * (info & 0xFFFF)
        self._starts = starts
        self._by_name: dict[str, list[int]] = {}
        for tid in composite_ids:
            name_off = unpack(data, starts[tid])[0]
            if name_off:
                self._by_name.setdefault(self._str(name_off), []).append(tid)

    # -- raw access ------------------------------------------------------------

    @property
    def type_count(self) -> int:
        return len(self._starts) - 1

    def _str(self, off: int) -> str:
        at = self._strs_at + off
        return self._data[at:self._data.index(b"\0", at)].decode()

    def _rec(self, tid: int) -> tuple[int, int, int, int, int]:
        """(name_off, kind, vlen, kind_flag, size_or_type) of type `tid`."""
        name_off, info, size_or_type = struct.unpack_from(self._e + "III", self._data, self._starts[tid])
        return name_off, (info >> 24) & 0x1F, info & 0xFFFF, info >> 31, size_or_type

    def _members(self, tid: int):
        """(name, type id, bit offset, bitfield bits) of a struct/union's direct members."""
        _, kind, vlen, kflag, _ = self._rec(tid)
        at = self._starts[tid] + 12
        for i in range(vlen):
            name_off, mtype, off = struct.unpack_from(self._e + "III", self._data, at + 12 * i)
            if kflag:
                yield (self._str(name_off) if name_off else ""), mtype, off & 0xFFFFFF, off >> 24
            else:
                yield (self._str(name_off) if name_off else ""), mtype, off, 0

    def _resolve(self, tid: int) -> int:
        """Look through typedefs and qualifiers."""
        for _ in range(64):
            if tid == 0:
                return 0
            _, kind, _, _, ref = self._rec(tid)
            if kind not in _TRANSPARENT:
                return tid
            tid = ref
        raise BtfError(f"{self.source}: typedef chain too long at type {tid}; the BTF is damaged")

    def _size(self, tid: int) -> int:
        tid = self._resolve(tid)
        if tid == 0:
            return 0
        _, kind, _, _, size_or_type = self._rec(tid)
        if kind == KIND_PTR:
            return self._pointer_size()
        if kind == KIND_ARRAY:
            elem, _, nelems = struct.unpack_from(self._e + "III", self._data, self._starts[tid] + 12)
            return nelems * self._size(elem)
        if kind in (KIND_INT, KIND_STRUCT, KIND_UNION, KIND_ENUM, KIND_ENUM64, KIND_FLOAT, KIND_DATASEC):
            return size_or_type
        raise BtfError(f"{self.source}: type {tid} (kind {kind}) has no size")

    def _pointer_size(self) -> int:
        # The kernel's own 'long' tells its word size; x86-64 and arm64 both say 8.
        return 8

    def _type_name(self, tid: int) -> str:
        if tid == 0:
            return "void"
        name_off, kind, _, _, ref = self._rec(tid)
        name = self._str(name_off) if name_off else ""
        if kind == KIND_PTR:
            return self._type_name(ref) + " *"
        if kind == KIND_ARRAY:
            elem, _, nelems = struct.unpack_from(self._e + "III", self._data, self._starts[tid] + 12)
            return f"{self._type_name(elem)}[{nelems}]"
        if kind in (KIND_CONST, KIND_VOLATILE, KIND_RESTRICT, KIND_TYPE_TAG):
            return self._type_name(ref)
        if kind == KIND_STRUCT:
            return f"struct {name or '<anon>'}"
        if kind == KIND_UNION:
            return f"union {name or '<anon>'}"
        if kind in (KIND_ENUM, KIND_ENUM64):
            return f"enum {name or '<anon>'}"
        return name or f"<kind {kind}>"

    # -- queries ---------------------------------------------------------------

    def composite(self, name: str) -> int:
        """Type id of the struct or union called `name` (the one with members)."""
        ids = self._by_name.get(name)
        if not ids:
            raise BtfError(f"this kernel's BTF ({self.source}) has no struct or union '{name}'; "
                           "pslat does not support this kernel version: please report it")
        # Deduplicated vmlinux BTF normally holds one definition; prefer a
        # non-empty one if a same-named empty placeholder also exists.
        return max(ids, key=lambda t: self._rec(t)[2])

    def sizeof(self, name: str) -> int:
        return self._size(self.composite(name))

    def _find(self, tid: int, name: str) -> tuple[int, int, int] | None:
        """(bit offset, type id, bitfield bits) of member `name` in composite `tid`,
        searching through anonymous nested structs/unions."""
        anon = []
        for mname, mtype, off, bits in self._members(tid):
            if mname == name:
                return off, mtype, bits
            if not mname:
                anon.append((mtype, off))
        for mtype, off in anon:
            inner = self._resolve(mtype)
            if inner and self._rec(inner)[1] in _COMPOSITE:
                found = self._find(inner, name)
                if found:
                    return off + found[0], found[1], found[2]
        return None

    def member(self, path: str) -> Member:
        """`struct.member[.member...]` -> where it lives in the outer struct."""
        parts = path.split(".")
        if len(parts) < 2 or not all(parts):
            raise BtfError(f"bad member path '{path}'; write it as struct.member[.member...]")
        tid = self.composite(parts[0])
        bit_off, bits, mtype = 0, 0, tid
        for i, part in enumerate(parts[1:], start=1):
            found = self._find(tid, part)
            if found is None:
                where = ".".join(parts[:i])
                raise BtfError(f"this kernel's BTF ({self.source}) has no member '{part}' in {where} "
                               f"({self._type_name(tid)}); pslat does not support this kernel's "
                               f"layout of it: please report it")
            off, mtype, bits = found
            bit_off += off
            if i < len(parts) - 1:
                inner = self._resolve(mtype)
                if not inner or self._rec(inner)[1] not in _COMPOSITE:
                    raise BtfError(f"'{'.'.join(parts[:i + 1])}' is a {self._type_name(mtype)}, "
                                   "not a struct or union: a path cannot go through it "
                                   "(pointers are read one hop at a time)")
                tid = inner
        size = (bits + 7) // 8 if bits else self._size(mtype)
        return Member(path, bit_off, size, bits, self._type_name(mtype))


_cache: dict[tuple, Btf] = {}


def load(path: str | os.PathLike = VMLINUX_BTF_PATH) -> Btf:
    """The BTF at `path`, parsed once per process per file identity."""
    try:
        st = os.stat(path)
        key = (str(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    except FileNotFoundError:
        key = None
    if key is not None and key in _cache:
        return _cache[key]
    btf = Btf.open(path)
    if key is not None:
        _cache[key] = btf
    return btf
