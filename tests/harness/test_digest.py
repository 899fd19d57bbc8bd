"""Every timed launch's outputs are checked (issue 28, route 9): digested on the GPU right after the
launch's event pair and compared with validation launch 1's digest. Here on the simulated GPU, whose
digest kernel is the numpy definition the CUDA source is tested against (tests/gpu/test_timed_digests_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from fake_worker import FakeKernel, FakeWorker, scale_xy
from test_hardening_gate import compare_request, kernels_for, scale_suite  # noqa: F401 - the fixture

from cudagate_harness import digest
from pytest_cudagate.judge.correctness import judge_case
from pytest_cudagate.worker.requests import run_request


def slow_digest(data: bytes, key: int) -> int:
    """The digest written out word by word in plain Python: what the numpy version must equal."""
    def mix(z: int) -> int:
        z ^= z >> 30
        z = (z * 0xBF58476D1CE4E5B9) & digest.MASK
        z ^= z >> 27
        z = (z * 0x94D049BB133111EB) & digest.MASK
        return z ^ (z >> 31)

    total = 0
    for i in range(0, len(data), 8):
        word = int.from_bytes(data[i:i + 8], "little")
        total += mix(word ^ ((key + (i // 8) * digest.GOLDEN) & digest.MASK))
    return total & digest.MASK


@pytest.mark.parametrize("nbytes", [0, 1, 7, 8, 9, 64, 1001])
def test_the_numpy_digest_is_the_word_by_word_definition(nbytes):
    data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
    key = 0xFEDCBA9876543210
    assert digest.digest(data, key) == slow_digest(data.tobytes(), key)


def test_one_changed_bit_or_another_key_changes_the_digest():
    data = np.random.default_rng(1).standard_normal(4099).astype(np.float32)
    key = digest.buffer_key(12345, 0)
    before = digest.digest(data, key)
    flipped = data.copy()
    flipped.view(np.uint32)[2048] ^= 1
    assert digest.digest(flipped, key) != before
    assert digest.digest(data, digest.buffer_key(12345, 1)) != before
    tail = data.view(np.uint8)[:4099 * 4 - 1].copy()  # an odd tail of bytes is digested too
    changed = tail.copy()
    changed[-1] ^= 0x80
    assert digest.digest(tail, key) != digest.digest(changed, key)


def wrong_once_in(every: int, first_wrong: int | None = None):
    """y = 2 x, except on the launches whose count (from 1) is ``first_wrong`` (or every ``every``-th)."""
    def body(launch):
        x, y, n = scale_xy(launch)
        calls = launch.state["calls"] = launch.state.get("calls", 0) + 1
        wrong = calls == first_wrong if first_wrong else calls % every == 0
        y[:] = 0.0 if wrong else 2 * x
    return body


def planted(suite, **bodies) -> FakeWorker:
    kernels = kernels_for(suite)
    params = [p.protocol() for p in suite.signature]
    kernels.update({name: FakeKernel(body, params) for name, body in bodies.items()})
    return FakeWorker(kernels)


def test_a_kernel_wrong_on_one_timed_launch_in_the_middle_is_caught_interleaved(scale_suite, tmp_path):
    """Launch 30 falls inside the 30 timed rounds whatever the warm-up count (11-21 launches), and never
    among the last four, which are all the per-copy check sees: without digests this kernel passes."""
    client = planted(scale_suite, once=wrong_once_in(0, first_wrong=30))
    body = client.compare(compare_request(scale_suite, "once", tmp_path), lambda chunk: 0).body
    case = scale_suite.case("perf")
    expected = scale_suite.resolved(case).expected_outputs()
    assert body["timed"]["digests"]["differing"] == 1, body["timed"]
    assert body["timed"]["digests"]["launches"] == 30
    assert not any(out["differing"] for out in body["timed"]["outputs"].values())  # the last writes were right
    verdict = judge_case("once", "perf", body, expected, scale_suite.tolerance)
    assert not verdict.passed
    assert "1 of 30 timed launches (the first: timed launch" in verdict.describe(), verdict.describe()
    assert "differ bitwise from validation launch 1 on the same inputs" in verdict.describe()
    approved = body["approved"]["timed"]["digests"]
    assert approved == {"launches": 30, "differing": 0}, approved  # the honest approved kernel's own digests


def test_an_honest_kernel_passes_with_every_timed_launch_digested(scale_suite, tmp_path):
    client = planted(scale_suite)
    body = client.compare(compare_request(scale_suite, "scale2", tmp_path), lambda chunk: 0).body
    assert body["timed"]["digests"] == {"launches": 30, "differing": 0}
    case = scale_suite.case("perf")
    verdict = judge_case("scale2", "perf", body, scale_suite.resolved(case).expected_outputs(), scale_suite.tolerance)
    assert verdict.passed, verdict.describe()


@pytest.mark.parametrize("every", [64, 256])
def test_a_kernel_timed_alone_wrong_on_one_launch_in_n_is_rejected(scale_suite, tmp_path, every):
    client = planted(scale_suite, rare=wrong_once_in(every))
    program = scale_suite.kernels[0].__class__(**{**scale_suite.kernels[0].__dict__, "name": "rare", "entry": "rare"})
    timing = {**scale_suite.timing.to_json(), "repeat": 2 * every, "warmup_ms": 0}
    body = client.run(run_request(scale_suite, program, [scale_suite.case("perf")], output_dir=tmp_path,
                                  timing=timing)).cases["perf"]
    digests = body["timed"]["digests"]
    assert digests["launches"] == 2 * every and digests["differing"] in (1, 2, 3), digests
    case = scale_suite.case("perf")
    verdict = judge_case("rare", "perf", body, scale_suite.resolved(case).expected_outputs(), scale_suite.tolerance)
    assert not verdict.passed and "differ bitwise from validation launch 1" in verdict.describe(), verdict.describe()


def test_digests_stay_off_where_timed_outputs_are_not_checked(scale_suite, tmp_path):
    client = planted(scale_suite, once=wrong_once_in(0, first_wrong=30))
    request = compare_request(scale_suite, "once", tmp_path)
    request["checks"] = {"guards": True, "scrub_shared": True, "timed_outputs": False}
    body = client.compare(request, lambda chunk: 0).body
    assert "timed" not in body or "digests" not in body["timed"], body.get("timed")


def skips_when_already_written(launch):
    """y = 2 x, unless y already holds a result (no poison left): then it returns at once, as a kernel
    timed in batches could, were the launches of one event pair to share a buffer copy."""
    x, y, _ = scale_xy(launch)
    if y.view(np.uint32)[0] not in (0xFFFFFFFF, 0x7F7F7F7F):  # neither poison pattern
        launch.state["skipped"] = launch.state.get("skipped", 0) + 1
        return
    y[:] = 2 * x


def test_each_launch_of_a_batch_finds_its_own_poisoned_copy_and_is_digested(scale_suite, tmp_path):
    kernel = FakeKernel(skips_when_already_written, [p.protocol() for p in scale_suite.signature])
    kernels = kernels_for(scale_suite)
    kernels["skipper"] = kernel
    client = FakeWorker(kernels)
    request = compare_request(scale_suite, "skipper", tmp_path)
    request["timing"].update(cache="hot", batch=8)
    body = client.compare(request, lambda chunk: 0).body
    assert body["status"] == "ok", body
    assert kernel.state.get("skipped", 0) == 0  # no launch found its outputs already written
    assert body["timed"]["digests"] == {"launches": 30 * 8, "differing": 0}, body["timed"]


def test_batches_get_as_many_buffer_copies_as_fit():
    from cudagate_harness.messages import BufferSpec, Case, Launch, Param
    from cudagate_harness.runner import HELD_LAUNCHES, launch_groups, rotation_copies

    def case(count: int) -> Case:
        return Case(name="c", scalars={}, buffers={"y": BufferSpec(count=count)}, launch=Launch(grid=(1,) * 3, block=(1,) * 3))

    signature = (Param(name="y", kind="buffer", dtype="float32", intent="out"),)
    small, huge = case(1024), case(20 << 20)
    assert rotation_copies(signature, small, None, batch=16) == 16
    assert rotation_copies(signature, small, None, batch=500) == HELD_LAUNCHES
    assert rotation_copies(signature, huge, None, batch=16) == 3  # 80 MiB each: three fit the rotation budget
    assert launch_groups(16, held=True, copies=3) == [3, 3, 3, 3, 3, 1]
    assert launch_groups(1, held=True, copies=4) == [1]
