"""Point one imported libc function of a loaded shared object at a Python callback.

A shared object calls libc through its own procedure-linkage table: each call jumps
through a slot of its global offset table (GOT) that the dynamic linker fills with the
address of, say, ``bind``. Replacing that one slot with the address of a ctypes callback
changes what *that object* calls, and nothing else: libc, Python and every other library
keep the real function. This module finds the slot from the object's own ELF relocations
(``.rela.plt`` and ``.rela.dyn``, the entries naming the symbol) and its load address
(``/proc/self/maps``), and writes it (lifting a read-only RELRO page for the write).

Linux x86-64 and aarch64, 64-bit little-endian ELF only; anything else raises
:class:`PltHookError`, naming the file, and nothing is written.
"""

from __future__ import annotations

import ctypes
import mmap
import struct
from pathlib import Path

_ELF_MAGIC = b"\x7fELF"
_SHT_RELA = 4
_JUMP_SLOTS = {62: (6, 7), 183: (1025, 1026)}  # e_machine -> (GLOB_DAT, JUMP_SLOT): x86-64, aarch64
_PROT = {"r": mmap.PROT_READ, "w": mmap.PROT_WRITE, "x": mmap.PROT_EXEC}


class PltHookError(OSError):
    """A shared object whose GOT slot cannot be found or written; the message names the file."""


def loaded_objects(under: Path) -> dict[Path, int]:
    """Every shared object mapped in this process from a file below ``under``: path -> load address."""
    under = under.resolve()
    bases: dict[Path, int] = {}
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or not fields[5].startswith("/"):
            continue
        path = Path(fields[5])
        if under not in path.parents or int(fields[2], 16) != 0:
            continue
        start = int(fields[0].split("-")[0], 16)
        bases[path] = min(start, bases.get(path, start))
    return bases


def got_slots(path: Path, symbol: str) -> list[int]:
    """The offsets (from the load address) of the GOT slots through which ``path`` calls ``symbol``."""
    data = path.read_bytes()
    if data[:4] != _ELF_MAGIC or data[4] != 2 or data[5] != 1:
        raise PltHookError(f"{path}: not a 64-bit little-endian ELF object")
    machine = struct.unpack_from("<H", data, 18)[0]
    if machine not in _JUMP_SLOTS:
        raise PltHookError(f"{path}: ELF machine {machine} is not x86-64 or aarch64")
    e_shoff, = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum = struct.unpack_from("<HH", data, 58)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    wanted = symbol.encode()
    slots = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != _SHT_RELA or not entsize:
            continue
        symtab = sections[link]
        strtab = sections[symtab[6]]
        for index in range(size // entsize):
            r_offset, r_info, _addend = struct.unpack_from("<QQq", data, offset + index * entsize)
            if (r_info & 0xFFFFFFFF) not in _JUMP_SLOTS[machine]:
                continue
            st_name, = struct.unpack_from("<I", data, symtab[4] + (r_info >> 32) * symtab[9])
            start = strtab[4] + st_name
            if data[start:data.index(b"\0", start)] == wanted:
                slots.append(r_offset)
    return slots


def _protection(address: int) -> int:
    """The current protection of the page holding ``address`` (from ``/proc/self/maps``)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, perms = line.split()[:2]
        low, high = (int(part, 16) for part in span.split("-"))
        if low <= address < high:
            return sum(bit for letter, bit in _PROT.items() if letter in perms)
    raise PltHookError(f"address {address:#x} is not mapped")


def write_slot(address: int, value: int) -> int:
    """Write ``value`` into the pointer at ``address`` (a GOT slot); returns what was there."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    page = address & ~(mmap.PAGESIZE - 1)
    before = _protection(address)
    writable = before | mmap.PROT_WRITE
    if before != writable and libc.mprotect(page, mmap.PAGESIZE, writable) != 0:
        raise PltHookError(f"mprotect({page:#x}) failed: errno {ctypes.get_errno()}")
    slot = ctypes.c_void_p.from_address(address)
    previous = slot.value or 0
    slot.value = value
    if before != writable:
        libc.mprotect(page, mmap.PAGESIZE, before)
    return previous
