"""Tunables in suite files, the autotune proposer, and the matmul example's register-blocked variant."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
import shutil

import numpy as np

import pytest

from helpers import EXAMPLES, SUITE_YAML, replace_once, write_suite
from optimize_fakes import OPT_SUITE_YAML, FakeEvaluator, opt_suite
from pytest_cudagate.cli import main as cli_main
from pytest_cudagate.errors import FileError
from pytest_cudagate.optimize.candidate import Candidate, include_problems
from pytest_cudagate.optimize.proposers import ProposerExhausted, RoundContext
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Launch
from test_loop import assert_pack_valid, optimize, parse
from pytest_cudagate.optimize.cli import run_optimize
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


def test_the_matmul_example_keeps_its_signed_launch_and_tunes_the_sgemm_template():
    suite = load_suite(MATMUL)
    kernel = suite.kernel("matmul_f32")
    assert kernel.launch == Launch(("cdiv(n, 16)", "cdiv(m, 16)"), ("16", "16"), "0")
    assert kernel.source.name == "matmul.cu" and kernel.tuning_source == MATMUL.parent / "sgemm.cu"
    assert set(kernel.tunables) == {"BM", "BN", "BK", "TM", "TN", "PAD", "STAGES", "SK"}
    assert kernel.tuning_launch.grid == ("cdiv(n, BN)", "cdiv(m, BM)")
    assert kernel.tuning_launch.shared_bytes == "max(SK * STAGES * BK * (BM + PAD + BN), (SK - 1) * BM * BN) * 4"
    assert gate_problems(suite, None, None) == []  # `cudagate verify` stays OK: tuning fields are not signed


@pytest.mark.slow
def test_autotune_candidates_come_from_the_tuning_source_and_the_gate_builds_them_as_the_kernel():
    suite = load_suite(MATMUL)
    kernel = suite.kernel("matmul_f32")
    proposer = AutotuneProposer(suite, kernel, [c for c in suite.cases if not c.holdout])
    (first,) = proposer.propose(RoundContext(1, 7, None, None, []))[:1]
    template = (MATMUL.parent / "sgemm.cu").read_text()
    assert first.text.endswith(template) and "MATMUL_RB" not in first.text
    assert first.defines == {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "PAD": 4, "STAGES": 2, "SK": 1}
    built = first.program(kernel)  # what the evaluator and the gate compile: the candidate's text as the kernel
    assert built.source == kernel.source and built.tuning_source is None and built.tunables == {}
    assert static_problems(first, suite, kernel, proposer.visible, own_source=True) == []
    assert proposer.describe()["source"] == "sgemm.cu"


@pytest.mark.parametrize("edit, message", [
    ("    tuning_source: missing.cu\n", "kernels[0].tuning_source: file 'missing.cu' not found next to the suite"),
    ("    tuning_source: ../outside.cu\n", "kernels[0].tuning_source: '../outside.cu' lies outside the suite folder"),
    ("    tuning_source: other.cu\n", "other.cu does not define the kernel's entry 'scale2'"),
    ("    tuning_source: [a.cu]\n", "tuning_source"),
    ("    tuning_source: sub/t.cu\n", "sub/t.cu is not in the folder of source"),
])
def test_a_bad_tuning_source_is_reported_with_the_field_and_the_fix(tmp_path, capsys, edit, message):
    yaml_text = replace_once(OPT_SUITE_YAML, "    tunables: {BLOCK:", edit + "    tunables: {BLOCK:")
    path = write_suite(tmp_path / "s", yaml_text=yaml_text, data=False)
    (path.parent / "other.cu").write_text('extern "C" __global__ void scale3(const float* x, float* y, int rows, int cols) {}\n')
    (tmp_path / "outside.cu").write_text("// not the suite's\n")
    (path.parent / "sub").mkdir()
    (path.parent / "sub" / "t.cu").write_text('extern "C" __global__ void scale2(const float* x, float* y, int rows, int cols) {}\n')
    with pytest.raises(FileError, match=re.escape(message)):
        load_suite(path)
    assert cli_main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path.name) in err and "tuning_source" in err


def test_tuning_source_needs_tunables(tmp_path):
    yaml_text = replace_once(SUITE_YAML, "    launch: {grid: [rows], block: [128]}\n",
                             "    launch: {grid: [rows], block: [128]}\n    tuning_source: kernel.cu\n")
    path = write_suite(tmp_path / "s", yaml_text=yaml_text, data=False)
    with pytest.raises(FileError, match=r"kernels\[0\]\.tuning_source: tuning_source needs tunables"):
        load_suite(path)


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


# -- the proposer ---------------------------------------------------------------------------------------

class _Attempt:
    """A measured attempt as the proposer reads it: one latency for every performance case
    (``per_case``: a latency per case name instead)."""

    def __init__(self, candidate, geomean, per_case: dict[str, float] | None = None):
        self.candidate, self.passed = candidate, geomean is not None or bool(per_case)
        self.anchored = per_case or {c: geomean for c in PERF_CASES} if self.passed else {}
        self.geomean_ms = (math.exp(sum(math.log(v) for v in per_case.values()) / len(per_case)) if per_case
                           else geomean)


PERF_CASES = ("perf_256x256x256", "perf_384x256x320", "large_2048x2048x2048", "perf", "perf2")


def sgemm_landscape(defines: dict) -> float:
    """A synthetic latency (ms) of the SGEMM template at 2048³ on a 132-SM GPU: shared-memory reads per
    FMA fall with the register tile, global traffic with the block tile; occupancy (registers, shared
    memory, threads), the last wave's idle SMs, bank conflicts without padding and BK's barrier count
    interact; more pipeline stages hide more memory latency but take shared memory. Its optimum is not the
    suite's default point."""
    bm, bn, bk, tm, tn, pad = (defines[n] for n in ("BM", "BN", "BK", "TM", "TN", "PAD"))
    stages, sk = defines.get("STAGES", 2), defines.get("SK", 1)
    threads = bm * bn // (tm * tn) * sk
    registers = threads * (tm * tn + 2 * (tm + tn) + 24)
    per_sm = min(65536 // registers, 232448 // (max(sk * stages * bk * (bm + pad + bn), (sk - 1) * bm * bn) * 4),
                 2048 // threads, 32)
    if per_sm == 0:
        return 50.0
    blocks = math.ceil(2048 / bm) * math.ceil(2048 / bn)
    waves = math.ceil(blocks / (132 * per_sm))
    busy = blocks / (waves * 132 * per_sm)
    occupancy = min(1.0, per_sm * threads / 32 / 16)
    reuse = min(1.0, tm * tn / (tm + tn) / 4)
    traffic = 1 + 8 * (1 / bm + 1 / bn)
    return (0.43 * traffic * (1.0 if pad else 1.08) * {8: 1.06, 16: 1.0, 32: 1.03}[bk]
            * (1.1 if threads < 64 else 1.0) * {2: 1.0, 3: 0.97, 4: 0.96}[stages] / (reuse * occupancy * busy))


def rugged_landscape(seed: int, axes: dict):
    """Random log-normal main effects and pairwise interactions over ``axes``: optimum anywhere."""
    rng = np.random.default_rng(seed)
    names = list(axes)
    main = {(n, v): rng.normal(0, 0.4) for n in names for v in sorted(axes[n])}
    pairs = {(a, x, b, y): rng.normal(0, 0.15) for a, b in itertools.combinations(names, 2)
             for x in sorted(axes[a]) for y in sorted(axes[b])}
    return lambda d: math.exp(sum(main[(n, d[n])] for n in names)
                              + sum(pairs[(a, d[a], b, d[b])] for a, b in itertools.combinations(names, 2)))


def search(proposer: AutotuneProposer, latency, rounds: int = 7) -> list[float]:
    """The best latency after each round, the proposer fed ``latency`` of what it proposed."""
    history, best, trace = [], math.inf, []
    for number in range(1, rounds + 1):
        try:
            batch = proposer.propose(RoundContext(number, rounds, None, None, list(history)))
        except ProposerExhausted:
            break
        for candidate in batch:
            history.append(_Attempt(candidate, latency(candidate.defines)))
            best = min(best, history[-1].geomean_ms)
        trace.append(best)
    return trace


def matmul_proposer(seed: int = 0, batch: int = 8, *, smallest_first: bool = True,
                    axes: tuple[str, ...] | None = None) -> AutotuneProposer:
    """The autotune proposer of the matmul example; ``smallest_first``: it starts from the smallest tiles;
    ``axes``: only these tunables are searched (the others keep their defaults)."""
    suite = load_suite(MATMUL)
    kernel = suite.kernel("matmul_f32")
    tunables = {n: v if axes is None or n in axes else v[:1] for n, v in kernel.tunables.items()}
    if smallest_first:
        tunables = {n: tuple(sorted(v)) for n, v in tunables.items()}
    kernel = dataclasses.replace(kernel, tunables=tunables)
    return AutotuneProposer(suite, kernel, [c for c in suite.cases if not c.holdout], batch=batch, seed=seed)


@pytest.mark.slow
def test_round_one_is_the_default_and_a_broad_feasible_sample():
    proposer = matmul_proposer(seed=3, smallest_first=False)
    assert proposer.size == 4 * 4 * 3 * 3 * 3 * 2 * 3 * 3 and len(proposer.feasible()) == 6692
    reasons = [why for why in proposer.skipped.values()]  # over 1024 threads, or over 227 KiB of shared memory
    assert all("threads; at most 1024" in why or "shared_bytes" in why for why in reasons)
    assert sum("shared_bytes" in why for why in reasons) == 130
    first = proposer.propose(RoundContext(1, 7, None, None, []))
    assert len(first) == 8 and len({c.key() for c in first}) == 8
    assert first[0].defines == {"BM": 128, "BN": 128, "BK": 8, "TM": 8, "TN": 8, "PAD": 4, "STAGES": 2, "SK": 1}
    for name, values in proposer.program.tunables.items():  # spread: both ends of every axis
        chosen = {c.defines[name] for c in first}
        assert {min(values), max(values)} <= chosen, (name, chosen)
    for candidate in first:
        for case in proposer.visible:
            launch = candidate.launch.resolve(case.scalars)
            assert launch["block"][0] * launch["block"][1] * launch["block"][2] <= 1024
            assert launch["shared_bytes"] <= 227 * 1024


@pytest.mark.slow
def test_the_search_is_deterministic_under_its_seed():
    def run(seed):
        proposer = matmul_proposer(seed)
        search(proposer, sgemm_landscape)
        return sorted(proposer.seen)

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_later_rounds_refine_around_the_best_points():
    proposer = matmul_proposer(seed=0)
    first = proposer.propose(RoundContext(1, 7, None, None, []))
    history = [_Attempt(c, sgemm_landscape(c.defines)) for c in first]
    history[1].passed, history[1].geomean_ms, history[1].anchored = False, None, {}  # never an elite point
    second = proposer.propose(RoundContext(2, 7, None, None, history))
    elite = sorted((a for a in history if a.passed), key=lambda a: a.geomean_ms)[:4]
    near = [c for c in second if any(sum(c.defines[n] != a.candidate.defines[n] for n in proposer.names) <= 2
                                     or all(c.defines[n] in (e.candidate.defines[n], a.candidate.defines[n])
                                            for n in proposer.names) for a in elite for e in elite)]
    assert len(proposer.classes) == 2  # small and large: each class's share of the batch explores one far point
    assert len(near) >= len(second) - len(proposer.classes)
    assert not {c.key() for c in second} & {c.key() for c in first}


@pytest.mark.parametrize("seed", [0, *[pytest.param(seed, marks=pytest.mark.slow) for seed in (1, 2)]])  # CI: three landscapes
def test_autotune_finds_the_optimum_of_an_sgemm_like_landscape_within_seven_rounds(seed):
    """At the README's batch of 16: 112 of 6692 feasible points measured. Over 8 tunables the search ends
    within 6 % of the optimum (seeds 0-4: 1.01, 1.056, 1.056, 1.056, 1.0); over the 6 it had before STAGES
    and SK (834 points), batch 8 reached it within 5 %."""
    proposer = matmul_proposer(seed, batch=16)
    optimum = min(sgemm_landscape(dict(zip(proposer.names, p))) for p in proposer.feasible())
    trace = search(proposer, sgemm_landscape)
    assert len(trace) == 7 and trace[-1] <= 1.06 * optimum, [t / optimum for t in trace]
    assert len(proposer.seen) <= 7 * 16


@pytest.mark.slow
def test_autotune_beats_the_neighbour_walk_it_replaced_on_rugged_landscapes():
    """21 landscapes × 3 seeds, batch 8, 7 rounds, from the smallest tiles. The neighbour-plus-random walk
    this strategy replaced came within 5% of the optimum in 54% of the runs, its geometric-mean distance
    from the optimum 1.24× (measured with the proposer of commit 76bd0a1 on these landscapes). Both over the
    space of that commit, without STAGES."""
    space = ("BM", "BN", "BK", "TM", "TN", "PAD")
    axes = {n: v for n, v in matmul_proposer(axes=space).program.tunables.items() if n in space}
    landscapes = [sgemm_landscape] + [rugged_landscape(seed, axes) for seed in range(20)]
    gaps = []
    for latency in landscapes:
        optimum = min(latency(dict(zip(axes, p))) for p in matmul_proposer(axes=space).feasible())
        for seed in range(3):
            gaps.append(search(matmul_proposer(seed, axes=space), latency)[-1] / optimum)
    close = sum(g <= 1.05 for g in gaps) / len(gaps)
    typical = math.exp(sum(math.log(g) for g in gaps) / len(gaps))
    assert close >= 0.70 and typical <= 1.10, (close, typical)


# Slow: ~110 candidates each compiled by NVRTC. The fast run keeps the rule: the landscape's optimum within seven
# rounds (test_autotune_finds_the_optimum_...) and the loop through the fake harness (..._end_to_end_...).
@pytest.mark.slow
def test_seven_rounds_of_the_optimizer_reach_the_landscape_optimum_through_the_fake_harness(tmp_path):
    """The whole loop on a copy of the matmul example that starts from the smallest tiles: every candidate
    is built from sgemm.cu and compiled by NVRTC; the fake harness answers with the SGEMM-like landscape."""
    suite_dir = tmp_path / "matmul"
    shutil.copytree(MATMUL.parent, suite_dir, ignore=shutil.ignore_patterns("proposals", "large_*"))
    yaml_path = suite_dir / "cudagate.yaml"
    text = "\n".join(line for line in yaml_path.read_text().splitlines() if "generated: true" not in line) + "\n"
    yaml_path.write_text(replace_once(
        text, "tunables: {BM: [128, 16, 32, 64], BN: [128, 16, 32, 64], BK: [8, 16, 32], TM: [8, 2, 4], "
        "TN: [8, 2, 4],\n               PAD: [4, 0], STAGES: [2, 3, 4], SK: [1, 2, 4]}",
        "tunables: {BM: [16, 32, 64, 128], BN: [16, 32, 64, 128], BK: [8, 16, 32], TM: [2, 4, 8], TN: [2, 4, 8], "
        "PAD: [0, 4], STAGES: [2, 3, 4], SK: [1, 2, 4]}"))
    tuner = AutotuneProposer(load_suite(yaml_path), load_suite(yaml_path).kernel("matmul_f32"), [])
    optimum = min(sgemm_landscape(dict(zip(tuner.names, p))) for p in itertools.product(*tuner.axes))
    evaluator = {}

    def factory(suite, program, ledger):
        evaluator["made"] = FakeEvaluator(suite, program, ledger, latency_fn=lambda c, case: (  # the initial: 20 µs
            sgemm_landscape(c.defines) / 100 if c.defines else 0.020))
        return evaluator["made"]

    results = tmp_path / "results"
    code = run_optimize(parse(yaml_path, "matmul_f32", "--proposer", "autotune", "--batch", 16, "--results", results,
                              "--quiet", "--allow-unsigned"), evaluator_factory=factory)  # the keys stay behind
    pack = sorted(results.glob("run-*"))[-1]
    summary = json.loads((pack / "summary.json").read_text())
    assert code == 0 and summary["rounds"] == 7 and summary["stop_reason"] == "max_iterations", summary["stop_detail"]
    best = summary["best"]
    assert sgemm_landscape(best["defines"]) <= 1.06 * optimum, best["defines"]  # see the test above
    assert len(evaluator["made"].evaluated) <= 1 + 7 * 16
    assert (pack / "best.cu").read_text().endswith((suite_dir / "sgemm.cu").read_text())
    assert summary["proposer"]["source"] == "sgemm.cu" and summary["proposer"]["feasible"] == 6692
    assert_pack_valid(pack)


def test_the_proposer_says_when_the_space_is_searched(tmp_path):
    suite = load_suite(opt_suite(tmp_path / "s"))
    proposer = AutotuneProposer(suite, suite.kernel("scale2"), [c for c in suite.cases if not c.holdout], batch=3)
    proposed = []
    with pytest.raises(ProposerExhausted, match="all 4 feasible points"):
        for number in range(1, 8):
            batch = proposer.propose(RoundContext(number, 7, None, None, [_Attempt(c, 1.0) for c in proposed]))
            proposed += batch
    assert sorted(c.defines["BLOCK"] for c in proposed) == [64, 128, 256, 512]


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
    assert a.key() != b.key() and a.text.endswith("#ifndef X\n#define X 1\n#endif\nsrc") and a.sha256 != b.sha256


@pytest.mark.slow
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
