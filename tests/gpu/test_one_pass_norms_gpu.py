"""On a GPU: an honest one-pass float32 LayerNorm passes the default adversarial fresh inputs, and a
kernel fitted to the value domain the signed cases show still fails them (issue 44, item 5).

The CPU twin, tests/defences/test_one_pass_norms.py, judges NumPy stand-ins on the simulated GPU; here the same
suite is gated with real kernels, compiled by NVRTC and replayed by the real worker under several
fresh seeds.
"""

from __future__ import annotations

import pytest

from helpers import replace_once
from test_one_pass_norms import LAYERNORM_YAML, suite_at

from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.session import open_worker
from pytest_cudagate.trust.approvals import Ledger

pytestmark = pytest.mark.gpu

SEEDS = (1, 2, 3)

# One block per row. one_pass: sums of x and x² in float32, variance E[x²] − mean² (the H100 kernels of
# the issue). clips: clips x to ±1000, which the signed inputs (|x| of a few units) never reach, then a
# two-pass variance: right on the signed and resampled inputs, wrong on rows with large values.
LAYERNORM_CU = r"""
template <bool Clip>
__device__ void layernorm(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    __shared__ float part[2][256];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const float* row = x + (size_t)r * cols;
    float s = 0.f, q = 0.f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = Clip ? fminf(fmaxf(row[c], -1000.f), 1000.f) : row[c];
        s += v;
        q += v * v;
    }
    part[0][threadIdx.x] = s;
    part[1][threadIdx.x] = q;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if (threadIdx.x < half) {
            part[0][threadIdx.x] += part[0][threadIdx.x + half];
            part[1][threadIdx.x] += part[1][threadIdx.x + half];
        }
        __syncthreads();
    }
    const float mean = part[0][0] / cols;
    float var = part[1][0] / cols - mean * mean;
    if (Clip) {
        __syncthreads();
        float d = 0.f;
        for (int c = threadIdx.x; c < cols; c += blockDim.x) {
            const float v = fminf(fmaxf(row[c], -1000.f), 1000.f) - mean;
            d += v * v;
        }
        part[0][threadIdx.x] = d;
        __syncthreads();
        for (int half = blockDim.x / 2; half > 0; half /= 2) {
            if (threadIdx.x < half) part[0][threadIdx.x] += part[0][threadIdx.x + half];
            __syncthreads();
        }
        var = part[0][0] / cols;
    }
    const float inv = rsqrtf(var + 1e-5f);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float v = Clip ? fminf(fmaxf(row[c], -1000.f), 1000.f) : row[c];
        y[(size_t)r * cols + c] = (v - mean) * inv;
    }
}

extern "C" __global__ void one_pass(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    layernorm<false>(x, y, rows, cols);
}

extern "C" __global__ void clips(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    layernorm<true>(x, y, rows, cols);
}
"""

KERNELS = """\
  - name: one_pass
    source: layernorm.cu
    launch: {grid: [rows], block: [256]}
  - name: clips
    source: layernorm.cu
    launch: {grid: [rows], block: [256]}
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Every kernel on every case under each seed: {(seed, kernel, case): outcome}."""
    folder = tmp_path_factory.mktemp("layernorm") / "s"
    folder.mkdir(parents=True)
    (folder / "layernorm.cu").write_text(LAYERNORM_CU, encoding="utf-8")
    yaml_text = replace_once(LAYERNORM_YAML, "  - name: scale2\n    source: scale.cu\n"
                                             "    launch: {grid: [rows], block: [128]}\n", KERNELS)
    suite = suite_at(folder, yaml_text)
    found = {}
    with open_worker(timeout_s=60) as worker:
        for seed in SEEDS:
            gate = Gate(worker.client, worker.fingerprint, GateOptions(fresh_seed=seed), folder.parent / f"out{seed}")
            for program in suite.kernels:
                for case in suite.cases:
                    found[seed, program.name, case.name] = gate.replay(suite, program, case, Ledger.for_suite(suite))
    return found


def test_an_honest_one_pass_layernorm_passes_every_default_adversarial_set(outcomes):
    judged = {key: o for key, o in outcomes.items() if key[1] == "one_pass"}
    assert len(judged) == 3 * len(SEEDS)
    for (seed, _, case), outcome in judged.items():
        assert not outcome.failed, f"case {case}, seed {seed}:\n{outcome.message}"


def test_a_layernorm_fitted_to_the_value_domain_still_fails_them(outcomes):
    judged = {key: o for key, o in outcomes.items() if key[1] == "clips"}
    for (seed, _, case), outcome in judged.items():
        assert outcome.failed, f"case {case}, seed {seed} passed"
        assert "wrong on fresh inputs (adversarial" in outcome.message, outcome.message
        assert "wrong on fresh inputs (resampled" not in outcome.message, outcome.message
