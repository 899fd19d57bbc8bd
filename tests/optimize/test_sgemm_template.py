"""The matmul example's SGEMM template (examples/matmul/sgemm.cu, the kernel's tuning_source): every part
of the space the autotune proposer may propose compiles to an sm_90 cubin that can be launched as declared.

The space has 6692 feasible points; compiling all of them takes many minutes, so this compiles its corners
(every tunable at its smallest or largest value) and a fixed sample of 50 more. Each point is its own NVRTC
compile (seconds of CPU), so only the two extreme corners run in the fast developer run; the rest are `slow`.
Correctness and speed on a GPU: tests/gpu/test_optimize_gpu.py and benchmarks/optimize_matmul.py --template."""

from __future__ import annotations

import itertools
import random

import pytest

from helpers import EXAMPLES
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.build import compile_program

MATMUL = EXAMPLES / "matmul" / "cudagate.yaml"
REGISTERS_PER_SM = 65536
SAMPLE = 50


def proposer() -> AutotuneProposer:
    suite = load_suite(MATMUL)
    return AutotuneProposer(suite, suite.kernel("matmul_f32"), [c for c in suite.cases if not c.holdout])


# One proposer for the module: it memoises its candidates, which every parametrisation and its id would
# otherwise rebuild, and the feasible set (seconds to enumerate) the space's test reads.
TUNER = proposer()


def points() -> list:
    """The feasible corners and a seeded sample of the other feasible points. The sample is drawn from
    the whole space in a seeded order, keeping the first SAMPLE feasible points: the feasible set itself
    takes seconds to enumerate, which every collection (each xdist worker's) would pay."""
    corners = [p for p in itertools.product(*[(min(a), max(a)) for a in TUNER.axes]) if TUNER.candidate(p)]
    space = list(itertools.product(*TUNER.axes))
    random.Random(16).shuffle(space)
    rest = list(itertools.islice((p for p in space if p not in corners and TUNER.candidate(p)), SAMPLE))
    extremes = {corners[0], corners[-1]}  # the first and last feasible corners: the smallest tile, the largest
    return [pytest.param(p, marks=() if p in extremes else pytest.mark.slow) for p in corners + rest]


def label(point: tuple) -> str:
    return "-".join(f"{n}{v}" for n, v in zip(TUNER.names, point))


POINTS = points()


def test_the_space_holds_the_fast_sgemm_shapes():
    feasible = [dict(zip(TUNER.names, p)) for p in TUNER.feasible()]
    assert {"BM": 128, "BN": 128, "TM": 8, "TN": 8} in [{k: d[k] for k in ("BM", "BN", "TM", "TN")} for d in feasible]
    assert {(d["TM"], d["TN"]) for d in feasible} >= {(4, 4), (4, 8), (8, 4), (8, 8)}
    assert {d["BM"] for d in feasible} >= {64, 128} and {d["PAD"] for d in feasible} == {0, 4}
    points = [p.values[0] for p in POINTS]
    assert len(points) >= SAMPLE + 40 and len(set(points)) == len(points)


@pytest.mark.parametrize("point", POINTS, ids=label)
def test_every_sampled_point_compiles_for_sm_90_and_fits_its_launch(point):
    candidate = TUNER.candidate(point)
    assert candidate is not None
    kernel = TUNER.program
    result = compile_program(candidate.program(kernel), "sm_90", candidate.text)
    assert result.ok, result.log
    assert result.cubin[:4] == b"\x7fELF" and result.arch == "sm_90"
    resources = result.resources
    values = dict(zip(TUNER.names, point))
    threads = (values["BM"] // values["TM"]) * (values["BN"] // values["TN"]) * values["SK"]
    # Before STAGES and SK (834 points, compiled in full once), none spilled more than 8 bytes (4 points: 80
    # registers and an 8-byte stack slot, a ptxas choice). A tile that needs a stack is a bug, unless the
    # block's threads leave each fewer registers than its tile of C plus the ~40 a thread needs besides
    # (addresses, operands): e.g. a 4×8 tile in a block of 1024 threads, which gets 64 registers each.
    if threads * (values["TM"] * values["TN"] + 40) <= REGISTERS_PER_SM:
        assert resources.get("spill_store_bytes", 0) <= 8 and resources.get("stack_frame_bytes", 0) <= 8, resources
    for case in TUNER.visible:
        launch = candidate.launch.resolve(case.scalars)
        assert launch["block"][0] * launch["block"][1] * launch["block"][2] == threads
        assert threads * resources["registers"] <= REGISTERS_PER_SM  # the block can be resident at all
        tiles = values["SK"] * values["STAGES"] * values["BK"] * (values["BM"] + values["PAD"] + values["BN"])
        assert launch["shared_bytes"] == max(tiles, (values["SK"] - 1) * values["BM"] * values["BN"]) * 4
