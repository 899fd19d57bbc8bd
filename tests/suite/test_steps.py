"""Kernels of several launches over a scratch workspace (``steps:`` and ``intent: scratch``), on the
simulated GPU: the real harness worker and gate run the split reduction of examples/split_reduce with
its two entries as Python bodies, and each planted cheat of a new path must be rejected."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from fake_worker import FakeKernel, FakeWorker
from helpers import EXAMPLES, line_of, replace_once
from test_hardening_gate import Fingerprint

from cudagate_harness.request_checks import request_problems
from pytest_cudagate.trust.approvals import Ledger, build_identity
from pytest_cudagate.errors import FileError
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Steps
from pytest_cudagate.trust.manifest import suite_manifest
from pytest_cudagate.worker.requests import compare_request, current_version, run_request

CHUNK = 2048  # columns per partial, as split_reduce.cu's CHUNK
YAML = (EXAMPLES / "split_reduce" / "cudagate.yaml").read_text(encoding="utf-8")


def _partials(launch, *, skip_last_chunk=False, overflow=0):
    rows, cols = launch.args["rows"], launch.args["cols"]
    chunks = -(-cols // CHUNK)
    x = launch.array("x", np.float32, rows * cols).reshape(rows, cols)
    partials = launch.array("partials", np.float32, rows * chunks + overflow).copy()
    for c in range(chunks - (1 if skip_last_chunk and chunks > 1 else 0)):
        partials[c:rows * chunks:chunks] = x[:, c * CHUNK:(c + 1) * CHUNK].sum(axis=1, dtype=np.float32)
    partials[rows * chunks:] = 0.0
    launch.array("partials", np.float32, rows * chunks + overflow)[:] = partials


def row_partials(launch):
    _partials(launch)


def row_finish(launch):
    rows, cols = launch.args["rows"], launch.args["cols"]
    chunks = -(-cols // CHUNK)
    partials = launch.array("partials", np.float32, rows * chunks).reshape(rows, chunks)
    launch.array("y", np.float32, rows)[:] = partials.sum(axis=1, dtype=np.float32)


def skips_the_final_pass(launch):  # a step that returns at once: the outputs keep their poison
    pass


def reads_unwritten_scratch(launch):  # the first pass leaves the last chunk of every row unwritten
    _partials(launch, skip_last_chunk=True)


def writes_past_scratch(launch):  # one partial too many: into the scratch buffer's guard zone
    _partials(launch, overflow=1)


@pytest.fixture
def suite(tmp_path):
    folder = tmp_path / "split_reduce"
    shutil.copytree(EXAMPLES / "split_reduce", folder, ignore=shutil.ignore_patterns("approved", "*.json"))
    shutil.copytree(EXAMPLES / "split_reduce" / "cases", folder / "cases", dirs_exist_ok=True)
    text = YAML + "checks: {sanitizer: off}\n"
    (folder / "cudagate.yaml").write_text(text, encoding="utf-8")
    return load_suite(folder / "cudagate.yaml")


def client(suite, **bodies) -> FakeWorker:
    """The split reduction's entries as fake kernels; ``bodies`` replace some of them by name."""
    params = {p.name: p.protocol() for p in suite.signature}
    steps = suite.kernels[0].steps
    chosen = {"row_partials": row_partials, "row_finish": row_finish, **bodies}
    return FakeWorker({step.entry: FakeKernel(chosen[step.entry], [params[a] for a in step.args]) for step in steps})


def replay(suite, worker, tmp_path, case="correct_5x3000"):
    gate = Gate(worker, Fingerprint(), GateOptions(fresh_seed=7), tmp_path / "out")
    return gate.replay(suite, suite.kernels[0], suite.case(case), Ledger.for_suite(suite))


def test_the_split_reduction_passes_and_each_step_gets_its_own_arguments(suite, tmp_path):
    worker = client(suite)
    outcome = replay(suite, worker, tmp_path)
    assert not outcome.failed, outcome.message
    request = worker.requests[0]
    assert request["kernel"]["entries"] == ["row_partials", "row_finish"]
    launch = request["cases"][0]["launch"]
    assert [(s["entry"], s["args"], s["grid"]) for s in launch] == [
        ("row_partials", ["x", "partials", "rows", "cols"], [2, 5, 1]),
        ("row_finish", ["partials", "y", "rows", "cols"], [1, 1, 1])]
    assert {"name": "partials", "kind": "buffer", "dtype": "float32", "intent": "scratch"} in request["signature"]


@pytest.mark.parametrize("body, entry, says", [
    (skips_the_final_pass, "row_finish", "5 elements were never written by the kernel"),
    (reads_unwritten_scratch, "row_partials", "5 of 5 elements outside tolerance"),
    (writes_past_scratch, "row_partials", "'partials'"),
])
def test_each_cheat_of_a_new_path_is_rejected(suite, tmp_path, body, entry, says):
    outcome = replay(suite, client(suite, **{entry: body}), tmp_path)
    assert outcome.failed, outcome.message
    assert says in outcome.message


def test_a_write_past_scratch_is_named_as_a_guard_zone_hit(suite, tmp_path):
    outcome = replay(suite, client(suite, row_partials=writes_past_scratch), tmp_path)
    assert "the kernel wrote past the end of buffer 'partials'" in outcome.message, outcome.message


def test_scratch_is_neither_returned_nor_compared(suite, tmp_path):
    worker = client(suite)
    result = worker.run(run_request(suite, suite.kernels[0], [suite.case("correct_5x3000")], output_dir=tmp_path))
    body = result.cases["correct_5x3000"]
    assert set(body["outputs"]) == {"y"}
    assert not any(p.name.startswith("partials") for p in (tmp_path / "correct_5x3000").iterdir())


def test_the_operation_is_timed_as_one_unit_interleaved_with_the_approved_steps(suite, tmp_path):
    worker = client(suite)
    program = suite.kernels[0]
    case = suite.case("perf_64x65536")
    request = compare_request(suite, case, current=current_version(program), baseline=current_version(program),
                              output_dir=tmp_path, chunk=20)
    request["case"]["buffers"]["x"]["input"] = str(suite.case_dir(suite.case("correct_5x3000")) / "x.npy")
    request["case"]["scalars"] = {"rows": 5, "cols": 3000}
    for role in ("approved", "current"):
        request["launches"][role] = suite.resolved(suite.case("correct_5x3000")).launch(program)
    request["case"]["buffers"] = {"x": {"count": 15000, "input": request["case"]["buffers"]["x"]["input"]},
                                  "partials": {"count": 10}, "y": {"count": 5}}
    result = worker.compare(request, lambda chunk: 0)
    assert result.body["status"] == "ok", result.body
    chunk = result.chunks[0]
    assert len(chunk["approved"]) == len(chunk["current"]) == 20
    # Each timed sample holds both launches (the fake device adds 10 µs a launch, pads and flushes aside).
    assert min(chunk["current"]) >= 0.0199


def test_steps_are_part_of_the_kernels_identity_and_manifest(suite):
    program = suite.kernels[0]
    swapped = dataclasses.replace(program, launch=Steps(tuple(reversed(program.steps))))
    assert build_identity(swapped) != build_identity(program)
    manifest = suite_manifest(suite)["kernels"]["row_sums_split"]
    assert [s["entry"] for s in manifest["launch"]["steps"]] == ["row_partials", "row_finish"]


def test_existing_suites_keep_their_manifests_without_steps():
    for name in ("softmax", "matmul", "fir"):
        manifest = suite_manifest(load_suite(EXAMPLES / name / "cudagate.yaml"))
        assert all("steps" not in k["launch"] for k in manifest["kernels"].values())


def test_the_worker_refuses_a_step_of_an_entry_the_kernel_does_not_compile(suite, tmp_path):
    request = run_request(suite, suite.kernels[0], [suite.case("correct_5x3000")], output_dir=tmp_path)
    request["cases"][0]["launch"][0]["args"] = ["x", "x"]
    assert request_problems(request) == ["case 'correct_5x3000': step 1: args must name signature parameters, each once"]
    request["cases"][0]["launch"][1]["entry"] = "elsewhere"
    assert "the kernel's `entries` must be the steps' entries" in request_problems(request)[0]
    request["kernel"]["entries"] = ["row_partials", "elsewhere"] + [f"e{i}" for i in range(5000)]
    assert "the kernel's `entries` must be the steps' entries" in request_problems(request)[0]  # nothing more compiled


STEPS = YAML[YAML.index("    steps:\n"):YAML.index("\ncases:")]

# name: (old text, new text, what the problem says, the text on the line it names)
BAD = {
    "zero steps": (STEPS, "    steps: []\n", "kernels[0].steps: [] should be non-empty", "steps: []"),
    "launch and steps": ("    steps:\n", "    launch: {grid: [1], block: [1]}\n    steps:\n", "either `launch`",
                         "- name: row_sums_split"),
    "unknown parameter": ("args: [x, partials, rows, cols]", "args: [x, partial, rows, cols]",
                          "'partial' is not a parameter of the signature", "args: [x, partial, rows, cols]"),
    "unknown entry": ("entry: row_finish", "entry: row_final", "'row_final' is not defined in split_reduce.cu",
                      "entry: row_final"),
    "unresolved launch": ('grid: ["cdiv(rows, 128)"]', 'grid: ["cdiv(rowz, 128)"]',
                          "'cdiv(rowz, 128)' uses rowz, which is not a scalar parameter", "cdiv(rowz, 128)"),
    "output taken by no step": ("args: [partials, y, rows, cols]", "args: [partials, rows, cols]",
                                "output buffer 'y' is written by no step", "- entry: row_partials"),
    "scratch in tolerance": ("  y: {atol: 2.0e-3, rtol: 1.0e-5, nan: fail}",
                             "  y: {atol: 2.0e-3, rtol: 1.0e-5, nan: fail}\n  partials: {atol: 0}",
                             "'partials' is a scratch buffer: the kernel's own workspace is never compared",
                             "partials: {atol: 0}"),
    "scratch in inputs": ("  x: {distribution: uniform, low: -1, high: 1}",
                          "  x: {distribution: uniform, low: -1, high: 1}\n  partials: {distribution: normal}",
                          "'partials' is a scratch buffer: it is poisoned before every run, never drawn",
                          "partials: {distribution: normal}"),
    "overrides with steps": ("    source: split_reduce.cu\n",
                             "    source: split_reduce.cu\n    launch_overrides: {correct_300x1: {grid: [1], block: [1]}}\n",
                             "not with `steps`", "launch_overrides:"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_a_bad_stepped_suite_is_refused_with_its_line_and_field(tmp_path, name):
    old, new, says, on_line = BAD[name]
    folder = tmp_path / "s"
    shutil.copytree(EXAMPLES / "split_reduce", folder)
    text = replace_once(YAML, old, new)
    (folder / "cudagate.yaml").write_text(text, encoding="utf-8")
    with pytest.raises(FileError) as caught:
        load_suite(folder / "cudagate.yaml")
    problem = next((p for p in caught.value.problems if says in p), None)
    assert problem is not None, caught.value.problems
    assert problem.startswith(f"line {line_of(text, on_line)}: "), problem


def test_optimize_refuses_a_kernel_of_steps_in_one_line(capsys):
    from pytest_cudagate.cli import main

    assert main(["optimize", str(EXAMPLES / "split_reduce"), "row_sums_split", "--proposer", "autotune"]) == 2
    assert "kernel 'row_sums_split' is 2 steps; cudagate optimize searches single-launch kernels" in capsys.readouterr().err
