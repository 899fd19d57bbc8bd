"""``instantiate: {T: [float32, bfloat16]}``: one suite file for a kernel template over types.

A suite file that declares ``instantiate`` stands for one suite per instantiation (the product of
the variables' types, at most :data:`MAX_INSTANTIATIONS`). :func:`expand` writes each as an ordinary
suite file's content before the schema and the loader see it:

- a signature type written ``"{T}"`` (a buffer's or a scalar's) becomes the instantiation's type;
- ``{T}`` in a kernel's or a CUDA reference's ``entry``, a step's ``entry`` and ``options`` becomes
  the type's C++ spelling (cudagate_harness.protocol.DTYPES: ``gelu<{T}>`` -> ``gelu<__nv_bfloat16>``);
- an output typed ``{T}`` takes a tolerance per type (``y: {float32: {...}, bfloat16: {...}}``);
- the case data of an instantiation lies in ``<data>/T=bfloat16/``: the same cases (names, scalars,
  seeds), with inputs drawn from the case's seed in the instantiation's type and expected outputs
  the reference computed from exactly those inputs, each file signed.

The loader names each kernel of an instantiation ``gelu[T=bfloat16]`` (:func:`label`): items,
reports, history and approvals know it by that name, so an approval is one instantiation's.
"""

from __future__ import annotations

import copy
import itertools
import re

from cudagate_harness.protocol import DTYPES, unknown_dtype

MAX_INSTANTIATIONS = 16  # every one is gated as a suite of its own
PLACEHOLDER = re.compile(r"\{([^{}]*)\}")
VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}")


class Instantiation:
    """One instantiation: each variable's type, and the suite file's content written for it."""

    def __init__(self, types: dict[str, str], raw: dict):
        self.types = types
        self.raw = raw

    @property
    def label(self) -> str:
        return label(self.types)


def label(types: dict[str, str]) -> str:
    """``T=bfloat16`` (variables in declared order, joined by commas): the suffix ``[...]`` of the
    instantiation's kernel names and the folder of its case data."""
    return ",".join(f"{name}={dtype}" for name, dtype in types.items())


def _typed(raw: dict) -> list[tuple[list, str, str]]:
    """``(parts, text, how)`` of every place a placeholder may stand: ``how`` is "type" (the whole
    value names a variable) or "c++" (each ``{V}`` inside becomes a C++ spelling)."""
    found = []
    for i, param in enumerate(raw.get("signature") or []):
        for key in ("buffer", "scalar"):
            if isinstance(param, dict) and isinstance(param.get(key), str):
                found.append((["signature", i, key], param[key], "type"))
    programs = [(["kernels", i], k) for i, k in enumerate(raw.get("kernels") or []) if isinstance(k, dict)]
    if isinstance(raw.get("reference"), dict):
        programs.append((["reference"], raw["reference"]))
    for parts, program in programs:
        texts = [(parts + ["entry"], program.get("entry"))]
        texts += [(parts + ["options", j], o) for j, o in enumerate(_list(program.get("options")))]
        texts += [(parts + ["steps", j, "entry"], s.get("entry")) for j, s in enumerate(_list(program.get("steps")))
                  if isinstance(s, dict)]
        for shape_class, variant in (program.get("classes") or {}).items() if isinstance(program.get("classes"), dict) else ():
            if isinstance(variant, dict):
                texts += [(parts + ["classes", shape_class, "options", j], o)
                          for j, o in enumerate(_list(variant.get("options")))]
        found += [(where, text, "c++") for where, text in texts if isinstance(text, str)]
    return found


def _list(value) -> list:
    return value if isinstance(value, list) else []


def expand(raw: dict) -> tuple[list[Instantiation], list[tuple[list, str]]]:
    """The instantiations of a parsed suite file (one, the file as it is, without ``instantiate``),
    and the problems that stop them, each ``(YAML path, message with its fix)``."""
    problems: list[tuple[list, str]] = []
    declared = raw.get("instantiate")
    variables: dict[str, list[str]] = {}
    if declared is not None and not isinstance(declared, dict):
        return [], [(["instantiate"], "expected a mapping of type variables to their types, e.g. "
                                      "`instantiate: {T: [float32, bfloat16]}`")]
    taken = {p.get("name") for p in raw.get("signature") or [] if isinstance(p, dict)} | set(raw.get("derived") or ())
    for name, types in (declared or {}).items():
        parts = ["instantiate", name]
        if not isinstance(name, str) or not VARIABLE.fullmatch(name):
            problems.append((parts, f"{name!r} is not a type variable name; write a C++-style name such as T"))
        elif name in taken:
            problems.append((parts, f"{name} is a parameter or derived scalar of the suite too (a Python reference "
                                    "naming it gets the type's name); give the type variable another name"))
        elif not isinstance(types, list) or not types:
            problems.append((parts, f"{name} lists no type; list the types to gate, e.g. `{name}: [float32, bfloat16]`"))
        elif not all(isinstance(t, str) for t in types):
            problems.append((parts, f"{name}: write each type as a name of the signature's types "
                                    f"({', '.join(DTYPES)})"))
        else:
            unknown = [problem for t in types if (problem := unknown_dtype(t))]
            repeated = sorted({t for t in types if types.count(t) > 1})
            if unknown:
                problems.append((parts, unknown[0]))
            elif repeated:
                problems.append((parts, f"{repeated[0]} is listed twice; list each type once"))
            else:
                variables[name] = list(types)
    count = 1
    for types in variables.values():
        count *= len(types)
    if count > MAX_INSTANTIATIONS:
        problems.append((["instantiate"], f"{count} instantiations (the product of the lists); at most "
                                          f"{MAX_INSTANTIATIONS}: gate the types a release ships"))
    used: set[str] = set()
    for parts, text, how in _typed(raw):
        for name in PLACEHOLDER.findall(text):
            if name in variables or name in (declared or {}):
                used.add(name)
                if how == "type" and text != f"{{{name}}}":
                    problems.append((parts, f"{text!r}: a type is one name or one variable; write {{{name}}}"))
                continue
            where = (f"of instantiate ({', '.join(map(str, declared))})" if declared
                     else "(the suite has no `instantiate:`)")
            problems.append((parts, f"{{{name}}} names no type variable {where}; declare it, e.g. "
                                    f"`instantiate: {{{name or 'T'}: [float32, bfloat16]}}`, or write the type"))
    for name in variables:
        if name not in used:
            problems.append((["instantiate", name], f"{name} is used by no signature type nor kernel entry; write "
                                                    f"{{{name}}} where the type goes (e.g. `buffer: \"{{{name}}}\"`, "
                                                    f"`entry: \"gelu<{{{name}}}>\"`), or remove it"))
    problems += _tolerance_problems(raw, variables)
    if problems:
        return [], problems
    if declared is None:
        return [Instantiation({}, raw)], []
    return [Instantiation(dict(zip(variables, combo)), _written(raw, dict(zip(variables, combo))))
            for combo in itertools.product(*variables.values())], []


def _output_variables(raw: dict) -> dict[str, str]:
    """Each output buffer typed by a placeholder: the name in its braces."""
    found = {}
    for param in raw.get("signature") or []:
        if isinstance(param, dict) and param.get("intent") in ("out", "inout") and isinstance(param.get("buffer"), str):
            match = PLACEHOLDER.fullmatch(param["buffer"])
            if match:
                found[param.get("name")] = match.group(1)
    return found


def _tolerance_problems(raw: dict, variables: dict[str, list[str]]) -> list[tuple[list, str]]:
    """An output typed ``{T}`` takes a tolerance per type of T, and only it does."""
    problems = []
    tolerance = raw.get("tolerance")
    if not isinstance(tolerance, dict):
        return problems  # the schema says what it takes
    typed = _output_variables(raw)
    for name, tol in tolerance.items():
        parts = ["tolerance", name]
        per_type = isinstance(tol, dict) and bool(tol) and all(key in DTYPES for key in tol)
        variable = typed.get(name)
        if variable is not None and variable not in variables:
            continue  # its placeholder is refused already
        if variable is None:
            if per_type:
                problems.append((parts, f"{name!r} has one type in every instantiation; give it one tolerance, "
                                        "e.g. `{atol: 1e-6, rtol: 1e-5}`"))
            continue
        types = variables[variable]
        example = ", ".join(f"{t}: {{atol: ..., rtol: ...}}" for t in types)
        if not per_type:
            problems.append((parts, f"{name} is typed {{{variable}}}: give a tolerance per type, "
                                    f"`{name}: {{{example}}}`"))
            continue
        for dtype in tol:
            if dtype not in types:
                problems.append((parts + [dtype], f"{dtype} is not one of {variable}'s types ({', '.join(types)}); "
                                                  "remove it, or add it to instantiate"))
        for dtype in types:
            if dtype not in tol:
                problems.append((parts, f"no tolerance for {dtype} ({variable} = {dtype} is instantiated); add "
                                        f"`{dtype}: {{atol: ..., rtol: ...}}` under {name}"))
    return problems


def _written(raw: dict, types: dict[str, str]) -> dict:
    """The suite file's content for the instantiation ``types``: placeholders replaced, each typed
    output's tolerance its type's, the case data in the instantiation's folder."""
    out = copy.deepcopy(raw)
    del out["instantiate"]
    for parts, text, how in _typed(out):
        node = out
        for part in parts[:-1]:
            node = node[part]
        if how == "type":
            node[parts[-1]] = PLACEHOLDER.sub(lambda m: types[m.group(1)], text)
        else:
            node[parts[-1]] = PLACEHOLDER.sub(lambda m: DTYPES[types[m.group(1)]][1], text)
    for name, variable in _output_variables(raw).items():
        out["tolerance"][name] = out["tolerance"][name][types[variable]]
    out["data"] = f"{str(raw.get('data', 'cases')).rstrip('/')}/{label(types)}"
    return out
