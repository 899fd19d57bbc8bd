"""An entry's parameter layout, read from the cubin NVRTC produced (no GPU needed), and its check
against a signature.

The driver copies each argument by the kernel's own layout, so a kernel that takes 3 parameters where
the signature lists 4, or a ``long long`` where it says int32, reads past or beside what the harness
passes: wrong results or memory corruption on a GPU, and nothing at compile time. The cubin says what
the entry takes: its ``.nv.info.<lowered name>`` section holds one EIATTR_KPARAM_INFO record per
parameter (ordinal, byte offset, byte size) and EIATTR_PARAM_CBANK (the parameters' total size).

Record layout, checked against NVRTC 13.5 cubins for sm_75 to sm_121 of kernels with known parameter
lists (every scalar width, pointers, by-value structs, ``__grid_constant__``, 0 parameters, over 4 KiB;
tests/harness/test_params.py):
a record is ``u8 format, u8 attribute``, then a u16 value (formats 1-3) or a u16 payload size and
the payload (format 4, EIFMT_SVAL). KPARAM_INFO's (0x17) payload: u32 index, u16 ordinal, u16 offset,
u32 whose bits 18-31 are the size in bytes (bits 0-17: pointee alignment, space and constant bank).
Past about 4 KiB of parameters NVRTC 13 writes attribute 0x45 instead, whose last u32 is the size.

Sizes cannot tell a ``double*`` from a ``float*`` (both pointers) or ``int`` from ``float``: for a
C++ entry its mangled name spells the types (:func:`.symbols.type_problems`); for an ``extern "C"``
one those mismatches still show only on a GPU. The cubin is NVRTC's (or the SHA-checked compile cache's), but it
is parsed as untrusted bytes: every offset and size is checked, and a malformed one is a
:class:`ParamInfoError` with one line saying what is wrong.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .protocol import numpy_dtype

POINTER_BYTES = 8  # 64-bit device code only: NVRTC dropped 32-bit targets
_ELF_MAGIC = b"\x7fELF"
_ELFCLASS64, _ELFDATA2LSB = 2, 1
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_MAX_SECTIONS = 1 << 16
_EIFMT_SVAL = 0x04
_EIATTR_PARAM_CBANK = 0x0A
_EIATTR_KPARAM_INFO = 0x17
_EIATTR_KPARAM_INFO_V2 = 0x45  # what NVRTC writes instead once the parameters exceed about 4 KiB
_KPARAM = struct.Struct("<IHHI")
_SIZE_SHIFT = 18  # KPARAM_INFO's size field; V2's is the whole word
# C types of a size, for a message only: a size alone never names one type.
_SIZE_TYPES = {1: "char, bool", 2: "short, __half", 4: "int, float", 8: "long long, double or a pointer"}


class ParamInfoError(ValueError):
    """The cubin's parameter info cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class KernelParam:
    ordinal: int
    offset: int  # bytes into the parameter space
    size: int  # bytes


@dataclass(frozen=True)
class ParamLayout:
    params: tuple[KernelParam, ...]  # by ordinal
    total_bytes: int  # EIATTR_PARAM_CBANK's size; 0 for an entry without parameters


def entry_params(cubin: bytes, lowered_name: str) -> ParamLayout:
    """The parameters of the entry ``lowered_name`` (NVRTC's lowered name) in ``cubin``."""
    info = _section(cubin, f".nv.info.{lowered_name}".encode())
    if info is None:
        raise ParamInfoError(f"the cubin has no .nv.info.{lowered_name} section (no parameter info for that entry)")
    params: dict[int, KernelParam] = {}
    total = 0
    position = 0
    while position < len(info):
        if position + 4 > len(info):
            raise ParamInfoError(f"a parameter-info record is cut short at byte {position}")
        form, attribute, value = struct.unpack_from("<BBH", info, position)
        position += 4
        if form != _EIFMT_SVAL:
            if not 1 <= form <= 3:
                raise ParamInfoError(f"unknown parameter-info record format {form} at byte {position - 4}")
            continue
        payload = info[position:position + value]
        if len(payload) != value:
            raise ParamInfoError(f"a parameter-info record at byte {position - 4} runs past its section")
        position += value
        if attribute in (_EIATTR_KPARAM_INFO, _EIATTR_KPARAM_INFO_V2):
            if value < _KPARAM.size:
                raise ParamInfoError(f"a parameter record of {value} bytes (expected {_KPARAM.size})")
            _, ordinal, offset, word = _KPARAM.unpack_from(payload)
            if ordinal in params:
                raise ParamInfoError(f"parameter ordinal {ordinal} is described twice")
            size = word >> _SIZE_SHIFT if attribute == _EIATTR_KPARAM_INFO else word
            params[ordinal] = KernelParam(ordinal, offset, size)
        elif attribute == _EIATTR_PARAM_CBANK:
            if value < 8:
                raise ParamInfoError(f"a PARAM_CBANK record of {value} bytes (expected 8)")
            total = struct.unpack_from("<H", payload, 6)[0]
    ordered = tuple(params[n] for n in sorted(params))
    if [p.ordinal for p in ordered] != list(range(len(ordered))):
        raise ParamInfoError(f"parameter ordinals {[p.ordinal for p in ordered]} are not 0..{len(ordered) - 1}")
    if any(p.offset + p.size > total for p in ordered):
        raise ParamInfoError(f"a parameter lies past the parameters' total size of {total} bytes")
    return ParamLayout(ordered, total)


def _section(elf: bytes, name: bytes) -> bytes | None:
    """The contents of the section named ``name``, or None."""
    return sections(elf).get(name)


def sections(elf: bytes) -> dict[bytes, bytes]:
    """Every section's contents by name (the first of a name); every header and range checked."""
    if len(elf) < 64 or elf[:4] != _ELF_MAGIC:
        raise ParamInfoError("not an ELF file")
    if elf[4] != _ELFCLASS64 or elf[5] != _ELFDATA2LSB:
        raise ParamInfoError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shentsize != _SHDR.size or not 0 < shnum <= _MAX_SECTIONS or shstrndx >= shnum \
            or shoff + shnum * _SHDR.size > len(elf):
        raise ParamInfoError("the ELF section header table is malformed")
    headers = [_SHDR.unpack_from(elf, shoff + n * _SHDR.size) for n in range(shnum)]

    def contents(header) -> bytes:
        offset, size = header[4], header[5]
        if offset + size > len(elf):
            raise ParamInfoError("an ELF section runs past the end of the file")
        return elf[offset:offset + size]

    names = contents(headers[shstrndx])
    found: dict[bytes, bytes] = {}
    for header in headers:
        start = header[0]
        if start >= len(names):
            raise ParamInfoError("an ELF section name lies outside the section name table")
        end = names.find(b"\x00", start)
        name = names[start:] if end < 0 else names[start:end]
        if name not in found:
            # SHT_NOBITS (8) holds no bytes in the file, whatever its offset says.
            found[name] = b"" if header[1] == 8 else contents(header)
    return found


def expected_size(param: dict) -> int:
    """What a signature entry (``{name, kind, dtype}``, as the protocol carries it) passes: a buffer
    is a device pointer, a scalar its dtype's size."""
    return POINTER_BYTES if param["kind"] == "buffer" else numpy_dtype(param["dtype"]).itemsize


def signature_problems(layout: ParamLayout, signature: list[dict], source: str = "the signature") -> list[str]:
    """How the kernel's parameters differ from ``signature``, one line each (what passes them named
    ``source``: a step's args, say); empty when they agree.

    Each parameter must have the size the signature passes, at the offset the C ABI gives that list
    (each aligned to its own size, as a pointer and every scalar dtype are). The driver places every
    argument where the kernel's layout says, so a wrong offset alone corrupts nothing, but it shows a
    type that is not the signature's: a struct of two shorts has an int32's size, not its alignment.
    """
    problems = []
    if len(layout.params) != len(signature):
        listed = ", ".join(p["name"] for p in signature) or "none"
        problems.append(f"the kernel takes {_count(len(layout.params))}, {source} lists "
                        f"{len(signature)} ({listed})")
    offset, agreed = 0, True
    for number, (kernel, wanted) in enumerate(zip(layout.params, signature), start=1):
        size = expected_size(wanted)
        offset = -(-offset // size) * size
        said = (f"a {wanted['dtype']} buffer (a pointer, {POINTER_BYTES} bytes)" if wanted["kind"] == "buffer"
                else f"{wanted['dtype']} ({_count(size, 'byte')})")
        if kernel.size != size:
            problems.append(f"parameter {number} {wanted['name']!r}: the kernel takes {_bytes(kernel.size)}, "
                            f"{source} says {said}")
            agreed = False
        elif kernel.offset != offset and agreed:
            # Only while every parameter before agreed: after a wrong size or place every offset moves.
            problems.append(f"parameter {number} {wanted['name']!r}: the kernel's parameter sits at byte {kernel.offset}, "
                            f"where {said} would sit at byte {offset}: the kernel takes a struct or array of the "
                            "same size but a smaller alignment")
            agreed = False
        offset += size
    return problems


def _count(n: int, noun: str = "parameter") -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _bytes(size: int) -> str:
    return f"{_count(size, 'byte')} ({_SIZE_TYPES.get(size, 'a struct or array by value')})"

