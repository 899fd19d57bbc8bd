"""Load ``cudagate.yaml``: parse, validate against ``schemas/suite.schema.json``, check meaning.

Every problem is collected (not just the first) and reported with the file, the line, the YAML
path and what is expected, because a suite author fixes them all in one edit. Each part of the file
is checked by a module of its own (suite/check_*.py), all adding to one :class:`Checker`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pytest_cudagate.boundary import schema
from pytest_cudagate.boundary import MAX_SUITE_BYTES, non_finite, read_text, walk, walk_tree
from pytest_cudagate.boundary.yaml_rules import parse_yaml
from pytest_cudagate.config import load_settings, project_root
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import command, display_path, visible
from pytest_cudagate.suite import (check_cases, check_derived, check_files, check_inputs, check_kernels, check_requires,
                                   check_resolved, check_signature, check_tolerance, instantiate, placeholders)
from pytest_cudagate.suite.checker import Checker, locator
from pytest_cudagate.suite.model import Checks, Suite, Timing

SUITE_FILENAME = "cudagate.yaml"


def load_suite(path: str | Path, include: tuple[Path, ...] | None = None) -> Suite:
    """The suite file at ``path``; its kernels look for shared headers in ``include`` (None: the
    include folders of the project holding it, :func:`project_include`)."""
    path = Path(path)
    try:
        text = read_text(path, MAX_SUITE_BYTES, "suite file")
    except OSError as exc:
        raise FileError(path, [f"cannot read the suite file: {exc.strerror}"]) from None
    raw = parse_yaml(text, path, "suite file")
    locate = locator(text)
    if not isinstance(raw, dict):
        raise FileError(path, ["(top level): expected a mapping with keys suite, signature, reference, kernels, cases, tolerance"])
    _refuse_placeholders(path, raw, locate)
    include = project_include(path) if include is None else include
    instantiations, problems = instantiate.expand(raw)
    if problems:
        checker = Checker(path, locate)
        for parts, message in problems:
            checker.add(parts, message)
        checker.raise_if_any()
    if len(instantiations) == 1 and not instantiations[0].types:
        return _build(path, raw, locate, include)
    suites, found = [], {}  # a problem -> the instantiations it is found in
    for one in instantiations:
        try:
            suites.append(_instance(_build(path, one.raw, locate, include), one.label))
        except FileError as exc:
            for problem in exc.problems:
                found.setdefault(problem, []).append(one.label)
    if found:  # a problem of every instantiation once; one of some, naming them
        raise FileError(path, [problem if len(labels) == len(instantiations) else
                               f"{problem} (instantiation {', '.join(labels)})" for problem, labels in found.items()])
    declared = {name: tuple(types) for name, types in raw["instantiate"].items()}
    for suite, one in zip(suites, instantiations):
        object.__setattr__(suite, "_instances", tuple(suites))  # not fields: see Suite.instances
        object.__setattr__(suite, "_instantiation", (declared, one.types))
    return suites[0]


def _build(path: Path, raw: dict, locate, include: tuple[Path, ...]) -> Suite:
    """The suite of ``raw``, each part checked in the order of the file; every expression is then
    evaluated on every case, where all the parts are sound."""
    schema.validate(raw, "suite", path, locate)
    checker = Checker(path, locate)
    for parts, value in non_finite(raw):  # JSON Schema cannot say "finite"
        checker.add(parts, f"{value} is not a finite number; write a finite value")
    check_signature.dtypes(checker, raw["signature"])
    checker.raise_if_any()
    signature = check_signature.params(checker, raw["signature"])
    derived = check_derived.declared(checker, raw.get("derived", {}), signature)
    scalars = {p.name for p in signature if p.kind == "scalar"} | set(derived)
    check_signature.expressions(checker, signature, scalars)
    cases = check_cases.cases(checker, raw["cases"], signature, derived)
    reference = check_kernels.reference(checker, raw["reference"], scalars, cases, include)
    kernels = check_kernels.kernels(checker, raw["kernels"], scalars, cases, signature, derived, include)
    suite = Suite(
        path=path.resolve(),
        name=raw["suite"],
        signature=tuple(signature),
        reference=reference,
        kernels=tuple(kernels),
        cases=tuple(cases),
        tolerance=check_tolerance.tolerances(checker, raw["tolerance"], signature),
        inputs=check_inputs.inputs(checker, raw.get("inputs", {}), signature),
        timing=Timing(**raw.get("timing", {})),
        threshold=float(raw.get("gate", {}).get("threshold", 0.02)),
        data_dir=check_files.data_dir(checker, raw.get("data", "cases")),
        description=raw.get("description", ""),
        derived=derived,
    )
    if "checks" in raw:
        object.__setattr__(suite, "_checks", _checks(raw["checks"]))  # see Suite.checks
    if not checker.problems:
        check_resolved.resolve_everything(checker, suite)
    if not checker.problems:
        check_requires.kernel_cases(checker, suite)
    checker.raise_if_any()
    return suite


def _checks(raw: dict) -> Checks:
    """``checks:`` (the schema has checked names and types)."""
    values = dict(raw)
    if "sanitizer" in values:
        tools = values["sanitizer"]
        values["sanitizer"] = () if tools is False or tools == "off" else tuple(dict.fromkeys(tools))
    return Checks(**values)


def _instance(suite: Suite, label: str) -> Suite:
    """An instantiation's suite: its kernels and a CUDA reference named for it (``gelu[T=bfloat16]``)."""
    program = suite.reference.program
    reference = replace(suite.reference, program=replace(program, name=f"reference[{label}]")) if program else suite.reference
    named = replace(suite, kernels=tuple(replace(k, name=f"{k.name}[{label}]") for k in suite.kernels),
                    reference=reference)
    named.__dict__.update((key, value) for key, value in suite.__dict__.items() if key.startswith("_"))  # _checks
    return named


def _refuse_placeholders(path: Path, raw: dict, locate) -> None:
    """A skeleton's values left to fill in (and its stub reference), all at once, before the schema
    would call each a value of the wrong type."""
    problems = [f"line {locate(parts)}: {schema.format_path(parts)}: left to fill in: {hint}"
                for parts, hint in placeholders.unfilled(raw)]
    stub = placeholders.stub_line(path, raw.get("reference"))
    if stub is not None:
        problems.append(f"line {locate(['reference', 'python'])}: reference.python: left to fill in: the reference's "
                        f"body ({raw['reference']['python']}, line {stub}, still raises the stub's "
                        "NotImplementedError): compute the outputs with numpy")
    if problems:
        raise FileError(path, problems + ["fix: replace each TODO with its value (docs/suite-format.md says what each "
                                          "key takes) and write the reference, then run "
                                          f"`{command('cudagate', 'cases', 'generate', path)}`"])


def project_include(path: Path) -> tuple[Path, ...]:
    """The include folders ``[tool.cudagate] include`` names in the project that holds ``path``."""
    return load_settings(project_root(path)).include_folders()


def discover(paths: list[Path], root: Path | None = None) -> list[Path]:
    """Suite files named on the command line or found below the folders named (:func:`boundary.walk`).
    A suite whose path holds a control character is refused: pytest prints node ids as they are, and a
    newline in one starts a line of the job's log with whatever follows (``::error::``...). So is a
    link to a folder on the way to them (:func:`refuse_folder_links`; ``root``: the checkout, by
    default the working folder)."""
    refuse_folder_links(paths, Path.cwd() if root is None else root)
    found = []
    for path in paths:
        if path.is_dir():
            found.extend(p for p in walk(path, "suite folder", skip=(".git",)) if p.name == SUITE_FILENAME)
        elif path.name.endswith(".yaml") or path.name.endswith(".yml"):
            found.append(path)
    for path in found:
        if not str(path).isprintable():
            raise FileError(display_path(path), ["a control character (a newline, tab or escape) in a file or folder "
                                                 "name of the suite's path; rename it"])
    return found


def collected_by_default(folder: Path) -> bool:
    """Whether pytest's collection, as configured by default (and by ``cudagate gate``), enters
    ``folder``: not a hidden one (``.git``, ``.venv``), nor a virtual environment."""
    return not folder.name.startswith(".") and not (folder / "pyvenv.cfg").is_file()


def refuse_folder_links(paths: list[Path], root: Path, enter: Callable[[Path], bool] = collected_by_default) -> None:
    """A :class:`CudagateError` naming the links to folders that gating ``paths`` would pass through:
    a path inside ``root`` (the checkout) itself or a folder between ``root`` and it, or a link below
    it where ``enter`` says the collection would step into it. pytest's collection follows such a
    link: one to ``.`` judges the suites again at every depth, one to ``/`` walks the whole disk while
    the GPU is held. None is followed here (a link costs the stat of its target): the refusal comes at
    once."""
    base = Path(os.path.abspath(root))
    links: list[Path] = []
    for path in paths:
        absolute = Path(os.path.abspath(path))  # as pytest names it: lexical, no link followed
        parts = absolute.relative_to(base).parts if absolute.is_relative_to(base) else ()  # else named by hand
        steps = [base.joinpath(*parts[:n]) for n in range(1, len(parts) + 1)]
        on_the_way = [step for step in steps if _folder_link(step)]
        if on_the_way:
            links.append(on_the_way[0])
        elif os.path.isdir(absolute):
            try:
                links += [link for link in walk_tree(absolute, "gated folder", enter=enter)[1] if enter(link)]
            except FileError as exc:
                raise CudagateError(f"{exc.path}: {exc.problems[0]}") from None
    if not links:
        return
    try:
        target = visible(os.readlink(links[0]))
    except OSError:  # replaced since
        target = "?"
    others = "".join(f", {display_path(link)}" for link in links[1:4]) + (", ..." if len(links) > 4 else "")
    what = (f"a link to a folder (it leads to {target})" if len(links) == 1
            else f"{len(links)} links to folders (the first leads to {target})")
    raise CudagateError(f"{display_path(links[0])}{others}: {what}; cudagate follows no link to a folder in the paths "
                        "it gates (pytest would collect what it leads to: the suites again, or the whole disk): "
                        "replace it with a real folder, or remove it")


def _folder_link(path: Path) -> bool:
    return os.path.islink(path) and os.path.isdir(path)
