"""Build harness requests (``schemas/harness-request.schema.json``) from a suite.

A request is self-contained: kernel source and headers inline, case data by path, and, for
``cudagate run``, the expected outputs and tolerances. The same builder serves the pytest items,
``cudagate run`` files and the optimizer's ``best-case-N.json`` replays, so all replay alike.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

from cudagate_harness.stopping import Settle

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, read_text
from pytest_cudagate.paths import display_path
from pytest_cudagate.suite.includes import local_headers
from pytest_cudagate.suite.model import Case, Launch, Program, Steps, Suite

REQUEST_PROTOCOL = 1
# A long kernel's library rounds stop once the median of the per-round ratios is known to ±0.5%
# (cudagate_harness.stopping), at the latest after one measurement block; 99% over all its looks.
LIBRARY_SETTLE = (0.5, 0.005)  # (quantile, within)


def quoted_includes(source: Path, text: str | None = None) -> dict[str, str]:
    """Headers a source pulls in with ``#include "..."``, recursively, keyed by include name;
    only files inside the suite folder (see :mod:`pytest_cudagate.suite.includes`)."""
    return local_headers(source, text)


def nvrtc_name(kernel: str) -> str:
    """The source name every build of ``kernel`` reaches NVRTC under (its ``__FILE__``, and the file in
    its cubin's line info): the kernel's signed name, never a path, which a pull request may rename,
    so that no build (current, approved, released, sanitized, timed alone) can tell which copy it is."""
    return f"{kernel}.cu"


def shown_log(program: Program, log: str) -> str:
    """A compile log of ``program`` naming its file where NVRTC named :func:`nvrtc_name`."""
    return re.sub(rf"(?<![\w./-]){re.escape(nvrtc_name(program.name))}(?![\w.])", display_path(program.source), log)


def kernel_spec(program: Program, source_text: str | None = None) -> dict:
    """``program`` as a request's ``kernel`` field: one build, so a kernel with class variants is
    resolved first (``program.for_case(case)``), or ``program.shared`` where only its files matter."""
    if program.classes:
        raise ValueError(f"{program.name} has class variants: pass program.for_case(case) (one build) to kernel_spec")
    text = source_text if source_text is not None else read_text(program.source, MAX_SOURCE_BYTES, "CUDA source")
    return {
        "name": program.name,
        "entry": program.entry,
        "source": text,
        "source_name": nvrtc_name(program.name),
        "source_path": display_path(program.source),
        "headers": quoted_includes(program.source, text),
        "options": list(program.options),
        "arch_suffix": program.arch_suffix,
        **({"entries": program.entries} if program.steps else {}),
    }


def case_spec(suite: Suite, program: Program, case: Case, *, expected: bool = False,
              data_dir: Path | None = None) -> dict:
    """One case of a request. ``data_dir`` replaces the suite's case folder (fresh inputs)."""
    resolved = suite.resolved(case)
    folder = data_dir / case.name if data_dir else suite.arrays_dir(case)
    spec = {
        "name": case.name,
        "scalars": dict(case.scalars),
        "buffers": {
            p.name: {"count": resolved.counts[p.name], **({"input": str(folder / f"{p.name}.npy")} if p.is_input else {})}
            for p in suite.buffers
        },
        "launch": resolved.launch(program),
    }
    if expected:
        spec["expected"] = {p.name: str(folder / "expected" / f"{p.name}.npy") for p in suite.outputs}
        spec["tolerance"] = {name: asdict(tol) for name, tol in suite.tolerance.items()}
        spec["shapes"] = {name: list(shape) for name, shape in resolved.shapes.items()}
    return spec


def library_spec(suite: Suite, program: Program) -> dict:
    """A request's ``library`` field: the kernel's library baseline, timed beside it for one
    measurement block (``timing.repeat`` rounds, also where the kernel alone takes
    :attr:`Timing.baseline_rounds`: the column is informational) or until settled; empty when it has none."""
    if not program.library_baseline:
        return {}
    rounds = suite.timing.repeat
    return {"library": {**program.library_baseline.to_json(), "rounds": rounds,
                        "settle": Settle.over_looks(*LIBRARY_SETTLE, rounds).to_json()}}


def run_request(suite: Suite, program: Program, cases: list[Case], *, output_dir: Path,
                timing: dict | None = None, expected: bool = False, source_text: str | None = None,
                data_dir: Path | None = None, library: bool = False) -> dict:
    """A ``run`` request of ``program`` on ``cases``, which must all run one build of it (cases of
    classes with different variants go in separate requests: see :meth:`Program.builds`).
    ``library``: time the kernel's library baseline beside it too (the gate's timed runs)."""
    builds = program.builds(cases)
    if len(builds) > 1:
        raise ValueError(f"{program.name}: cases {', '.join(c.name for c in cases)} run {len(builds)} builds "
                         "(class variants); one request per build")
    return {
        "protocol": REQUEST_PROTOCOL,
        "op": "run",
        "suite": display_path(suite.path),
        "kernel": kernel_spec(builds[0], source_text),
        "signature": [p.protocol() for p in suite.signature],
        "cases": [case_spec(suite, program, c, expected=expected, data_dir=data_dir) for c in cases],
        "timing": timing,
        "output_dir": str(output_dir),
        **(library_spec(suite, program) if library and timing else {}),
    }


def compare_request(suite: Suite, program: Program, case: Case, *, approved: dict, approved_launch: Launch | Steps,
                    output_dir: Path, chunk: int, source_text: str | None = None, seed: int | None = None,
                    library: bool = False, current: tuple[dict, Launch | Steps] | None = None) -> dict:
    """A ``compare`` request: ``program`` (``source_text`` in place of its file, if given; or the
    ``current`` kernel spec and launch, a version read from git) timed interleaved with the
    ``approved`` kernel spec on ``case``, ``chunk`` rounds per answer."""
    timing = {**suite.timing.to_json(), "chunk": chunk, **({"seed": seed} if seed is not None else {})}
    ours, launch = current or (kernel_spec(program.for_case(case), source_text), program)
    # NVRTC's __FILE__ is the source name: one name for both builds, so that a kernel cannot tell at
    # compile time whether it is the baseline (and be slow only there, hiding every later regression).
    name = nvrtc_name(program.name)
    return {
        "protocol": 1, "op": "compare", "suite": str(suite.path),
        "kernels": {"approved": {**approved, "source_name": name}, "current": {**ours, "source_name": name}},
        "launches": {"approved": suite.resolved(case).launch(approved_launch),
                     "current": suite.resolved(case).launch(launch)},
        "signature": [p.protocol() for p in suite.signature],
        "case": case_spec(suite, program, case),
        "timing": timing,
        "output_dir": str(output_dir),
        **(library_spec(suite, program) if library else {}),
    }
