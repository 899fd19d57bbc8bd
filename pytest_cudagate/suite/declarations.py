"""The ``__global__`` functions a CUDA source declares, with their parameter lists, read from its text.

For ``cudagate init`` only: the cubin is what says which kernels exist and (for a C++ entry) their
parameter types, but not their parameters' names, and an ``extern "C"`` entry's symbol says nothing of
its types. The text is read with a bounded scan, not a C++ parser: comments, literals and preprocessor
lines are blanked, and a declaration the scan cannot read (one a macro builds, say) is left out; the
caller then falls back to what the cubin says.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cudagate_harness.symbols import split_top

_MAX_HEAD = 512  # characters from __global__ to the parameter list's "(": attributes, return type, name
_MAX_PARAMS_TEXT = 1 << 16
_MAX_DECLARATIONS = 4096
# Whatever stands between __global__ and the name with a parenthesised argument of its own.
_ATTRIBUTES = frozenset({"__launch_bounds__", "__attribute__", "__declspec", "alignas", "__cluster_dims__",
                         "__maxnreg__", "__align__", "decltype"})
_BLANKED = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|^[ \t]*#(?:\\\n|[^\n])*",
                      re.DOTALL | re.MULTILINE)
_TYPE_WORDS = frozenset({"const", "volatile", "__restrict__", "__restrict", "restrict", "unsigned", "signed", "short",
                         "long", "int", "char", "float", "double", "bool", "void", "__grid_constant__", "struct",
                         "class", "typename"})
# Spellings a source uses for what the demangler spells otherwise (cudagate_harness.symbols.C_TYPES).
_SPELLINGS = {
    "int8_t": "signed char", "int16_t": "short", "int32_t": "int", "int64_t": "long long",
    "uint8_t": "unsigned char", "uint16_t": "unsigned short", "uint32_t": "unsigned int",
    "uint64_t": "unsigned long long", "unsigned": "unsigned int", "signed": "int", "signed int": "int",
    "short int": "short", "signed short": "short", "unsigned short int": "unsigned short", "long int": "long",
    "long long int": "long long", "unsigned long int": "unsigned long", "unsigned long long int": "unsigned long long",
    "size_t": "unsigned long", "__nv_bfloat16": "__nv_bfloat16", "half": "__half",
}


@dataclass(frozen=True)
class Parameter:
    name: str | None  # None where the declaration leaves it unnamed
    c_type: str  # as written, whitespace squeezed; an array parameter as the pointer it is


@dataclass(frozen=True)
class Declaration:
    name: str  # unqualified
    params: tuple[Parameter, ...]
    line: int
    template: bool


def declarations(text: str) -> list[Declaration]:
    """Every ``__global__`` function ``text`` declares or defines that the scan can read, in order."""
    code = _BLANKED.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)
    found = []
    for match in re.finditer(r"\b__global__\b", code):
        if len(found) == _MAX_DECLARATIONS:
            break
        head = _head(code, match.end())
        if head is None:
            continue
        name, opened = head
        closed = _matching(code, opened)
        if closed is None:
            continue
        before = code[max(0, match.start() - _MAX_HEAD):match.start()]
        template = bool(re.search(r"\btemplate\s*<[^;{}]*$", before))
        found.append(Declaration(name, _parameters(code[opened + 1:closed]),
                                 code.count("\n", 0, match.start()) + 1, template))
    return found


def normal_type(c_type: str) -> str:
    """``c_type`` as the demangler would spell its base type (``const uint32_t*`` -> ``const unsigned int*``),
    so that :func:`cudagate_harness.symbols.scalar_dtype` and ``pointee_dtype`` read it."""
    words = re.sub(r"\b(const|volatile|__restrict__|__restrict|restrict|__grid_constant__)\b", " ", c_type)
    stars = words.count("*")
    base = " ".join(words.replace("*", " ").split())
    base = _SPELLINGS.get(base, base)
    return base + "*" * stars


def _head(code: str, start: int) -> tuple[str, int] | None:
    """The function's name after ``__global__`` and where its parameter list opens."""
    at, limit = start, min(len(code), start + _MAX_HEAD)
    while at < limit:
        opened = code.find("(", at, limit)
        if opened < 0 or re.search(r"[;{}]", code[at:opened]):
            return None
        word = re.search(r"([A-Za-z_]\w*)\s*$", code[at:opened])
        if word is None:
            return None
        if word.group(1) not in _ATTRIBUTES:
            return word.group(1), opened
        closed = _matching(code, opened)
        if closed is None:
            return None
        at = closed + 1
    return None


def _matching(code: str, opened: int) -> int | None:
    depth = 0
    for at in range(opened, min(len(code), opened + _MAX_PARAMS_TEXT)):
        if code[at] == "(":
            depth += 1
        elif code[at] == ")":
            depth -= 1
            if depth == 0:
                return at
    return None


def _parameters(text: str) -> tuple[Parameter, ...]:
    # A default argument ("float s = 1.0f") is dropped: the type and name come before it.
    squeezed = [" ".join(split_top(p, "=")[0].split()) for p in split_top(text)]
    if squeezed == [""] or squeezed == ["void"]:
        return ()
    return tuple(_parameter(p) for p in squeezed)


def _parameter(text: str) -> Parameter:
    named = re.fullmatch(r"(.*?[\s*&])([A-Za-z_]\w*)\s*((?:\[[^\]]*\]\s*)*)", text)
    if named is None or named.group(2) in _TYPE_WORDS or not named.group(1).strip():
        return Parameter(None, text)
    arrays = named.group(3).count("[")
    return Parameter(named.group(2), " ".join(named.group(1).split()) + "*" * arrays)
