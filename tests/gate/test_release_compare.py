"""The gate's release path on the simulated GPU: today's kernel timed against the version approved
at a release, with the real worker, gate and judge (fake_worker's FakeDevice, no CUDA)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from helpers import SUITE_YAML, write_suite
from fake_worker import FakeKernel, FakeWorker

from pytest_cudagate.boundary import schema
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.latency import Latency
from pytest_cudagate.trust.release import AbsentAtRef, NoReleaseYet, ReleasedApproval, ReleaseError
from pytest_cudagate.reports.document import build_report
from pytest_cudagate.suite.loader import load_suite

LABEL = "v1.0.0"
RNG = np.random.default_rng(11)


class Fingerprint:
    def key(self) -> str:
        return "fake0000"

    def describe(self) -> str:
        return "a simulated GPU"


def timed(extra: float):
    """y = 2x taking 10 ms of fake clock (every launch) plus ``extra`` and a little jitter."""
    def body(launch):
        n = launch.args["rows"] * launch.args["cols"]
        launch.array("y", np.float32, n)[:] = 2 * launch.array("x", np.float32, n)
        launch.device.clock += extra + RNG.uniform(0, 1e-4)
    return body


class Release:
    """What the gate asks of a :class:`~pytest_cudagate.trust.release.ReleaseSource`."""

    def __init__(self, found):
        self.found = found

    def lookup(self, suite, kernel):
        if isinstance(self.found, Exception):
            raise self.found
        return self.found


@pytest.fixture
def suite(tmp_path):
    return load_suite(write_suite(tmp_path / "scale", yaml_text=SUITE_YAML + "checks: {sanitizer: off}\n"))


@pytest.fixture
def ledger(suite):
    ledger = Ledger.for_suite(suite)
    ledger.approvals["scale2"] = approval_for(ledger, suite.kernels[0], approved_by="alice", approved_at="2026-12-01",
                                              git={}, tool_version="test")
    return ledger


def released(ledger, entry: str | None = None) -> ReleasedApproval:
    """The approved version as a release pinned it; ``entry`` swaps in another (fake) kernel."""
    approval = ledger.approvals["scale2"]
    return ReleasedApproval(kernel="scale2", label=LABEL, commit="0" * 40,
                            source=ledger.read_blob(approval.source_blob, approval.source_sha256),
                            source_sha256=approval.source_sha256, headers={}, entry=entry or approval.entry,
                            options=tuple(approval.options), arch_suffix=approval.arch_suffix, launch=approval.launch,
                            launch_overrides=approval.launch_overrides, build=None)


def replay(suite, ledger, release, tmp_path, *, kernels=None, program=None):
    params = [p.protocol() for p in suite.signature]
    kernels = {name: FakeKernel(body, params) for name, body in (kernels or {"scale2": timed(0.0)}).items()}
    worker = FakeWorker(kernels)
    worker.start()
    gate = Gate(worker, Fingerprint(), GateOptions(release=True, fresh_seed=1, budget_s=5.0), tmp_path / "out",
                release=Release(release))
    return gate.replay(suite, program or suite.kernels[0], suite.case("perf"), ledger)


def test_creep_since_the_release_fails_naming_it(suite, ledger, tmp_path):
    """Approved today = current (unchanged since approval), but 10% slower than what was released."""
    outcome = replay(suite, ledger, released(ledger, entry="fast"), tmp_path,
                     kernels={"scale2": timed(0.0), "fast": timed(-0.001)})
    release = outcome.latency.release
    assert release.verdict is Latency.REGRESSED and release.reason == LABEL
    assert outcome.failed
    assert "release gate: latency regressed: current is 1" in outcome.message
    assert f"% slower than {LABEL} (ratio 1.1" in outcome.message
    assert outcome.latency.verdict is Latency.INCOMPARABLE and outcome.latency.advisory  # no stored runs here
    kinds = [r["op"] for r in outcome.requests]
    assert kinds == ["run", "compare"]
    kernels = outcome.requests[1]["kernels"]
    assert kernels["approved"]["entry"] == "fast"  # the released build, compiled under the current one's name
    assert kernels["approved"]["source_name"] == kernels["current"]["source_name"]


def test_a_kernel_identical_to_the_release_is_not_timed_again(suite, ledger, tmp_path):
    outcome = replay(suite, ledger, released(ledger), tmp_path)
    release = outcome.latency.release
    assert release.verdict is Latency.PASS and release.reason.startswith(f"identical to the version approved at {LABEL}")
    assert [r["op"] for r in outcome.requests] == ["run"]
    assert "toolchain" in release.note  # the release recorded no build: said, not hidden
    assert not outcome.failed


def test_when_the_approved_version_is_the_released_one_one_comparison_serves_both(suite, ledger, tmp_path):
    program = dataclasses.replace(suite.kernels[0], entry="slow")  # a change not approved yet
    outcome = replay(suite, ledger, released(ledger), tmp_path, program=program,
                     kernels={"scale2": timed(0.0), "slow": timed(0.001)})
    assert [r["op"] for r in outcome.requests] == ["compare"]
    pr, release = outcome.latency, outcome.latency.release
    assert pr.verdict is release.verdict is Latency.REGRESSED and release.estimate == pr.estimate
    assert release.reason == LABEL and "one comparison serves both" in release.note


@pytest.mark.parametrize("found, said", [
    (AbsentAtRef("scale2", LABEL, "kernels/scale did not exist there"),
     f"kernel 'scale2' did not exist at {LABEL} (kernels/scale did not exist there); judged by the PR gate only"),
    (ReleaseError(f"kernels/scale/cudagate.approvals.json at {LABEL}: not signed; the release cannot be used"),
     f"kernels/scale/cudagate.approvals.json at {LABEL}: not signed"),
    (CudagateError("no tag"), "no tag"),
])
def test_no_usable_release_warns_in_the_case_and_times_nothing_more(suite, ledger, tmp_path, found, said):
    outcome = replay(suite, ledger, found, tmp_path)
    release = outcome.latency.release
    assert release.verdict is Latency.INCOMPARABLE and release.advisory and said in release.reason
    assert not outcome.failed and said in outcome.warning  # the kernel's `release` item is what fails
    assert [r["op"] for r in outcome.requests] == ["run"]


def test_the_report_json_carries_the_release_verdict(suite, ledger, tmp_path):
    outcome = replay(suite, ledger, released(ledger, entry="fast"), tmp_path,
                     kernels={"scale2": timed(0.0), "fast": timed(-0.001)})
    document = to_json(build_report([outcome], [], index={}, fingerprint=None, root=tmp_path).document)
    assert schema.problems(document, "report") == []
    item = document["items"][0]
    assert item["latency"]["release"]["verdict"] == "regressed"
    assert item["latency"]["release"]["headline"].startswith("latency regressed: current is")
    assert LABEL in item["latency"]["release"]["headline"]


@pytest.mark.parametrize("found, warned", [
    (AbsentAtRef("scale2", LABEL, "kernels/scale did not exist there"), False),
    (NoReleaseYet("no tag matching 'v*' is reachable from HEAD other than HEAD's own"), False),
    (ReleaseError(f"kernels/scale/cudagate.approvals.json at {LABEL}: not signed; the release cannot be used"), True),
])
def test_a_pass_warns_only_of_a_release_it_could_not_use(suite, ledger, tmp_path, found, warned):
    """No release to compare with (a first release, a kernel new since it) is said once, by the kernel's
    `release` item: its passing cases stay passes. A release that cannot be used warns in every case,
    since a run of some cases (-k) leaves the `release` item out."""
    program = dataclasses.replace(suite.kernels[0], entry="same")  # changed, as fast as approved
    outcome = replay(suite, ledger, found, tmp_path, program=program,
                     kernels={"scale2": timed(0.0), "same": timed(0.0)})
    assert outcome.latency.verdict is Latency.PASS
    assert outcome.latency.release.verdict is Latency.INCOMPARABLE
    assert not outcome.failed
    assert ("not signed; the release cannot be used" in outcome.warning) is warned
    assert ("latency" in outcome.warning) is warned  # else only the fixture's relaxed-checks note
