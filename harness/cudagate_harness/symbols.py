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

import json
import re
import struct
import subprocess
import sys
from dataclasses import dataclass
from functools import lru_cache

from .params import ParamInfoError, ParamLayout, expected_size, sections
from .protocol import DTYPES

_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym
_STT_FUNC = 2
_STO_CUDA_ENTRY = 0x10
_LITERAL_SUFFIX = re.compile(r"(?<![\w.])(\d+)(?:[uU](?:ll|LL|l|L)?|(?:ll|LL|l|L)[uU]?)(?![\w.])")
_MAX_NAME = 4096  # a mangled name longer than this is not demangled (a suite names such an entry by symbol)
# The demangler runs in a child process of its own, bounded: a few hundred bytes of mangled name whose
# back-references nest can demangle to gigabytes over minutes (a typedef'd pair of pairs, 24 deep).
DEMANGLE_SECONDS = 5.0
_DEMANGLE_MEMORY = 512 << 20
_DEMANGLED_MAX = 64 << 10  # a longer C++ name is no kernel a suite names
_DEMANGLER = f"""
import ctypes, ctypes.util, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, ({_DEMANGLE_MEMORY}, {_DEMANGLE_MEMORY}))
function = ctypes.CDLL(ctypes.util.find_library("stdc++") or "libstdc++.so.6").__cxa_demangle
function.restype = ctypes.c_void_p
function.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int)]
free = ctypes.CDLL(None).free
free.argtypes = [ctypes.c_void_p]
for line in sys.stdin:
    status = ctypes.c_int(0)
    pointer = function(line.strip().encode("ascii", "replace"), None, None, ctypes.byref(status))
    text = None
    if status.value == 0 and pointer:
        raw = ctypes.string_at(pointer)
        free(pointer)
        text = raw.decode("utf-8", "replace") if len(raw) <= {_DEMANGLED_MAX} else None
    sys.stdout.write(json.dumps(text) + "\\n")
    sys.stdout.flush()
"""
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
        if name_at >= len(strtab) or end < 0:
            raise ParamInfoError("a kernel's symbol name lies outside the string table")
        found.append(strtab[name_at:end].decode("ascii", "replace"))
    texts = demangled(tuple(found))
    return tuple(_described(symbol, texts.get(symbol)) for symbol in found)


def described(symbol: str) -> Kernel:
    """``symbol``'s kernel name and parameter types, from its mangling (none for a plain name)."""
    return _described(symbol, demangle(symbol))


def _described(symbol: str, text: str | None) -> Kernel:
    if text is None:
        return Kernel(symbol, symbol, None)
    split = _top_level_paren(text)
    if split is None:
        return Kernel(symbol, symbol, None)
    head, params = text[:split], text[split + 1:-1]
    # A template kernel's mangling carries its return type; a kernel returns void.
    name = head[5:] if head.startswith("void ") else head
    types = tuple(p.strip() for p in split_top(params)) if params.strip() not in ("", "void") else ()
    return Kernel(symbol, name, types)


def find(cubin: bytes, entry: str) -> tuple[Kernel | None, tuple[Kernel, ...]]:
    """The kernel ``entry`` names (its symbol, or its C++ name with template arguments, spaces aside),
    and every kernel of the cubin (to list when none or several match)."""
    every = kernels(cubin)
    wanted = _squeeze(entry)
    matches = [k for k in every if k.symbol == entry or _squeeze(k.name) == wanted]
    if not matches:
        # Looser spellings, taken only where they name one kernel of the cubin: "reduce0<float>" for
        # "ns::reduce0<float>", and "reduce4<float, 256>" for the demangler's "reduce4<float, 256u>". Two
        # kernels that both fit ("k<256u>" and "evil::k<256>") name none: the gate must time the kernel
        # the suite names, not one that merely shares its short name.
        plain = _unsuffixed(wanted)
        matches = [k for k in every
                   if plain in (_unsuffixed(_squeeze(k.name)), _unsuffixed(_squeeze(k.name).split("::")[-1]))]
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


def type_problems(types: tuple[str, ...], layout: ParamLayout, signature: list[dict],
                  source: str = "the signature") -> list[str]:
    """How a C++ entry's parameter types (:attr:`Kernel.params`) differ from ``signature`` (as
    :func:`~.params.signature_problems` takes it), one line each with the fix; empty when they agree.

    Judged only where the sizes agree (a size that differs is already a line of its own) and the C
    type is one a signature can name: a struct, ``void*`` or a vector type (``float4``) is not judged.
    """
    if len(types) != len(signature) or len(layout.params) != len(signature):
        return []
    problems = []
    for number, (c_type, kernel, wanted) in enumerate(zip(types, layout.params, signature), start=1):
        if kernel.size != expected_size(wanted):
            continue
        pointer = _strip_qualifiers(c_type).endswith("*")
        dtype = pointee_dtype(c_type) if pointer else scalar_dtype(c_type)
        said = f"{_a(wanted['dtype'])} {wanted['kind']}"
        head = f"parameter {number} {wanted['name']!r}: the kernel takes {c_type!r}"
        if wanted["kind"] == "buffer" and not pointer and dtype is not None:
            problems.append(f"{head} by value, {source} says {said} (a pointer): make it `scalar: {dtype}`, or make "
                            f"the kernel's parameter a {DTYPES[wanted['dtype']][1]}*")
        elif wanted["kind"] == "scalar" and pointer:
            problems.append(f"{head} (a pointer), {source} says {said}: make it a buffer (`buffer: {dtype or 'DTYPE'}` "
                            f"with its intent and size), or make the kernel's parameter a {DTYPES[wanted['dtype']][1]}")
        elif dtype is not None and dtype != wanted["dtype"]:
            theirs = f"{_a(dtype)} {'buffer' if pointer else 'scalar'}"
            ours = f"{DTYPES[wanted['dtype']][1]}{'*' if pointer else ''}"
            key = "buffer" if wanted["kind"] == "buffer" else "scalar"
            problems.append(f"{head} ({theirs}), {source} says {said}: write `{key}: {dtype}`, or make the "
                            f"kernel's parameter {ours}")
    return problems


def _a(dtype: str) -> str:
    return f"{'an' if dtype.startswith('int') else 'a'} {dtype}"


def demangle(symbol: str) -> str | None:
    """``symbol`` as C++ spells it, or None (not a mangled name, no C++ runtime on this host, or one
    whose demangling runs past the bounds)."""
    return demangled((symbol,)).get(symbol)


@lru_cache(maxsize=256)
def demangled(symbols: tuple[str, ...]) -> dict[str, str | None]:
    """Each mangled name of ``symbols`` as C++ spells it, from the bounded demangler child (shortest
    first: one name that runs past :data:`DEMANGLE_SECONDS` or the memory cap costs only itself and
    longer ones, which stay undemangled, None)."""
    wanted = sorted({s for s in symbols if s.startswith("_Z") and len(s) <= _MAX_NAME and s.isascii()
                     and s.isprintable()}, key=len)
    if not wanted:
        return {}
    try:
        done = subprocess.run([sys.executable, "-I", "-S", "-c", _DEMANGLER], input="\n".join(wanted) + "\n",
                              capture_output=True, text=True, timeout=DEMANGLE_SECONDS, cwd="/",
                              env={"PATH": "/usr/bin:/bin"})
        out = done.stdout
    except subprocess.TimeoutExpired as stopped:
        out = stopped.stdout.decode(errors="replace") if isinstance(stopped.stdout, bytes) else stopped.stdout or ""
    texts: dict[str, str | None] = {}
    for symbol, line in zip(wanted, out.splitlines()):
        try:
            text = json.loads(line)
        except ValueError:
            break
        texts[symbol] = text if isinstance(text, str) else None
    return texts


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


def split_top(text: str, separator: str = ",") -> list[str]:
    """``text`` split at each ``separator`` outside brackets (a parameter list at its commas)."""
    parts, depth, start = [], 0, 0
    for at, char in enumerate(text):
        if char in "(<[{":
            depth += 1
        elif char in ")>]}":
            depth -= 1
        elif char == separator and depth == 0:
            parts.append(text[start:at])
            start = at + 1
    return [*parts, text[start:]]


def _strip_qualifiers(c_type: str) -> str:
    text = re.sub(r"\b(const|volatile|__restrict__|__restrict|restrict)\b", " ", c_type)
    text = re.sub(r"\s*\*\s*", "*", text)
    return " ".join(text.split())


def _unsuffixed(name: str) -> str:
    return _LITERAL_SUFFIX.sub(r"\1", name)


def _squeeze(name: str) -> str:
    return re.sub(r"\s+", "", name).removeprefix("::")

