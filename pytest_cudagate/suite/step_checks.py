"""What the suite loader checks of a kernel's ``steps:`` (a launch, memset, copy or library step each),
and of a scratch buffer's ``init:``.

Each problem is one line on the loader's checker (file, line, field and fix: suite/checker.py); the
kernel's other fields are checked in suite/check_kernels.py.
"""

from __future__ import annotations

import re

from cudagate_harness.library import ADAPTERS, StepAdapter, known

from pytest_cudagate.suite.expr import ExprError
from pytest_cudagate.suite.model import Step
from pytest_cudagate.suite.steps import CopyStep, LibraryStep, MemsetStep, element_bits

OTHER_STEPS = ("memset", "copy", "library")
# The keys each kind of step may hold besides its own.
_KEYS = {"entry": ("args", "launch"), "memset": (), "copy": (), "library": ("args", "options")}


def init_value(checker, raw: dict, parts: list):
    """A buffer's ``init:``: a value of its type, on a scratch buffer only (None where not given)."""
    if "init" not in raw:
        return None
    value = raw["init"]
    if raw.get("intent") != "scratch":
        checker.add(parts + ["init"], f"`init` is for scratch buffers; {raw['name']!r} has intent {raw.get('intent')} "
                                      "(an output starts poisoned, so the gate sees what no step writes; set it in a "
                                      "`memset` step instead): remove `init`")
        return None
    _, problem = element_bits(value, raw["buffer"])
    if problem:
        checker.add(parts + ["init"], problem)
    return value


def kernel_steps(checker, raw: dict, parts: list, scalars: set[str], name: str, signature: tuple,
                 text: str | None) -> list:
    """A kernel's ``steps:`` (or its one launch with ``args:``): each launch step an entry the source
    defines (``text``: the source and its headers, None where they cannot be read), the signature's
    parameters it takes (each once), and a launch whose expressions resolve; every output and scratch
    buffer taken by some step."""
    params = {p.name: p for p in signature}
    steps = []
    if "steps" in raw and "args" in raw:
        checker.add(parts + ["args"], "a kernel of steps names its parameters per step; move `args` into its steps")
    # A one-launch kernel with `args` is its one step: its entry, args and launch sit where a step's do.
    listed = ([(parts + ["steps", i], raw_step) for i, raw_step in enumerate(raw["steps"])] if "steps" in raw else
              [(parts, {"entry": raw.get("entry", name), "args": raw["args"], "launch": raw["launch"]})])
    for where, raw_step in listed:
        if "entry" not in raw_step or any(k in raw_step for k in OTHER_STEPS):
            step = other_step(checker, raw_step, where, params, scalars)
            if step is not None:
                steps.append(step)
            continue
        if "launch" not in raw_step:
            checker.add(where, "a launch step needs `launch: {grid: [...], block: [...]}`")
            continue
        entry = raw_step["entry"]
        base = entry.split("<", 1)[0].strip()
        if text is not None and not re.search(rf"\b{re.escape(base)}\b", text):
            checker.add(where + ["entry"], f"{entry!r} is not defined in {raw['source']} (nor in the headers it "
                                           "includes); name a __global__ function of the kernel's source")
        args = tuple(raw_step.get("args", [p.name for p in signature]))
        for j, arg in enumerate(args):
            if arg not in params:
                checker.add(where + ["args", j], f"{arg!r} is not a parameter of the signature (parameters: "
                                                 f"{', '.join(params)})")
        for arg in sorted({a for a in args if args.count(a) > 1}):
            checker.add(where + ["args"], f"{arg!r} is named twice; a step takes each parameter once")
        steps.append(Step(entry, args, checker.launch(raw_step["launch"], where + ["launch"], scalars)))
    taken = {a for step in steps for a in step.params}
    written = {a for step in steps for a in step.writes}
    if "steps" in raw and len(steps) == len(listed) and not any(isinstance(step, Step) for step in steps):
        checker.add(parts + ["steps"], f"no step launches an entry of {raw['source']}: the operation gated is the "
                                       "kernel's; add its launch step (`- entry: NAME`)")
    # An output left out of `outputs:` may be written by none (it is not judged); so may the scratch
    # of a one-launch kernel with `args` (a fused version needs no workspace).
    for param in signature if len(steps) == len(listed) else ():  # (a refused step has said why)
        if ((param.is_scratch and "steps" in raw or param.is_output and "outputs" not in raw)
                and param.name not in (taken if param.is_scratch else written)):
            if "steps" in raw:
                checker.add(parts + ["steps"], f"{'scratch' if param.is_scratch else 'output'} buffer {param.name!r} "
                                               f"is {'taken' if param.is_scratch else 'written'} by no step; add it "
                                               "to the `args` of the step that writes it (a memset, copy or library "
                                               "call into it counts)")
            else:
                checker.add(parts + ["args"], f"output buffer {param.name!r} is not in `args`, so it is never written; "
                                              "add it, or name the outputs the kernel is judged on in `outputs:`")
    return steps


def other_step(checker, raw: dict, where: list, params: dict, scalars: set[str]):
    """A step that is a memset, a copy or a library call, checked against the signature (``params``
    by name) and the scalars its expressions may read; None where it is refused."""
    kinds = [k for k in ("entry", *OTHER_STEPS) if k in raw]
    if len(kinds) != 1:
        checker.add(where, (f"a step is one of a launch (`entry`), `memset`, `copy` or `library`; this one is "
                            f"{' and '.join(kinds)}: split it into one step each") if kinds else
                    "a step needs one of `entry` (a launch), `memset`, `copy` or `library`")
        return None
    kind = kinds[0]
    extra = sorted(set(raw) - {kind, *_KEYS[kind]})
    if extra:
        checker.add(where + [extra[0]], f"a {kind} step takes no `{extra[0]}` (its keys: "
                                        f"{', '.join((kind, *_KEYS[kind]))}); remove it")
        return None

    def buffer(name: str, at: list, writes: bool, what: str):
        param = params.get(name)
        if param is None or param.kind != "buffer":
            checker.add(at, f"{name!r} is not a buffer of the signature (buffers: "
                            f"{', '.join(p.name for p in params.values() if p.kind == 'buffer')})")
            return None
        if writes and param.intent == "in":
            checker.add(at, f"{what} writes {name!r}, an input buffer, which must come back unchanged; "
                            "write an output or scratch buffer")
            return None
        if param.ld is not None:  # the step would take the padding for elements and the worker blame the kernel
            checker.add(at, f"{what} takes {name!r}, a padded buffer (ld): memset, copy and library steps see a "
                            "buffer's elements in one run, padding included; give the step an unpadded buffer or "
                            "remove `ld`")
            return None
        return param

    if kind == "memset":
        body = raw["memset"]
        param = buffer(body["buffer"], where + ["memset", "buffer"], True, "the memset")
        if param is None:
            return None
        bits, problem = element_bits(body["value"], param.dtype)
        if problem:
            checker.add(where + ["memset", "value"], f"buffer {param.name!r} is {param.dtype}: {problem}")
            return None
        return MemsetStep(param.name, body["value"], bits)
    if kind == "copy":
        body = raw["copy"]
        source = buffer(body["from"], where + ["copy", "from"], False, "the copy")
        target = buffer(body["to"], where + ["copy", "to"], True, "the copy")
        if source is None or target is None:
            return None
        if source.dtype != target.dtype:
            checker.add(where + ["copy"], f"a copy keeps the type: {source.name!r} is {source.dtype}, {target.name!r} "
                                          f"is {target.dtype}; copy between buffers of one type")
            return None
        count = checker.expr(body.get("count", source.size), where + ["copy", "count"], scalars)
        return CopyStep(source.name, target.name, count)
    return library_step(checker, raw, where, params, scalars, buffer)


def library_step(checker, raw: dict, where: list, params: dict, scalars: set[str], buffer):
    name = raw["library"]
    adapter = ADAPTERS.get(name)
    if not isinstance(adapter, StepAdapter):
        checker.add(where + ["library"], f"unknown library step adapter {name!r}; known adapters: "
                                         f"{', '.join(known(StepAdapter))}")
        return None
    args = raw.get("args", {})
    if not isinstance(args, dict):
        checker.add(where + ["args"], f"a library step's args map each role of {name} to a buffer, e.g. "
                                      f"`args: {{{', '.join(f'{r}: {r}' for r in adapter.buffers)}}}`")
        return None
    ok = True
    for role in sorted(set(args) - set(adapter.buffers)):
        checker.add(where + ["args", role], f"{name} has no role {role!r} (its roles: {', '.join(adapter.buffers)})")
        ok = False
    dtypes = {}
    for role, writes in adapter.buffers.items():
        if role not in args:
            checker.add(where + ["args"], f"{name} needs role {role!r}: map it to a buffer, e.g. `{role}: {role}`")
            ok = False
            continue
        param = buffer(args[role], where + ["args", role], writes, f"{name}'s {role}")
        if param is None:
            ok = False
            continue
        dtypes[role] = param.dtype
    if ok:
        problem = adapter.types(dtypes)
        if problem:
            checker.add(where + ["args"], f"{problem}; map buffers of types it takes")
            ok = False
    options = raw.get("options", {})
    for option in sorted(set(options) - set(adapter.options)):
        checker.add(where + ["options", option], f"{name} has no option {option!r} (its options: "
                                                 f"{', '.join(adapter.options)})")
        ok = False
    for option in adapter.required:
        if option not in options:
            checker.add(where + ["options"], f"{name} needs option {option!r}: an expression over the scalars")
            ok = False
    for option, value in options.items():
        what, at = adapter.options.get(option), where + ["options", option]
        if what in ("int", "number"):
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                checker.add(at, f"{value!r} is not an expression; write a number or an expression over the scalars")
                ok = False
            elif what == "number" and isinstance(value, (int, float)):
                continue
            else:
                errors = len(checker.problems)
                checker.expr(value, at, scalars)
                ok = ok and len(checker.problems) == errors
        elif what == "bool" and not isinstance(value, bool):
            checker.add(at, f"{value!r} is not true or false")
            ok = False
        elif isinstance(what, tuple) and value not in what:
            checker.add(at, f"{value!r} is not one of {', '.join(what)}")
            ok = False
    if not ok:
        return None
    return LibraryStep(name, dict(args), {k: (str(v) if adapter.options[k] == "int" else v) for k, v in options.items()})


def step_fits(checker, program, case, index: int, scalars: dict, counts: dict[str, int], named: set) -> None:
    """Each copy and library step of ``program`` on ``case``: a copy's count within both buffers, a
    library call's extents within its buffers (``scalars``: the case's, derived ones too; ``counts``: its
    buffers' element counts). A step that does not fit is named once, on the first case it does not fit
    (``named``: those named so far)."""
    for number, step in enumerate(program.steps, 1):
        if not isinstance(step, (CopyStep, LibraryStep)) or (program.name, number) in named:
            continue
        label = f"{program.name} step {number} ({step.kind}) in case {case.name!r}"
        try:
            resolved = step.resolve(scalars)
        except ExprError as exc:
            problem = str(exc)
        else:
            if isinstance(step, CopyStep):
                count = resolved["copy"]["count"]
                problem = (None if 0 <= count <= min(counts[step.source], counts[step.target]) else
                           f"copies {count} elements, but {step.source!r} holds {counts[step.source]} and "
                           f"{step.target!r} {counts[step.target]}; size the destination for the source, or copy fewer")
            else:
                problem = ADAPTERS[step.adapter].fits({role: counts[name] for role, name in step.args.items()},
                                                      resolved["options"])
        if problem:
            named.add((program.name, number))
            checker.add(["cases", index], f"{label}: {problem}")
