"""A suite's ``kernels:`` and a CUDA ``reference:``: each one's source, its launch (per case and per
class), tunables and tuning template, compiler options and library baseline. The steps of a kernel of
``steps:`` are checked in suite/step_checks.py, its ``requires:`` and ``outputs:`` in suite/check_requires.py."""

from __future__ import annotations

from pathlib import Path

from cudagate_harness import nvcc
from cudagate_harness.compiler import CompileOptionError, check_options
from cudagate_harness.library import ADAPTERS, Adapter, known

from pytest_cudagate.suite import check_files, check_requires, step_checks
from pytest_cudagate.suite.checker import Checker
from pytest_cudagate.suite.model import (INT_DTYPES, Case, LibraryBaseline, Param, Program, Reference, Step, Steps,
                                        Variant, derivations)

# Tunables are not signed (the gate never passes them), so a pull request can add any number: the
# caps keep loading, checking and autotune's search bounded. The schema caps each list at 64 values.
MAX_TUNABLES = 256  # per kernel; a hand-tuned kernel has a handful
MAX_TUNABLE_VALUES = 1024  # per kernel, all lists together: autotune's model has one coefficient each


def reference(checker: Checker, raw: dict, scalars: set[str], cases: list[Case],
              include: tuple[Path, ...]) -> Reference:
    """``reference:``: a Python function in a file of the suite's folder, or a CUDA program."""
    if "python" in raw:
        file_name = raw["python"].rsplit(":", 1)[0]
        check_files.source(checker, file_name, ["reference", "python"])
        return Reference(python=raw["python"])
    return Reference(program=_program(checker, raw, ["reference"], scalars, "reference", {c.name for c in cases},
                                      include))


def kernels(checker: Checker, raw: list[dict], scalars: set[str], cases: list[Case], signature: list[Param],
            derived: dict[str, str], include: tuple[Path, ...]) -> list[Program]:
    """The kernels, each name once; ``scalars``: the signature's and the derived ones."""
    case_names = {c.name for c in cases}
    case_classes = {c.shape_class for c in cases}
    found = [check_requires.preconditions(checker, _program(checker, k, ["kernels", i], scalars, k["name"], case_names,
                                                            include, case_classes, tuple(signature)),
                                          k, ["kernels", i], scalars, tuple(signature), derivations(signature, derived))
             for i, k in enumerate(raw)]
    checker.unique([k.name for k in found], ["kernels"], "kernel")
    return found


def _program(checker: Checker, raw: dict, parts: list, scalars: set[str], name: str, case_names: set[str],
             include: tuple[Path, ...], case_classes: set[str] = frozenset(),
             signature: tuple[Param, ...] = ()) -> Program:
    """A kernel, or a CUDA reference (no classes, no signature to map a library baseline to)."""
    tunables = _tunables(checker, raw.get("tunables", {}), parts + ["tunables"], scalars, name)
    names = scalars | set(tunables)  # launch expressions may use tunables' names
    defaults = {tunable: values[0] for tunable, values in tunables.items()}
    overrides, raw_overrides = {}, {}
    for case_name, launch in raw.get("launch_overrides", {}).items():
        if case_name not in case_names:
            checker.add(parts + ["launch_overrides", case_name], f"no case named {case_name!r} (cases: {', '.join(sorted(case_names))})")
        raw_overrides[case_name] = checker.launch(launch, parts + ["launch_overrides", case_name], names)
        overrides[case_name] = raw_overrides[case_name].with_constants(defaults)
    entry = raw.get("entry", name)
    source = check_files.source(checker, raw["source"], parts + ["source"])
    if "steps" in raw or "args" in raw:  # a one-launch kernel of some parameters is a kernel of one step
        return _stepped(checker, raw, parts, scalars, name, source, include, signature, case_classes)
    launch = checker.launch(raw["launch"], parts + ["launch"], names)
    if "tuning_launch" in raw and not tunables:
        checker.add(parts + ["tuning_launch"], "tuning_launch needs tunables: declare the -D constants it uses")
    tuning = checker.launch(raw["tuning_launch"], parts + ["tuning_launch"], names) if "tuning_launch" in raw else None
    tuning_source = None
    if "tuning_source" in raw:
        if not tunables:
            checker.add(parts + ["tuning_source"], "tuning_source needs tunables: declare the -D constants its "
                                                   "template reads, e.g. `tunables: {TILE: [16, 8, 32]}`")
        tuning_source = check_files.template(checker, raw["tuning_source"], parts + ["tuning_source"], entry)
        if tuning_source.parent != source.parent:  # a candidate's quoted #includes resolve beside `source`
            checker.add(parts + ["tuning_source"], f"{raw['tuning_source']} is not in the folder of source "
                                                   f"{raw['source']}: candidates are built where the kernel is, so "
                                                   "put the template next to it")
    return Program(
        include=include,
        name=name,
        source=source,
        entry=entry,
        options=tuple(raw.get("options", [])),
        launch=launch.with_constants(defaults),  # the kernel as shipped: each tunable at its default
        launch_overrides=overrides,
        arch_suffix=raw.get("arch_suffix", ""),
        tunables=tunables,
        tuning_launch=tuning or (launch if tunables else None),
        tuning_overrides={} if tuning else (raw_overrides if tunables else {}),
        tuning_source=tuning_source,
        classes={shape_class: _variant(checker, variant, parts + ["classes", shape_class], names, defaults, case_classes)
                 for shape_class, variant in raw.get("classes", {}).items()},
        library_baseline=(_library_baseline(checker, raw["library_baseline"], parts + ["library_baseline"], signature)
                          if "library_baseline" in raw else None),
        compiler=_compiler(checker, raw, parts, source, include),
    )


def _stepped(checker: Checker, raw: dict, parts: list, scalars: set[str], name: str, source: Path,
             include: tuple[Path, ...], signature: tuple[Param, ...], case_classes: set[str]) -> Program:
    """A kernel given as ``steps:`` (or as one launch with ``args:``), its steps checked by
    :func:`step_checks.kernel_steps`. What varies a single launch per case or per tuning
    (launch_overrides, a class variant's launch, tunables) is refused: a step's launch is written
    once, in terms of the case's scalars."""
    for key, why in (("launch_overrides", "write the steps' launches in terms of the case's scalars"),
                     ("tunables", "autotune searches single-launch kernels"),
                     ("tuning_launch", "autotune searches single-launch kernels"),
                     ("tuning_source", "autotune searches single-launch kernels")):
        if key in raw:
            checker.add(parts + [key], f"not with `{'steps' if 'steps' in raw else 'args'}`: {why}; remove `{key}`")
    for shape_class, variant in raw.get("classes", {}).items():
        if "launch" in variant:
            checker.add(parts + ["classes", shape_class, "launch"], "a kernel of steps takes no class variant launch "
                                                                    "(a variant may change options only); remove it")
    text = check_files.defined_names(source, include)
    found = step_checks.kernel_steps(checker, raw, parts, scalars, name, signature, text)
    return Program(
        include=include,
        name=name, source=source, entry=next((s.entry for s in found if isinstance(s, Step)), name),
        options=tuple(raw.get("options", [])),
        launch=Steps(tuple(found)), arch_suffix=raw.get("arch_suffix", ""),
        classes={shape_class: _variant(checker, variant, parts + ["classes", shape_class], scalars, {}, case_classes)
                 for shape_class, variant in raw.get("classes", {}).items() if "launch" not in variant},
        library_baseline=(_library_baseline(checker, raw["library_baseline"], parts + ["library_baseline"], signature)
                          if "library_baseline" in raw else None),
        compiler=_compiler(checker, raw, parts, source, include),
    )


def _tunables(checker: Checker, raw: dict, parts: list, scalars: set[str], kernel: str) -> dict[str, tuple[int, ...]]:
    """``tunables: {NAME: [default, other, ...]}``: -D constants for the autotune proposer."""
    values_in_all = sum(len(values) for values in raw.values())
    if len(raw) > MAX_TUNABLES or values_in_all > MAX_TUNABLE_VALUES:
        checker.add(parts, f"kernel {kernel!r} declares {len(raw)} tunables with {values_in_all} values in all; "
                           f"at most {MAX_TUNABLES} tunables and {MAX_TUNABLE_VALUES} values per kernel: keep the "
                           "-D constants and values the search needs")
    found = {}
    for name, values in raw.items():
        if name in scalars:
            checker.add(parts + [name], f"{name!r} is a scalar parameter; a tunable needs a name of its own")
        elif name in ("cdiv", "min", "max", "ceil", "floor"):
            checker.add(parts + [name], f"{name!r} is an expression function; choose another name")
        elif len(set(values)) != len(values):
            checker.add(parts + [name], f"values {values} repeat one; list each value once, the default first")
        found[name] = tuple(int(v) for v in values)
    return found


def _variant(checker: Checker, raw: dict, parts: list, names: set[str], defaults: dict[str, int],
            case_classes: set[str]) -> Variant:
    """One entry of a kernel's ``classes:``: a class some case has, options the compiler accepts,
    and a launch whose expressions resolve as the kernel's do."""
    shape_class = parts[-1]
    if shape_class not in case_classes:
        checker.add(parts, f"no case has class {shape_class!r} (the cases' classes: {', '.join(sorted(case_classes))}); "
                           f"name one of those, or give the cases it is for `class: {shape_class}`")
    options = tuple(raw.get("options", []))
    for i, option in enumerate(options):
        try:
            check_options([option])
        except CompileOptionError as exc:
            checker.add(parts + ["options", i], f"{exc}; remove it from the variant")
    launch = checker.launch(raw["launch"], parts + ["launch"], names).with_constants(defaults) if "launch" in raw else None
    return Variant(options=options, launch=launch)


def _compiler(checker: Checker, raw: dict, parts: list, source: Path, include: tuple[Path, ...]) -> str:
    """The kernel's ``compiler:``; where nvcc builds it (named, or `auto` on a file with host code),
    each of its options nvcc may be given."""
    compiler = raw.get("compiler", "auto")
    options = raw.get("options", [])
    if options and compiler != "nvrtc":
        text = check_files.defined_names(source, include) if compiler == "auto" else ""
        if compiler == "nvcc" or (text is not None and nvcc.host_code(text, {})):
            for i, option in enumerate(options):
                try:
                    nvcc.check_options([option])
                except CompileOptionError as exc:
                    checker.add(parts + ["options", i], f"{exc}; remove it")
    return compiler


def _library_baseline(checker: Checker, raw: dict, parts: list, signature: tuple[Param, ...]) -> LibraryBaseline:
    """``library_baseline:``: a registered adapter whose every role names a parameter it can read."""
    name, args = raw["adapter"], dict(raw["args"])
    adapter = ADAPTERS.get(name)
    if adapter is None:
        checker.add(parts + ["adapter"], f"unknown library baseline adapter {name!r}; known adapters: "
                                         f"{', '.join(known(Adapter))}")
        return LibraryBaseline(name, args)
    params = {p.name: p for p in signature}
    if not isinstance(adapter, Adapter):
        checker.add(parts + ["adapter"], f"{name} is a library step adapter (`steps: - library: {name}`), not a "
                                         f"baseline; known baseline adapters: {', '.join(known(Adapter))}")
        return LibraryBaseline(name, args)
    for role in sorted(set(args) - set(adapter.roles)):
        checker.add(parts + ["args", role], f"{name} has no role {role!r} (its roles: {', '.join(adapter.roles)})")
    for role in adapter.roles:
        if role not in args:
            checker.add(parts + ["args"], f"{name} needs role {role!r}: map it to a parameter, e.g. `{role}: {role}`")
            continue
        param = params.get(args[role])
        if role in adapter.buffers:
            dtype, writes = adapter.buffers[role]
            if param is None or param.kind != "buffer" or param.dtype != dtype:
                checker.add(parts + ["args", role], f"{name}'s {role} is a {dtype} buffer; {args[role]!r} is not one "
                                                    "of the signature's")
            elif writes and not param.is_output:
                checker.add(parts + ["args", role], f"{name} writes {role}; {args[role]!r} has intent in: map an "
                                                    "output buffer")
        elif param is None or param.kind != "scalar" or param.dtype not in INT_DTYPES:
            checker.add(parts + ["args", role], f"{name}'s {role} is an integer scalar; {args[role]!r} is not one "
                                                "of the signature's")
    return LibraryBaseline(name, args)
