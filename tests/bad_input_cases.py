"""Malformed inputs for every family of issue 13, and a driver that runs each under limits.

Each input builds its files in a fresh folder and names the entry point that must refuse it:
``cudagate`` (exit code 2, one clear message), ``pytest`` (``pytest --cuda-gate``: a failed item or
a usage error, never INTERNALERROR) or ``harness`` (``python -m cudagate_harness FILE``: exit 2).

``gate`` (``cudagate gate --repo REPO --trusted-ref BASE``, in a repository of tests/acceptance/test_attacks.py
with a signed base commit: exit 1 or 2, or 4 for a usage error).

``python tests/bad_input_cases.py NAME FOLDER`` runs one input in this process under RLIMIT_AS and
prints one JSON line: exit code, seconds, CPU seconds, peak RSS and the output. :func:`run_all` runs
every input that way, two at a time, and sorts each result into refused / traceback / hang /
memory / accepted. An input is bounded by the CPU time it spends (``BadInput.cpu_s``), which a
loaded host does not inflate; its wall time may be :data:`WALL_PER_CPU` times that before it counts
as a hang, and a child still running at twice that is killed (a blocked read spends no CPU).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import resource
import shutil
import sqlite3
import stat
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from pytest_cudagate.cli import main
from pytest_cudagate.reports.writer import write_report

# Run as a child too (no conftest there): the support modules, and tests/acceptance for test_attacks' Repo.
sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parent / "acceptance")]
from helpers import REFERENCE_PY, SUITE_YAML, replace_once, write_suite  # noqa: E402
from instantiated import GELU_YAML, write_gelu  # noqa: E402
from optimize_fakes import opt_suite, write_proposals  # noqa: E402
from report_fixtures import build_scenario, built_report  # noqa: E402
from test_attacks import Repo  # noqa: E402
from trust_project import make_project  # noqa: E402

MEMORY_LIMIT = 512 * 1024 * 1024
SECONDS = 2.0  # CPU seconds an input may take
GATE_SECONDS = 10.0  # a whole gate run: pytest in-process, trust, NVRTC compiles
WALL_PER_CPU = 5  # wall seconds per CPU second before a slow input counts as a hang (2 loaded cores)
MIN_WALL_S = 10.0
# A raw exception inside a pytest item: its failure shows "E   IndexError: ..." (a GateFailure shows its message).
ITEM_EXCEPTION = re.compile(r"^E +[A-Za-z_][\w.]*(Error|Exception):", re.MULTILINE)


@dataclass(frozen=True)
class BadInput:
    family: str
    name: str
    build: Callable[[Path], tuple[str, list[str]]]  # folder -> (entry point, arguments)
    cpu_s: float = SECONDS

    @property
    def wall_s(self) -> float:
        return max(MIN_WALL_S, WALL_PER_CPU * self.cpu_s)


INPUTS: list[BadInput] = []


def bad(family: str, name: str, cpu_s: float = SECONDS):
    def register(build):
        INPUTS.append(BadInput(family, name, build, cpu_s))
        return build
    return register


# -- helpers that write a suite with one thing wrong ------------------------------------------------

def suite_with(folder: Path, old: str | None = None, new: str = "", *, yaml_text: str | None = None,
               data: bool = True) -> Path:
    text = yaml_text if yaml_text is not None else (replace_once(SUITE_YAML, old, new) if old else SUITE_YAML)
    if data:
        path = write_suite(folder / "s", data=True)
        path.write_text(text, encoding="utf-8")
        return path
    return write_suite(folder / "s", yaml_text=text, data=False)


def check(path: Path) -> tuple[str, list[str]]:
    return "cudagate", ["check", "--allow-unsigned", str(path)]


def expression(family_name: str, old: str, new: str) -> None:
    bad("expressions", family_name)(lambda d: check(suite_with(d, yaml_text=SUITE_YAML.replace(old, new), data=False)))


for _name, _old, _new in [
    ("power tower", "size: rows*cols,", "size: '(((10**64)**64)**64)**64',"),
    ("five power levels", "size: rows*cols,", "size: '((((10**64)**64)**64)**64)**64',"),
    ("1000 unary minus", "size: rows*cols,", "size: '" + "-" * 1000 + "rows',"),
    ("300 unary minus", "size: rows*cols,", "size: '" + "-" * 300 + "rows',"),
    ("5000-term sum", "size: rows*cols,", "size: '" + "+".join(["rows"] * 5000) + "',"),
    ("200-term sum", "size: rows*cols,", "size: '" + "+".join(["rows"] * 120) + "',"),
    ("ceil overflow", "grid: [rows]", "grid: ['ceil(1e308*10)']"),
    ("over 4300 digits", "grid: [rows]", "grid: ['10**5000']"),
    ("grid 10**30", "grid: [rows]", "grid: ['10**30']"),
    ("grid y too big", "grid: [rows]", "grid: [rows, 70000]"),
    ("block too big", "block: [128]", "block: [2048]"),
    ("block threads", "block: [128]", "block: [1024, 2]"),
    ("negative shared", "block: [128]}", "block: [128], shared_bytes: -1}"),
    ("huge shared", "block: [128]}", "block: [128], shared_bytes: '2**40'}"),
    ("huge buffer", "size: rows*cols,", "size: 'rows*cols*2**60',"),
    ("long expression text", "size: rows*cols,", "size: '" + "9" * 5000 + "',"),
    ("float literal 1e308", "grid: [rows]", "grid: ['1e308']"),
    ("tuning launch 10**30", "    launch: {grid: [rows], block: [128]}\n",
     "    launch: {grid: [rows], block: [128]}\n    tunables: {T: [1, 2]}\n"
     "    tuning_launch: {grid: ['10**30 * T'], block: [128]}\n"),
    ("tuning value out of range", "    launch: {grid: [rows], block: [128]}\n",
     "    launch: {grid: [rows], block: [128]}\n    tunables: {T: [1, 4096]}\n"
     "    tuning_launch: {grid: [rows], block: [T]}\n"),
]:
    expression(_name, _old, _new)


# -- YAML and files -----------------------------------------------------------------------------------

@bad("yaml", "billion laughs")
def _(d):
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return check(suite_with(d, "cases:\n", "\n".join(lines) + "\ncases:\n", data=False))


@bad("yaml", "50 MB suite")
def _(d):
    path = suite_with(d, data=False)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(("# " + "x" * 1000 + "\n") * 50_000)
    return check(path)


@bad("yaml", "nesting 10k deep")
def _(d):
    return check(suite_with(d, "description: y = 2 * x, row by row\n", "description: " + "[" * 10000 + "]" * 10000 + "\n",
                            data=False))


@bad("yaml", "block nesting 2k deep")
def _(d):
    deep = "".join("  " * i + f"k{i}:\n" for i in range(2000))
    return check(suite_with(d, yaml_text=SUITE_YAML + "x:\n" + "\n".join("  " + line for line in deep.splitlines()) + " 1\n",
                            data=False))


@bad("yaml", "duplicate gate key")
def _(d):
    return check(suite_with(d, yaml_text=SUITE_YAML + "gate: {threshold: 0.02}\ngate: {threshold: 0.9}\n", data=False))


@bad("yaml", "5000-digit integer")
def _(d):
    return check(suite_with(d, "rows: 3,", "rows: " + "9" * 5000 + ",", data=False))


@bad("yaml", "non-UTF-8 suite")
def _(d):
    path = suite_with(d, data=False)
    path.write_bytes(path.read_bytes().replace(b"row by row", b"row \xff\xfe row"))
    return check(path)


@bad("yaml", "non-UTF-8 kernel source")
def _(d):
    path = suite_with(d, data=False)
    (path.parent / "scale.cu").write_bytes(b"// \xff\xfe\n" + (path.parent / "scale.cu").read_bytes())
    return check(path)


@bad("yaml", "non-UTF-8 header")
def _(d):
    path = suite_with(d, data=False)
    (path.parent / "common.cuh").write_bytes(b"// caf\xe9\n")
    (path.parent / "scale.cu").write_text('#include "common.cuh"\n' + (path.parent / "scale.cu").read_text())
    return check(path)


@bad("yaml", "suite is a link to /dev/zero")
def _(d):
    d.mkdir(parents=True, exist_ok=True)
    (d / "cudagate.yaml").symlink_to("/dev/zero")
    return check(d / "cudagate.yaml")


@bad("yaml", "suite is a FIFO")
def _(d):
    d.mkdir(parents=True, exist_ok=True)
    os.mkfifo(d / "cudagate.yaml")
    return check(d / "cudagate.yaml")


@bad("yaml", "kernel source outside the suite")
def _(d):
    return check(suite_with(d, "source: scale.cu", "source: /etc/hostname", data=False))


@bad("yaml", "data folder outside the suite")
def _(d):
    return check(suite_with(d, yaml_text=SUITE_YAML + "data: ../../..\n", data=False))


@bad("yaml", "unknown tag")
def _(d):
    return check(suite_with(d, "rows: 3,", "rows: !!python/object:os.system 3,", data=False))


# -- data -------------------------------------------------------------------------------------------

def with_expected(d: Path, array_or_bytes, name: str = "y", where: str = "expected") -> tuple[str, list[str]]:
    path = suite_with(d)
    target = path.parent / "cases" / "small" / (f"expected/{name}.npy" if where == "expected" else f"{name}.npy")
    target.unlink()
    if isinstance(array_or_bytes, bytes):
        target.write_bytes(array_or_bytes)
    elif isinstance(array_or_bytes, str):
        target.symlink_to(array_or_bytes)
    else:
        np.save(target, array_or_bytes, allow_pickle=True)
    return check(path)


def npy_bytes(header: str) -> bytes:
    body = header.encode("latin1")
    pad = 64 - (10 + len(body) + 1) % 64
    return b"\x93NUMPY\x01\x00" + (len(body) + pad + 1).to_bytes(2, "little") + body + b" " * pad + b"\n"


bad("data", "expected of strings")(lambda d: with_expected(d, np.array(["a"] * 150)))
bad("data", "expected of objects")(lambda d: with_expected(d, np.array([{"a": 1}] * 150, dtype=object)))
bad("data", "header shape 10**30")(lambda d: with_expected(
    d, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (10**30,), }")))
bad("data", "header shape 2**40")(lambda d: with_expected(
    d, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776,), }")))
bad("data", "header not a literal")(lambda d: with_expected(
    d, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (__import__('os'),), }")))
bad("data", "truncated expected")(lambda d: with_expected(d, npy_bytes(
    "{'descr': '<f4', 'fortran_order': False, 'shape': (150,), }") + b"\0" * 8))
bad("data", "all-NaN expected, nan: fail")(lambda d: with_expected(d, np.full(150, np.nan, dtype=np.float32)))
bad("data", "input is a link to /dev/zero")(lambda d: with_expected(d, "/dev/zero", name="x", where="input"))
bad("data", "input of wrong dtype")(lambda d: with_expected(d, np.zeros(150, dtype=np.float64), name="x", where="input"))

# numpy parses a header as a Python literal: these exhaust memory or the parser's recursion.
bad("data", "header shape behind 9000 unary minuses")(lambda d: with_expected(
    d, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "-" * 9000 + "150,), }")))
bad("data", "header shape a 1+1+... chain")(lambda d: with_expected(
    d, npy_bytes("{'descr': '<f4', 'fortran_order': False, 'shape': (" + "1+" * 4000 + "1,), }")))

for _key, _old, _new in [
    ("atol .nan", "atol: 1.0e-6", "atol: .nan"),
    ("rtol .inf", "rtol: 1.0e-5", "rtol: .inf"),
    ("max_rel_norm .nan", "rtol: 1.0e-5}", "rtol: 1.0e-5, max_rel_norm: .nan}"),
    ("low .nan", "cases:\n", "inputs: {x: {low: .nan, high: 1.0}}\ncases:\n"),
    ("std .inf", "cases:\n", "inputs: {x: {distribution: normal, std: .inf}}\ncases:\n"),
    ("high 1e999", "cases:\n", "inputs: {x: {low: 0.0, high: 1e999}}\ncases:\n"),
    ("low above high", "cases:\n", "inputs: {x: {low: 2.0, high: 1.0}}\ncases:\n"),
    ("float scalar beyond float32", "- {name: cols, scalar: int32}", "- {name: cols, scalar: int32}\n  - {name: s, scalar: float32}"),
]:
    if _key.startswith("float scalar"):
        bad("data", _key)(lambda d, o=_old, n=_new: check(suite_with(
            d, yaml_text=replace_once(replace_once(SUITE_YAML, o, n), "cols: 50}", "cols: 50, s: 1.0e+300}")
            .replace("cols: 256}", "cols: 256, s: 1.0}"), data=False)))
    else:
        bad("data", _key)(lambda d, o=_old, n=_new: check(suite_with(d, o, n, data=False)))

bad("data", "threshold .nan")(lambda d: check(suite_with(d, yaml_text=SUITE_YAML + "gate: {threshold: .nan}\n", data=False)))
bad("data", "warmup_ms .inf")(lambda d: check(suite_with(d, yaml_text=SUITE_YAML + "timing: {warmup_ms: .inf}\n", data=False)))


# -- signature and ledger files ---------------------------------------------------------------------

def trust_file(d: Path, name: str, write) -> tuple[str, list[str]]:
    path = suite_with(d)
    write(path.parent / name)
    return "verify", ["verify", str(path)]


def sparse(size: int):
    def write(target: Path):
        with open(target, "wb") as handle:
            handle.truncate(size)
    return write


for _file in ("cudagate.sig.json", "cudagate.approvals.json"):
    _short = "signature" if "sig" in _file else "ledger"
    bad("trust", f"{_short} is a link to /dev/zero")(lambda d, f=_file: trust_file(d, f, lambda t: t.symlink_to("/dev/zero")))
    bad("trust", f"{_short} of 100 MB")(lambda d, f=_file: trust_file(d, f, sparse(100 * 1024 * 1024)))
    bad("trust", f"{_short} nested 100k deep")(lambda d, f=_file: trust_file(
        d, f, lambda t: t.write_text("[" * 100_000 + "]" * 100_000)))
    bad("trust", f"{_short} with a 5000-digit integer")(lambda d, f=_file: trust_file(
        d, f, lambda t: t.write_text('{"format": ' + "9" * 5000 + "}")))
    bad("trust", f"{_short} not JSON")(lambda d, f=_file: trust_file(d, f, lambda t: t.write_text("{broken")))
    bad("trust", f"{_short} with NaN")(lambda d, f=_file: trust_file(d, f, lambda t: t.write_text('{"format": NaN}')))
    bad("trust", f"{_short} not UTF-8")(lambda d, f=_file: trust_file(d, f, lambda t: t.write_bytes(b'{"a": "\xff"}')))
    bad("trust", f"{_short} of 400 KB of escaped quotes, never closed")(lambda d, f=_file: trust_file(
        d, f, lambda t: t.write_text('"' + '\\"' * 200_000)))  # a quadratic scan once took minutes


@bad("trust", "ledger of the wrong shape")
def _(d):
    return trust_file(d, "cudagate.approvals.json", lambda t: t.write_text('{"format": 1, "suite": "scale", "approvals": 5}'))


@bad("trust", "ledger chain link no SHA-256")
def _(d):
    return trust_file(d, "cudagate.approvals.json",
                      lambda t: t.write_text('{"format": 2, "suite": "scale", "approvals": {}, "chain": ["HEAD~1"]}'))


@bad("trust", "signature a link to /dev/zero under pytest")
def _(d):
    path = suite_with(d)
    (path.parent / "cudagate.sig.json").symlink_to("/dev/zero")
    return "pytest", [str(path), "--cuda-gate"]


@bad("yaml", "kernel line of 60 comments before an absolute include")
def _(d):
    path = suite_with(d, data=False)
    kernel = path.parent / "scale.cu"
    kernel.write_text("/**/" * 60 + "static int pad;\n#include \"/etc/passwd\"\n" + kernel.read_text())
    return "pytest", [str(path), "--cuda-gate", "--cuda-gate-allow-unsigned"]


for _name, _old, _new in [("billion laughs under pytest", "cases:\n", "a: &a [1, 2]\nb: [*a, *a]\ncases:\n"),
                          ("nesting 10k deep under pytest", "suite: scale\n", "suite: scale\nx: " + "[" * 10000 + "]" * 10000 + "\n"),
                          ("power tower under pytest", "grid: [rows]", "grid: ['(((10**64)**64)**64)**64']")]:
    bad("yaml", _name)(lambda d, o=_old, n=_new: ("pytest", [str(suite_with(d, o, n, data=False)), "--cuda-gate",
                                                             "--cuda-gate-allow-unsigned"]))


# -- settings ---------------------------------------------------------------------------------------

def settings(d: Path, toml: str) -> tuple[str, list[str]]:
    path = suite_with(d)
    (d / "pyproject.toml").write_text("[tool.cudagate]\n" + toml)
    (d / "pytest.ini").write_text("[pytest]\n")
    return "pytest", [str(path), "--cuda-gate", "--cuda-gate-allow-unsigned", "--rootdir", str(d)]


for _name, _toml in [
    ("timeout_s a string", 'timeout_s = "soon"\n'),
    ("timeout_s nan", "timeout_s = nan\n"),
    ("trusted_keys a root walk", 'trusted_keys = ["/"]\n'),
    ("trusted_keys up and out", 'trusted_keys = ["../../.."]\n'),
    ("suites a number", "suites = 5\n"),
    ("arch a table", "arch = {a = 1}\n"),
    ("unknown key", "colour = 1\n"),
]:
    bad("settings", _name)(lambda d, t=_toml: settings(d, t))


def include_setting(d: Path, toml: str) -> tuple[str, list[str]]:
    """An include folder setting beside a suite (cudagate check); d/out links out of the project."""
    (d / "elsewhere").mkdir(parents=True)
    (d / "project" / "common").mkdir(parents=True)
    (d / "project" / "out").symlink_to(d / "elsewhere", target_is_directory=True)
    path = suite_with(d / "project")
    (d / "project" / "pyproject.toml").write_text("[tool.cudagate]\n" + toml)
    return "cudagate", ["check", "--allow-unsigned", str(path)]


for _name, _toml in [("include folder outside the project", 'include = ["../elsewhere"]\n'),
                     ("include folder a link out of the project", 'include = ["out"]\n'),
                     ("include folder missing", 'include = ["missing"]\n'),
                     ("include not a list", 'include = "common"\n')]:
    bad("includes", _name)(lambda d, t=_toml: include_setting(d, t))


for _name, _toml in [("trusted_keys a root walk (cudagate verify)", 'trusted_keys = ["/"]\n'),
                     ("nested 10k deep (cudagate verify)", "x = " + "[" * 10000 + "]" * 10000 + "\n"),
                     ("timeout_s a list (cudagate verify)", "timeout_s = [1]\n")]:
    bad("settings", _name)(lambda d, t=_toml: verify_with_settings(d, t))


def verify_with_settings(d: Path, toml: str) -> tuple[str, list[str]]:
    path = suite_with(d)
    (d / "s" / "pyproject.toml").write_text("[tool.cudagate]\n" + toml)
    return "cudagate", ["verify", str(path)]


# -- harness requests -------------------------------------------------------------------------------

def request(d: Path, entry: str, change) -> tuple[str, list[str]]:
    d.mkdir(parents=True, exist_ok=True)
    (d / "x.npy").parent.mkdir(exist_ok=True)
    np.save(d / "x.npy", np.zeros(4, np.float32))
    body = {"op": "run", "kernel": {"name": "k", "entry": "k", "source": 'extern "C" __global__ void k(float* x) {}'},
            "signature": [{"name": "x", "kind": "buffer", "dtype": "float32", "intent": "inout"}],
            "cases": [{"name": "c", "scalars": {}, "buffers": {"x": {"count": 4, "input": "x.npy"}},
                       "launch": {"grid": [1, 1, 1], "block": [32, 1, 1], "shared_bytes": 0}}]}
    text = change(body)
    path = d / "request.json"
    if isinstance(text, Path):
        path.symlink_to(text)
    elif isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text if isinstance(text, str) else json.dumps(text))
    if entry == "cudagate":
        return "cudagate", ["run", str(path), "--output", str(d / "out")]
    return "harness", [str(path)]


def case_change(**fields):
    def change(body):
        body["cases"][0].update(fields)
        return body
    return change


def buffer_change(**fields):
    def change(body):
        body["cases"][0]["buffers"]["x"].update(fields)
        return body
    return change


def dtype_object(body):
    body["signature"][0]["dtype"] = "object"
    return body


_REQUESTS = [
    ("case name ../../x", case_change(name="../../x")),
    ("input outside the folder", buffer_change(input="/etc/hostname")),
    ("input up and out", buffer_change(input="../../../../etc/hostname")),
    ("expected outside the folder", case_change(expected={"x": "/etc/hostname"})),
    ("count 10**30", buffer_change(count=10**30)),
    ("count 2**60", buffer_change(count=2**60)),
    ("dtype object", dtype_object),
    ("dtype a list", lambda body: body["signature"][0].update(dtype=["float32"]) or body),
    ("buffers a list", case_change(buffers=["x"])),
    ("buffers null", case_change(buffers=None)),
    ("timing's settle as text", lambda body: body.update(timing={"warmup": 1, "repeat": 5,
                                                                "settle": {"quantile": "0.5", "within": 0.1}}) or body),
    ("a step that is a string", case_change(launch=["memset"])),
    ("grid 10**30", case_change(launch={"grid": [10**30, 1, 1], "block": [1, 1, 1]})),
    ("bad JSON", lambda body: '{"op": "run", '),
    ("nested 100k deep", lambda body: "[" * 100_000 + "]" * 100_000),
    ("a link to /dev/zero", lambda body: Path("/dev/zero")),
    ("not UTF-8", lambda body: json.dumps(body).replace('"k"', '"\\u00e9"', 1).replace("\\u00e9", "\xe9").encode("latin1")),
]
for _entry in ("cudagate", "harness"):
    for _name, _change in _REQUESTS:
        bad("requests", f"{_entry}: {_name}")(lambda d, e=_entry, c=_change: request(d, e, c))
bad("requests", "cudagate: op compile")(lambda d: request(d, "cudagate", lambda body: {"op": "compile", "kernel": body["kernel"]}))


# -- references -------------------------------------------------------------------------------------

def reference(d: Path, source: str, yaml_text: str = SUITE_YAML) -> tuple[str, list[str]]:
    path = suite_with(d, yaml_text=yaml_text, data=False)
    (path.parent / "reference.py").write_text(source)
    return "cudagate", ["cases", "generate", str(path)]


for _name, _source in [
    ("wrong signature", "def scale_rows(a, b):\n    return a\n"),
    ("syntax error", "def scale_rows(x, rows, cols)\n    return x\n"),
    ("raises", "def scale_rows(x, rows, cols):\n    return 1 / 0\n"),
    ("exits", "import sys\n\ndef scale_rows(x, rows, cols):\n    sys.exit(3)\n"),
    ("returns 10 elements", "import numpy as np\n\ndef scale_rows(x, rows, cols):\n    return np.zeros(10, np.float32)\n"),
    ("returns float64", "import numpy as np\n\ndef scale_rows(x, rows, cols):\n    return (x * 2).astype(np.float64)\n"),
    ("returns strings", "import numpy as np\n\ndef scale_rows(x, rows, cols):\n    return np.array(['a'] * (rows * cols))\n"),
    ("returns NaN under nan: fail", "import numpy as np\n\ndef scale_rows(x, rows, cols):\n    return x * np.float32('nan')\n"),
    ("returns None", "def scale_rows(x, rows, cols):\n    pass\n"),
    ("import fails", "import no_such_module_here\n"),
]:
    bad("references", _name)(lambda d, s=_source: reference(d, s))


@bad("references", "reference outside the suite folder")
def _(d):
    (d / "evil.py").parent.mkdir(parents=True, exist_ok=True)
    (d / "evil.py").write_text("open('PWNED', 'w')\ndef f(**kw):\n    pass\n")
    return reference(d, REFERENCE_PY, replace_once(SUITE_YAML, "reference.py:scale_rows", "../evil.py:f"))


# -- cudagate gate --trusted-ref (issue 28) ----------------------------------------------------------

def gate(repo: Repo, *pytest_args: str, ref: str | None = None) -> tuple[str, list[str]]:
    """The pull request committed; the gate run on it against ``ref`` (the signed base by default)."""
    repo.commit("pull request")
    return "gate", ["gate", "--repo", str(repo.path), "--trusted-ref", repo.base if ref is None else ref,
                    "--", "-q", *pytest_args]


@bad("gate", "trusted ref empty, a PR key and a loosened tolerance", cpu_s=GATE_SECONDS)
def _(d):
    repo = Repo(d)
    shutil.copy(repo.keys / "mallory.pub", repo.path / ".cudagate/trusted_keys/mallory.pub")
    repo.edit_yaml(lambda raw: raw["tolerance"]["y"].update(atol=1))
    repo.sign("mallory")
    return gate(repo, ref="")


for _name, _ref in [("deadbeef", "deadbeef"), ("v9.9.9", "v9.9.9"), ("HEAD~5", "HEAD~5"),
                    ("a 10k-character ref", "a" * 10_000)]:
    bad("gate", f"trusted ref {_name}", cpu_s=GATE_SECONDS)(lambda d, r=_ref: gate(Repo(d), ref=r))


for _name, _value in [("0", "0"), ("-1", "-1"), ("abc", "abc"), ("empty", ""), ("of 10,000 digits", "9" * 10_000)]:
    bad("gate", f"--pull-request {_name}", cpu_s=GATE_SECONDS)(lambda d, v=_value: (
        "gate", ["gate", "--repo", str(Repo(d).path), "--trusted-ref", "HEAD", "--pull-request", v, "--", "-q"]))


@bad("gate", "--pull-request without --trusted-ref", cpu_s=GATE_SECONDS)
def _(d):
    return "gate", ["gate", "--repo", str(Repo(d).path), "--pull-request", "3", "--", "-q"]


def fresh_clone_reflog(repo: Repo) -> None:
    """HEAD's reflog as a fresh clone (CI's checkout) has it: one entry, so HEAD@{1} names nothing."""
    log = repo.path / ".git" / "logs" / "HEAD"
    log.write_text(log.read_text().splitlines()[-1] + "\n")


@bad("gate", "trusted ref HEAD@{1} in a fresh clone", cpu_s=GATE_SECONDS)
def _(d):
    repo = Repo(d)
    repo.commit("pull request")
    fresh_clone_reflog(repo)
    return "gate", ["gate", "--repo", str(repo.path), "--trusted-ref", "HEAD@{1}", "--", "-q"]


@bad("gate", "--cuda-gate-release=HEAD@{5}", cpu_s=GATE_SECONDS)
def _(d):
    repo = Repo(d)
    repo.commit("pull request")
    fresh_clone_reflog(repo)
    return "gate", ["gate", "--repo", str(repo.path), "--trusted-ref", repo.base, "--", "-q", "--cuda-gate-release=HEAD@{5}"]


def new_base(repo: Repo, path: Path, text: str) -> None:
    """The signed base commit with ``path`` replaced by ``text``; the pull request restores it."""
    original = path.read_text()
    path.write_text(text)
    repo.base = repo.commit("base: " + path.name)
    path.write_text(original)


@bad("gate", "base ledger nested 100k deep", cpu_s=GATE_SECONDS)
def _(d):
    repo = Repo(d)
    new_base(repo, repo.suite_dir / "cudagate.approvals.json", "[" * 100_000 + "]" * 100_000)
    return gate(repo)


@bad("gate", "[tool.cudagate] = \"x\" at the base", cpu_s=GATE_SECONDS)
def _(d):
    repo = Repo(d)
    new_base(repo, repo.path / "pyproject.toml", '[project]\nname = "demo"\n\n[tool]\ncudagate = "x"\n')
    return gate(repo)


@bad("gate", "12,000 tunables in the pull request", cpu_s=GATE_SECONDS)
def _(d):
    repo = Repo(d)
    path = repo.suite_dir / "cudagate.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["kernels"][0]["tunables"] = {f"T{i}": [i + 1] for i in range(12_000)}
    path.write_text(yaml.safe_dump(raw, sort_keys=False, default_flow_style=None))  # 180 KB
    return gate(repo)


# -- cudagate report merge ------------------------------------------------------------------------

def merge(d: Path, change) -> tuple[str, list[str]]:
    """A report folder a job wrote, ``change(folder)`` applied to it, merged."""
    folder = d / "report"
    write_report(folder, built_report(build_scenario(d / "scale"), folder))
    change(folder)
    return "cudagate", ["report", "merge", str(d / "merged"), str(folder)]


def edit_report(edit):
    def change(folder: Path):
        path = folder / "report.json"
        path.write_text(edit(path.read_text()))
    return change


def replace_report(make):
    def change(folder: Path):
        (folder / "report.json").unlink()
        make(folder / "report.json")
    return change


def fifo_request(folder: Path) -> None:
    name = next(n for item in json.loads((folder / "report.json").read_text())["items"] for n in item["requests"])
    (folder / name).unlink()
    os.mkfifo(folder / name)


for _name, _change in [
    ("a NaN where the schema takes a number",
     edit_report(lambda text: text.replace('"budget_s": 2.0', '"budget_s": NaN', 1))),
    ("nested 100k deep", edit_report(lambda text: "[" * 100_000 + "]" * 100_000)),
    ("items[0].run = 7", edit_report(lambda text: text.replace('"run": 0', '"run": 7', 1))),
    ("report a link to /dev/zero", replace_report(lambda path: path.symlink_to("/dev/zero"))),
    ("report a FIFO", replace_report(os.mkfifo)),
    ("request a FIFO", fifo_request),
]:
    bad("merge", _name)(lambda d, c=_change: merge(d, c))


# -- issue 41: what report.schema.json bounds, and where the merged report or the comment goes ---------

def edit_document(edit):
    """A change to a report folder: its report.json parsed, ``edit(document)`` applied, written back."""
    def change(folder: Path):
        path = folder / "report.json"
        document = json.loads(path.read_text())
        edit(document)
        path.write_text(json.dumps(document))
    return change


def timed(document: dict) -> dict:
    """The report's regressed item (timed against the approved version: medians and an interval)."""
    return next(i for i in document["items"] if (i["latency"] or {}).get("verdict") == "regressed")


def median(value):
    return edit_document(lambda document: timed(document)["latency"]["current"].update(median=value))


OUT_OF_BOUNDS = [
    ("a median of -1 ms", median(-1)), ("a median of 0 ms", median(0)), ("a median as text", median("12")),
    ("a median of null", median(None)), ("a median of true", median(True)),
    ("an interval's low above its high",
     edit_document(lambda document: timed(document)["latency"]["estimate"].update(low=1.3, high=1.1))),
    ("created: yesterday", edit_document(lambda document: document.update(created="yesterday"))),
    ("created in the year 99999", edit_document(lambda document: document.update(created="99999-01-01T00:00:00+00:00"))),
    ("a run created on 30 February",
     edit_document(lambda document: document["runs"][0].update(created="2026-02-30T10:00:00+00:00"))),
    ("more mismatched elements than elements", edit_document(
        lambda document: timed(document)["correctness"]["comparisons"][0].update(mismatches=10**6))),
]
for _name, _change in OUT_OF_BOUNDS:
    bad("merge", _name)(lambda d, c=_change: merge(d, c))


def read_only_folder(d: Path) -> Path:
    """A folder this process cannot write in: a folder without write permission, or (root ignores
    permissions) /sys, which containers mount read-only."""
    if os.geteuid() != 0:
        folder = d / "read-only"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    return Path("/sys")


def _long_path(d: Path) -> Path:
    return d / "/".join(["x" * 200] * 25) / "report.md"  # 5,000 characters: past PATH_MAX


def merge_into(out) -> Callable[[Path], tuple[str, list[str]]]:
    """A sound report merged into ``out(d)``: a place no merged report may go."""
    def build(d: Path) -> tuple[str, list[str]]:
        folder = d / "report"
        write_report(folder, built_report(build_scenario(d / "scale"), folder))
        return "cudagate", ["report", "merge", str(out(d)), str(folder)]
    return build


def _file(d: Path) -> Path:
    (d / "taken").write_text("a file, not a folder")
    return d / "taken"


def _linked_page(d: Path) -> Path:
    (d / "merged").mkdir()
    (d / "merged" / "report.html").symlink_to(d / "elsewhere.html")
    return d / "merged"


def device(d: Path) -> Path:
    """A character device like /dev/full, made in ``d`` (a FIFO where this user may not make one): a
    command that wrongly wrote over it damages nothing outside the test's folder."""
    path = d / "full"
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except PermissionError:
        os.mkfifo(path)
    return path


for _name, _out in [("OUT a file", _file), ("OUT a device", device),
                    ("OUT a read-only folder", lambda d: read_only_folder(d) / "merged"),
                    ("OUT/report.html a link", _linked_page)]:
    bad("merge", _name)(merge_into(_out))
bad("merge", "DIR a 5,000-character path")(lambda d: ("cudagate", ["report", "merge", str(d / "merged"),
                                                                   str(_long_path(d))]))


# -- cudagate report comment --------------------------------------------------------------------------

def comment(d: Path, change=None, out=None) -> tuple[str, list[str]]:
    """A sound report folder, ``change(folder)`` applied, as a comment (written to ``out(d)``)."""
    folder = d / "report"
    write_report(folder, built_report(build_scenario(d / "scale"), folder))
    if change:
        change(folder)
    return "cudagate", ["report", "comment", str(folder), *(["--out", str(out(d))] if out else [])]


def _linked_comment(d: Path) -> Path:
    (d / "comment.md").symlink_to(d / "elsewhere.md")
    return d / "comment.md"


for _name, _out in [("--out a device (like /dev/full)", device), ("--out a folder", lambda d: d),
                    ("--out a link", _linked_comment),
                    ("--out ''", lambda d: ""), ("--out in a read-only folder", lambda d: read_only_folder(d) / "c.md"),
                    ("--out a 5,000-character path", _long_path)]:
    bad("comment", _name)(lambda d, o=_out: comment(d, out=o))
bad("comment", "REPORT_DIR ''")(lambda d: ("cudagate", ["report", "comment", ""]))
bad("comment", "REPORT_DIR a 5,000-character path")(lambda d: ("cudagate", ["report", "comment", str(_long_path(d))]))
for _name, _change in OUT_OF_BOUNDS:
    bad("comment", _name)(lambda d, c=_change: comment(d, c))


# -- cudagate optimize --proposer replay:DIR --------------------------------------------------------

def replay(d: Path, change) -> tuple[str, list[str]]:
    """A replay folder of one proposal (01.json, 01.cu), ``change(folder)`` applied; a sound one gets as
    far as the GPU (exit 3)."""
    folder = write_proposals(d / "props", [{"marker": "latency=0.010"}])
    change(folder)
    return "cudagate", ["optimize", str(opt_suite(d / "s")), "scale2", "--allow-unsigned", "--quiet",
                        "--results", str(d / "results"), "--proposer", f"replay:{folder}"]


def proposal(edit):
    def change(folder: Path):
        path = folder / "01.json"
        path.write_text(edit(path.read_text()))
    return change


def proposal_field(name: str, value):
    return proposal(lambda text: json.dumps({**json.loads(text), name: value}))


def history(text: str):
    def change(folder: Path):
        (folder / "history.json").write_text(text)
    return change


def fifo_source(folder: Path) -> None:
    (folder / "01.cu").unlink()
    os.mkfifo(folder / "01.cu")


for _name, _change in [
    ("launch a number", proposal_field("launch", 5)),
    ("label a number", proposal_field("label", 7)),
    ("source_file a number", proposal_field("source_file", 3)),
    ("a define a string", proposal_field("defines", {"BLOCK": "x"})),
    ("launch_overrides a list", proposal_field("launch_overrides", [1])),
    ("proposals a number", proposal(lambda text: '{"proposals": 5}')),
    ("a proposal a number", proposal(lambda text: '{"proposals": [3]}')),
    ("define 1e400", proposal(lambda text: text.replace("{", '{"defines": {"BLOCK": 1e400}, ', 1))),
    ("proposal nested 100k deep", proposal(lambda text: "[" * 100_000 + "]" * 100_000)),
    ("source not UTF-8", lambda folder: (folder / "01.cu").write_bytes(b"// caf\xe9\n")),
    ("source_file a FIFO", fifo_source),
    ("history not JSON", history("{broken")),
    ("history attempts a number", history('{"attempts": 5}')),
    ("history nested 100k deep", history("[" * 100_000 + "]" * 100_000)),
]:
    bad("replay", _name)(lambda d, c=_change: replay(d, c))


# -- tunables -------------------------------------------------------------------------------------

def with_tunables(d: Path, count: int, values: int = 1) -> Path:
    """The suite with its case data, so that the tunables are the one thing wrong."""
    entries = ", ".join(f"T{i}: [{', '.join(str(v + 1) for v in range(values))}]" for i in range(count))
    return suite_with(d, "    launch: {grid: [rows], block: [128]}\n",
                      "    launch: {grid: [rows], block: [128]}\n    tunables: {" + entries + "}\n"
                      "    tuning_launch: {grid: [rows], block: ['T0 * 16']}\n")


bad("tunables", "12,000 tunables (cudagate check)")(lambda d: check(with_tunables(d, 12_000)))
bad("tunables", "257 tunables (cudagate check)")(lambda d: check(with_tunables(d, 257)))
bad("tunables", "17 tunables of 64 values (cudagate check)")(lambda d: check(with_tunables(d, 17, 64)))


@bad("tunables", "3,000 tunables under --proposer autotune")
def _(d):
    return "cudagate", ["optimize", str(with_tunables(d, 3000, 2)), "scale2", "--allow-unsigned", "--quiet",
                        "--results", str(d / "results"), "--proposer", "autotune"]


# -- cudagate history -------------------------------------------------------------------------------

def timed_report(d: Path, edit=None) -> Path:
    """A report with timed cases at a commit of its own (no repository needed); ``edit(document)`` applied
    to the file written (the gate writes no report its readers refuse)."""
    folder = d / "report"
    built = built_report(build_scenario(d / "scale"), folder)
    built.document["runs"][0]["github"] = {"sha": "ab" * 20, "ref": "refs/heads/main"}
    write_report(folder, built)
    if edit:
        edit_document(edit)(folder)
    return folder


def record(d: Path, *args: str, edit=None) -> tuple[str, list[str]]:
    return "cudagate", ["history", "record", str(timed_report(d, edit)), "--repo", str(d), *args]


def first_latency(key: str, value):
    def edit(document):
        next(item for item in document["items"] if item.get("latency"))["latency"]["current"][key] = value
    return edit


def damaged_history(d: Path, query: str) -> tuple[str, list[str]]:
    """A history recorded from a sound report, then ``query`` run on it: every result it shows is damaged."""
    db = d / "history.sqlite"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["history", "record", str(timed_report(d)), "--repo", str(d), "--db", str(db)]) == 0
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(query)
    return "cudagate", ["history", "show", "--db", str(db), "--out", str(d / "page")]


bad("history", "--db :memory:")(lambda d: record(d, "--db", ":memory:"))
bad("history", "--db file:x?mode=memory")(lambda d: record(d, "--db", "file:x?mode=memory"))
bad("history", "a current median of 1e308 ms")(lambda d: record(d, "--db", str(d / "h.sqlite"),
                                                                edit=first_latency("median", 1e308)))
bad("history", "a current median of 1e-300 ms")(lambda d: record(d, "--db", str(d / "h.sqlite"),
                                                                 edit=first_latency("median", 1e-300)))
for _name, _query in [
    ("a text latency in every result", "UPDATE results SET current_us = 'fast'"),
    ("a latency of 1e308 in every result", "UPDATE results SET current_us = 1e308"),
    ("a latency of -1 in every result", "UPDATE results SET current_us = -1"),
    ("an infinite ratio in every result", "UPDATE results SET ratio = 9e999"),
    ("a verdict of 7 in every result", "UPDATE results SET verdict = 7"),
    ("every result of a run not recorded", "UPDATE results SET run = 'gone'"),
    ("a run's release flag of 'yes'", "UPDATE runs SET release = 'yes'"),
    ("a commit sha a blob", "UPDATE commits SET sha = x'00'"),
    ("no table runs", "DROP TABLE runs"),
    ("no column current_us", "ALTER TABLE results DROP COLUMN current_us"),
]:
    bad("history", _name)(lambda d, q=_query: damaged_history(d, q))


# -- numbers and paths on the command line ------------------------------------------------------------

for _args in [["bisect", "v1", "HEAD", "s", "--budget", "nan"], ["bisect", "v1", "HEAD", "s", "--budget", "inf"],
              ["bisect", "v1", "HEAD", "s", "--budget", "1e308"], ["bisect", "v1", "HEAD", "s", "--timeout", "nan"],
              ["bisect", "v1", "HEAD", "s", "--lock-timeout", "nan"], ["bisect", "v1", "HEAD", "s", "--threshold", "nan"],
              ["history", "show", "--out", "o", "--last", "0"], ["history", "show", "--out", "o", "--last", str(10**30)],
              ["history", "show", "--db", "", "--out", "o"], ["history", "show", "--out", ""],
              ["report", "merge", "o", ""], ["approve", "s", "--runs", "-1"],
              ["run", "r.json", "--timeout", "-inf"], ["optimize", "s", "k", "--max-gpu-minutes", "nan"],
              ["optimize", "s", "k", "--batch", str(10**30)], ["optimize", "s", "k", "--results", ""],
              ["cases", "generate", "s", "--lock-timeout", "1e308"], ["check", ""], ["gate", "--repo", ""]]:
    bad("options", "cudagate " + " ".join(repr(a) if not a else a for a in _args))(lambda d, a=_args: ("cudagate", a))
# Each of these a sound report: only the option is wrong.
bad("options", "cudagate history record REPORT --db ''")(lambda d: record(d, "--db", ""))
bad("options", "cudagate history record REPORT --lock-timeout nan")(lambda d: record(
    d, "--db", str(d / "h.sqlite"), "--lock-timeout", "nan"))
bad("options", "cudagate report merge '' REPORT")(lambda d: ("cudagate", ["report", "merge", "", str(timed_report(d))]))
# A suite with its case data: without a GPU, a run of it passes; only the option is wrong.
for _option in ["--cuda-gate-budget=nan", "--cuda-gate-timeout=inf", "--cuda-gate-lock-timeout=-1",
                "--cuda-gate-threshold=nan", "--cuda-gate-durations=-1", "--cuda-gate-fresh-seed=1e308",
                "--cuda-gate-report=", "--cuda-gate-benchmark-json="]:
    bad("options", f"pytest {_option}")(lambda d, o=_option: ("pytest", [str(suite_with(d)), "--cuda-gate",
                                                                         "--cuda-gate-allow-unsigned", o]))
# -- a kernel's headers (issue 41: items 8, fuzz 9) -----------------------------------------------------------------

def including(d: Path, include: str, make=None, *, entry: str = "cudagate") -> tuple[str, list[str]]:
    """The suite with its case data, its kernel including ``include``; ``make(folder)`` writes the header."""
    path = suite_with(d)
    source = path.parent / "scale.cu"
    source.write_text(f'#include "{include}"\n' + source.read_text())
    if make:
        make(path.parent)
    if entry == "pytest":
        return "pytest", [str(path), "--cuda-gate", "--cuda-gate-allow-unsigned"]
    return check(path)


def links_to_one_header(folder: Path, count: int = 20, size: int = 4 * 1024 * 1024 - 16) -> None:
    (folder / "big.cuh").write_text("// " + "x" * size + "\n")
    for i in range(count):
        (folder / f"l{i}.cuh").symlink_to("big.cuh")
    source = folder / "scale.cu"
    source.write_text("".join(f'#include "l{i}.cuh"\n' for i in range(count)) + source.read_text())


_HEADERS = [
    ("a 5,000-character include name", "a" * 5000 + ".cuh", None),
    ("a header over 4 MiB", "big.cuh", lambda f: (f / "big.cuh").write_bytes(b"/" * (5 << 20))),
    ("a non-UTF-8 header", "latin1.cuh", lambda f: (f / "latin1.cuh").write_bytes(b"// caf\xe9\n")),
    ("an .npy include", "cases/small/x.npy", None),
    ("a header that links to itself", "loop.cuh", lambda f: (f / "loop.cuh").symlink_to("loop.cuh")),
    ("a header that is a FIFO", "fifo.cuh", lambda f: os.mkfifo(f / "fifo.cuh")),
    ("20 links to one 4 MiB header", "l0.cuh", lambda f: links_to_one_header(f)),
    ("300 links to one header", "l0.cuh", lambda f: links_to_one_header(f, 300, 10)),
]
for _name, _include, _make in _HEADERS:
    for _entry in ("cudagate", "pytest"):
        bad("includes", f"{_name} ({'check' if _entry == 'cudagate' else 'pytest'})")(
            lambda d, i=_include, m=_make, e=_entry: including(d, i, m, entry=e))


@bad("includes", "a CUDA reference including a 5,000-character name (verify)")
def _(d):
    project = make_project(d, cuda_reference=True)
    reference = project.suite_dir / "reference.cu"
    reference.write_text('#include "' + "a" * 5000 + '.cuh"\n' + reference.read_text())
    return "verify", ["verify", str(project.suite_file)]


@bad("includes", "a kernel source that links to itself (check)")
def _(d):
    path = suite_with(d)
    (path.parent / "scale.cu").unlink()
    (path.parent / "scale.cu").symlink_to("scale.cu")
    return check(path)


# -- cudagate init KERNEL.cu [ENTRY] (issue 42, item 3) ---------------------------------------------------------------

SAXPY_CU = "__global__ void saxpy(const float* x, float* y, float a, int n) { if (n) y[0] = a * x[0]; }\n"


def init_with(d: Path, source: str | None, *extra: str) -> tuple[str, list[str]]:
    d.mkdir(parents=True, exist_ok=True)
    if source is not None:
        (d / "k.cu").write_text(source, encoding="utf-8")
    return "cudagate", ["init", str(d / "k.cu"), *extra]


for _name, _source, _extra in (
        ("a missing file", None, ()),
        ("a file with no kernel", "__device__ float twice(float x) { return 2 * x; }\n", ()),
        ("several kernels and no ENTRY", SAXPY_CU + "__global__ void other(int* z) {}\n", ()),
        ("an ENTRY that names no kernel", SAXPY_CU, ("nosuch",)),
        ("a file that does not compile", "__global__ void k(float* x) { x[0] = undefined_name; }\n", ()),
):
    bad("init", _name, cpu_s=GATE_SECONDS)(lambda d, s=_source, e=_extra: init_with(d, s, *e))


@bad("init", "an --out folder that does not hold the file", cpu_s=GATE_SECONDS)
def _(d):
    (d / "elsewhere").mkdir(parents=True)
    return init_with(d / "kernel", SAXPY_CU, "--out", str(d / "elsewhere"))


@bad("init", "an existing suite", cpu_s=GATE_SECONDS)
def _(d):
    d.mkdir(parents=True, exist_ok=True)
    (d / "cudagate.yaml").write_text("suite: mine\n", encoding="utf-8")
    return init_with(d, SAXPY_CU)


@bad("init", "a skeleton left as written (check)", cpu_s=GATE_SECONDS)
def _(d):
    d.mkdir(parents=True, exist_ok=True)
    (d / "k.cu").write_text(SAXPY_CU, encoding="utf-8")
    assert main(["init", str(d / "k.cu")]) == 0
    return check(d / "cudagate.yaml")


# -- input settings: adversarial bounds (issue 44, items 5 and 6) ----------------------------------------------------

for _name, _value in [("zero", "0"), ("negative", "-4"), ("infinite", ".inf"), ("NaN", ".nan"), ("text", "lots"),
                      ("a list", "[1, 2]")]:
    bad("inputs", f"adversarial_max {_name}")(lambda d, v=_value: check(suite_with(
        d, "tolerance:", f"inputs:\n  x: {{distribution: normal, std: 1, adversarial_max: {v}}}\ntolerance:", data=False)))


for _name, _entry in [("outliers k as long as a row", "{distribution: outliers, k: 50, scale: 10}"),
                      ("outliers k past a block", "{distribution: outliers, k: 9, scale: 10, per: 8}"),
                      ("outliers without k", "{distribution: outliers, scale: 10}"),
                      ("outliers over outliers", "{distribution: outliers, base: {distribution: outliers, k: 1, "
                                                 "scale: 2}, k: 1, scale: 10}"),
                      ("k without outliers", "{distribution: normal, k: 2}")]:
    bad("inputs", _name)(lambda d, e=_entry: check(suite_with(d, "tolerance:", f"inputs:\n  x: {e}\ntolerance:",
                                                              data=False)))


@bad("inputs", "adversarial_max on an integer input")
def _(d):
    text = replace_once(SUITE_YAML, "{name: x, buffer: float32", "{name: x, buffer: int32")
    return check(suite_with(d, yaml_text=replace_once(
        text, "tolerance:", "inputs:\n  x: {distribution: integers, low: 0, high: 9, adversarial_max: 100}\ntolerance:"),
        data=False))


# -- links to folders in the gated paths (issue 41, item 6) ----------------------------------------------------------

def folder_links(d: Path, links: dict[str, str], entry: str) -> tuple[str, list[str]]:
    path = suite_with(d)
    for name, target in links.items():
        (path.parent / name).symlink_to(target)
    if entry == "pytest":
        return "pytest", [str(path.parent), "--cuda-gate", "--cuda-gate-allow-unsigned"]
    return "cudagate", ["check", "--allow-unsigned", str(path.parent)]


for _name, _links in [("loop -> .", {"loop": "."}), ("two links to . and ..", {"a": ".", "b": ".."}),
                      ("a link to /", {"root": "/"})]:
    for _entry in ("cudagate", "pytest"):
        bad("links", f"{_name} ({'check' if _entry == 'cudagate' else 'pytest'})")(
            lambda d, k=_links, e=_entry: folder_links(d, k, e))


@bad("links", "a link to / in the trusted suites (cudagate gate)", cpu_s=GATE_SECONDS)
def _(d):
    repo = Repo(d)
    (repo.suite_dir / "root").symlink_to("/")
    return gate(repo)


# -- a kernel's compiler: nvcc beside NVRTC (issue 42, item 1) ------------------------------------------------------

HOST_CODE = '#include <stdio.h>\n'  # makes `compiler: auto` choose nvcc


def compiled_by(d: Path, extra: str = "", *, source: str = "", nvcc_env: str | None = None,
                entry: str = "pytest") -> tuple[str, list[str]]:
    """The suite with its case data, its kernel's file prefixed with ``source`` (host code) and its
    kernel entry followed by ``extra``; ``nvcc_env``: $CUDAGATE_NVCC for this input's process."""
    path = suite_with(d)
    path.write_text(replace_once(path.read_text(), "    launch: {grid: [rows], block: [128]}\n",
                                 "    launch: {grid: [rows], block: [128]}\n" + extra))
    kernel = path.parent / "scale.cu"
    kernel.write_text(source + kernel.read_text())
    if nvcc_env is not None:
        os.environ["CUDAGATE_NVCC"] = nvcc_env
    if entry == "pytest":
        return "pytest", [str(path), "--cuda-gate", "--cuda-gate-allow-unsigned"]
    return check(path)


def nvcc_of_cuda_12(folder: Path) -> str:
    """A script that answers --version and -dryrun as CUDA 12.4's nvcc does."""
    script = folder / "cuda-12.4" / "bin" / "nvcc"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n"
                      f"echo '#$ _HERE_={script.parent}' >&2\n")
    script.chmod(0o755)
    return str(script)


bad("compiler", "compiler: gcc (check)")(lambda d: compiled_by(d, "    compiler: gcc\n", entry="cudagate"))
bad("compiler", "compiler: [nvcc] (check)")(lambda d: compiled_by(d, "    compiler: [nvcc]\n", entry="cudagate"))
# A file with host code: `compiler: auto` takes nvcc, which may not be given these.
for _option in ("-Xcompiler=-fplugin=/tmp/p.so", "-ccbin=/tmp", "--run", "-odir=/tmp", "--keep",
                "--dependency-output=/tmp/d", "-Xlinker=-T", "--compiler-bindir=/tmp"):
    bad("compiler", f"nvcc option {_option} (check)")(
        lambda d, o=_option: compiled_by(d, f"    options: ['{o}']\n", source=HOST_CODE, entry="cudagate"))
bad("compiler", "host code and no nvcc (pytest)", cpu_s=GATE_SECONDS)(
    lambda d: compiled_by(d, source=HOST_CODE, nvcc_env=str(d / "no-nvcc")))
bad("compiler", "nvcc of CUDA 12 beside NVRTC 13 (pytest)", cpu_s=GATE_SECONDS)(
    lambda d: compiled_by(d, source=HOST_CODE, nvcc_env=nvcc_of_cuda_12(d)))
bad("compiler", "a host-code file whose kernel launches another (pytest)", cpu_s=GATE_SECONDS)(
    lambda d: compiled_by(d, source=HOST_CODE + '__global__ void child(float* y) { y[0] = 1; }\n'
                          '__global__ void parent(float* y) { child<<<1, 1>>>(y); }\n'))
bad("compiler", "a host-code file with an extern __device__ of another file (pytest)", cpu_s=GATE_SECONDS)(
    lambda d: compiled_by(d, source=HOST_CODE + 'extern __device__ float gain;\n'
                          '__global__ void uses(float* y) { y[0] = gain; }\n'))


# -- a kernel's preconditions and parameters: requires, args, outputs (issue 44, item 2) ----------------------------

def kernel_field(family_name: str, field: str) -> None:
    """A suite whose kernel has ``field`` (a line of YAML), refused by `cudagate check`."""
    bad("kernel_cases", family_name)(lambda d: check(suite_with(
        d, yaml_text=replace_once(SUITE_YAML, "    source: scale.cu\n", f"    source: scale.cu\n    {field}\n"),
        data=False)))


for _name, _field in [
    ("requires that is not a condition", 'requires: ["cols % 4"]'),
    ("requires that is a number", "requires: [4]"),
    ("requires over an unknown scalar", 'requires: ["width >= 4"]'),
    ("requires calling a function", 'requires: ["__import__(\'os\') == 0"]'),
    ("requires with a huge power", 'requires: ["2 ** 100000 == cols"]'),
    ("requires nested deeply", "requires: [\"" + "not " * 100 + "cols > 0\"]"),
    ("requires 600 characters long", "requires: [\"" + "cols + " * 85 + "1 > 0\"]"),
    ("requires that no performance case meets", 'requires: ["cols < 100"]'),
    ("requires dividing by zero", 'requires: ["cols % (rows - rows) == 0"]'),
    ("outputs naming an input", "outputs: [x]"),
    ("outputs naming no parameter", "outputs: [w]"),
    ("outputs naming a scalar", "outputs: [rows]"),
    ("args naming an unknown parameter", "args: [x, y, rows, cols, w]"),
    ("args leaving the output unwritten", "args: [x, rows, cols]"),
    ("outputs judged but not in args", "args: [x, rows, cols]\n    outputs: [y]"),
]:
    kernel_field(_name, _field)


# -- the driver -------------------------------------------------------------------------------------

# -- derived scalars (issue 44): each refused by `cudagate check`, naming the derived scalar --------
def derived(d: Path, derived_yaml: str, signature: str = "", case: str = "") -> tuple[str, list[str]]:
    """The suite with ``derived_yaml`` (a `derived:` mapping), ``signature`` (extra scalar entries)
    and ``case`` (extra scalars of the first case)."""
    text = SUITE_YAML + f"derived: {derived_yaml}\n"
    if signature:
        text = replace_once(text, "  - {name: cols, scalar: int32}\n", "  - {name: cols, scalar: int32}\n" + signature)
    if case:
        text = replace_once(text, "scalars: {rows: 3, cols: 50}", "scalars: {rows: 3, cols: 50, " + case + "}")
    return check(suite_with(d, yaml_text=text, data=False))


for _name, _args in [
    ("a cycle", ("{a: b + 1, b: 2 * a}",)),
    ("one that reads itself", ("{a: a + rows}",)),
    ("one named as a buffer", ("{x: rows * cols}",)),
    ("an unknown scalar", ("{n: rows * depth}",)),
    ("a case that gives a derived scalar", ("{n: rows * cols}", "  - {name: n, scalar: int32}\n", "n: 150")),
    ("a case scalar shadowed", ("{rows: cols * 2}",)),
    ("an int32 overflow", ("{n: rows * cols * 2**40}", "  - {name: n, scalar: int32}\n")),
    ("a fraction for an integer", ("{n: rows / 7}", "  - {name: n, scalar: int32}\n")),
    ("a device fact's name", ("{warp_size: rows}",)),
    ("a value beyond 2**64", ("{f: 10.0**60}", "  - {name: f, scalar: float32}\n")),
]:
    bad("derived", _name)(lambda d, a=_args: derived(d, *a))


# -- `ulp:` tolerances (issue 44, item 6): each refused by `cudagate check`, naming tolerance.y.ulp ----
for _name, _old, _new in [
    ("ulp on an integer output", "y: {atol: 1.0e-6, rtol: 1.0e-5}", "y: {atol: 0, ulp: 2}"),
    ("a negative ulp", "y: {atol: 1.0e-6, rtol: 1.0e-5}", "y: {ulp: -1}"),
    ("a fractional ulp", "y: {atol: 1.0e-6, rtol: 1.0e-5}", "y: {ulp: 0.5}"),
    ("a ulp that is text", "y: {atol: 1.0e-6, rtol: 1.0e-5}", 'y: {ulp: "4"}'),
    ("an infinite ulp", "y: {atol: 1.0e-6, rtol: 1.0e-5}", "y: {ulp: .inf}"),
]:
    _text = replace_once(SUITE_YAML, _old, _new)
    if _name == "ulp on an integer output":
        _text = replace_once(_text, "{name: y, buffer: float32", "{name: y, buffer: int32")
    bad("tolerances", _name)(lambda d, t=_text: check(suite_with(d, yaml_text=t, data=False)))


# -- padded buffers (issue 44, item 6): `ld` refused by `cudagate check`, a bad layout by both entry points --
_PADDED = SUITE_YAML.replace("shape: [rows, cols]}\n  - {name: rows", "shape: [rows, cols], ld: LD}\n  - {name: rows")
for _name, _old, _new in [
    ("ld shorter than a row", "tolerance:", "derived: {LD: cols - 1}\ntolerance:"),
    ("ld without a 2-D shape", "size: rows*cols, shape: [rows, cols], ld: LD}", "size: rows*cols, ld: LD}"),
    ("ld over an unknown name", "ld: LD}", "ld: width}"),
    ("ld as a list", "ld: LD}", "ld: [LD]}"),
    ("padding over 128 GiB", "tolerance:", "derived: {LD: cols * 2**40}\ntolerance:"),
]:
    _text = replace_once(_PADDED.replace("- {name: cols, scalar: int32}\n", "- {name: cols, scalar: int32}\n"
                                         "  - {name: LD, scalar: int64}\n"), _old, _new)
    if "derived" not in _text:
        _text = replace_once(_text, "tolerance:", "derived: {LD: cols + 4}\ntolerance:")
    bad("layouts", _name)(lambda d, t=_text: check(suite_with(d, yaml_text=t, data=False)))
for _entry in ("cudagate", "harness"):
    for _name, _layout in [("a layout that is not three numbers", [1, 4]), ("a layout whose ld is below its cols", [1, 4, 3]),
                           ("a layout that does not hold count", [2, 4, 8]), ("a layout of text", "1x4")]:
        bad("layouts", f"{_entry}: {_name}")(lambda d, e=_entry, v=_layout: request(d, e, buffer_change(layout=v)))


# -- dtype instantiations (issue 44 item 4): each refused by `cudagate check`, naming the field ------------
def instantiated(d: Path, *changes: str) -> tuple[str, list[str]]:
    """The gelu suite with each (old, new) pair of ``changes`` made."""
    text = GELU_YAML
    for old, new in zip(changes[::2], changes[1::2]):
        text = replace_once(text, old, new)
    return check(write_gelu(d / "s", text))


for _name, _args in [
    ("a type without a tolerance", ("    bfloat16: {atol: 1.0e-2, rtol: 1.6e-2}\n", "")),
    ("an unknown dtype", ("[float32, bfloat16]", "[float32, bfloat17]")),
    ("a placeholder not declared", ('"gelu<{T}>"', '"gelu<{U}>"')),
    ("a variable nothing uses", ("{T: [float32, bfloat16]}", "{T: [float32, bfloat16], U: [int32]}")),
    ("an empty list", ("{T: [float32, bfloat16]}", "{T: []}")),
    ("a type listed twice", ("[float32, bfloat16]", "[bfloat16, bfloat16]")),
    ("a list that is a string", ("{T: [float32, bfloat16]}", "{T: float32}")),
    ("one tolerance for a typed output", ("    float32: {atol: 1.0e-6, rtol: 1.0e-5}\n    bfloat16: {atol: 1.0e-2, "
                                          "rtol: 1.6e-2}\n", "    atol: 1.0e-2\n")),
    ("a tolerance of a type not instantiated", ("    bfloat16: {atol", "    float16: {atol: 1.0}\n    bfloat16: {atol")),
    ("a placeholder inside a type name", ('buffer: "{T}", intent: in', 'buffer: "b{T}", intent: in')),
    ("a placeholder without instantiate", ("instantiate: {T: [float32, bfloat16]}\n", "")),
    ("the product of the lists too large", ("{T: [float32, bfloat16]}", "{T: [float32, bfloat16, float16, float64, "
                                            "int8], U: [int8, int16, int32, int64]}")),
    ("instantiate that is a list", ("{T: [float32, bfloat16]}", "[float32, bfloat16]")),
    ("a bfloat16 scalar", ("  - {name: n, scalar: int32}\n", "  - {name: n, scalar: int32}\n  - {name: a, scalar: "
                                                             "\"{T}\"}\n", "{n: 1000}", "{n: 1000, a: 1.0}",
                           "{n: 65536}", "{n: 65536, a: 1.0}")),
]:
    bad("instantiate", _name)(lambda d, a=_args: instantiated(d, *a))
# -- steps beyond launches (issue 44): examples/attention with one edit each -----------------------------
ATTENTION = Path(__file__).resolve().parents[1] / "examples" / "attention"
# name: (old text of examples/attention/cudagate.yaml, new text); kernels[0].steps[1] is its memset.
STEP_EDITS = {
    "an unknown library adapter": ("  - library: cublas_gemm\n        args: {a: q", "  - library: cublas_hgemm\n        args: {a: q"),
    "a library buffer of a type the adapter does not take": (
        "{name: out, buffer: float32", "{name: out, buffer: int32"),
    "a library layout the adapter does not know": ("trans_b: true,", "trans_b: true, layout: diagonal,"),
    "a memset value beyond the buffer's type": ("value: -inf}", "value: 1.0e+39}"),
    "a memset value that is not a number": ("value: -inf}", "value: minus_infinity}"),
    "a memset of an input": ("memset: {buffer: rowmax", "memset: {buffer: q"),
    "a copy into an input": ("      - memset: {buffer: rowmax, value: -inf}\n",
                             "      - memset: {buffer: rowmax, value: -inf}\n      - copy: {from: out, to: v}\n"),
    "a step of two kinds": ("      - memset: {buffer: rowmax, value: -inf}\n",
                            "      - memset: {buffer: rowmax, value: -inf}\n        copy: {from: q, to: out}\n"),
    "an output no step writes": ("        args: {a: scores, b: v, c: out}", "        args: {a: scores, b: v, c: scores}"),
    "init on an output": ("{name: out, buffer: float32, intent: out,", "{name: out, buffer: float32, intent: out, init: 0,"),
    "a scratch init beyond its type": ("{name: rowmax, buffer: float32, intent: scratch,",
                                       "{name: rowmax, buffer: float32, intent: scratch, init: 1.0e+300,"),
    "a library call past its buffer": ("options: {m: T, n: D, k: T, batch: H}", "options: {m: T, n: D, k: T, batch: H*2}"),
}


def attention_with(d: Path, old: str, new: str) -> tuple[str, list[str]]:
    folder = d / "attention"
    shutil.copytree(ATTENTION, folder, ignore=shutil.ignore_patterns("cases", "approved", "*.json"))
    path = folder / "cudagate.yaml"
    path.write_text(replace_once(path.read_text(encoding="utf-8"), old, new), encoding="utf-8")
    return check(path)


for _name, (_old, _new) in STEP_EDITS.items():
    bad("steps", _name)(lambda d, o=_old, n=_new: attention_with(d, o, n))


def cpu_seconds() -> float:
    """CPU time of this process and the children it has waited for (the harness, compilers)."""
    return sum(usage.ru_utime + usage.ru_stime
               for usage in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))


# Every input runs with a signing key in its environment, as a maintainer's shell may have one: no piece
# of it (a line, or 16 characters of one) may reach the output or a file the command writes.
SIGNING_KEY = ("-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEIKqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq\n"
               "-----END PRIVATE KEY-----\n")
SECRET_PIECE = 16


def leaked(text: str) -> bool:
    """Whether ``text`` holds a line of :data:`SIGNING_KEY`'s body or 16 of its characters in a row."""
    body = SIGNING_KEY.splitlines()[1]
    return any(body[i:i + SECRET_PIECE] in text for i in range(len(body) - SECRET_PIECE + 1))


def special_files(folder: Path) -> dict[str, tuple]:
    """Each link, device and FIFO under ``folder`` (without following a link): its kind and target."""
    found = {}
    for path in folder.rglob("*"):
        try:
            mode = path.lstat().st_mode
        except OSError:
            continue
        if stat.S_ISLNK(mode):
            found[str(path)] = ("link", os.readlink(path))
        elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
            found[str(path)] = ("special", stat.S_IFMT(mode))
    return found


def damage(before: dict[str, tuple], folder: Path) -> list[str]:
    """What a command did outside its output: a link, device or FIFO it replaced, or a file that a link
    pointing to nothing before now leads to (written through the link)."""
    after = special_files(folder)
    hurt = [f"{path} ({kind[0]}) replaced" for path, kind in before.items() if after.get(path) != kind
            and os.path.lexists(path)]
    for path, (kind, target) in before.items():
        if kind == "link":
            where = Path(path).parent / target
            if not str(target).startswith("/dev/") and where.exists() and not where.is_dir() \
                    and where.stat().st_mtime > START[0]:
                hurt.append(f"{where} written through the link {path}")
    return hurt


def written_text(folder: Path, since: float) -> str:
    """The first 64 KiB of each regular file under ``folder`` written after ``since``."""
    texts = []
    for path in folder.rglob("*"):
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_mtime < since:
                continue
            with open(path, "rb") as handle:
                texts.append(handle.read(1 << 16).decode("utf-8", "replace"))
        except OSError:
            continue
    return "\n".join(texts)


START = [0.0]  # when the command under test started (this process runs one input)


def run_one(name: str, folder: Path) -> dict:
    """Build and run one input in this process; the caller has set the memory limit."""
    entry, args = next(i for i in INPUTS if f"{i.family}/{i.name}" == name).build(folder)
    specials = special_files(folder)
    START[0] = time.time()
    if entry == "gate":  # as tests/acceptance/test_attacks.py runs it: no device, a cache of its own
        os.environ.update(CUDA_VISIBLE_DEVICES="", CUDAGATE_CACHE_DIR=str(folder / "gate-cache"))
    out = io.StringIO()
    start, cpu_start = time.perf_counter(), cpu_seconds()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            if entry in ("cudagate", "verify", "gate"):
                code = main(args)
            elif entry == "harness":  # its own process: the worker writes to the real stdout
                done = subprocess.run([sys.executable, "-m", "cudagate_harness", *args], capture_output=True,
                                      text=True, timeout=MIN_WALL_S * 2)
                print(done.stdout + done.stderr)
                code = done.returncode
            else:
                code = int(pytest.main([*args, "-p", "no:cacheprovider", "-q"]))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # noqa: BLE001 - what the test counts: an uncaught error is a traceback
            traceback.print_exc(file=out)
            code = -1
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu_start
    return {"entry": entry, "code": code, "seconds": seconds, "cpu_s": cpu,
            "output": out.getvalue()[:1500] + out.getvalue()[-2500:],
            "leaked": leaked(out.getvalue()) or leaked(written_text(folder, START[0])),
            "damaged": damage(specials, folder),
            "peak_mb": max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024}


def verdict(result: dict) -> str:
    """refused, or the first of leak / damaged / traceback / hang / memory / accepted that applies."""
    output = result.get("output", "")
    if result.get("timed_out"):
        return "hang"
    if result.get("leaked"):
        return "leak"
    if result.get("damaged"):
        return "damaged"
    if ("Traceback (most recent call last)" in output or "INTERNALERROR" in output or result["code"] == -1
            or ITEM_EXCEPTION.search(output)):
        return "memory" if "MemoryError" in output else "traceback"
    if result["cpu_s"] > result["cpu_limit"] or result["seconds"] > result["wall_limit"]:
        return "hang"
    if result["peak_mb"] > MEMORY_LIMIT / 2**20:
        return "memory"
    # verify: a signature or ledger file it cannot read is NOT TRUSTED (exit 1), named in its message.
    refused = {"cudagate": (2,), "verify": (1, 2), "harness": (2,), "pytest": (1, 4), "gate": (1, 2, 4)}[result["entry"]]
    return "refused" if result["code"] in refused else "accepted"


def run_in_subprocess(item: BadInput, root: Path) -> dict:
    folder = root / f"{INPUTS.index(item):03d}"
    command = [sys.executable, __file__, f"{item.family}/{item.name}", str(folder)]
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "CUDAGATE_SIGNING_KEY": SIGNING_KEY}
    limits = {"cpu_limit": item.cpu_s, "wall_limit": item.wall_s}
    try:
        # twice the wall limit, the build of its files included: only a run that never ends gets here
        done = subprocess.run(command, capture_output=True, text=True, timeout=2 * item.wall_s, env=env, cwd=root)
    except subprocess.TimeoutExpired:
        return {"entry": "?", "code": None, "seconds": 2 * item.wall_s, "cpu_s": 0.0, "peak_mb": 0, "output": "",
                "timed_out": True, **limits}
    lines = done.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        result = {"entry": "?", "code": -1, "seconds": 0.0, "cpu_s": 0.0, "peak_mb": 0,
                  "output": (done.stdout + done.stderr)[-4000:] or f"driver exited {done.returncode}"}
    result["output"] += done.stderr[-2000:]
    return {**result, **limits}


def run_all(root: Path, workers: int = 2) -> list[tuple[BadInput, dict, str]]:
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda item: run_in_subprocess(item, root), INPUTS))
    return [(item, result, verdict(result)) for item, result in zip(INPUTS, results)]


def table(rows: list[tuple[BadInput, dict, str]]) -> str:
    count = lambda what: sum(1 for _, _, v in rows if v == what)  # noqa: E731
    lines = [f"{'family':<12} {'input':<48} {'verdict':<10} {'exit':>4} {'s':>6} {'cpu s':>6} {'MB':>6}"]
    for item, result, v in rows:
        lines.append(f"{item.family:<12} {item.name[:48]:<48} {v:<10} {str(result['code']):>4} "
                     f"{result['seconds']:6.2f} {result['cpu_s']:6.2f} {result['peak_mb']:6.0f}")
    lines.append(f"inputs tried / tracebacks / hangs / wrongly accepted / leaks / damaged outside the output: "
                 f"{len(rows)} / {count('traceback')} / {count('hang')} / {count('accepted')} / {count('leak')} / "
                 f"{count('damaged')}  (memory over {MEMORY_LIMIT >> 20} MB: {count('memory')})")
    return "\n".join(lines)


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT + 1024**3, MEMORY_LIMIT + 1024**3))
    print(json.dumps(run_one(sys.argv[1], Path(sys.argv[2]))))
