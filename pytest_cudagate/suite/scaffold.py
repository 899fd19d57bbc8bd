"""``cudagate init KERNEL.cu [ENTRY]``: a suite skeleton from a kernel's own parameters.

The kernel file is compiled (NVRTC, on the host, as `cudagate check` compiles it) and the entry found in
the cubin (:mod:`cudagate_harness.symbols`). A C++ entry's mangled name spells its parameter types; an
``extern "C"`` entry's names none, so its types are read from the source's declaration
(:mod:`.declarations`) and each checked against the size the cubin gives the parameter. Names come from
the declaration either way (a cubin holds none). What cannot be known (sizes, launches, case values,
tolerances, the reference's body, a type no signature can name) is written as a placeholder that every
command refuses, one line each, until filled in (:mod:`.placeholders`).
"""

from __future__ import annotations

import json
import keyword
import os
import re
from dataclasses import dataclass
from pathlib import Path

from cudagate_harness import symbols
from cudagate_harness.compiler import CompileOptionError, compile_kernel
from cudagate_harness.params import POINTER_BYTES, ParamInfoError, entry_params
from cudagate_harness.protocol import LOW_PRECISION, numpy_dtype

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, read_text
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import command, display_path
from pytest_cudagate.suite.declarations import Declaration, declarations, normal_type
from pytest_cudagate.suite.includes import IncludeError, local_headers
from pytest_cudagate.suite.loader import SUITE_FILENAME
from pytest_cudagate.suite.model import INT_DTYPES
from pytest_cudagate.suite.placeholders import STUB_RAISE, todo

REFERENCE_FILENAME = "reference.py"
LISTED = 12  # kernels named when a file defines several and no ENTRY was given


@dataclass(frozen=True)
class Slot:
    """One parameter of the skeleton's signature."""

    name: str
    kind: str  # "buffer" or "scalar"
    dtype: str | None  # None: a type the signature cannot name (a TODO says what to do)
    c_type: str  # as the cubin or the source spells it
    todo: str = ""

    @property
    def intent(self) -> str:
        # A pointer to const is read only; any other is guessed written (the comment says so).
        return "in" if self.kind == "buffer" and "const" in self.c_type.split("*")[0].split() else "out"


@dataclass(frozen=True)
class Skeleton:
    suite_file: Path
    reference_file: Path
    entry: str
    count: int


def init(source: Path, entry: str | None, arch: str, out: Path | None = None) -> Skeleton:
    """Write ``cudagate.yaml`` and ``reference.py`` for ``entry`` of ``source`` (the file's only
    kernel when None) into ``out`` (default: the source's folder); nothing is written on a refusal."""
    folder = Path(out) if out is not None else source.parent
    text = _read(source)
    inside = Path(os.path.realpath(source)).parent
    if not folder.is_dir():
        raise FileError(folder, ["--out: not a folder; name the folder that holds the kernel file (or one above it)"])
    if not inside.is_relative_to(os.path.realpath(folder)):
        raise FileError(folder, [f"--out: {display_path(source)} lies outside it, and a suite's kernel source must lie "
                                 "inside the suite's folder; name the kernel's folder or one above it"])
    for name in (SUITE_FILENAME, REFERENCE_FILENAME):
        if os.path.lexists(folder / name):
            raise FileError(folder / name, ["exists: `cudagate init` never overwrites a suite; edit it, or move it "
                                            "away and run init again (or pass --out DIR)"])
    kernel, cubin, declared = _entry(source, text, entry, arch)
    slots = _slots(kernel, cubin, declared, source)
    relative = Path(os.path.relpath(os.path.realpath(source), os.path.realpath(folder))).as_posix()
    short = _short_name(kernel.name)
    suite_text = _suite_yaml(short, kernel, relative, slots, entry or kernel.name, declared)
    reference_text = _reference_py(short, slots)
    _write_both(folder / SUITE_FILENAME, suite_text, folder / REFERENCE_FILENAME, reference_text)
    return Skeleton(folder / SUITE_FILENAME, folder / REFERENCE_FILENAME, kernel.name, len(slots))


def next_steps(skeleton: Skeleton) -> list[str]:
    """What to do after init, for the command to print."""
    suite = skeleton.suite_file
    return [f"wrote {display_path(suite)} and {display_path(skeleton.reference_file)}: a suite skeleton for "
            f"{skeleton.entry} ({skeleton.count} parameter{'s' if skeleton.count != 1 else ''})",
            f"next: replace each TODO and write the reference (`{command('cudagate', 'check', suite)}` lists what is "
            f"left), then draw the cases (`{command('cudagate', 'cases', 'generate', suite)}`) and sign them "
            "(docs/trust.md)"]


def _read(source: Path) -> str:
    if not source.is_file():
        what = "a folder" if source.is_dir() else "no such file"
        raise FileError(source, [f"{what}: name the .cu file that defines the kernel"])
    return read_text(source, MAX_SOURCE_BYTES, "kernel source")


def _entry(source: Path, text: str, entry: str | None, arch: str):
    """The entry's kernel, the cubin it lives in, and its declaration in the text (or None)."""
    try:
        headers = local_headers(source, text)
        result = compile_kernel(text, entry=entry, arch=arch, source_name=source.name, headers=headers)
    except (IncludeError, CompileOptionError) as exc:
        raise FileError(source, [str(exc)]) from None
    if not result.ok:
        lines = [line.strip() for line in result.log.splitlines() if line.strip()] or ["no log"]
        first = next((line for line in lines if line.startswith("entry ") or "error" in line), lines[0])
        raise FileError(source, [f"does not compile with NVRTC for {result.arch}: {first} (fix it, then run init "
                                 "again)"])
    found = declarations(text)
    kernels = symbols.kernels(result.cubin)
    if entry is not None:
        kernel, kernels = symbols.find(result.cubin, result.lowered_name)
    elif len(kernels) == 1:
        kernel = kernels[0]
    else:
        templates = sorted({d.name for d in found if d.template})
        if not kernels:
            hint = (f"; a template kernel needs its arguments: `{command('cudagate', 'init', source, templates[0] + '<float>')}`"
                    if templates else "; declare the kernel __global__")
            raise FileError(source, [f"defines no kernel to gate{hint}"])
        every = sorted(k.name for k in kernels)
        # A file of templates instantiated for every type and block size lists hundreds: the first few say enough.
        names = ", ".join(every[:LISTED]) + (f", and {len(every) - LISTED} more" if len(every) > LISTED else "")
        raise FileError(source, [f"defines {len(kernels)} kernels ({names}); name the one to gate: "
                                 f"`{command('cudagate', 'init', source, min(k.name for k in kernels))}`"])
    if kernel is None:  # a name NVRTC found but the cubin cannot tell apart: C++ overloads
        raise FileError(source, [f"entry {entry!r} names more than one kernel; give one a name of its own"])
    base = kernel.name.split("<")[0].split("::")[-1]
    matches = [d for d in found if d.name == base and (kernel.params is None or len(d.params) == len(kernel.params))]
    return kernel, result.cubin, matches[-1] if matches else None


def _slots(kernel: symbols.Kernel, cubin: bytes, declared: Declaration | None, source: Path) -> list[Slot]:
    try:
        sizes = [p.size for p in entry_params(cubin, kernel.symbol).params]
    except ParamInfoError as exc:
        raise FileError(source, [f"the parameters of {kernel.name} cannot be read from its cubin: {exc}"]) from None
    names = _names(declared, len(sizes))
    if kernel.params is not None:
        return [_slot(name, c_type, size) for name, c_type, size in zip(names, kernel.params, sizes)]
    if declared is not None and len(declared.params) == len(sizes):
        return [_slot(name, p.c_type, size, read=True) for name, p, size in zip(names, declared.params, sizes)]
    return [Slot(name, "scalar", None, f"{size} bytes", _unread(size)) for name, size in zip(names, sizes)]


def _slot(name: str, c_type: str, size: int, *, read: bool = False) -> Slot:
    spelled = normal_type(c_type) if read else c_type
    pointer = spelled.endswith("*") and not spelled.endswith("**")
    if pointer and size == POINTER_BYTES:
        dtype = symbols.pointee_dtype(spelled)
        hint = "" if dtype else (f"the kernel takes {c_type!r}, whose elements no dtype names: write the dtype of the "
                                 "elements it reads (a vector type such as float4 or __half2: its element type, with "
                                 "the size counted in those)")
        return Slot(name, "buffer", dtype, c_type, hint)
    dtype = symbols.scalar_dtype(spelled)
    if dtype is not None and numpy_dtype(dtype).itemsize != size:
        return Slot(name, "scalar", None, c_type, f"the source says {c_type!r}, but the cubin's parameter is {size} "
                                                  f"bytes (a macro or typedef?): {_unread(size)}")
    if dtype in LOW_PRECISION:
        return Slot(name, "scalar", None, c_type, f"the kernel takes {c_type!r} by value, which a signature passes as "
                                                  "float32: make the kernel's parameter float and convert it inside")
    if dtype is None:
        return Slot(name, "scalar", None, c_type, f"the kernel takes {c_type!r} by value, which no dtype names: make "
                                                  "the kernel take its fields as scalars (or a buffer), then list them")
    return Slot(name, "scalar", dtype, c_type)


def _unread(size: int) -> str:
    if size == POINTER_BYTES:
        return ("8 bytes: a buffer (write `buffer: DTYPE`, `intent` and `size` instead of `scalar`) or an int64, "
                "uint64 or float64 scalar")
    return f"{size} bytes: a scalar of that size (int32, uint32, float32 ...) or a struct, which no dtype names"


def _names(declared: Declaration | None, count: int) -> list[str]:
    given = [p.name for p in declared.params] if declared is not None and len(declared.params) == count else [None] * count
    taken = {n for n in given if n}
    names = []
    for number, name in enumerate(given, start=1):
        if not name:
            name = f"p{number}"
            while name in taken:
                name += "_"
            taken.add(name)
        names.append(name)
    return names


def _short_name(name: str) -> str:
    base = name.split("<")[0].split("::")[-1].strip()
    return base[:128] if base.isidentifier() and base.isascii() else "kernel"


def _q(text: str) -> str:
    return json.dumps(text)  # a YAML double-quoted scalar


def _suite_yaml(short: str, kernel: symbols.Kernel, source: str, slots: list[Slot], entry: str,
                declared: Declaration | None) -> str:
    ints = [s.name for s in slots if s.kind == "scalar" and s.dtype in INT_DTYPES]
    over = f"an expression over {', '.join(ints)}" if ints else "a number (the kernel takes no integer scalar)"
    if kernel.params is not None:
        how = "types from the cubin (the entry's mangled name)"
    elif declared is not None and len(declared.params) == len(slots):
        how = (f"types from the declaration in {source} (line {declared.line}; an extern \"C\" symbol names none), "
               "each checked against the size the cubin gives it")
    else:
        how = (f"sizes from the cubin only: the declaration in {source} could not be read (an extern \"C\" symbol "
               "names no types)")
    named = f"names from {source}, line {declared.line}" if declared is not None else "names p1, p2, ... (none read)"
    lines = [f"# A suite skeleton `cudagate init` wrote for {kernel.name} (docs/suite-format.md lists every key).",
             "# Replace each \"TODO: ...\" value and write the reference; `cudagate check` lists what is left.",
             f"suite: {short}",
             "signature:",
             f"  # {how}; {named}.",
             "  # Intents are a guess: a pointer to const is read (in), any other written (out); write inout where the",
             "  # kernel also reads it, scratch where it is the kernel's own workspace."]
    for slot in slots:
        if slot.kind == "buffer":
            dtype = slot.dtype or _q(todo(slot.todo))
            size = _q(todo(f"{slot.name}'s element count, {over}"))
            lines.append(f"  - {{name: {slot.name}, buffer: {dtype}, intent: {slot.intent}, size: {size}}}"
                         f"  # {slot.c_type}")
        else:
            lines.append(f"  - {{name: {slot.name}, scalar: {slot.dtype or _q(todo(slot.todo))}}}  # {slot.c_type}")
    outputs = [s for s in slots if s.kind == "buffer" and s.intent == "out"]
    lines += ["reference:", f"  python: {REFERENCE_FILENAME}:{_function(short)}",
              "tolerance:  # |actual - expected| <= atol + rtol * |expected|, per output"]
    for slot in outputs:
        if slot.dtype in INT_DTYPES:
            lines.append(f"  {slot.name}: {{atol: 0, rtol: 0}}  # an integer output: exact")
        else:
            lines.append(f"  {slot.name}: {{atol: {_q(todo('the absolute error allowed, such as 1.0e-6'))}, "
                         f"rtol: {_q(todo('the relative error allowed, such as 1.0e-5'))}}}")
    if not outputs:
        lines.append(f"  {_q(todo('one entry per output buffer'))}: {{}}")
    grid = _q(todo(f"the grid, {over}, such as cdiv({ints[0]}, 256)" if ints else f"the grid, {over}"))
    plain = re.fullmatch(r"[A-Za-z0-9_][\w./-]*", source) is not None
    lines += ["kernels:", f"  - name: {short}", f"    source: {source if plain else _q(source)}"]
    if entry != short:
        lines.append(f"    entry: {_q(entry)}")
    lines += [f"    launch: {{grid: [{grid}], block: [{_q(todo('threads per block, such as 256'))}]}}",
              "cases:  # inputs are drawn by `cudagate cases generate` (the inputs: key sets how)"]
    scalars = [s for s in slots if s.kind == "scalar"]
    for name, kind, hint in (("small", "correctness", "odd sizes catch a kernel that handles only full blocks"),
                             ("perf", "performance", "sizes you ship: the latency gate times this case")):
        values = ", ".join(f"{s.name}: {_q(todo(f'{s.name} in this case'))}" for s in scalars)
        lines.append(f"  - {{name: {name}, kind: {kind}, scalars: {{{values}}}}}  # {hint}")
    return "\n".join(lines) + "\n"


def _function(short: str) -> str:
    return short if not keyword.iskeyword(short) else "reference"


def _reference_py(short: str, slots: list[Slot]) -> str:
    inputs = [s for s in slots if s.kind == "scalar" or s.intent == "in"]
    outputs = [s for s in slots if s.kind == "buffer" and s.intent == "out"]
    returned = ", ".join(s.name for s in outputs) or "the outputs"

    def shown(slot: Slot) -> str:
        if slot.kind == "scalar":
            kind = "int" if slot.dtype in INT_DTYPES else "float" if slot.dtype else "its value"
            return f"{slot.name}: a Python {kind}" if slot.dtype else f"{slot.name}: {kind}"
        dtype = "float32 (its values, exact)" if slot.dtype in LOW_PRECISION else slot.dtype or "its dtype"
        return f"{slot.name}: a numpy array of {dtype}"

    said = "\n".join(f"    #   {shown(s)}" for s in inputs) or "    #   (no inputs)"
    results = "\n".join(f"    #   {s.name}: {s.dtype or 'its dtype'}, `size` elements" for s in outputs)
    keywords = any(keyword.iskeyword(s.name) for s in inputs)
    arguments = "**arguments" if keywords else ", ".join(s.name for s in inputs)
    raising = f'{STUB_RAISE}write the reference {_function(short)} in {REFERENCE_FILENAME}: return {returned}")'
    return f'''"""The trusted reference of suite {short}: the outputs its kernel must produce, computed with numpy.

Written by `cudagate init`. The gate calls {_function(short)}(**inputs, **scalars) with every input buffer and
scalar by name, and checks the kernel's outputs against what it returns: one output as an array, several
as a tuple in signature order (or a dict by name). It must depend on its arguments only.
"""

import numpy as np


def {_function(short)}({arguments}):
    # Arguments{" (by name in `arguments`: some are Python keywords)" if keywords else ""}:
{said}
    # Returns ({returned}):
{results or "    #   each output buffer"}
    {raising}
'''


def _write_both(first: Path, first_text: str, second: Path, second_text: str) -> None:
    """Both files or neither; an existing file is never replaced (O_EXCL)."""
    written = []
    try:
        for path, text in ((first, first_text), (second, second_text)):
            with open(path, "x", encoding="utf-8") as handle:
                written.append(path)
                handle.write(text)
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise CudagateError(f"{display_path(exc.filename or first)}: cannot be written ({exc.strerror}); nothing "
                            "was written") from None
