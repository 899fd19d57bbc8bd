"""Kernels nobody here wrote, on a real GPU (issue 42's acceptance): every version of the public projects
under tests/public/ gets the verdict its code deserves on the correctness cases (every defence on; the
performance cases' latencies are benchmarks/public_kernels.py's). The correct versions pass every case; each
version with a known bug (PROVENANCE.md of its project says where it was found) fails the case that
reaches the bug, with a message that names the bug's class."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.session import open_worker
from pytest_cudagate.suite.loader import load_suite

pytestmark = pytest.mark.gpu

PUBLIC = Path(__file__).resolve().parents[1] / "public"
SUITES = sorted(path.parent for path in PUBLIC.rglob("cudagate.yaml"))

# The words of each bug class in the gate's messages: a guard zone, memcheck or the fault itself for a
# write (or read) out of bounds; the fault or memcheck for a misaligned vector access; the poison left in
# an output; racecheck, or the wrong values a race left.
OUT_OF_BOUNDS = r"wrote past the end of buffer|out-of-bounds or misaligned access|CUDA_ERROR_ILLEGAL_ADDRESS"
MISALIGNED = r"CUDA_ERROR_MISALIGNED_ADDRESS|out-of-bounds or misaligned access"
UNWRITTEN = r"were never written by the kernel"
RACE = r"shared-memory race|elements outside tolerance"

PARTIAL_TILE = "correct_136x136x136"
# (suite, kernel, case) -> the class its failure must name; every other kernel and case must pass.
BUGS = {
    **{("sgemm_cuda", kernel, PARTIAL_TILE): OUT_OF_BOUNDS for kernel in (
        "k03_smem_caching", "k04_1d_blocktiling", "k05_2d_blocktiling", "k06_vectorize",
        "k07_bank_conflicts_linearize", "k08_bank_conflicts_offset", "k09_autotuning", "k10_warptiling",
        "k11_double_buffering", "k12_double_buffering2")},
    ("llm_c_layernorm_forward", "v2", "correct_3x5x100"): r"wrote past the end of buffer 'out'|" + OUT_OF_BOUNDS,
    ("llm_c_layernorm_forward", "v2", "correct_2x5x99"): r"wrote past the end of buffer 'out'|" + OUT_OF_BOUNDS,
    ("llm_c_layernorm_forward", "v6", "correct_2x5x99"): MISALIGNED,
    ("llm_c_softmax_forward", "v8_online8", "correct_33x40"): UNWRITTEN,
    ("llm_c_softmax_forward", "v7", "correct_33x40"): RACE,
    ("llm_c_softmax_forward", "v4", "correct_33x40"): RACE,
    # racecheck reports hazards inside cooperative_groups' multi-warp tile reduce (PROVENANCE.md)
    ("cuda_samples_reduce_grid_stride", "multi_warp_cg_reduce", "correct_1001"): r"compute-sanitizer racecheck: \d+ error",
}


@pytest.fixture(scope="module")
def worker():
    with open_worker(timeout_s=120) as opened:
        yield opened


@pytest.fixture(scope="module")
def replayed(worker, tmp_path_factory):
    """Each public suite's outcomes, every kernel on every case, replayed through the gate the first time
    a test asks for the suite (so `-k SUITE` runs one suite)."""
    tmp = tmp_path_factory.mktemp("public")
    found: dict[str, dict] = {}

    def suite_outcomes(name: str) -> dict:
        if name not in found:
            folder = next(f for f in SUITES if load_suite(f / "cudagate.yaml").name == name)
            copy = tmp / folder.relative_to(PUBLIC)
            shutil.copytree(folder, copy)
            suite = load_suite(copy / "cudagate.yaml")
            gate = Gate(worker.client, worker.fingerprint, GateOptions(), tmp / "out")
            ledger = Ledger.for_suite(suite)
            found[name] = {(p.name, c.name): gate.replay(suite, p, c, ledger)
                           for p in suite.kernels for c in suite.cases if c.kind == "correctness"}
        return found[name]
    return suite_outcomes


def every_item():
    for folder in SUITES:
        suite = load_suite(folder / "cudagate.yaml")
        for program in suite.kernels:
            for case in suite.cases:
                if case.kind == "correctness":  # latencies and their order: benchmarks/public_kernels.py
                    yield suite.name, program.name, case.name


def test_every_known_bug_is_reached_by_a_case():
    assert set(BUGS) <= set(every_item())


@pytest.mark.parametrize("item", list(every_item()), ids="::".join)
def test_each_version_gets_the_verdict_its_code_deserves(replayed, item):
    outcome = replayed(item[0])[item[1:]]
    bug = BUGS.get(item)
    if bug is None:
        assert not outcome.failed, outcome.message
        assert outcome.correctness is not None and outcome.correctness.passed, outcome.message
    else:
        assert outcome.failed, f"{'::'.join(item)} has a known bug and passed: {outcome.message or outcome.warning}"
        assert re.search(bug, outcome.message), outcome.message
