"""The kernels a cubin holds, by mangled name, and the C++ signature each name spells.

A cubin's symbol table marks every ``__global__`` function (STO_CUDA_ENTRY in ``st_other``). An
``extern "C"`` kernel's symbol is its plain name and says nothing of its types; any other kernel's is
an Itanium-mangled name that encodes its scope, template arguments and parameter types. Demangled
(by the C++ runtime's ``__cxa_demangle``, which every Linux host has in libstdc++), that name lets the
gate find the kernel an entry such as ``reduce0<float>`` names in a cubin that nvcc built, and check
each parameter's C type (not only its size, :mod:`.params`) against the suite's signature.

The cubin is parsed as untrusted bytes (every offset checked; :class:`~.params.ParamInfoError`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import re
import struct
from dataclasses import dataclass
from functools import lru_cache

from .params import ParamInfoError, sections
from .protocol import DTYPES

_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10
_MAX_NAME = 4096  # a mangled name longer than this is not one a suite can name
# Pointee C types the demangler spells for each signature dtype (``const`` and ``__restrict__`` aside).
C_TYPES: dict[str, frozenset[str]] = {
    name: frozenset({spelling, *extra}) for name, (_, spelling), extra in (
        (name, DTYPES[name], {"float16": {"half"}, "int64": {"long"}, "uint64": {"unsigned long"},
                              "int8": {"char"}, "bfloat16": {"nv_bfloat16"}}.get(name, set()))
        for name in DTYPES)
}


@dataclass(frozen=True)
class Kernel:
    """One ``__global__`` function of a cubin."""

    symbol: str  # what the driver looks up (cuModuleGetFunction)
    name: str  # scope and template arguments, as C++ spells them: "ns::reduce0<float>"; the symbol if extern "C"
    params: tuple[str, ...] | None  # each parameter's C type ("float const*"); None for an extern "C" kernel


def kernels(cubin: bytes) -> tuple[Kernel, ...]:
    """Every kernel ``cubin`` holds, in symbol-table order."""
    found = []
    symtab = sections(cubin).get(b".symtab")
    strtab = sections(cubin).get(b".strtab")
    if symtab is None or strtab is None:
        return ()
    for start in range(0, len(symtab) - _SYM.size + 1, _SYM.size):
        name_at, info, other, _, _, _ = _SYM.unpack_from(symtab, start)
        if info & 0xF != _STT_FUNC or not other & _STO_CUDA_ENTRY:
            continue
        end = strtab.find(b"\x00", name_at)
        if name_at >= len(strtab) or end < 0 or end - name_at > _MAX_NAME:
            raise ParamInfoError("a kernel's symbol name lies outside the string table or is over-long")
        symbol = strtab[name_at:end].decode("ascii", "replace")
        found.append(described(symbol))
    return tuple(found)


def described(symbol: str) -> Kernel:
    """``symbol``'s kernel name and parameter types, from its mangling (none for a plain name)."""
    text = demangle(symbol) if symbol.startswith("_Z") else None
    if text is None:
        return Kernel(symbol, symbol, None)
    split = _top_level_paren(text)
    if split is None:
        return Kernel(symbol, symbol, None)
    head, params = text[:split], text[split + 1:-1]
    # A template kernel's mangling carries its return type; a kernel returns void.
    name = head[5:] if head.startswith("void ") else head
    types = tuple(p.strip() for p in _split_top(params)) if params.strip() not in ("", "void") else ()
    return Kernel(symbol, name, types)


def find(cubin: bytes, entry: str) -> tuple[Kernel | None, tuple[Kernel, ...]]:
    """The kernel ``entry`` names (its symbol, or its C++ name with template arguments, spaces aside),
    and every kernel of the cubin (to list when none or several match)."""
    every = kernels(cubin)
    wanted = _squeeze(entry)
    matches = [k for k in every if k.symbol == entry or _squeeze(k.name) == wanted]
    if len(matches) != 1:
        # "reduce0<float>" also names "::reduce0<float>"; an unqualified name matches a scoped one only alone.
        matches = matches or [k for k in every if _squeeze(k.name).split("::")[-1] == wanted]
    return (matches[0] if len(matches) == 1 else None), every


def pointee_dtype(c_type: str) -> str | None:
    """The signature dtype a pointer parameter's C type points to (``float const*`` -> float32);
    None for a non-pointer or a type the signature cannot name (a struct, ``void*``)."""
    text = _strip_qualifiers(c_type)
    if not text.endswith("*") or text.count("*") != 1:
        return None
    return scalar_dtype(text[:-1])


def scalar_dtype(c_type: str) -> str | None:
    """The signature dtype of a by-value C type (``unsigned int`` -> uint32), or None."""
    text = _strip_qualifiers(c_type)
    return next((name for name, spellings in C_TYPES.items() if text in spellings), None)


@lru_cache(maxsize=1)
def _cxa_demangle():
    path = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        function = ctypes.CDLL(path).__cxa_demangle
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t),
                         ctypes.POINTER(ctypes.c_int)]
    return function


@lru_cache(maxsize=1)
def _free():
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return free


def demangle(symbol: str) -> str | None:
    """``symbol`` as C++ spells it, or None (not a mangled name, or no C++ runtime on this host)."""
    function = _cxa_demangle()
    if function is None or len(symbol) > _MAX_NAME:
        return None
    status = ctypes.c_int(0)
    pointer = function(symbol.encode("ascii", "replace"), None, None, ctypes.byref(status))
    if status.value != 0 or not pointer:
        return None
    try:
        return ctypes.string_at(pointer).decode("utf-8", "replace")
    finally:
        _free()(pointer)


def _top_level_paren(text: str) -> int | None:
    """Where the parameter list of a demangled function name opens (the last top-level '(')."""
    if not text.endswith(")"):
        return None
    depth = 0
    for at in range(len(text) - 1, -1, -1):
        char = text[at]
        if char in ")>":
            depth += 1
        elif char in "(<":
            depth -= 1
            if depth == 0 and char == "(":
                return at
    return None


def _split_top(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for at, char in enumerate(text):
        if char in "(<[":
            depth += 1
        elif char in ")>]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:at])
            start = at + 1
    return [*parts, text[start:]]


def _strip_qualifiers(c_type: str) -> str:
    text = re.sub(r"\b(const|volatile|__restrict__|__restrict|restrict)\b", " ", c_type)
    text = re.sub(r"\s*\*\s*", "*", text)
    return " ".join(text.split())


def _squeeze(name: str) -> str:
    return re.sub(r"\s+", "", name).removeprefix("::")


def type_problems(kernel: Kernel, signature: list[dict], source: str = "the signature") -> list[str]:
    """How the C types ``kernel``'s mangled name spells differ from ``signature``'s dtypes, one line
    each (a ``float*`` where an int32 buffer is passed, an ``int`` for a float32 scalar): mismatches
    of one size that the parameter layout cannot show. None for an ``extern "C"`` kernel, whose name
    carries no types, and nothing said of a type the signature cannot name (a struct, ``void*``)."""
    if kernel.params is None:
        return []
    problems = []
    for number, (c_type, wanted) in enumerate(zip(kernel.params, signature), start=1):
        pointer = _strip_qualifiers(c_type).endswith("*")
        if wanted["kind"] == "buffer":
            found = pointee_dtype(c_type) if pointer else scalar_dtype(c_type)
            wrong = not pointer or (found is not None and found != wanted["dtype"])
            said = f"a {wanted['dtype']} buffer"
        else:
            found = scalar_dtype(c_type)
            wrong = pointer or (found is not None and found != wanted["dtype"])
            said = f"a {wanted['dtype']} scalar"
        if wrong:
            problems.append(f"parameter {number} {wanted['name']!r}: the kernel takes `{c_type}` ({kernel.name}), "
                            f"{source} says {said}")
    return problems
