"""Who disturbed an interleaved comparison: a kernel that drives the card into its power cap is not
spared by the chunks it disturbs, and an `unstable` comparison fails under a trust root unless the
disturbance came from outside. On the fake worker's simulated GPU, whose NVML view follows the
kernel that ran last, with the real harness worker (its probe), gate and judge."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from fake_worker import SCALE_PARAMS, FakeKernel, FakeWorker, scale_xy
from helpers import SUITE_YAML, changed_after_approval, write_suite
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.judge.latency import APPROVED, BOTH, CURRENT, OUTSIDE, UNKNOWN, Latency, blame
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.fingerprint import Fingerprint

NO_SANITIZER = SUITE_YAML + "checks: {sanitizer: off}\n"
BASE_MS = 0.010
CALM = {"throttle_reasons": [], "other_processes": [], "sm_clock_mhz": 1980, "temperature_c": 50}
CAPPED = {**CALM, "throttle_reasons": ["sw_power_cap"], "sm_clock_mhz": 1600}
ELSEWHERE = {**CALM, "other_processes": [{"pid": 4242, "used_memory_bytes": 1 << 30}]}


class Card:
    """What NVML says: the state the kernel that ran last leaves the card in (``hot`` sources run it
    into its power cap, and 3x slower), or ``always`` whatever ran."""

    def __init__(self, hot: tuple[str, ...] = (), always: dict | None = None):
        self.hot, self.always, self.last = hot, always, None

    def state(self) -> dict:
        if self.always is not None:
            return dict(self.always)
        return dict(CAPPED if self.last in self.hot else CALM)

    def kernels(self, spec: dict) -> FakeKernel:
        role = "throttles" if "// throttles" in spec["source"] else "calm"
        rng = np.random.default_rng(zlib.crc32(spec["source"].encode()))

        def body(launch) -> None:
            x, y, _ = scale_xy(launch)
            y[:] = 2 * x
            self.last = role
            slow = role in self.hot
            launch.device.clock += BASE_MS * ((3.0 if slow else 1.0) * rng.normal(1, 0.01) - 1)

        return FakeKernel(body, SCALE_PARAMS)


@pytest.fixture
def judge(tmp_path):
    def run(card: Card, edit: str = "// throttles\n", **options):
        suite, ledger = changed_after_approval(load_suite(write_suite(tmp_path / "scale", yaml_text=NO_SANITIZER)))
        program = suite.kernels[0]
        program.source.write_text(program.source.read_text() + edit)
        worker = FakeWorker(card.kernels, state=card.state)
        gate = Gate(worker, Fingerprint.from_hello(worker.start()), GateOptions(fresh_seed=3, budget_s=2.0, **options),
                    tmp_path / "out")
        return gate.replay(suite, program, suite.case("perf"), ledger)

    return run


def test_a_kernel_that_drives_the_card_into_its_power_cap_is_timed_throttled_and_fails(judge):
    outcome = judge(Card(hot=("throttles",)))
    latency = outcome.latency
    assert latency.disturbed_by == CURRENT and latency.kept_disturbed and not latency.discarded
    assert outcome.failed and latency.verdict is Latency.REGRESSED
    assert "disturbed by the current kernel itself kept" in outcome.message
    assert "found it with the current kernel only" in outcome.message


def test_a_disturbance_from_another_process_is_unstable_and_only_warns_under_a_trust_root(judge):
    outcome = judge(Card(always=ELSEWHERE), trusted=True)
    assert outcome.latency.verdict is Latency.UNSTABLE and outcome.latency.disturbed_by == OUTSIDE
    assert not outcome.failed and "came from outside the comparison" in outcome.warning


def test_a_card_capped_before_either_kernel_ran_is_not_shown_to_come_from_outside(judge):
    """A clock event found before the comparison may be what the pull request's own kernel left behind
    in its case before: only another process is outside."""
    outcome = judge(Card(always=CAPPED), edit="// a comment\n", trusted=True)
    assert outcome.latency.verdict is Latency.UNSTABLE and outcome.latency.disturbed_by == BOTH
    assert outcome.failed


class Heating(Card):
    """The current kernel heats the card in its untimed correctness case (heat outlasts an idle
    second), then runs 3x slower into the power cap on the performance case."""

    def __init__(self):
        super().__init__(hot=("throttles",))
        self.heated = False

    def state(self) -> dict:
        return {**super().state(), **({"temperature_c": 90} if self.heated else {})}

    def kernels(self, spec: dict) -> FakeKernel:
        kernel = super().kernels(spec)
        body = kernel.body

        def heating(launch) -> None:
            body(launch)
            if self.last == "throttles" and launch.args["rows"] * launch.args["cols"] < 1000:
                self.heated = True

        kernel.body = heating
        return kernel


def test_heat_the_current_kernel_left_behind_does_not_excuse_its_throttling(tmp_path):
    suite, ledger = changed_after_approval(load_suite(write_suite(tmp_path / "scale", yaml_text=NO_SANITIZER)))
    program = suite.kernels[0]
    program.source.write_text(program.source.read_text() + "// throttles\n")
    card = Heating()
    worker = FakeWorker(card.kernels, state=card.state)
    gate = Gate(worker, Fingerprint.from_hello(worker.start()),
                GateOptions(fresh_seed=3, budget_s=2.0, trusted=True), tmp_path / "out")
    assert not gate.replay(suite, program, suite.case("small"), ledger).failed
    card.last = None  # the card idles between the cases: the power cap is gone, the heat is not
    outcome = gate.replay(suite, program, suite.case("perf"), ledger)
    assert outcome.latency.disturbed_by == CURRENT and outcome.failed, outcome.latency.describe()


@pytest.mark.parametrize("trusted", [False, True])
def test_a_card_capped_by_both_kernels_is_unstable_and_fails_under_a_trust_root(judge, trusted):
    outcome = judge(Card(hot=("throttles", "calm")), edit="// a comment\n", trusted=trusted)
    assert outcome.latency.verdict is Latency.UNSTABLE and outcome.latency.disturbed_by == BOTH
    assert outcome.failed is trusted
    assert "found it with both kernels" in (outcome.message if trusted else outcome.warning)


def test_a_calm_card_probes_nothing(judge):
    outcome = judge(Card(), edit="// a comment\n")
    assert outcome.latency.verdict is Latency.PASS and outcome.latency.disturbed_by is None


def probe(current: list[str], approved: list[str], clocks=(1980, 1980)) -> dict:
    return {"current": {"events": current, "sm_clock_mhz": clocks[0]},
            "approved": {"events": approved, "sm_clock_mhz": clocks[1]}}


@pytest.mark.parametrize("prior, disturbances, probes, who", [
    ([], [["clock event sw_power_cap (after)"]], [probe(["sw_power_cap"], [])], CURRENT),
    ([], [["clock event sw_power_cap (after)"]], [probe([], ["sw_power_cap"])], APPROVED),
    ([], [["clock event sw_power_cap (after)"]], [probe(["sw_power_cap"], ["sw_power_cap"])], BOTH),
    ([], [["SM clock changed 1980 -> 1500 MHz (-24.2%)"]], [probe([], [], clocks=(1500, 1980))], CURRENT),
    ([], [["SM clock changed 1980 -> 1950 MHz (-1.5%)"]], [probe([], [], clocks=(1950, 1980))], UNKNOWN),
    (["clock event hw_slowdown (before)"], [["clock event sw_power_cap (after)"]], [probe(["sw_power_cap"], [])],
     CURRENT),
    (["another compute process on the GPU (pid 7)"], [["clock event sw_power_cap (after)"]],
     [probe(["sw_power_cap"], [])], OUTSIDE),
    ([], [["another compute process on the GPU (pid 7)"]], [probe(["sw_power_cap"], [])], OUTSIDE),
    ([], [["clock event hw_slowdown (after)"]], [], UNKNOWN),
])
def test_blame(prior, disturbances, probes, who):
    assert blame(prior, disturbances, probes) == who
