"""Tunables in suite files, the autotune proposer, and the matmul example's register-blocked variant."""

from __future__ import annotations

import hashlib
import json

import pytest

from helpers import EXAMPLES, SUITE_YAML, replace_once, write_suite
from optimize_fakes import opt_suite
from pytest_cudagate.errors import FileError
from pytest_cudagate.optimize.candidate import Candidate, include_problems
from pytest_cudagate.optimize.proposers import ProposerExhausted, RoundContext
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Launch
from test_optimize_loop import assert_pack_valid, optimize
from pytest_cudagate.trust import gate_problems
from cudagate_harness.compiler import compile_kernel
from pytest_cudagate.worker.build import compile_program
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.optimize.candidate import static_problems
from pytest_cudagate.optimize.proposers.replay import load_rounds

MATMUL = EXAMPLES / "matmul" / "cudagate.yaml"


# -- the suite format ---------------------------------------------------------------------------------

def test_tunables_load_and_the_shipped_launch_gets_the_defaults(tmp_path):
    suite = load_suite(opt_suite(tmp_path / "s"))
    kernel = suite.kernel("scale2")
    assert kernel.tunables == {"BLOCK": (128, 64, 256, 512)}
    assert kernel.launch == Launch(("rows",), ("128",), "0")  # what the gate runs: the default substituted
    assert kernel.tuning_launch == Launch(("rows",), ("BLOCK",), "0")


def test_substitution_keeps_other_names_and_precedence():
    launch = Launch(("cdiv(n, BN) * BNX", "BN"), ("BN / TN",), "BN * -1 + BN")
    assert launch.with_constants({"BN": 64, "TN": -4}).to_json() == {
        "grid": ["cdiv(n, 64) * BNX", "64"], "block": ["64 / (-4)"], "shared_bytes": "64 * -1 + 64"}
    assert launch.with_constants({}) is launch


@pytest.mark.parametrize("edit, message", [
    (("    launch: {grid: [rows], block: [128]}",
      "    launch: {grid: [rows], block: [128]}\n    tunables: {rows: [1, 2]}"), "is a scalar parameter"),
    (("    launch: {grid: [rows], block: [128]}",
      "    launch: {grid: [rows], block: [128]}\n    tunables: {B: [1, 1]}"), "repeat one"),
    (("    launch: {grid: [rows], block: [128]}",
      "    launch: {grid: [rows], block: [128]}\n    tunables: {cdiv: [1, 2]}"), "expression function"),
    (("    launch: {grid: [rows], block: [128]}",
      "    launch: {grid: [rows], block: [128]}\n    tuning_launch: {grid: [rows], block: [B]}"), "needs tunables"),
    (("    launch: {grid: [rows], block: [128]}",
      "    launch: {grid: [rows], block: [B]}\n    tunables: {C: [1]}"), "uses B"),
    (("    launch: {grid: [rows], block: [128]}",
      "    launch: {grid: [rows], block: [128]}\n    tunables: {B: []}"), "tunables.B"),
])
def test_bad_tunables_are_reported(tmp_path, edit, message):
    path = write_suite(tmp_path / "s", yaml_text=replace_once(SUITE_YAML, *edit), data=False)
    with pytest.raises(FileError, match=message):
        load_suite(path)


def test_the_matmul_example_keeps_its_signed_launch_and_signature():
    suite = load_suite(MATMUL)
    kernel = suite.kernel("matmul_f32")
    assert kernel.launch == Launch(("cdiv(n, 16)", "cdiv(m, 16)"), ("16", "16"), "0")
    assert set(kernel.tunables) == {"MATMUL_RB", "BM", "BN", "BK", "TM", "TN", "STAGES"}
    assert kernel.tuning_launch.grid == ("cdiv(n, BN)", "cdiv(m, BM)")
    assert kernel.tuning_launch.shared_bytes == "STAGES * BK * (BM + 1 + BN) * 4"
    assert gate_problems(suite, None, None) == []  # `cudagate verify` stays OK


def test_the_shipped_matmul_kernel_compiles_to_the_approved_binary():
    """matmul.cu gained a -DMATMUL_RB=1 variant; without the define it is the kernel approved before that
    (kept in the ledger's history), bit for bit."""
    ledger = json.loads((EXAMPLES / "matmul" / "cudagate.approvals.json").read_text())
    earlier = [entry for entry in ledger["history"] if entry["kernel"] == "matmul_f32"]
    approved = (EXAMPLES / "matmul" / earlier[0]["source_blob"]).read_text()
    current = (EXAMPLES / "matmul" / "matmul.cu").read_text()
    assert approved != current
    binaries = [compile_kernel(text, entry="matmul_f32", arch="sm_90", source_name="examples/matmul/matmul.cu",
                               use_cache=False) for text in (approved, current)]
    assert all(b.ok for b in binaries)
    assert hashlib.sha256(binaries[0].cubin).hexdigest() == hashlib.sha256(binaries[1].cubin).hexdigest()


@pytest.mark.parametrize("point", [
    {"BM": 32, "BN": 32, "BK": 32, "TM": 2, "TN": 2, "STAGES": 4},
    {"BM": 16, "BN": 16, "BK": 32, "TM": 1, "TN": 1, "STAGES": 6},
    {"BM": 64, "BN": 32, "BK": 64, "TM": 4, "TN": 2, "STAGES": 2},
    {"BM": 64, "BN": 64, "BK": 16, "TM": 4, "TN": 4, "STAGES": 3},
])
def test_register_blocked_variants_compile(point):
    suite = load_suite(MATMUL)
    kernel = suite.kernel("matmul_f32")
    proposer = AutotuneProposer(suite, kernel, [c for c in suite.cases if not c.holdout])
    candidate = proposer.candidate(tuple({"MATMUL_RB": 1, **point}[n] for n in proposer.names))
    assert candidate is not None
    result = compile_program(candidate.program(kernel), "sm_90", candidate.text)
    assert result.ok, result.log
    assert result.resources.get("spill_store_bytes", 0) == 0
    launch = candidate.launch.resolve({"m": 256, "n": 256, "k": 256})
    assert launch["grid"] == [256 // point["BN"], 256 // point["BM"], 1]
    assert launch["block"] == [point["BN"] // point["TN"], point["BM"] // point["TM"], 1]
    assert launch["shared_bytes"] == point["STAGES"] * point["BK"] * (point["BM"] + 1 + point["BN"]) * 4
    assert candidate.text.startswith("// cudagate optimize --proposer autotune") and "#define MATMUL_RB 1" in candidate.text


# -- the proposer ---------------------------------------------------------------------------------------

class _Attempt:
    def __init__(self, candidate, geomean):
        self.candidate, self.geomean_ms, self.passed = candidate, geomean, geomean is not None


def test_autotune_walks_from_the_defaults_to_the_best_neighbours():
    suite = load_suite(MATMUL)
    kernel = suite.kernel("matmul_f32")
    proposer = AutotuneProposer(suite, kernel, [c for c in suite.cases if not c.holdout], batch=4, seed=1)
    assert proposer.size == 3 ** 5 * 4
    first = proposer.propose(RoundContext(1, 7, None, None, []))
    assert first[0].defines == {"MATMUL_RB": 1, "BM": 32, "BN": 16, "BK": 32, "TM": 2, "TN": 1, "STAGES": 4}
    assert len(first) == 4 and len({c.key() for c in first}) == 4
    for cand in first[1:]:  # neighbours: one tunable moved one step
        assert sum(cand.defines[n] != first[0].defines[n] for n in cand.defines) == 1
    history = [_Attempt(c, g) for c, g in zip(first, [10.0, 8.0, None, 12.0])]
    second = proposer.propose(RoundContext(2, 7, None, None, history))
    best = first[1].defines
    assert sum(sum(c.defines[n] != best[n] for n in best) == 1 for c in second) >= 2  # around the best point
    seen = {c.key() for c in first + second}
    while True:
        try:
            batch = proposer.propose(RoundContext(3, 7, None, None, []))
        except ProposerExhausted as exc:
            assert "972 points" in str(exc)
            break
        assert not seen & {c.key() for c in batch}
        seen |= {c.key() for c in batch}
    assert proposer.skipped and len(seen) + len(proposer.skipped) == 972  # skipped: over 1024 threads a block
    assert all("threads" in why for why in proposer.skipped.values())


def test_autotune_needs_tunables(tmp_path):
    suite = load_suite(write_suite(tmp_path / "s"))
    with pytest.raises(CudagateError, match="declares no tunables"):
        AutotuneProposer(suite, suite.kernel("scale2"), [])


def test_autotune_end_to_end_with_the_fake_harness(tmp_path):
    suite = opt_suite(tmp_path / "scale")
    timing = {128: 0.020, 64: 0.016, 256: 0.012, 512: 0.018}

    def latency(candidate, case):
        return timing[candidate.defines["BLOCK"]] if candidate.defines else 0.020

    code, pack, summary, history, evaluator = optimize(tmp_path, suite, "--proposer", "autotune", "--batch", 2,
                                                       evaluator={"latency_fn": latency})
    assert code == 0 and summary["stop_reason"] == "proposer_exhausted"
    assert summary["best"]["defines"] == {"BLOCK": 256} and summary["best"]["launch"]["block"] == ["256"]
    assert "#define BLOCK 256" in (pack / "best.cu").read_text()
    labels = [a["label"] for a in history["attempts"]]
    assert labels[:2] == ["initial kernel", "BLOCK=128"]
    assert len(labels) == 5 and summary["proposer"]["kind"] == "autotune" and summary["proposer"]["space"] == 4
    assert_pack_valid(pack)


# -- includes -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line, ok", [
    ("#include <cuda_fp16.h>", True),
    ("  #  include <mma.h> // tensor cores", True),
    ('#include "common.cuh"', True),
    ('#include "../cases/perf/expected/c.npy"', False),
    ('#include "/etc/passwd"', False),
    ("#include </etc/passwd>", False),
    ("#include <stdio.h>", False),
    ("%:include <cuda_fp16.h>", True),
    ("%:include </root/.ssh/id_rsa>", False),
    ("#/**/include \"cudagate.yaml\"", False),
    ("#include_next <cuda_fp16.h>", False),
    ("#define F \"x.h\"\n#include F", False),
    ("#import <x>", False),
    ("#embed \"data.bin\"", False),
    ("#inc\\\nlude </etc/hosts>", False),
])
def test_includes_are_limited(line, ok):
    assert (include_problems(line + "\n", {"common.cuh"}) == []) is ok


def test_candidate_key_and_text():
    a = Candidate("src", Launch(("1",), ("32",)), defines={"X": 1})
    b = Candidate("src", Launch(("1",), ("32",)), defines={"X": 2})
    assert a.key() != b.key() and a.text.endswith("#define X 1\nsrc") and a.sha256 != b.sha256


def test_the_recorded_matmul_proposals_pass_the_static_checks_and_compile():
    suite = load_suite(MATMUL)
    kernel = suite.kernel("matmul_f32")
    rounds = load_rounds(EXAMPLES / "matmul" / "proposals")
    labels = [r[0].label for r in rounds]
    assert len(rounds) == 5 and all(len(r) == 1 for r in rounds)
    assert labels[0].startswith("naive") and labels[2].startswith("PLANTED wrong") and labels[3].startswith("PLANTED overfit")
    for (candidate,) in rounds:
        assert static_problems(candidate, suite, kernel, [c for c in suite.cases if not c.holdout]) == []
        result = compile_program(candidate.program(kernel), "sm_90", candidate.text)
        assert result.ok, (candidate.label, result.log)
