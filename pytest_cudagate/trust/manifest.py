"""The canonical manifest of a suite: everything that defines what "correct" means.

Signed: suite name, the ordered parameter signature, the reference (its source or Python file hash,
the headers it includes, entry, options, launch), every case (kind, holdout, seed, scalars, class
and generated where set, the sha256 of each input and expected-output file, or for a generated
case of its generated.json and output samples), tolerances (their `ulp` where given), input distributions, each kernel's
entry and launch configuration(s), its class variants' launches included, its ``requires`` and
judged ``outputs`` where given (a kernel's steps: its launches, memsets, copies and library calls,
with their values and options), a scratch buffer's ``init`` and a buffer's ``ld`` where given, timing
settings and the gate threshold, and the derived scalars' expressions where the suite has any. An
instantiated suite (``instantiate:``) signs that mapping and all of the above per instantiation
(``instances``).

Not signed: a kernel's source and compile options, its class variants' options too (changing a
kernel is what pull requests do; the approvals ledger pins approved kernel sources and variants),
its autotune settings (tunables, tuning_launch,
tuning_source: the gate never uses them), its library_baseline (an informational column that never
changes a verdict), the description, comments and formatting.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

from pytest_cudagate import boundary
from pytest_cudagate.errors import FileError
from pytest_cudagate.host.paths import command, visible
from pytest_cudagate.suite.cases import case_data_fix, sign_command
from pytest_cudagate.suite.generated import generated_files
from pytest_cudagate.suite.model import DEFAULT_CLASS, Case, Launch, Param, Program, Suite, manifest_entry
from pytest_cudagate.trust.canonical import canonical_bytes, file_sha256

MANIFEST_FORMAT = 1
# Suite fields placed in the manifest by name below, or deliberately not signed (path, description;
# a kernel's source and options are left out of "kernels" on purpose).
_HANDLED_SUITE_FIELDS = frozenset({"path", "name", "signature", "reference", "kernels", "cases", "tolerance",
                                   "inputs", "timing", "threshold", "data_dir", "description", "derived"})
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def sign_fix(suite: Suite, pull_request: int | None = None) -> str:
    return f"fix: a maintainer reviews the change and runs `{sign_command(suite, pull_request)}`"


def change_fix(suite: Suite, signed: dict, current: dict, pull_request: int | None = None) -> str:
    """The fix for a manifest that changed from ``signed`` to ``current``: after a reference change the
    expected outputs are stale, so they are generated again before anyone signs."""
    def references(manifest) -> list:  # an instantiated suite's: each instantiation's
        instances = _named(_named(manifest).get("instances"))
        return [_named(m).get("reference") for m in instances.values()] or [_named(manifest).get("reference")]

    if references(signed) != references(current):
        return case_data_fix(suite, pull_request)
    return sign_fix(suite, pull_request)


def _rel(path: Path, root: Path) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _plain(value, root: Path):
    """JSON-ready form of a model value: dataclasses by field, tuples as lists, paths relative to root.

    A number in a field annotated ``float`` becomes a float, so ``atol: 0`` and ``atol: 0.0`` sign alike.
    """
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if isinstance(item, int) and not isinstance(item, bool) and "float" in str(f.type):
                item = float(item)
            out[f.name] = _plain(item, root)
        return out
    if isinstance(value, dict):
        return {str(k): _plain(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, root) for v in value]
    if isinstance(value, Path):
        return _rel(value, root)
    return value


def _launch(launch: Launch) -> dict:
    return _plain(launch, Path("."))


def _param(param: Param, root: Path) -> dict:
    """A parameter's fields; a scratch buffer's ``init`` and a buffer's ``ld`` only where given, so suites
    signed before they existed keep their signatures."""
    entry = _plain(param, root)
    for key in ("init", "ld"):
        if entry[key] is None:
            entry.pop(key)
    return entry


def _program_launches(program: Program) -> dict:
    """A program's launches. A class variant's launch is signed as the kernel's launch is (its options,
    like the kernel's, are not); ``classes`` appears only where a variant has a launch, so suites
    signed before variants existed keep their signatures."""
    entry = {"launch": _launch(program.launch),
             "launch_overrides": {case: _launch(l) for case, l in sorted(program.launch_overrides.items())}}
    launches = {name: {"launch": _launch(v.launch)} for name, v in sorted(program.classes.items()) if v.launch}
    if launches:
        entry["classes"] = launches
    return entry


def _kernel_cases(program: Program) -> dict:
    """A kernel's ``requires`` and judged ``outputs``: which cases and outputs it is held to, signed
    only where given, so suites signed before they existed keep their signatures."""
    entry = {}
    if program.requires:
        entry["requires"] = list(program.requires)
    if program.judged is not None:
        entry["outputs"] = list(program.judged)
    return entry


def _headers(source: Path, root: Path, problems: list[str]) -> dict[str, str]:
    """Quoted includes of ``source`` found next to it, recursively (those travel with the request)."""
    found: dict[str, str] = {}
    todo = [source]
    seen = {source.resolve()}
    while todo:
        current = todo.pop()
        try:
            body = boundary.read_bytes(current, boundary.MAX_SOURCE_BYTES, "source")
        except FileError as exc:
            problems.extend(f"{_rel(current, root)}: {problem}" for problem in exc.problems)
            continue
        except OSError:
            continue
        for name in _INCLUDE.findall(body):
            candidate = current.parent / name.decode("utf-8", "replace")
            if not os.path.isfile(candidate):  # (False, not OSError, for a name too long to look up)
                continue  # a system or toolkit header: not ours; the compile names a bad one
            resolved = candidate.resolve()
            if resolved in seen:
                continue
            seen.add(resolved)
            rel = _rel(Path(os.path.normpath(candidate)), root)
            found[rel] = _sha256(candidate, True, rel, "missing (an included header)", problems)
            todo.append(candidate)
    return found


def _sha256(path: Path, text: bool, rel: str, missing: str, problems: list[str]) -> str | None:
    """:func:`file_sha256`, or None with the reason in ``problems``: ``missing``, or why the file is
    refused (a link to a device, over the size cap)."""
    try:
        return file_sha256(path, text=text)
    except FileError as exc:
        problems.extend(f"{rel}: {problem}" for problem in exc.problems)
    except OSError:
        problems.append(f"{rel}: {missing}")
    return None


def _reference(suite: Suite, problems: list[str]) -> dict:
    root = suite.root
    if suite.reference.python:
        file_name, function = suite.reference.python.rsplit(":", 1)
        path = Path(os.path.normpath(root / file_name))
        entry = {"file": _rel(path, root), "function": function, "sha256": None}
        entry["sha256"] = _sha256(path, True, entry["file"], "missing (the Python reference)", problems)
        return {"python": entry}
    program = suite.reference.program
    entry = {"source": _rel(program.source, root), "sha256": None, "entry": program.entry,
             "options": list(program.options), "arch_suffix": program.arch_suffix, **_program_launches(program)}
    entry["sha256"] = _sha256(program.source, True, entry["source"], "missing (the reference source)", problems)
    entry["headers"] = _headers(program.source, root, problems)
    return {"cuda": entry}


def case_files(suite: Suite, case: Case) -> list[Path]:
    """The data files a case uses: one input per in/inout buffer, one expected output per out/inout;
    for a generated case, its generated.json and one output sample per out/inout."""
    if case.generated:
        return generated_files(suite, case)
    files = [suite.input_path(case, p) for p in suite.buffers if p.is_input]
    files += [suite.expected_path(case, p) for p in suite.buffers if p.is_output]
    return files


def _case_entry(case: Case, root: Path) -> dict:
    """A case's fields; ``class``, ``generated`` and ``constant_ok`` only where set, so suites signed
    before they existed keep their signatures."""
    entry = _plain(case, root)
    entry.pop("name")
    shape_class, generated, constant_ok = entry.pop("shape_class"), entry.pop("generated"), entry.pop("constant_ok")
    if shape_class != DEFAULT_CLASS:
        entry["class"] = shape_class
    if generated:
        entry["generated"] = True
    if constant_ok:
        entry["constant_ok"] = True
    return entry


def collect_manifest(suite: Suite) -> tuple[dict, list[str]]:
    """The manifest of ``suite`` as it is on disk, and the problems found while building it: referenced
    files that are missing (their hash is ``None``) and files under the case folder no case uses.

    An instantiated suite (``instantiate:``) signs ``instantiate`` and, per instantiation, all that an
    ordinary suite's manifest holds, whichever of its instantiations ``suite`` is; a suite without
    it keeps the manifest it had."""
    problems: list[str] = []
    referenced: set[Path] = set()
    if suite.instantiate:
        manifest = {"format": MANIFEST_FORMAT, "suite": suite.name,
                    "instantiate": {name: list(types) for name, types in suite.instantiate.items()},
                    "instances": {one.label: _signed(one, problems, referenced) for one in suite.instances}}
        data_dir = suite.data_dir.parent  # each instantiation's data lies in its folder there
    else:
        manifest = {"format": MANIFEST_FORMAT, "suite": suite.name, **_signed(suite, problems, referenced)}
        data_dir = suite.data_dir
    _unexpected_files(data_dir, referenced, suite.root, problems)
    try:
        canonical_bytes(manifest)
    except ValueError as exc:  # NaN or Infinity somewhere in the suite's numbers
        problems.append(f"the suite holds a number JSON cannot represent (NaN or Infinity): {exc}")
    return manifest, problems


def instance_manifest(manifest: dict, suite: Suite) -> dict:
    """What a manifest signs of ``suite``: an instantiation's part, or the whole manifest of a plain
    suite. KeyError or TypeError where it holds none (a manifest signed before the suite was instantiated)."""
    return manifest["instances"][suite.label] if suite.label else manifest


def _unexpected_files(data_dir: Path, referenced: set[Path], root: Path, problems: list[str]) -> None:
    if data_dir.is_dir():
        try:
            below = boundary.walk(data_dir, "case folder")
        except FileError as exc:  # too deep or too large to be checked for planted files: not trusted
            problems.append(f"{exc.path}: {exc.problems[0]}")
            below = []
        for path in below:
            if (path.is_file() or path.is_symlink()) and Path(os.path.normpath(path)) not in referenced:
                problems.append(f"unexpected file {visible(_rel(path, root))}: no case references it (remove it, or "
                                "add the case that uses it to the suite and re-sign)")


def _signed(suite: Suite, problems: list[str], referenced: set[Path]) -> dict:
    """What the manifest signs of one suite (or instantiation) but the format and the suite's name."""
    root = suite.root
    cases = {}
    for case in suite.cases:
        files = {}
        for path in case_files(suite, case):
            rel = _rel(path, root)
            referenced.add(Path(os.path.normpath(path)))
            files[rel] = _sha256(path, False, rel, f"missing (case {case.name} needs it)", problems)  # .npy: as stored
        entry = _case_entry(case, root)
        entry["files"] = files
        cases[case.name] = entry
    manifest = {
        "signature": [_param(p, root) for p in suite.signature],
        "reference": _reference(suite, problems),
        "cases": cases,
        # `ulp` only where given, so suites signed before it existed keep their signatures
        "tolerance": {name: {k: v for k, v in _plain(t, root).items() if k != "ulp" or v is not None}
                      for name, t in suite.tolerance.items()},
        # a key a suite leaves unset is left out, so suites signed before the key existed still verify
        "inputs": {name: {k: v for k, v in _plain(d, root).items() if v is not None} for name, d in suite.inputs.items()},
        "kernels": {k.name: {"entry": k.entry, **_program_launches(k), **_kernel_cases(k)} for k in suite.kernels},
        "timing": _plain(suite.timing, root),
        "gate": {"threshold": float(suite.threshold)},
    }
    # A relaxed defence (e.g. determinism: tolerance) counts only when a maintainer signed it.
    relaxed = manifest_entry(suite)
    if relaxed:
        manifest["checks"] = relaxed
    if suite.derived:  # only where given, so every suite signed before `derived` keeps its signature
        manifest["derived"] = dict(suite.derived)
    # Fail closed: a suite field this module does not know yet (added to the model later) is signed
    # as it is, rather than silently left out of what defines correctness.
    for f in dataclasses.fields(suite):
        if f.name not in _HANDLED_SUITE_FIELDS:
            manifest[f.name] = _plain(getattr(suite, f.name), root)
    return manifest


def suite_manifest(suite: Suite) -> dict:
    """The canonical manifest of ``suite``; raises :class:`FileError` if a referenced file is missing
    or the case folder holds a file no case uses (the manifest would not describe what is on disk)."""
    manifest, problems = collect_manifest(suite)
    if problems:
        raise FileError(suite.path, problems + [f"fix: run `{command('cudagate', 'check', suite.path)}`, fix the "
                                                "case data, then sign"])
    return manifest


def manifest_bytes(manifest: dict) -> bytes:
    return canonical_bytes(manifest)


# --------------------------------------------------------------------------- differences


def _show(value) -> str:
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        return "[" + ", ".join(str(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value, sort_keys=True, separators=(", ", ": "))


def _flatten(value, path: str, out: dict) -> dict:
    if isinstance(value, dict) and value:
        for key in sorted(value):
            _flatten(value[key], f"{path}.{key}" if path else str(key), out)
    else:
        out[path] = value
    return out


_ABSENT = object()


def _diff_values(old, new, path: str, out: list[str]) -> None:
    a = _flatten(old, path, {}) if old is not _ABSENT else {}
    b = _flatten(new, path, {}) if new is not _ABSENT else {}
    for key in sorted(set(a) | set(b)):
        if key not in b:
            out.append(f"{key}: removed (was {_show(a[key])})")
        elif key not in a:
            out.append(f"{key}: added ({_show(b[key])})")
        elif a[key] != b[key] or type(a[key]) is not type(b[key]):
            out.append(f"{key}: {_show(a[key])} → {_show(b[key])}")


def _named(mapping) -> dict:
    return mapping if isinstance(mapping, dict) else {}


def _diff_signature(old, new, out: list[str]) -> None:
    old, new = old if isinstance(old, list) else [], new if isinstance(new, list) else []
    old_names = [p.get("name") if isinstance(p, dict) else p for p in old]
    new_names = [p.get("name") if isinstance(p, dict) else p for p in new]
    if old_names != new_names:
        out.append(f"signature: parameters ({', '.join(map(str, old_names))}) → ({', '.join(map(str, new_names))})")
        return
    for name, a, b in zip(old_names, old, new):
        _diff_values(a, b, f"signature.{name}", out)


def _diff_reference(old, new, out: list[str]) -> None:
    old, new = _named(old), _named(new)
    if set(old) != set(new):
        kinds = {"python": "a Python reference", "cuda": "a CUDA reference kernel"}
        out.append(f"reference: {' / '.join(kinds.get(k, k) for k in old) or 'none'} → "
                   f"{' / '.join(kinds.get(k, k) for k in new) or 'none'}")
        return
    for kind in old:
        a, b = dict(_named(old[kind])), dict(_named(new[kind]))
        name_key = "file" if kind == "python" else "source"
        if a.get(name_key) == b.get(name_key) and a.get("sha256") != b.get("sha256") and b.get("sha256") is not None:
            what = "the Python reference" if kind == "python" else "the reference source"
            out.append(f"{b.get(name_key)}: sha256 changed ({what})")
        if a.get(name_key) == b.get(name_key):
            a.pop("sha256", None), b.pop("sha256", None)
        ha, hb = _named(a.pop("headers", {})), _named(b.pop("headers", {}))
        for header in sorted(set(ha) | set(hb)):
            if header not in hb:
                out.append(f"{header}: no longer included by the reference")
            elif header not in ha:
                out.append(f"{header}: now included by the reference, not signed")
            elif ha[header] != hb[header]:
                out.append(f"{header}: sha256 changed (a header the reference includes)")
        _diff_values(a, b, "reference", out)


def _diff_cases(old, new, out: list[str]) -> None:
    old, new = _named(old), _named(new)
    for name in sorted(set(new) - set(old)):
        out.append(f"case {name} added (not in the signed manifest)")
    for name in sorted(set(old) - set(new)):
        out.append(f"case {name} removed (it is in the signed manifest)")
    for name in sorted(set(old) & set(new)):
        a, b = dict(_named(old[name])), dict(_named(new[name]))
        fa, fb = _named(a.pop("files", {})), _named(b.pop("files", {}))
        for key in sorted(set(a) | set(b)):
            if key == "scalars":
                _diff_values(a.get(key, _ABSENT), b.get(key, _ABSENT), f"case {name}: scalars", out)
            elif a.get(key, _ABSENT) != b.get(key, _ABSENT):
                out.append(f"case {name}: {key}: {_show(a.get(key))} → {_show(b.get(key))}")
        for path in sorted(set(fa) | set(fb)):
            if path not in fb:
                out.append(f"{path}: no longer part of case {name}")
            elif path not in fa:
                out.append(f"{path}: now part of case {name}, not signed")
            elif fb[path] is not None and fa[path] != fb[path]:
                out.append(f"{path}: sha256 changed")  # a missing file is reported where it is collected


def _diff_kernels(old, new, out: list[str]) -> None:
    old, new = _named(old), _named(new)
    for name in sorted(set(new) - set(old)):
        out.append(f"kernel {name} added (its entry and launch are not signed)")
    for name in sorted(set(old) - set(new)):
        out.append(f"kernel {name} removed (it is in the signed manifest)")
    for name in sorted(set(old) & set(new)):
        _diff_values(old[name], new[name], f"kernels.{name}", out)


def _diff_instances(old, new, out: list[str]) -> None:
    """An instantiated suite's: each instantiation's differences, under its name."""
    old, new = _named(old), _named(new)
    for label in sorted(set(old) | set(new)):
        if label not in new or label not in old:
            out.append(f"instances.{label}: {'removed' if label not in new else 'added'}")
        else:
            out += [f"instances.{label}.{line}" for line in diff_manifests(old[label], new[label])]


def diff_manifests(signed: dict, current: dict) -> list[str]:
    """Readable differences, field by field and file by file, from ``signed`` to ``current``."""
    out: list[str] = []
    signed, current = _named(signed), _named(current)
    special = {"signature": _diff_signature, "reference": _diff_reference, "cases": _diff_cases,
               "kernels": _diff_kernels, "instances": _diff_instances}
    for key in sorted(set(signed) | set(current), key=lambda k: (k not in ("format", "suite"), k)):
        if key in special:
            special[key](signed.get(key), current.get(key), out)
        else:
            _diff_values(signed.get(key, _ABSENT), current.get(key, _ABSENT), key, out)
    if not out and canonical_bytes(signed) != canonical_bytes(current):
        out.append("the manifest differs from the signed one")
    return out
