"""Build harness requests (``schemas/harness-request.schema.json``) from a suite.

A request is self-contained: kernel source and headers inline, case data by path, and, for
``cudagate run``, the expected outputs and tolerances. The same builder serves the pytest items,
``cudagate run`` files and the optimizer's ``best-case-N.json`` replays, so all replay alike.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cudagate_harness.stopping import Settle

from pytest_cudagate.boundary import MAX_SOURCE_BYTES, read_text
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.suite.includes import header_files
from pytest_cudagate.suite.model import Case, Launch, LibraryBaseline, Program, Steps, Suite, Variant, launch_from_record

REQUEST_PROTOCOL = 1
# A long kernel's library rounds stop once the median of the per-round ratios is known to ±0.5%
# (cudagate_harness.stopping), at the latest after one measurement block; 99% over all its looks.
LIBRARY_SETTLE = (0.5, 0.005)  # (quantile, within)


def nvrtc_name(kernel: str) -> str:
    """The source name every build of ``kernel`` reaches NVRTC under (its ``__FILE__``, and the file in
    its cubin's line info): the kernel's signed name, never a path, which a pull request may rename,
    so that no build (current, approved, released, sanitized, timed alone) can tell which copy it is."""
    return f"{kernel}.cu"


def shown_log(kernel: str, path: str, log: str, headers: dict[str, str] | None = None) -> str:
    """A compile log of ``kernel`` naming its file (``path``) where NVRTC named :func:`nvrtc_name`, and
    each header as ``headers`` shows it (name, as the harness names it in the log -> the file the
    project holds): ``util.cuh(12): error`` becomes ``kernels/common/util.cuh(12): error``. A header is
    renamed where the log says where (``name(line)``, ``of name``), never in quoted source."""
    log = re.sub(rf"(?<![\w./-]){re.escape(nvrtc_name(kernel))}(?![\w.])", path, log)
    for name in sorted(headers or {}, key=len, reverse=True):
        log = re.sub(rf"(?m)(^|(?<= of )){re.escape(name)}(?=\(\d+\)|$|\s)", lambda m: m.group(1) + headers[name],
                     log)
    return log


@dataclass(frozen=True)
class KernelVersion:
    """One version of a kernel, resolved once into what the worker builds and launches: the current
    one (its files, or a proposal's text), the approved one (its pinned copies), the one approved at
    a release ref, or one read from a commit. Its texts are read, and its identity worked out, when
    it is made; every request of it is built from this value."""

    name: str
    source: str
    headers: dict[str, str]  # include name -> text
    entry: str  # a kernel of steps: its first step's
    options: tuple[str, ...]
    arch_suffix: str
    launch: Launch | Steps
    launch_overrides: dict[str, Launch | Steps]
    classes: dict[str, Variant]  # shape class -> its variant
    identity: dict  # what makes two versions the same build (ledger.Approval.identity's shape)
    source_file: Path | None = None  # the current version's file
    source_path: str | None = None  # that file as shown (reports and compile logs)
    library: LibraryBaseline | None = None  # the current version's library baseline
    header_paths: dict[str, str] = field(default_factory=dict)  # the current version's: header name -> file as shown
    compiler: str = "auto"  # the kernel's `compiler:` (cudagate_harness.compiler.chosen)

    def options_for(self, case: Case | None) -> tuple[str, ...]:
        variant = self.classes.get(case.shape_class) if case is not None else None
        return self.options + variant.options if variant is not None else self.options

    def launch_for(self, case: Case) -> Launch | Steps:
        """``case``'s override, else its class variant's launch, else the kernel's (or its steps)."""
        variant = self.classes.get(case.shape_class)
        return self.launch_overrides.get(case.name) or (variant.launch if variant else None) or self.launch

    def kernel(self, case: Case | None) -> dict:
        """A request's ``kernel`` field: the build ``case`` runs (None: the shared build), under the
        one NVRTC source name every build of this kernel gets."""
        return {
            "name": self.name, "entry": self.entry, "source": self.source, "source_name": nvrtc_name(self.name),
            **({"source_path": self.source_path} if self.source_path is not None else {}),
            "headers": dict(self.headers), "options": list(self.options_for(case)), "arch_suffix": self.arch_suffix,
            **({"entries": self.launch.entries} if isinstance(self.launch, Steps) else {}),
            **({"compiler": self.compiler} if self.compiler != "auto" else {}),
        }

    def build_name(self, case: Case) -> str:
        """The kernel's name, and for a class variant's build its class and all its options."""
        if case.shape_class not in self.classes:
            return self.name
        return f"{self.name} (variant of class {case.shape_class}: options {list(self.options_for(case))})"


def version_identity(source: str, headers: dict[str, str], *, entry: str, options, launch: dict,
                     launch_overrides: dict, arch_suffix: str, classes: dict | None, compiler: str | None) -> dict:
    """What an approval pins of a version (sources by their SHA-256), the working tree's and an
    approval's alike. Classes and compiler only where set: kernels without the field keep the
    identities their approvals pinned."""
    return {
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "headers": {n: hashlib.sha256(t.encode()).hexdigest() for n, t in headers.items()},
        "entry": entry, "options": list(options), "launch": launch, "launch_overrides": launch_overrides,
        "arch_suffix": arch_suffix, **({"classes": classes} if classes else {}),
        **({"compiler": compiler} if compiler else {}),
    }


def current_version(program: Program, source_text: str | None = None) -> KernelVersion:
    """``program`` as the working tree holds it (``source_text`` in place of its file: a proposal)."""
    text = source_text if source_text is not None else read_text(program.source, MAX_SOURCE_BYTES, "CUDA source")
    files = header_files(program.source, text, program.include)
    headers = {name: body for name, (_, body) in files.items()}
    identity = version_identity(
        text, headers, entry=program.entry, options=program.options, launch=program.launch.to_json(),
        launch_overrides={k: v.to_json() for k, v in program.launch_overrides.items()}, arch_suffix=program.arch_suffix,
        classes={name: variant.to_json() for name, variant in sorted(program.classes.items())},
        compiler=program.compiler if program.compiler != "auto" else None)
    return KernelVersion(program.name, text, headers, program.entry, program.options, program.arch_suffix, program.launch,
                   dict(program.launch_overrides), dict(program.classes), identity,
                   source_file=program.source, source_path=display_path(program.source),
                   library=program.library_baseline, compiler=program.compiler,
                   header_paths={name: display_path(path) for name, (path, _) in files.items()})


def pinned_version(kernel: str, source: str, headers: dict[str, str], record: dict) -> KernelVersion:
    """A version as an approval records it (``record``: its entry, options, arch_suffix, launch,
    launch_overrides and classes), from its source and headers read and checked by the caller."""
    classes = {name: Variant(tuple(raw.get("options", ())), launch_from_record(raw["launch"]) if "launch" in raw else None)
               for name, raw in record.get("classes", {}).items()}
    identity = version_identity(
        source, headers, entry=record["entry"], options=record["options"], launch=record["launch"],
        launch_overrides=record["launch_overrides"], arch_suffix=record["arch_suffix"],
        classes=record.get("classes"), compiler=record.get("compiler"))
    return KernelVersion(kernel, source, dict(headers), record["entry"], tuple(record["options"]), record["arch_suffix"],
                   launch_from_record(record["launch"]),
                   {case: launch_from_record(raw) for case, raw in record["launch_overrides"].items()}, classes, identity,
                   compiler=record.get("compiler") or "auto")


def kernel_spec(program: Program, source_text: str | None = None) -> dict:
    """``program`` as a request's ``kernel`` field: one build, so a kernel with class variants is
    resolved first (``program.for_case(case)``), or ``program.shared`` where only its files matter."""
    if program.classes:
        raise ValueError(f"{program.name} has class variants: pass program.for_case(case) (one build) to kernel_spec")
    return current_version(program, source_text).kernel(None)


def case_spec(suite: Suite, launch: Program | Launch | Steps, case: Case, *, expected: bool = False,
              data_dir: Path | None = None) -> dict:
    """One case of a request, run with ``launch`` (a program: its launch for the case). ``data_dir``
    replaces the suite's case folder (fresh inputs)."""
    resolved = suite.resolved(case)
    folder = data_dir / case.name if data_dir else suite.arrays_dir(case)
    spec = {
        "name": case.name,
        # the case's scalars, and the derived ones a kernel takes (those the signature declares)
        "scalars": {name: value for name, value in resolved.scalars.items()
                    if name in case.scalars or any(p.name == name and p.kind == "scalar" for p in suite.signature)},
        "buffers": {
            p.name: {"count": resolved.counts[p.name], **({"input": str(folder / f"{p.name}.npy")} if p.is_input else {}),
                     **({"layout": suite.layout(p, case)} if p.ld is not None else {})}
            for p in suite.buffers
        },
        "launch": resolved.launch(launch),
    }
    if expected:
        spec["expected"] = {p.name: str(folder / "expected" / f"{p.name}.npy") for p in suite.outputs}
        spec["tolerance"] = {name: asdict(tol) for name, tol in suite.tolerance.items()}
        spec["shapes"] = {name: list(shape) for name, shape in resolved.shapes.items()}
    return spec


def library_spec(suite: Suite, version: KernelVersion) -> dict:
    """A request's ``library`` field: the kernel's library baseline, timed beside it for one
    measurement block (``timing.repeat`` rounds, also where the kernel alone takes
    :attr:`Timing.baseline_rounds`: the column is informational) or until settled; empty when it has none."""
    if version.library is None:
        return {}
    rounds = suite.timing.repeat
    return {"library": {**version.library.to_json(), "rounds": rounds,
                        "settle": Settle.over_looks(*LIBRARY_SETTLE, rounds).to_json()}}


def run_request(suite: Suite, program: Program, cases: list[Case], *, output_dir: Path,
                timing: dict | None = None, expected: bool = False, source_text: str | None = None,
                data_dir: Path | None = None, library: bool = False) -> dict:
    """:func:`version_request` of ``program`` as the working tree holds it (``source_text``: a proposal)."""
    return version_request(suite, current_version(program, source_text), cases, output_dir=output_dir, timing=timing,
                           expected=expected, data_dir=data_dir, library=library)


def version_request(suite: Suite, version: KernelVersion, cases: list[Case], *, output_dir: Path,
                    timing: dict | None = None, expected: bool = False, data_dir: Path | None = None,
                    library: bool = False) -> dict:
    """A ``run`` request of ``version`` on ``cases``, which must all run one build of it (cases of
    classes with different variants go in separate requests). ``library``: time the kernel's library
    baseline beside it too (the gate's timed runs)."""
    builds = list(dict.fromkeys(version.options_for(c) for c in cases))
    if len(builds) > 1:
        raise ValueError(f"{version.name}: cases {', '.join(c.name for c in cases)} run {len(builds)} builds "
                         "(class variants); one request per build")
    return {
        "protocol": REQUEST_PROTOCOL,
        "op": "run",
        "suite": display_path(suite.path),
        "kernel": version.kernel(cases[0] if cases else None),
        "signature": [p.protocol() for p in suite.signature],
        "cases": [case_spec(suite, version.launch_for(c), c, expected=expected, data_dir=data_dir) for c in cases],
        "timing": timing,
        "output_dir": str(output_dir),
        **(library_spec(suite, version) if library and timing else {}),
    }


def compare_request(suite: Suite, case: Case, *, current: KernelVersion, baseline: KernelVersion, output_dir: Path, chunk: int,
                    seed: int | None = None, library: bool = False) -> dict:
    """A ``compare`` request: ``current`` timed interleaved with ``baseline`` (the approved version, a
    release's, or an optimizer's initial kernel) on ``case``, ``chunk`` rounds per answer. Both builds
    reach NVRTC under one source name (:func:`nvrtc_name`, the current one's kernel name), so that a
    kernel cannot tell at compile time whether it is the baseline (and be slow only there, hiding
    every later regression)."""
    timing = {**suite.timing.to_json(), "chunk": chunk, **({"seed": seed} if seed is not None else {})}
    name = nvrtc_name(current.name)
    approved = {key: value for key, value in baseline.kernel(case).items() if key != "source_path"}
    return {
        "protocol": 1, "op": "compare", "suite": str(suite.path),
        "kernels": {"approved": {**approved, "source_name": name}, "current": {**current.kernel(case), "source_name": name}},
        "launches": {"approved": suite.resolved(case).launch(baseline.launch_for(case)),
                     "current": suite.resolved(case).launch(current.launch_for(case))},
        "signature": [p.protocol() for p in suite.signature],
        "case": case_spec(suite, current.launch_for(case), case),
        "timing": timing,
        "output_dir": str(output_dir),
        **(library_spec(suite, current) if library else {}),
    }
