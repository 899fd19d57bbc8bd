"""Load ``cudagate.yaml``: parse, validate against ``schemas/suite.schema.json``, check meaning.

Every problem is collected (not just the first) and reported with the file, the line, the YAML
path and what is expected, because a suite author fixes them all in one edit.
"""

from __future__ import annotations

import os
import re
from collections import ChainMap
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from cudagate_harness import nvcc
from cudagate_harness.compiler import CompileOptionError, check_options
from cudagate_harness.library import ADAPTERS, Adapter, known
from cudagate_harness.protocol import DTYPES, LOW_PRECISION, finfo, numpy_dtype, unknown_dtype

from pytest_cudagate.boundary import schema
from pytest_cudagate.boundary import MAX_SOURCE_BYTES, MAX_SUITE_BYTES, clipped, non_finite, read_text, walk, walk_tree
from pytest_cudagate.boundary.yaml_rules import compose_yaml, parse_yaml
from pytest_cudagate.config import load_settings, project_root
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.host.paths import command, display_path, visible
from pytest_cudagate.suite.expr import ExprError, buffer_problem, launch_problems, parse, parse_condition
from pytest_cudagate.suite import device, instantiate, placeholders
from pytest_cudagate.suite.includes import IncludeError, local_headers
from pytest_cudagate.suite.step_checks import OTHER_STEPS, init_value, other_step, step_fits
from pytest_cudagate.suite.model import (DEFAULT_CLASS, Case, Checks, Distribution, Launch, LibraryBaseline, Param,
                                        Program, Reference, Step, Steps, Suite, Tolerance, Timing, Variant,
                                        default_bounds, default_rtol, derivations)

SUITE_FILENAME = "cudagate.yaml"
CLASS_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,63}")
INT_DTYPES = tuple(name for name in DTYPES if numpy_dtype(name).kind in "iu")
# Tunables are not signed (the gate never passes them), so a pull request can add any number: the
# caps keep loading, checking and autotune's search bounded. The schema caps each list at 64 values.
MAX_TUNABLES = 256  # per kernel; a hand-tuned kernel has a handful
MAX_TUNABLE_VALUES = 1024  # per kernel, all lists together: autotune's model has one coefficient each
NORMAL_SPAN = 6  # a normal draw's mean ± 6 std must fit a low-precision type; the rarer tail is clipped


def _locator(text: str):
    root = compose_yaml(text)

    def locate(parts):
        node = root
        for part in parts:
            if isinstance(node, yaml.MappingNode):
                node = next((v for k, v in node.value if k.value == part), None)
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
                node = node.value[part]
            else:
                break
            if node is None:
                return None
        return node.start_mark.line + 1 if node is not None else None

    return locate


def _real(path: Path) -> Path:
    """``path`` with every link followed; a loop of links is left as it is (Path.resolve raises
    RuntimeError there on Python 3.10 to 3.12), and the file checks that follow refuse it."""
    return Path(os.path.realpath(path))


def load_suite(path: str | Path, include: tuple[Path, ...] | None = None) -> Suite:
    """The suite file at ``path``; its kernels look for shared headers in ``include`` (None: the
    include folders of the project holding it, :func:`project_include`)."""
    path = Path(path)
    try:
        text = read_text(path, MAX_SUITE_BYTES, "suite file")
    except OSError as exc:
        raise FileError(path, [f"cannot read the suite file: {exc.strerror}"]) from None
    raw = parse_yaml(text, path, "suite file")
    locate = _locator(text)
    if not isinstance(raw, dict):
        raise FileError(path, ["(top level): expected a mapping with keys suite, signature, reference, kernels, cases, tolerance"])
    _refuse_placeholders(path, raw, locate)
    include = project_include(path) if include is None else include
    instantiations, problems = instantiate.expand(raw)
    if problems:
        checker = _Checker(path, locate)
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
    schema.validate(raw, "suite", path, locate)
    checker = _Checker(path, locate, include)
    for parts, value in non_finite(raw):  # JSON Schema cannot say "finite"
        checker.add(parts, f"{value} is not a finite number; write a finite value")
    for n, param in enumerate(raw["signature"]):  # the schemas take any name: DTYPES is the one list
        for key in ("buffer", "scalar"):
            if key in param and (problem := unknown_dtype(param[key])):
                checker.add(["signature", n, key], problem)
    checker.raise_if_any()
    suite = checker.build(raw)
    checker.raise_if_any()
    return suite


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


class _Checker:
    def __init__(self, path: Path, locate, include: tuple[Path, ...] = ()):
        self.include = include
        self.path = path
        self.locate = locate
        self.problems: list[str] = []

    def add(self, parts: list, message: str) -> None:
        line = self.locate(parts)
        where = schema.format_path(parts)
        self.problems.append(f"line {line}: {where}: {message}" if line else f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.problems:
            raise FileError(self.path, self.problems)

    def expr(self, value, parts: list, scalars: set[str]) -> str:
        text = str(value)
        try:
            names = parse(text).names
        except ExprError as exc:
            self.add(parts, str(exc))
            return text
        unknown = sorted(names - scalars)
        if unknown:
            self.add(parts, f"{text!r} uses {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not "
                            f"a scalar parameter (scalars: {', '.join(sorted(scalars)) or 'none'})")
        return text

    def source(self, value: str, parts: list) -> Path:
        """A file the suite names: inside the suite's folder, a regular file, UTF-8 text."""
        root = _real(self.path.parent)
        path = _real(root / value)
        shown = clipped(repr(value))
        try:
            if not path.is_relative_to(root):
                self.add(parts, f"{shown} lies outside the suite folder (it resolves to {clipped(str(path))}); a "
                                "suite's files, symlinks included, must stay inside its folder")
            elif (root / value).is_symlink() and not path.is_file():
                self.add(parts, f"{shown} is a link that leads to no file (a loop of links, or a missing target); "
                                "replace it with the file itself")
            elif not path.is_file():
                self.add(parts, f"file {shown} not found next to the suite (looked for {clipped(str(path))})")
            else:
                read_text(path, MAX_SOURCE_BYTES, "source file")
        except FileError as exc:
            self.add(parts, f"{clipped(value)}: {exc.problems[0]}")
        except OSError as exc:  # a name too long for the file system
            self.add(parts, f"{shown} cannot be looked up ({exc.strerror}); name a file of the suite folder")
        return path

    def launch(self, raw: dict, parts: list, scalars: set[str]) -> Launch:
        """A launch: its expressions may also read the device facts (suite/device.py)."""
        scalars = scalars | set(device.FACTS)
        return Launch(
            grid=tuple(self.expr(v, parts + ["grid", i], scalars) for i, v in enumerate(raw["grid"])),
            block=tuple(self.expr(v, parts + ["block", i], scalars) for i, v in enumerate(raw["block"])),
            shared_bytes=self.expr(raw.get("shared_bytes", 0), parts + ["shared_bytes"], scalars),
        )

    def program(self, raw: dict, parts: list, scalars: set[str], name: str, case_names: set[str],
                case_classes: set[str] = frozenset(), signature: tuple[Param, ...] = ()) -> Program:
        tunables = self.tunables(raw.get("tunables", {}), parts + ["tunables"], scalars, name)
        names = scalars | set(tunables)  # launch expressions may use tunables' names
        defaults = {tunable: values[0] for tunable, values in tunables.items()}
        overrides, raw_overrides = {}, {}
        for case_name, launch in raw.get("launch_overrides", {}).items():
            if case_name not in case_names:
                self.add(parts + ["launch_overrides", case_name], f"no case named {case_name!r} (cases: {', '.join(sorted(case_names))})")
            raw_overrides[case_name] = self.launch(launch, parts + ["launch_overrides", case_name], names)
            overrides[case_name] = raw_overrides[case_name].with_constants(defaults)
        entry = raw.get("entry", name)
        source = self.source(raw["source"], parts + ["source"])
        if "steps" in raw or "args" in raw:  # a one-launch kernel of some parameters is a kernel of one step
            return self.stepped(raw, parts, scalars, name, source, signature, case_classes)
        launch = self.launch(raw["launch"], parts + ["launch"], names)
        if "tuning_launch" in raw and not tunables:
            self.add(parts + ["tuning_launch"], "tuning_launch needs tunables: declare the -D constants it uses")
        tuning = self.launch(raw["tuning_launch"], parts + ["tuning_launch"], names) if "tuning_launch" in raw else None
        tuning_source = None
        if "tuning_source" in raw:
            if not tunables:
                self.add(parts + ["tuning_source"], "tuning_source needs tunables: declare the -D constants its "
                                                    "template reads, e.g. `tunables: {TILE: [16, 8, 32]}`")
            tuning_source = self.template(raw["tuning_source"], parts + ["tuning_source"], entry)
            if tuning_source.parent != source.parent:  # a candidate's quoted #includes resolve beside `source`
                self.add(parts + ["tuning_source"], f"{raw['tuning_source']} is not in the folder of source "
                                                    f"{raw['source']}: candidates are built where the kernel is, so "
                                                    "put the template next to it")
        return Program(
            include=self.include,
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
            classes={shape_class: self.variant(variant, parts + ["classes", shape_class], names, defaults, case_classes)
                     for shape_class, variant in raw.get("classes", {}).items()},
            library_baseline=(self.library_baseline(raw["library_baseline"], parts + ["library_baseline"], signature)
                              if "library_baseline" in raw else None),
            compiler=self.compiler(raw, parts, source),
        )

    def stepped(self, raw: dict, parts: list, scalars: set[str], name: str, source: Path,
                signature: tuple[Param, ...], case_classes: set[str]) -> Program:
        """A kernel given as ``steps:``: each step an entry the source defines, the signature's
        parameters it takes (each once), and a launch whose expressions resolve; every output and
        scratch buffer taken by some step. What varies a single launch per case or per tuning
        (launch_overrides, a class variant's launch, tunables) is refused: a step's launch is
        written once, in terms of the case's scalars."""
        for key, why in (("launch_overrides", "write the steps' launches in terms of the case's scalars"),
                         ("tunables", "autotune searches single-launch kernels"),
                         ("tuning_launch", "autotune searches single-launch kernels"),
                         ("tuning_source", "autotune searches single-launch kernels")):
            if key in raw:
                self.add(parts + [key], f"not with `{'steps' if 'steps' in raw else 'args'}`: {why}; remove `{key}`")
        for shape_class, variant in raw.get("classes", {}).items():
            if "launch" in variant:
                self.add(parts + ["classes", shape_class, "launch"], "a kernel of steps takes no class variant launch "
                                                                     "(a variant may change options only); remove it")
        params = {p.name: p for p in signature}
        text = self.defined_names(source)
        steps = []
        if "steps" in raw and "args" in raw:
            self.add(parts + ["args"], "a kernel of steps names its parameters per step; move `args` into its steps")
        # A one-launch kernel with `args` is its one step: its entry, args and launch sit where a step's do.
        listed = ([(parts + ["steps", i], raw_step) for i, raw_step in enumerate(raw["steps"])] if "steps" in raw else
                  [(parts, {"entry": raw.get("entry", name), "args": raw["args"], "launch": raw["launch"]})])
        for where, raw_step in listed:
            if "entry" not in raw_step or any(k in raw_step for k in OTHER_STEPS):
                step = other_step(self, raw_step, where, params, scalars)
                if step is not None:
                    steps.append(step)
                continue
            if "launch" not in raw_step:
                self.add(where, "a launch step needs `launch: {grid: [...], block: [...]}`")
                continue
            entry = raw_step["entry"]
            base = entry.split("<", 1)[0].strip()
            if text is not None and not re.search(rf"\b{re.escape(base)}\b", text):
                self.add(where + ["entry"], f"{entry!r} is not defined in {raw['source']} (nor in the headers it "
                                            "includes); name a __global__ function of the kernel's source")
            args = tuple(raw_step.get("args", [p.name for p in signature]))
            for j, arg in enumerate(args):
                if arg not in params:
                    self.add(where + ["args", j], f"{arg!r} is not a parameter of the signature (parameters: "
                                                  f"{', '.join(params)})")
            for arg in sorted({a for a in args if args.count(a) > 1}):
                self.add(where + ["args"], f"{arg!r} is named twice; a step takes each parameter once")
            steps.append(Step(entry, args, self.launch(raw_step["launch"], where + ["launch"], scalars)))
        taken = {a for step in steps for a in step.params}
        written = {a for step in steps for a in step.writes}
        if "steps" in raw and len(steps) == len(listed) and not any(isinstance(step, Step) for step in steps):
            self.add(parts + ["steps"], f"no step launches an entry of {raw['source']}: the operation gated is the "
                                        "kernel's; add its launch step (`- entry: NAME`)")
        # An output left out of `outputs:` may be written by none (it is not judged); so may the scratch
        # of a one-launch kernel with `args` (a fused version needs no workspace).
        for param in signature if len(steps) == len(listed) else ():  # (a refused step has said why)
            if ((param.is_scratch and "steps" in raw or param.is_output and "outputs" not in raw)
                    and param.name not in (taken if param.is_scratch else written)):
                if "steps" in raw:
                    self.add(parts + ["steps"], f"{'scratch' if param.is_scratch else 'output'} buffer {param.name!r} "
                                                f"is {'taken' if param.is_scratch else 'written'} by no step; add it "
                                                "to the `args` of the step that writes it (a memset, copy or library "
                                                "call into it counts)")
                else:
                    self.add(parts + ["args"], f"output buffer {param.name!r} is not in `args`, so it is never written; "
                                               "add it, or name the outputs the kernel is judged on in `outputs:`")
        return Program(
            include=self.include,
            name=name, source=source, entry=next((s.entry for s in steps if isinstance(s, Step)), name),
            options=tuple(raw.get("options", [])),
            launch=Steps(tuple(steps)), arch_suffix=raw.get("arch_suffix", ""),
            classes={shape_class: self.variant(variant, parts + ["classes", shape_class], scalars, {}, case_classes)
                     for shape_class, variant in raw.get("classes", {}).items() if "launch" not in variant},
            library_baseline=(self.library_baseline(raw["library_baseline"], parts + ["library_baseline"], signature)
                              if "library_baseline" in raw else None),
            compiler=self.compiler(raw, parts, source),
        )

    def preconditions(self, program: Program, raw: dict, parts: list, scalars: set[str],
                      signature: tuple[Param, ...], derivations: tuple = ()) -> Program:
        """A kernel's ``requires:`` (conditions over the scalars, derived ones included: ``derivations``,
        :attr:`Suite.derivations`) and ``outputs:`` (the outputs it is judged on: outputs of the
        signature, each written by one of its steps where it has steps)."""
        requires = []
        for i, text in enumerate(raw.get("requires", [])):
            try:
                names = parse_condition(text).names
            except ExprError as exc:
                self.add(parts + ["requires", i], f"{exc}")
                continue
            unknown = sorted(names - scalars)
            if unknown:
                self.add(parts + ["requires", i], f"{text!r} uses {', '.join(unknown)}, which "
                                                  f"{'is' if len(unknown) == 1 else 'are'} neither a scalar parameter "
                                                  f"nor a derived scalar (scalars: {', '.join(sorted(scalars)) or 'none'})"
                                                  "; name those only")
                continue
            requires.append(text.strip())
        program = replace(program, requires=tuple(requires), derived=derivations if requires else ())
        if "outputs" not in raw:
            return program
        params = {p.name: p for p in signature}
        taken = {a for step in program.steps for a in step.writes} if program.steps else set(params)
        for i, name in enumerate(raw["outputs"]):
            param = params.get(name)
            if param is None or not param.is_output:
                what = ("not a parameter of the signature" if param is None else
                        "a scalar" if param.kind == "scalar" else f"a buffer of intent {param.intent}")
                self.add(parts + ["outputs", i], f"{name!r} is {what}; name outputs of the signature (intent out or "
                                                 f"inout: {', '.join(p.name for p in signature if p.is_output)})")
            elif name not in taken:
                self.add(parts + ["outputs", i], f"output {name!r} is judged but no step takes it; add it to the "
                                                 "`args` of the step that writes it, or remove it from `outputs`")
        for name in sorted({n for n in raw["outputs"] if raw["outputs"].count(n) > 1}):
            self.add(parts + ["outputs"], f"{name!r} is named twice; name each judged output once")
        return replace(program, judged=tuple(raw["outputs"]))

    def kernel_cases(self, suite: Suite) -> None:
        """Each kernel's ``requires`` evaluate on every case, and leave it a non-holdout performance
        case (the latency gate ranks those): a kernel is never left without latency cases."""
        for i, kernel in enumerate(suite.kernels):
            try:
                kept = [case for case in suite.cases if kernel.runs(case)]
            except ExprError as exc:
                self.add(["kernels", i, "requires"], f"{exc}")
                continue
            if not any(c.kind == "performance" and not c.holdout for c in kept):
                self.add(["kernels", i, "requires"], f"kernel {kernel.name!r} meets its requires on no non-holdout "
                                                     "performance case; add a case that meets them, or loosen them")

    def compiler(self, raw: dict, parts: list, source: Path) -> str:
        """The kernel's ``compiler:``; where nvcc builds it (named, or `auto` on a file with host code),
        each of its options nvcc may be given."""
        compiler = raw.get("compiler", "auto")
        options = raw.get("options", [])
        if options and compiler != "nvrtc":
            text = self.defined_names(source) if compiler == "auto" else ""
            if compiler == "nvcc" or (text is not None and nvcc.host_code(text, {})):
                for i, option in enumerate(options):
                    try:
                        nvcc.check_options([option])
                    except CompileOptionError as exc:
                        self.add(parts + ["options", i], f"{exc}; remove it")
        return compiler

    def defined_names(self, source: Path) -> str | None:
        """The kernel source and the headers it includes from the suite folder, as one text in which
        a step's entry must appear; None where they cannot be read (the source check says why)."""
        try:
            text = read_text(source, MAX_SOURCE_BYTES, "source file")
            return "\n".join([text, *local_headers(source, text, self.include).values()])
        except (OSError, FileError, IncludeError):
            return None

    def library_baseline(self, raw: dict, parts: list, signature: tuple[Param, ...]) -> LibraryBaseline:
        """``library_baseline:``: a registered adapter whose every role names a parameter it can read."""
        name, args = raw["adapter"], dict(raw["args"])
        adapter = ADAPTERS.get(name)
        if adapter is None:
            self.add(parts + ["adapter"], f"unknown library baseline adapter {name!r}; known adapters: "
                                          f"{', '.join(known(Adapter))}")
            return LibraryBaseline(name, args)
        params = {p.name: p for p in signature}
        if not isinstance(adapter, Adapter):
            self.add(parts + ["adapter"], f"{name} is a library step adapter (`steps: - library: {name}`), not a "
                                          f"baseline; known baseline adapters: {', '.join(known(Adapter))}")
            return LibraryBaseline(name, args)
        for role in sorted(set(args) - set(adapter.roles)):
            self.add(parts + ["args", role], f"{name} has no role {role!r} (its roles: {', '.join(adapter.roles)})")
        for role in adapter.roles:
            if role not in args:
                self.add(parts + ["args"], f"{name} needs role {role!r}: map it to a parameter, e.g. `{role}: {role}`")
                continue
            param = params.get(args[role])
            if role in adapter.buffers:
                dtype, writes = adapter.buffers[role]
                if param is None or param.kind != "buffer" or param.dtype != dtype:
                    self.add(parts + ["args", role], f"{name}'s {role} is a {dtype} buffer; {args[role]!r} is not one "
                                                     "of the signature's")
                elif writes and not param.is_output:
                    self.add(parts + ["args", role], f"{name} writes {role}; {args[role]!r} has intent in: map an "
                                                     "output buffer")
            elif param is None or param.kind != "scalar" or param.dtype not in INT_DTYPES:
                self.add(parts + ["args", role], f"{name}'s {role} is an integer scalar; {args[role]!r} is not one "
                                                 "of the signature's")
        return LibraryBaseline(name, args)

    def variant(self, raw: dict, parts: list, names: set[str], defaults: dict[str, int],
                case_classes: set[str]) -> Variant:
        """One entry of a kernel's ``classes:``: a class some case has, options the compiler accepts,
        and a launch whose expressions resolve as the kernel's do."""
        shape_class = parts[-1]
        if shape_class not in case_classes:
            self.add(parts, f"no case has class {shape_class!r} (the cases' classes: {', '.join(sorted(case_classes))}); "
                            f"name one of those, or give the cases it is for `class: {shape_class}`")
        options = tuple(raw.get("options", []))
        for i, option in enumerate(options):
            try:
                check_options([option])
            except CompileOptionError as exc:
                self.add(parts + ["options", i], f"{exc}; remove it from the variant")
        launch = self.launch(raw["launch"], parts + ["launch"], names).with_constants(defaults) if "launch" in raw else None
        return Variant(options=options, launch=launch)

    def template(self, value: str, parts: list, entry: str) -> Path:
        """``tuning_source``: a file like ``source`` that defines the kernel's entry (its candidates replace the kernel)."""
        problems = len(self.problems)
        path = self.source(value, parts)
        if len(self.problems) == problems:
            text = read_text(path, MAX_SOURCE_BYTES, "source file")
            if not re.search(rf"\b{re.escape(entry)}\s*\(", text):
                self.add(parts, f"{value} does not define the kernel's entry {entry!r}: autotune candidates built from "
                                f"it replace the kernel, so declare `extern \"C\" __global__ void {entry}(...)` with "
                                "the suite's signature there")
        return path

    def derived(self, raw: dict, signature: list[Param]) -> dict[str, str]:
        """``derived: {N: "B*T*C"}``: each name once, none a buffer's or an expression function's,
        each expression over the case's scalars and other derived ones, with no cycle. Returned in
        the order they are evaluated: each after the derived scalars it reads."""
        params = {p.name: p for p in signature}
        given = {p.name for p in signature if p.kind == "scalar"} - set(raw)  # the scalars cases give
        reads: dict[str, set[str]] = {}
        for name, value in raw.items():
            parts = ["derived", name]
            if name in params and params[name].kind == "buffer":
                self.add(parts, f"{name!r} is a buffer of the signature; name the derived scalar otherwise")
                continue
            if name in ("cdiv", "min", "max", "ceil", "floor"):
                self.add(parts, f"{name!r} is an expression function; choose another name")
                continue
            if name in device.FACTS:
                self.add(parts, f"{name!r} is a device fact (launch expressions read it from the GPU); choose "
                                "another name")
                continue
            try:
                names = parse(value).names
            except ExprError as exc:
                self.add(parts, str(exc))
                continue
            unknown = sorted(names - given - set(raw))
            if unknown:
                self.add(parts, f"{str(value)!r} uses {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} "
                                f"neither a scalar the cases give nor a derived scalar (scalars: "
                                f"{', '.join(sorted(given)) or 'none'}; derived: {', '.join(raw)})")
                continue
            reads[name] = names & set(raw)
        order: list[str] = []
        state: dict[str, str] = {}  # name -> "open" while its reads are visited, "done" after

        def visit(name: str, path: list[str]) -> None:
            if state.get(name) == "done" or name not in reads:
                return
            if state.get(name) == "open":
                cycle = path[path.index(name):] + [name]
                self.add(["derived", name], f"derived scalars form a cycle ({' -> '.join(cycle)}); derive each "
                                            "from the case's scalars or from derived ones that do not read it")
                return
            state[name] = "open"
            for read in sorted(reads[name]):
                visit(read, path + [name])
            state[name] = "done"
            order.append(name)

        for name in raw:
            visit(name, [])
        return {name: str(raw[name]) for name in order}

    def derived_values(self, suite: Suite, case: Case, scalars: dict) -> bool:
        """Whether every derived scalar the signature declares fits its type on ``case`` (each that
        does not is reported)."""
        fits = True
        types = {p.name: p.dtype for p in suite.signature if p.kind == "scalar"}
        for name in suite.derived:
            dtype = types.get(name)
            if dtype is None:
                continue
            info = np.iinfo(dtype) if dtype in INT_DTYPES else finfo(dtype)
            if not -abs(info.min) <= scalars[name] <= info.max:
                fits = False
                self.add(["derived", name], f"case {case.name!r}: {name} = {suite.derived[name]} gives "
                                            f"{scalars[name]}, which does not fit {name}'s type {dtype} "
                                            f"({info.min} to {info.max}); give {name} a wider type in the signature")
        return fits

    def tunables(self, raw: dict, parts: list, scalars: set[str], kernel: str) -> dict[str, tuple[int, ...]]:
        """``tunables: {NAME: [default, other, ...]}``: -D constants for the autotune proposer."""
        values_in_all = sum(len(values) for values in raw.values())
        if len(raw) > MAX_TUNABLES or values_in_all > MAX_TUNABLE_VALUES:
            self.add(parts, f"kernel {kernel!r} declares {len(raw)} tunables with {values_in_all} values in all; "
                            f"at most {MAX_TUNABLES} tunables and {MAX_TUNABLE_VALUES} values per kernel: keep the "
                            "-D constants and values the search needs")
        found = {}
        for name, values in raw.items():
            if name in scalars:
                self.add(parts + [name], f"{name!r} is a scalar parameter; a tunable needs a name of its own")
            elif name in ("cdiv", "min", "max", "ceil", "floor"):
                self.add(parts + [name], f"{name!r} is an expression function; choose another name")
            elif len(set(values)) != len(values):
                self.add(parts + [name], f"values {values} repeat one; list each value once, the default first")
            found[name] = tuple(int(v) for v in values)
        return found

    def build(self, raw: dict) -> Suite:
        signature = []
        for i, p in enumerate(raw["signature"]):
            if "buffer" in p:
                signature.append(Param(p["name"], "buffer", p["buffer"], p["intent"], str(p["size"]),
                                       tuple(str(s) for s in p["shape"]) if "shape" in p else None,
                                       str(p["ld"]) if "ld" in p else None, init_value(self, p, ["signature", i])))
                if "ld" in p and len(p.get("shape", ())) != 2:
                    self.add(["signature", i, "ld"], f"{p['name']!r} has no 2-D shape; `ld` is the distance between "
                                                     "the rows of a [rows, cols] buffer: give it `shape: [ROWS, COLS]`"
                                                     ", or remove `ld`")
                if "ld" in p and "init" in p:
                    self.add(["signature", i, "init"], f"{p['name']!r} has `ld`: its padding must keep the canary the "
                                                       "harness checks, and `init` sets the whole buffer; scratch is "
                                                       "never compared, so remove `ld` (or `init`)")
            else:
                signature.append(Param(p["name"], "scalar", p["scalar"]))
                if p["scalar"] in LOW_PRECISION:
                    self.add(["signature", i, "scalar"], f"{p['scalar']} is for buffers only; pass the scalar as "
                                                         "float32 (`scalar: float32`) and convert it in the kernel")
        self.unique([p.name for p in signature], ["signature"], "parameter")
        derived = self.derived(raw.get("derived", {}), signature)
        scalars = {p.name for p in signature if p.kind == "scalar"} | set(derived)
        for i, p in enumerate(signature):
            if p.kind == "buffer":
                self.expr(p.size, ["signature", i, "size"], scalars)
                for j, s in enumerate(p.shape or ()):
                    self.expr(s, ["signature", i, "shape", j], scalars)
                if p.ld is not None:
                    self.expr(p.ld, ["signature", i, "ld"], scalars)
        outputs = {p.name for p in signature if p.is_output}
        inputs = {p.name for p in signature if p.is_input}
        if not outputs:
            self.add(["signature"], "no buffer has intent out or inout: there would be nothing to check")

        cases = [Case(c["name"], c["kind"], dict(c["scalars"]), bool(c.get("holdout", False)), c.get("seed"),
                      self.shape_class(c.get("class", DEFAULT_CLASS), ["cases", i, "class"]), bool(c.get("generated", False)),
                      bool(c.get("constant_ok", False)))
                 for i, c in enumerate(raw["cases"])]
        case_names = {c.name for c in cases}
        self.unique([c.name for c in cases], ["cases"], "case")
        if not any(c.kind == "performance" and not c.holdout for c in cases):
            self.add(["cases"], "at least one non-holdout case needs kind: performance (the latency gate ranks those)")
        for i, case in enumerate(cases):
            self.case_scalars(case, i, signature, derived)

        ref_raw = raw["reference"]
        if "python" in ref_raw:
            file_name = ref_raw["python"].rsplit(":", 1)[0]
            self.source(file_name, ["reference", "python"])
            reference = Reference(python=ref_raw["python"])
        else:
            reference = Reference(program=self.program(ref_raw, ["reference"], scalars, "reference", case_names))

        case_classes = {c.shape_class for c in cases}
        kernels = [self.preconditions(self.program(k, ["kernels", i], scalars, k["name"], case_names, case_classes,
                                                   tuple(signature)), k, ["kernels", i], scalars, tuple(signature),
                                      derivations(signature, derived))
                   for i, k in enumerate(raw["kernels"])]
        self.unique([k.name for k in kernels], ["kernels"], "kernel")

        tolerance = {}
        dtypes = {p.name: p.dtype for p in signature}
        scratch = {p.name for p in signature if p.is_scratch}
        for name, tol in raw["tolerance"].items():
            if name in scratch:
                self.add(["tolerance", name], f"{name!r} is a scratch buffer: the kernel's own workspace is never "
                                              "compared; remove its tolerance, or make it an output (intent: out)")
            elif name not in outputs:
                self.add(["tolerance", name], f"{name!r} is not an output buffer (outputs: {', '.join(sorted(outputs))})")
            if "ulp" in tol:
                tol = {**tol, "ulp": self.ulp(tol["ulp"], dtypes.get(name), ["tolerance", name, "ulp"])}
            if dtypes.get(name) in LOW_PRECISION and "rtol" not in tol and "ulp" not in tol:
                tol = {**tol, "rtol": default_rtol(dtypes[name])}
            tolerance[name] = Tolerance(**tol)
        for name in sorted(outputs - set(tolerance)):
            self.add(["tolerance"], f"output {name!r} has no tolerance; add `{name}: {{atol: ..., rtol: ...}}`")
        distributions = {}
        for name, dist in raw.get("inputs", {}).items():
            if name in scratch:
                self.add(["inputs", name], f"{name!r} is a scratch buffer: it is poisoned before every run, never "
                                           "drawn; remove it from `inputs`, or make it an input (intent: in)")
            elif name not in inputs:
                self.add(["inputs", name], f"{name!r} is not an input buffer (inputs: {', '.join(sorted(inputs))})")
            dtype = next((p.dtype for p in signature if p.name == name), None)
            low, high = default_bounds(dist.get("distribution", "uniform"), dtype or "float32")
            if dist.get("distribution") == "outliers":
                base = {"distribution": "uniform", **dist.get("base", {})}
                dist = {**dist, "per": dist.get("per", "row"), "base": Distribution(**{
                    "low": -1.0, "high": 1.0, **base, "adversarial_max": None})}
            distributions[name] = Distribution(**{"low": low, "high": high, **dist})
            if dtype is not None:
                self.distribution(distributions[name], dtype, ["inputs", name])

        suite = Suite(
            path=self.path.resolve(),
            name=raw["suite"],
            signature=tuple(signature),
            reference=reference,
            kernels=tuple(kernels),
            cases=tuple(cases),
            tolerance=tolerance,
            inputs=distributions,
            timing=Timing(**raw.get("timing", {})),
            threshold=float(raw.get("gate", {}).get("threshold", 0.02)),
            data_dir=self.data_dir(raw.get("data", "cases")),
            description=raw.get("description", ""),
            derived=derived,
        )
        if "checks" in raw:
            object.__setattr__(suite, "_checks", self.checks(raw["checks"]))  # see Suite.checks
        if not self.problems:
            self.resolve_everything(suite)
        if not self.problems:
            self.kernel_cases(suite)
        return suite

    def ulp(self, value: float, dtype: str | None, parts: list) -> int:
        """A tolerance's ``ulp``: a whole number of units in the last place, 0 or more, of a float output."""
        if dtype in INT_DTYPES:
            self.add(parts, f"the output is {dtype}: units in the last place belong to float outputs; remove `ulp` "
                            "and use atol (0 for exact integers)")
        elif value < 0 or not float(value).is_integer():
            self.add(parts, f"{value!r} is not a number of units in the last place; write a whole number, 0 or more "
                            "(e.g. `ulp: 4`)")
        return int(value) if float(value).is_integer() else 0

    def distribution(self, dist: Distribution, dtype: str, parts: list) -> None:
        """Parameters the generator can draw from for ``dtype`` (numpy refuses or overflows otherwise)."""
        if dist.low > dist.high:
            self.add(parts, f"low ({dist.low}) is above high ({dist.high}); swap them")
        if dist.adversarial_max is not None:
            self.adversarial_max(dtype, parts + ["adversarial_max"])
        if dist.distribution == "outliers" or dist.base is not None or dist.k is not None or dist.scale is not None:
            self.outliers(dist, dtype, parts)
            if dist.base is not None and dist.base.distribution != "outliers":
                self.distribution(dist.base, dtype, parts + ["base"])
        if dtype in LOW_PRECISION:
            self.low_precision_distribution(dist, dtype, parts)
            return
        info = np.iinfo(dtype) if dtype in INT_DTYPES else np.finfo(dtype)
        limit = float(info.max) / 2  # the draw spans high - low, which must stay finite
        for key in ("low", "high", "mean", "std"):
            value = getattr(dist, key)
            if dtype in INT_DTYPES and key in ("low", "high") and not info.min <= value <= info.max:
                self.add(parts + [key], f"{value} does not fit {dtype} ({info.min} to {info.max})")
            elif abs(value) > limit:
                self.add(parts + [key], f"{value} is too large for {dtype} (at most {limit:g})")

    def adversarial_max(self, dtype: str, parts: list) -> None:
        """(The schema has refused a number that is not positive, the loader one that is not finite.)"""
        if dtype in INT_DTYPES:
            self.add(parts, f"{dtype} input: adversarial fresh inputs leave integers unchanged, so a bound means "
                            "nothing; remove `adversarial_max`")

    def outliers(self, dist: Distribution, dtype: str, parts: list) -> None:
        if dist.distribution != "outliers":
            self.add(parts, "`base`, `k`, `scale` and `per` belong to `distribution: outliers`; remove them, or "
                            "write `distribution: outliers` with the distribution as its `base`")
        elif dist.k is None or dist.scale is None:
            self.add(parts, "an outliers distribution needs `k` (outliers per row) and `scale` (their size), e.g. "
                            "{distribution: outliers, base: {distribution: normal}, k: 2, scale: 100}")
        elif dtype in INT_DTYPES:
            self.add(parts, f"outliers are drawn for float inputs; {dtype} takes uniform, normal or integers")
        elif dist.base.distribution in ("outliers", "integers"):
            self.add(parts + ["base", "distribution"], f"{dist.base.distribution!r} cannot be an outliers "
                                                       "distribution's base; use uniform or normal")

    def low_precision_distribution(self, dist: Distribution, dtype: str, parts: list) -> None:
        """Refused where the draw reaches past ``dtype``'s largest finite value (448 for float8_e4m3fn,
        57344 for float8_e5m2), which rounds to NaN or Inf: uniform and integers bounds, and a normal
        draw's mean ± 6 std (a value further out is clipped to the range, see suite/draw.py)."""
        limit = float(finfo(dtype).max)
        if dist.distribution == "normal":
            reach = abs(dist.mean) + NORMAL_SPAN * dist.std
            if reach > limit:
                self.add(parts, f"mean ± {NORMAL_SPAN} std reaches {reach:g}, beyond {dtype}'s largest value "
                                f"{limit:g}; lower mean or std so the draws stay representable")
            return
        for key in ("low", "high"):
            value = getattr(dist, key)
            if abs(value) > limit:
                self.add(parts + [key], f"{value:g} is beyond {dtype}'s largest value {limit:g} (it would round to "
                                        f"NaN or Inf); keep the range within ±{limit:g}")

    def data_dir(self, value: str) -> Path:
        root = _real(self.path.parent)
        path = _real(root / value)
        if not path.is_relative_to(root):
            self.add(["data"], f"{value!r} is outside the suite's folder ({root}); keep the case data beside the suite")
        return path

    def checks(self, raw: dict) -> Checks:
        """``checks:`` (the schema has checked names and types)."""
        values = dict(raw)
        if "sanitizer" in values:
            tools = values["sanitizer"]
            values["sanitizer"] = () if tools is False or tools == "off" else tuple(dict.fromkeys(tools))
        return Checks(**values)

    def shape_class(self, value: str, parts: list) -> str:
        """A case's ``class:``: one word, since it is typed after ``--cuda-gate-class`` and ``-k``."""
        if not CLASS_NAME.fullmatch(value):
            self.add(parts, f"{value!r} is not a class name; write one word of letters, digits, '_' or '-' "
                            f"starting with a letter (e.g. small, large), or leave `class` out for {DEFAULT_CLASS!r}")
        return value

    def unique(self, names: list[str], parts: list, what: str) -> None:
        seen = set()
        for i, name in enumerate(names):
            if name in seen:
                self.add(parts + [i, "name"], f"{what} name {name!r} is used twice")
            seen.add(name)

    def case_scalars(self, case: Case, index: int, signature: list[Param], derived: dict[str, str]) -> None:
        declared = {p.name: p for p in signature if p.kind == "scalar"}
        parts = ["cases", index, "scalars"]
        for name in sorted(set(declared) - set(case.scalars) - set(derived)):
            self.add(parts, f"scalar {name!r} has no value in case {case.name!r}")
        for name, value in case.scalars.items():
            if name in derived:
                self.add(parts + [name], f"{name!r} is derived by the suite ({name} = {derived[name]}); remove it "
                                         "from the case")
            elif name not in declared:
                self.add(parts + [name], f"{name!r} is not a scalar parameter of the signature")
            elif declared[name].dtype in INT_DTYPES and not (isinstance(value, int) and not isinstance(value, bool)):
                self.add(parts + [name], f"{name} is {declared[name].dtype}, so its value must be a whole number, not {value!r}")
            else:
                info = np.iinfo(declared[name].dtype) if declared[name].dtype in INT_DTYPES else finfo(declared[name].dtype)
                if not -abs(info.min) <= value <= info.max:
                    self.add(parts + [name], f"{value} does not fit {name}'s type {declared[name].dtype} "
                                             f"({info.min} to {info.max})")

    def resolve_everything(self, suite: Suite) -> None:
        """Evaluate every derived scalar, size, shape and launch expression (tuning launches too, at
        each tunable value) for every case, and check each result against what it feeds, so errors
        show at load time."""
        crowded: set[str] = set()  # inputs whose outliers fill a row
        narrow: set[str] = set()  # padded buffers whose ld is refused (one line each, naming the first case)
        misfits: set[tuple[str, int]] = set()  # (kernel, step number) of steps already named as not fitting
        for i, case in enumerate(suite.cases):
            try:
                scalars = suite.scalars(case)
            except ExprError as exc:
                self.add(["derived"], f"case {case.name!r}: {exc}")
                continue
            if not self.derived_values(suite, case, scalars):
                continue
            counts = None  # stays None where the sizes cannot be worked out (named once, below)
            try:
                counts = suite.counts(case)
                for param in suite.buffers:
                    problem = buffer_problem(counts[param.name], numpy_dtype(param.dtype).itemsize)
                    if problem:
                        self.add(["cases", i], f"buffer {param.name!r} {problem} in case {case.name!r}")
                    elif param.shape:
                        shape = suite.shape(param, case)
                        product = 1
                        for dim in shape:
                            product *= dim
                        if min(shape) < 0 or product != counts[param.name]:
                            self.add(["cases", i], f"buffer {param.name!r}: shape {list(shape)} holds {product} "
                                                   f"elements but size gives {counts[param.name]}")
                        elif param.ld is not None and param.name not in narrow:
                            self.padding(suite, param, case, narrow)
                    dist = suite.inputs.get(param.name)
                    if (not problem and dist is not None and dist.distribution == "outliers" and dist.k is not None
                            and param.name not in crowded and dist.k >= dist.group(suite.shape(param, case))):
                        crowded.add(param.name)  # one line for the input, naming the first case
                        group, what = dist.group(suite.shape(param, case)), "a row" if dist.per == "row" else "a block"
                        self.add(["inputs", param.name, "k"], f"{dist.k} outliers in {what} of {group} elements "
                                 f"(case {case.name!r}) leave no value of the base distribution; make k at most "
                                 f"{group - 1}" + (", or draw them per a larger block (`per: N`)" if what == "a row" else ""))
            except ExprError as exc:
                self.add(["cases", i], f"case {case.name!r}: {exc}")
            programs = list(suite.kernels) + ([suite.reference.program] if suite.reference.program else [])
            for program in programs:
                if not self.meets(program, case):  # absent for it: its launches need not fit the case
                    continue
                if counts is not None:
                    step_fits(self, program, case, i, scalars, counts, misfits)
                for what, launch, scalars in self.launches(program, case, scalars):
                    for label, one in self.labelled(what, launch):
                        facts = "" if one.names().isdisjoint(device.FACTS) else f" ({device.STAND_IN_TEXT})"
                        try:
                            resolved = one.resolve(device.with_facts(scalars, device.STAND_IN))
                        except ExprError as exc:
                            self.add(["cases", i], f"{program.name} {label} in case {case.name!r}: {exc}{facts}")
                            continue
                        for problem in launch_problems(resolved["grid"], resolved["block"], resolved["shared_bytes"]):
                            self.add(["cases", i], f"{program.name} {label} in case {case.name!r}: {problem}{facts}")

    @staticmethod
    def meets(program: Program, case: Case) -> bool:
        """Whether ``case`` meets ``program``'s requires; one that cannot be worked out counts as met,
        so its launches are resolved and the problem named there."""
        try:
            return program.runs(case)
        except ExprError:
            return True

    def padding(self, suite: Suite, param: Param, case: Case, narrow: set[str]) -> None:
        """A padded buffer's ``ld`` on ``case``: at least its row length, its rows within a buffer's bytes
        (a buffer refused is added to ``narrow``)."""
        rows, cols, ld = suite.layout(param, case)
        parts = ["signature", suite.signature.index(param), "ld"]
        problem = buffer_problem(rows * ld, numpy_dtype(param.dtype).itemsize)
        if ld < cols:
            self.add(parts, f"ld = {param.ld} gives {ld} in case {case.name!r}, less than the row length {cols} of "
                            f"buffer {param.name!r}: its rows would overlap; make ld at least {param.shape[1]}")
        elif problem:
            self.add(parts, f"buffer {param.name!r} with its padding (ld = {ld}) {problem} in case {case.name!r}")
        else:
            return
        narrow.add(param.name)

    @staticmethod
    def labelled(what: str, launch: Launch | Steps):
        """``(label, launch)`` for a launch, or for each step of a kernel's steps (named by number and entry)."""
        if isinstance(launch, Steps):
            for number, step in enumerate(launch.steps, 1):
                if isinstance(step, Step):
                    yield f"step {number} ({step.entry})", step.launch
        else:
            yield what, launch

    @staticmethod
    def launches(program: Program, case: Case, scalars: dict):
        """``(what, launch, scalars)`` for the launch the gate uses and the tuning launch with every
        value of each tunable it names (one tunable at a time, the others at their defaults). A tunable
        the launch does not name cannot change it, and each value costs one resolve: the checks grow
        with the values, not with their square. ``scalars``: the case's, derived ones included."""
        build = program.for_case(case)
        what = f"launch (class {case.shape_class} variant)" if build.variant else "launch"
        yield what, build.launch_for(case.name), scalars
        tuning = program.tuning_overrides.get(case.name, program.tuning_launch)
        if tuning is None or not program.tunables:
            return
        defaults = ChainMap({name: values[0] for name, values in program.tunables.items()}, scalars)
        used = tuning.names()
        named = [name for name in program.tunables if name in used]
        if not named:
            yield "tuning_launch", tuning, defaults
        for name in named:
            for value in program.tunables[name]:
                yield f"tuning_launch ({name}={value})", tuning, defaults.new_child({name: value})


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
