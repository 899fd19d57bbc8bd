"""The pytest plugin's entry point: the ``--cuda-gate`` options and the hook that starts a gate
session. Everything else (collection, items, the worker) lives in :mod:`pytest_cudagate.items`.

Installed, it is loaded by every pytest run of the environment, so until ``--cuda-gate`` is given it
imports pytest and the standard library only (tests/plugin/test_plugin.py pins what it loads): the
options' converters and defaults when pytest asks for the options, the rest in
:func:`pytest_configure` under ``--cuda-gate``, after the harness worker's process is started
(:mod:`pytest_cudagate.worker.spawn`, light) so that its CUDA start overlaps them.
PYTEST_DONT_REWRITE: it holds no test assertion, and pytest would otherwise parse and rewrite it on
every run without bytecode caches.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import pytest

if TYPE_CHECKING:
    from pytest_cudagate.items import GateSession
    from pytest_cudagate.worker.client import Worker


def add_gate_options(add: Callable[..., object]) -> None:
    """The ``--cuda-gate*`` options, given to ``add``: pytest's ``group.addoption`` here, an argparse
    ``add_argument`` for ``cudagate gate --help`` and its refusals (one definition, never typed twice)."""
    # Light (the standard library, and no TOML parser until a settings file is read): every pytest run.
    from pytest_cudagate.boundary.options import (BUDGET_S, LOCK_TIMEOUT_S, PATH, TIMEOUT_S, count, finite, nonempty,
                                                ref_or_bare)
    from pytest_cudagate.config import DEFAULT_BUDGET_S, DEFAULT_LOCK_TIMEOUT_S

    # A fraction, never silently replaced by the suite's: 0.02 = 2 %.
    threshold = finite(0, 1, above=True, below=True, hint="0.02 = 2%; leave it out to use each suite's gate.threshold")
    add("--cuda-gate", action="store_true", help="collect cudagate.yaml suites and replay them on the GPU")
    add("--cuda-gate-require-gpu", action="store_true",
        help="fail (instead of skip) replay items when no CUDA device is present; for reserved GPU runners")
    add("--cuda-gate-arch", default=None, type=nonempty("a compile target such as sm_90"), metavar="SM",
        help="compile target when no GPU is present (default: [tool.cudagate] arch, else sm_90)")
    add("--cuda-gate-timeout", type=TIMEOUT_S, default=None, metavar="S",
        help="watchdog per case in seconds; a kernel silent for longer is killed "
             "(default: [tool.cudagate] timeout_s, else 60)")
    add("--cuda-gate-strict", action="store_true",
        help="fail on inconclusive or unstable latency verdicts instead of warning")
    # An optional value: bare, it must come last (or before another option) so that it cannot take a path.
    add("--cuda-gate-release", nargs="?", const="", default=None, type=ref_or_bare("a tag, branch or commit"),
        metavar="REF",
        help="release mode: time each kernel interleaved against its version approved at REF (default: "
             "the newest tag matching [tool.cudagate] release_tags, else v*, before HEAD); a regression "
             "against it, or against the stored runs of an unchanged kernel, fails. Write "
             "--cuda-gate-release=REF, or the bare flag after the paths")
    add("--cuda-gate-budget", type=BUDGET_S, default=DEFAULT_BUDGET_S, metavar="S",
        help=f"measurement time per performance case for the interleaved comparison (default {DEFAULT_BUDGET_S:g})")
    add("--cuda-gate-threshold", type=threshold, default=None, metavar="F",
        help="latency drift tolerated, as a fraction strictly between 0 and 1 (overrides each suite's "
             "gate.threshold)")
    add("--cuda-gate-fresh-seed", type=count(0, 2**64 - 1), default=None, metavar="N",
        help="seed of the fresh random inputs (default: $CUDAGATE_FRESH_SEED, else new each run; "
             "the report names the seed so a failure can be replayed)")
    add("--cuda-gate-allow-unsigned", action="store_true",
        help="judge suites whose cases or approvals are unsigned or altered (local experiments only)")
    add("--cuda-gate-report", default=None, type=PATH, metavar="DIR",
        help="write report.json, a self-contained report.html and replayable requests/ into DIR")
    add("--cuda-gate-benchmark-json", default=None, type=PATH, metavar="FILE",
        help="write the timings in pytest-benchmark's JSON format (seconds), for its compare command "
             "and benchmark dashboards")
    add("--cuda-gate-durations", type=count(0, 1_000_000), default=None, metavar="N",
        help="list the N slowest cases with their time split by phase (compile, worker start, checks, "
             "fresh inputs, warm-up, timing, sanitizer, statistics, IPC); 0 lists all")
    add("--cuda-gate-class", action="append", default=None, type=nonempty("a shape class"), metavar="NAME",
        help="run only the performance cases of shape class NAME (a case's `class:`), repeatable; "
             "compile items and correctness cases always run")
    add("--cuda-gate-lock-timeout", type=LOCK_TIMEOUT_S, default=DEFAULT_LOCK_TIMEOUT_S, metavar="S",
        help=f"how long to wait for another gate run to release the GPU (default {DEFAULT_LOCK_TIMEOUT_S:g})")
    # Set by `cudagate gate --trusted-ref` only: keys, policy and ledger sequences of the base commit.
    add("--cuda-gate-trust-root", default=None, type=PATH, metavar="FILE", help=argparse.SUPPRESS)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_cudagate import hookspecs  # pytest and the standard library only

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    add_gate_options(parser.getgroup("cudagate", "CUDA kernel regression gate").addoption)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` under --cuda-gate: one worker per visible GPU; without one, xdist's default."""
    if not config.getoption("cuda_gate"):
        return None
    from pytest_cudagate.xdist_hooks import gpu_count  # lazy, as in pytest_configure

    return gpu_count() or None


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU; skipped cleanly without one")
    if not config.getoption("cuda_gate"):
        if config.getoption("cuda_gate_require_gpu"):
            config.issue_config_time_warning(pytest.PytestConfigWarning(
                "--cuda-gate-require-gpu does nothing without --cuda-gate"), stacklevel=2)
        return
    from pytest_cudagate import phases

    if not hasattr(config, "workerinput"):  # an xdist worker's output is not the job's log
        from pytest_cudagate.reports import github

        github.stop_commands()  # the checkout's names and compiler logs are printed from here on
    clock = phases.RunClock()  # the run's phases (--cuda-gate-durations, report.json), from here on
    clock.add("startup", phases.process_age() or 0.0)
    token = phases.RUN.set(clock)
    spawned = None
    try:
        with clock.phase("configure"):
            # First: the worker's process starts CUDA while the imports below run and pytest collects.
            # A light module (the standard library and the worker client), yet 5 ms that a run
            # without --cuda-gate does not pay.
            from pytest_cudagate import extensions
            from pytest_cudagate.worker.spawn import spawn_worker

            try:
                adapters = extensions.library_adapters(config)  # the worker imports them itself
            except extensions.ExtensionError as exc:
                raise pytest.UsageError(str(exc)) from None
            worker_env = extensions.worker_env(adapters)
            spawned = spawn_worker(config, worker_env)
            session = _start_gate(config, spawned, adapters, worker_env)
            from pytest_cudagate.items import RunPhases  # imported by _start_gate

            config.pluginmanager.register(RunPhases(clock, token, session), "cudagate-run-phases")
    except BaseException:  # a usage error, Ctrl-C: nothing may outlive pytest
        if spawned is not None:
            spawned.close()
        phases.RUN.reset(token)
        raise


def _start_gate(config: pytest.Config, spawned: Worker | None, adapters: dict[str, str],
                worker_env: dict[str, str]) -> GateSession:
    """Settings and options resolved, the plugins' library adapters registered, the session
    registered; a bad setting or adapter is one usage error."""
    # The one lazy import point (see the module docstring): suites, the worker, the judge and trust.
    from pytest_cudagate.config import load_settings, resolve
    from pytest_cudagate.errors import FileError
    from pytest_cudagate.extensions import ExtensionError, register_adapters
    from pytest_cudagate.items import PLUGIN_NAME, GateSession, load_trust_root

    trust_root = load_trust_root(config)
    try:
        settings = trust_root.settings() if trust_root else load_settings(Path(config.rootpath))
        gate_config = resolve(
            settings, arch=config.getoption("cuda_gate_arch"), timeout_s=config.getoption("cuda_gate_timeout"),
            threshold=config.getoption("cuda_gate_threshold"),
            budget_s=config.getoption("cuda_gate_budget"), lock_timeout_s=config.getoption("cuda_gate_lock_timeout"),
            strict=config.getoption("cuda_gate_strict"), release=config.getoption("cuda_gate_release") is not None,
            release_ref=config.getoption("cuda_gate_release") or None,
            fresh_seed=config.getoption("cuda_gate_fresh_seed"),
            allow_unsigned=config.getoption("cuda_gate_allow_unsigned"),
            require_gpu=config.getoption("cuda_gate_require_gpu"))
        register_adapters(config, adapters)  # before collection: the suite loader reads the registry
    except (FileError, ExtensionError) as exc:  # one clear error, not INTERNALERROR
        raise pytest.UsageError(str(exc)) from None
    session = GateSession(config, gate_config, trust_root, spawned, worker_env)
    config.pluginmanager.register(session, PLUGIN_NAME)  # the one way to the run (items.gate_session)
    # `pytest --cuda-gate` with no paths replays the suites the project lists.
    if settings.suites and config.args_source != pytest.Config.ArgsSource.ARGS:
        config.args = [str(Path(config.rootpath) / s) for s in settings.suites]
    return session
