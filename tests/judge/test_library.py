"""The library baseline column (suite ``library_baseline``): refused at load when it cannot work,
found on disk in a fixed order, carried by the protocol, timed beside the kernel by the real harness
worker on the fake device, and shown per performance case in the terminal, report.json and
report.html, and in an optimize pack, without ever changing a verdict."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from cudagate_harness import library
from cudagate_harness.library import ADAPTERS, CublasSgemm, LibraryUnavailable, find_cublas
from fake_worker import FakeDevice, FakeKernel, install, make_worker
from helpers import line_of, replace_once
from optimize_fakes import FakeEvaluator, opt_suite
from pytest_cudagate.boundary import schema
from pytest_cudagate.cli import main
from pytest_cudagate.gate import baseline_timing
from pytest_cudagate.judge import stats
from pytest_cudagate.judge.library import LibraryResult
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import suite_manifest
from pytest_cudagate.worker.requests import run_request
from test_loop import assert_pack_valid
from test_optimize_report import run_pack

pytest_plugins = ["pytester"]

BASELINE = "    library_baseline: {adapter: cublas_sgemm, args: {a: a, b: b, c: c, m: m, n: n, k: k}}\n"
MM_YAML = """\
suite: mm
signature:
  - {name: a, buffer: float32, intent: in, size: m*k, shape: [m, k]}
  - {name: b, buffer: float32, intent: in, size: k*n, shape: [k, n]}
  - {name: c, buffer: float32, intent: out, size: m*n, shape: [m, n]}
  - {name: m, scalar: int32}
  - {name: n, scalar: int32}
  - {name: k, scalar: int32}
reference:
  python: reference.py:matmul
tolerance:
  c: {atol: 1.0e-4, rtol: 1.0e-4}
kernels:
  - name: mm
    source: mm.cu
    launch: {grid: ["cdiv(n, 16)", "cdiv(m, 16)"], block: [16, 16]}
""" + BASELINE + """\
cases:
  - {name: small, kind: correctness, scalars: {m: 5, n: 7, k: 3}}
  - {name: square, kind: performance, scalars: {m: 32, n: 32, k: 32}}
  - {name: wide, kind: performance, scalars: {m: 24, n: 40, k: 16}}
"""
REFERENCE_PY = """\
import numpy as np


def matmul(a, b, m, n, k):
    return (a.astype(np.float64).reshape(m, k) @ b.astype(np.float64).reshape(k, n)).astype(np.float32)
"""
MM_CU = """\
extern "C" __global__ void mm(const float* a, const float* b, float* c, int m, int n, int k)
{
    const int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += a[row * k + i] * b[i * n + col];
    c[row * n + col] = sum;
}
"""
PARAMS = [{"name": "a", "kind": "buffer", "dtype": "float32", "intent": "in"},
          {"name": "b", "kind": "buffer", "dtype": "float32", "intent": "in"},
          {"name": "c", "kind": "buffer", "dtype": "float32", "intent": "out"},
          *({"name": s, "kind": "scalar", "dtype": "int32"} for s in "mnk")]
KERNEL_MS, LIBRARY_MS = 0.010, 0.005  # the fake device: 10 µs a kernel launch; the fake cuBLAS takes 5 µs


def product(view, m: int, n: int, k: int) -> None:
    a, b = view("a", m * k).reshape(m, k), view("b", k * n).reshape(k, n)
    view("c", m * n)[:] = (a.astype(np.float64) @ b).astype(np.float32).reshape(-1)


def mm_kernel(launch) -> None:
    product(lambda name, count: launch.array(name, np.float32, count), *(launch.args[s] for s in "mnk"))


class FakeSgemm:
    """cuBLAS on the fake device: the row-major product, written where the roles point."""

    def __init__(self, device):
        self.device = device

    def enqueue(self, pointers, scalars) -> None:
        product(lambda role, count: self.device.view(pointers[role], np.dtype(np.float32), count),
                scalars["m"], scalars["n"], scalars["k"])
        self.device.clock += LIBRARY_MS


def missing(device):
    raise LibraryUnavailable("cuBLAS not found (nowhere): pip install 'cuda-toolkit[cublas]' or set CUDAGATE_CUBLAS")


def write_mm(folder: Path, yaml_text: str = MM_YAML) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mm.cu").write_text(MM_CU)
    (folder / "reference.py").write_text(REFERENCE_PY)
    path = folder / "cudagate.yaml"
    path.write_text(yaml_text)
    generate(load_suite(path))
    return path


@pytest.fixture
def fake_cublas(monkeypatch):
    """Swap the cuBLAS adapter's loader: ``fake_cublas(loader)``, FakeSgemm by default."""
    def use(loader=FakeSgemm):
        monkeypatch.setitem(ADAPTERS, "cublas_sgemm", dataclasses.replace(ADAPTERS["cublas_sgemm"], load=loader))
    use()
    return use


def gate(pytester, suite_path: Path, monkeypatch):
    workers = install(monkeypatch, pytester.path, {"mm": FakeKernel(mm_kernel, PARAMS)})
    result = pytester.runpytest_inprocess("--cuda-gate", "--cuda-gate-allow-unsigned", str(suite_path.parent),
                                          "--cuda-gate-report", "out", "-p", "no:cacheprovider")
    document = json.loads((pytester.path / "out" / "report.json").read_text())
    assert schema.problems(document, "report") == []
    return result, {i["case"]: i for i in document["items"] if i["kernel"] == "mm"}, workers


# -- the suite field ------------------------------------------------------------------------------

@pytest.mark.parametrize("change, field, words", [
    ("adapter: cublas_sgemm", "kernels[0].library_baseline.adapter",
     "unknown library baseline adapter 'mkl_sgemm'; known adapters: cublas_sgemm"),
    ("a: a, b: b", "kernels[0].library_baseline.args.b",
     "cublas_sgemm's b is a float32 buffer; 'm' is not one of the signature's"),
    ("c: c", "kernels[0].library_baseline.args.c", "cublas_sgemm writes c; 'a' has intent in: map an output buffer"),
    (", k: k", "kernels[0].library_baseline.args", "cublas_sgemm needs role 'k': map it to a parameter, e.g. `k: k`"),
])
def test_a_baseline_that_cannot_work_is_refused_at_load_naming_file_field_and_fix(tmp_path, capsys, change, field,
                                                                                   words):
    replacement = {"adapter: cublas_sgemm": "adapter: mkl_sgemm", "a: a, b: b": "a: a, b: m", "c: c": "c: a",
                   ", k: k": ""}[change]
    text = replace_once(MM_YAML, BASELINE, BASELINE.replace(change, replacement))
    folder = tmp_path / "mm"
    folder.mkdir()
    (folder / "mm.cu").write_text(MM_CU)
    (folder / "reference.py").write_text(REFERENCE_PY)
    (folder / "cudagate.yaml").write_text(text)
    assert main(["check", str(folder / "cudagate.yaml")]) == 2
    err = capsys.readouterr().err
    assert str(folder / "cudagate.yaml") in err
    assert f"line {line_of(text, 'library_baseline')}: {field}: {words}" in err


def test_the_baseline_is_not_signed_like_tunables(tmp_path):
    with_baseline = load_suite(write_mm(tmp_path / "a"))
    without = load_suite(write_mm(tmp_path / "b", MM_YAML.replace(BASELINE, "")))
    assert with_baseline.kernels[0].library_baseline.to_json() == {
        "adapter": "cublas_sgemm", "args": {"a": "a", "b": "b", "c": "c", "m": "m", "n": "n", "k": "k"}}
    assert without.kernels[0].library_baseline is None
    assert suite_manifest(with_baseline)["kernels"] == suite_manifest(without)["kernels"]


# -- finding cuBLAS -------------------------------------------------------------------------------

def wheel(root: Path, folder: str, name: str) -> Path:
    path = root / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")
    return path


def test_cublas_is_found_in_order_env_then_the_cuda13_wheel_then_the_cuda12_wheel_then_the_system(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.setattr(library.ctypes.util, "find_library", lambda name: "libcublas.so.12" if name == "cublas" else None)
    site = tmp_path / "site-packages"
    wheel(site, "nvidia/cublas/lib", "libcublasLt.so.12")
    assert find_cublas({}, [str(site)]) == ("libcublas.so.12", "the system's library path")
    cu12 = wheel(site, "nvidia/cublas/lib", "libcublas.so.12")
    assert find_cublas({}, [str(tmp_path / "empty"), str(site)])[0] == str(cu12)
    cu13 = wheel(site, "nvidia/cu13/lib", "libcublas.so.13")
    wheel(site, "nvidia/cu13/lib", "libcublasLt.so.13")
    assert find_cublas({}, [str(site)]) == (str(cu13), f"the pip wheel folder {site / 'nvidia/cu13/lib'}")
    own = wheel(tmp_path, "mine", "libcublas.so")
    assert find_cublas({"CUDAGATE_CUBLAS": str(own)}, [str(site)]) == (str(own), "CUDAGATE_CUBLAS")
    assert find_cublas({"CUDAGATE_CUBLAS": str(tmp_path / "gone.so")}, [str(site)]) == (
        None, f"CUDAGATE_CUBLAS={tmp_path / 'gone.so'} is not a file")


def test_no_cublas_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(library.ctypes.util, "find_library", lambda name: None)
    monkeypatch.setattr(library.sys, "path", [str(tmp_path)])
    monkeypatch.delenv("CUDAGATE_CUBLAS", raising=False)
    with pytest.raises(LibraryUnavailable) as excinfo:
        CublasSgemm(device=None)
    assert str(excinfo.value).startswith("cuBLAS not found (not in CUDAGATE_CUBLAS, nvidia/cu13/lib or "
                                         "nvidia/cublas/lib under site-packages, or the system's library path): "
                                         "pip install 'cuda-toolkit[cublas]'")
    broken = wheel(tmp_path, "nvidia/cu13/lib", "libcublas.so.13")  # empty: no shared object to load
    with pytest.raises(LibraryUnavailable, match=f"cuBLAS at {broken} .* does not load: "):
        CublasSgemm(device=None)


# -- the protocol ---------------------------------------------------------------------------------

def test_a_timed_run_carries_the_baseline_and_answers_with_paired_samples(tmp_path, fake_cublas):
    suite = load_suite(write_mm(tmp_path / "mm"))
    program, case = suite.kernels[0], suite.case("wide")
    untimed = run_request(suite, program, [case], output_dir=tmp_path / "out", library=True)
    assert "library" not in untimed  # only timed runs time the library
    request = json.loads(json.dumps(run_request(suite, program, [case], output_dir=tmp_path / "out",
                                                timing=suite.timing.to_json(), library=True)))
    assert request["library"] == {"adapter": "cublas_sgemm", "args": {"a": "a", "b": "b", "c": "c", "m": "m",
                                                                       "n": "n", "k": "k"}, "rounds": 100,
                                  "settle": {"quantile": 0.5, "within": 0.005, "confidence": 0.99}}
    assert schema.problems(request, "harness-request") == []
    lines: list[dict] = []
    worker = make_worker({"mm": FakeKernel(mm_kernel, PARAMS)}, emit=lines.append)
    worker.handle({**request, "id": 1})
    # every timed launch holds the stream until it is enqueued and releases it: the kernel's own 100,
    # then the library's rounds (kernel and library, 100 each)
    assert worker.device.holds == worker.device.released == 300
    assert [schema.problems(line, "harness-response") for line in lines] == [[]] * len(lines)
    (answer,) = [line for line in lines if line["type"] == "case"]
    entry = answer["library"]
    assert entry["current_ms"] == pytest.approx([KERNEL_MS] * 100) and entry["library_ms"] == pytest.approx([LIBRARY_MS] * 100)
    assert answer["timing"]["samples_ms"] == pytest.approx([KERNEL_MS] * 100)  # the kernel's own rounds, unchanged
    got = np.load(entry["outputs"]["c"]["path"])
    assert got.shape == (24 * 40,) and np.isfinite(got).all()


def test_without_a_held_stream_the_library_is_not_timed_and_says_why(tmp_path, fake_cublas):
    suite = load_suite(write_mm(tmp_path / "mm"))
    program, case = suite.kernels[0], suite.case("wide")
    request = json.loads(json.dumps(run_request(suite, program, [case], output_dir=tmp_path / "out",
                                                timing=suite.timing.to_json(), library=True)))
    device = FakeDevice()
    device.holdable = False
    lines: list[dict] = []
    make_worker({"mm": FakeKernel(mm_kernel, PARAMS)}, device=device, emit=lines.append).handle({**request, "id": 1})
    (answer,) = [line for line in lines if line["type"] == "case"]
    assert answer["status"] == "ok" and answer["timing"]["held"] is False and device.holds == 0
    assert answer["library"] == {"adapter": "cublas_sgemm", "error": "not timed: a library baseline needs held "
                                 "launches, and this driver cannot hold a stream (no stream memory operations)"}


def test_a_kernel_timed_alone_times_its_library_for_one_block_only(tmp_path, fake_cublas):
    """A kernel identical to its approval takes several blocks alone; the informational column needs one."""
    suite = load_suite(write_mm(tmp_path / "mm"))
    program, case = suite.kernels[0], suite.case("wide")
    request = json.loads(json.dumps(run_request(suite, program, [case], output_dir=tmp_path / "out",
                                                timing=baseline_timing(suite), library=True)))
    assert request["timing"]["repeat"] == suite.timing.baseline_rounds > 100 and request["library"]["rounds"] == 100
    assert schema.problems(request, "harness-request") == []
    lines: list[dict] = []
    worker = make_worker({"mm": FakeKernel(mm_kernel, PARAMS)}, emit=lines.append)
    worker.handle({**request, "id": 1})
    (answer,) = [line for line in lines if line["type"] == "case"]
    assert len(answer["timing"]["samples_ms"]) == suite.timing.baseline_rounds
    assert len(answer["library"]["current_ms"]) == len(answer["library"]["library_ms"]) == 100
    assert worker.device.holds == suite.timing.baseline_rounds + 200


def test_the_library_warms_up_by_count_alone_after_the_kernels_timed_launches(tmp_path, fake_cublas):
    """The clocks were ramped by the kernel's own timed launches: no second time floor."""
    calls = []

    class Counting(FakeSgemm):
        def enqueue(self, pointers, scalars) -> None:
            calls.append(1)
            super().enqueue(pointers, scalars)

    fake_cublas(Counting)
    suite = load_suite(write_mm(tmp_path / "mm"))
    program, case = suite.kernels[0], suite.case("wide")
    timing = {**suite.timing.to_json(), "warmup": 2, "warmup_ms": 300.0}
    request = json.loads(json.dumps(run_request(suite, program, [case], output_dir=tmp_path / "out", timing=timing,
                                                library=True)))
    worker = make_worker({"mm": FakeKernel(mm_kernel, PARAMS)}, emit=lambda line: None)
    worker.handle({**request, "id": 1})
    # one validation launch, 2 to 4 warm-up launches, one block of rounds
    assert 1 + 2 + suite.timing.repeat <= len(calls) <= 1 + 4 + suite.timing.repeat


def test_a_kernel_writing_past_its_buffer_only_during_the_library_rounds_fails_its_case(tmp_path):
    """The kernel runs in the library's rounds too: a stray write there is the kernel's finding."""
    enqueued = []

    class CountingSgemm(FakeSgemm):
        def enqueue(self, pointers, scalars) -> None:
            enqueued.append(1)
            super().enqueue(pointers, scalars)

    def late_stray(launch) -> None:
        mm_kernel(launch)
        if 0 < len(enqueued) < 50:  # only while the library series runs (it enqueues cuBLAS 100+ times)
            launch.at("c", np.float32, 24 * 40, 2)[:] = 7.0

    suite = load_suite(write_mm(tmp_path / "mm"))
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("wide")], output_dir=tmp_path / "out",
                                                timing=suite.timing.to_json(), library=True)))
    lines: list[dict] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ADAPTERS, "cublas_sgemm", dataclasses.replace(ADAPTERS["cublas_sgemm"], load=CountingSgemm))
        make_worker({"mm": FakeKernel(late_stray, PARAMS)}, emit=lines.append).handle({**request, "id": 1})
    (answer,) = [line for line in lines if line["type"] == "case"]
    assert len(enqueued) > 100 and answer["guards"]["c"]["after"]["phase"] == "the library baseline's launches"
    assert "guards" not in answer["library"]


# -- the gate and its reports ---------------------------------------------------------------------

def test_each_performance_case_shows_its_multiple_of_cublas_and_nothing_else_changes(pytester, monkeypatch,
                                                                                     fake_cublas):
    result, items, workers = gate(pytester, write_mm(pytester.path / "mm"), monkeypatch)
    result.assert_outcomes(passed=4)  # compile and three cases
    for case in ("square", "wide"):
        lib = items[case]["library"]
        assert lib["error"] is None and lib["label"] == "cuBLAS SGEMM"
        assert lib["estimate"]["ratio"] == pytest.approx(KERNEL_MS / LIBRARY_MS)
        assert lib["estimate"]["low"] <= lib["estimate"]["ratio"] <= lib["estimate"]["high"]
        assert lib["estimate"]["n"] == 100 and lib["library"]["median"] == pytest.approx(LIBRARY_MS)
        assert items[case]["passed"] and items[case]["latency"]["verdict"] == "incomparable"  # as without a baseline
    assert items["small"]["library"] is None
    out = result.stdout.str()
    assert "× cuBLAS SGEMM [99% CI]" in out and "2.000× [2.000, 2.000]" in out
    html = (pytester.path / "out" / "report.html").read_text()
    assert "<th>× cuBLAS SGEMM (informational)</th>" in html and "2.000× [2.000, 2.000]" in html
    assert "<h4>Library baseline</h4>" in html and "informational, never part of the verdict" in html
    timed = [r for r in workers[0].requests if r.get("timing")]
    assert timed and all(r["library"]["adapter"] == "cublas_sgemm" for r in timed)
    assert not any("library" in r for r in workers[0].requests if not r.get("timing"))


def test_a_wrong_mapping_or_a_missing_library_is_said_in_the_column_never_as_a_failure(pytester, monkeypatch,
                                                                                       fake_cublas):
    swapped = replace_once(MM_YAML, "args: {a: a, b: b,", "args: {a: b, b: a,")
    result, items, _ = gate(pytester, write_mm(pytester.path / "mm", swapped), monkeypatch)
    result.assert_outcomes(passed=4)
    assert items["square"]["library"]["error"].startswith(
        "its output does not match the reference (check the suite's library_baseline args): output 'c':")
    assert items["wide"]["library"]["error"] == (
        "b: buffer a holds 384 elements, the call reads or writes 640 (m=24, n=40, k=16)")
    assert items["square"]["library"]["estimate"] is None
    out = result.stdout.str()
    assert "library baseline cuBLAS SGEMM, no ratio for mm × square: its output does not match" in out

    fake_cublas(missing)
    result, items, _ = gate(pytester, write_mm(pytester.path / "mm"), monkeypatch)
    result.assert_outcomes(passed=4)
    assert {items[c]["library"]["error"] for c in ("square", "wide")} == {
        "cuBLAS not found (nowhere): pip install 'cuda-toolkit[cublas]' or set CUDAGATE_CUBLAS"}
    assert ("library baseline cuBLAS SGEMM, no ratio for mm × square, mm × wide: cuBLAS not found"
            in result.stdout.str())


def test_the_comparison_with_the_approved_kernel_times_the_library_after_its_own_rounds(pytester, monkeypatch,
                                                                                      fake_cublas):
    suite_path = write_mm(pytester.path / "mm")
    workers = install(monkeypatch, pytester.path, {"mm": FakeKernel(mm_kernel, PARAMS)})
    assert main(["approve", str(suite_path), "--approved-by", "reviewer", "--runs", "1"]) == 0
    assert not any("library" in r for w in workers for r in w.requests)  # approving never times the library
    (suite_path.parent / "mm.cu").write_text(MM_CU + "// changed\n")
    result, items, workers = gate(pytester, suite_path, monkeypatch)
    result.assert_outcomes(passed=4)
    compares = [r for r in workers[0].requests if r["op"] == "compare"]
    assert {r["case"]["name"] for r in compares} == {"square", "wide"}
    assert all(r["library"]["adapter"] == "cublas_sgemm" for r in compares)
    for case in ("square", "wide"):
        assert items[case]["latency"]["verdict"] == "pass"
        assert items[case]["library"]["estimate"]["ratio"] == pytest.approx(KERNEL_MS / LIBRARY_MS)


# -- the optimize pack ----------------------------------------------------------------------------

def test_the_pack_shows_the_winners_multiple_of_the_library_per_case(tmp_path):
    class WithLibrary(FakeEvaluator):
        def validate(self, candidate):
            validation = super().validate(candidate)
            for entry in validation.cases:
                if entry["kind"] == "performance" and entry["case"] != "perf2":
                    result = LibraryResult("cublas_sgemm", "cuBLAS SGEMM",
                                           estimate=stats.paired_ratio([0.012] * 40, [0.010] * 40),
                                           library=stats.summarize([0.010] * 40), current=stats.summarize([0.012] * 40))
                    entry["library"] = to_json(result)
                elif entry["kind"] == "performance":
                    entry["library"] = to_json(LibraryResult("cublas_sgemm", "cuBLAS SGEMM", error="cuBLAS not found"))
            return validation

    code, pack, summary, _ = run_pack(tmp_path, opt_suite(tmp_path / "scale"), "--proposer", "autotune", "--batch", 4,
                                      "--max-iterations", 2, evaluator=WithLibrary,
                                      latency_fn=lambda candidate, case: 0.010 if candidate.defines.get("BLOCK") == 256
                                      else 0.020)
    assert code == 0, summary["stop_detail"]
    assert_pack_valid(pack)
    cases = {c["case"]: c["gate"] for c in summary["best"]["cases"]}
    assert cases["perf"]["library"]["ratio"]["ratio"] == pytest.approx(1.2)
    assert cases["perf"]["library"]["library_ms"] == pytest.approx(0.010)
    assert cases["perf2"]["library"] == {"label": "cuBLAS SGEMM", "ratio": None, "error": "cuBLAS not found",
                                         "library_ms": None}
    assert "library" not in cases["small"]
    html = (pack / "report.html").read_text()
    assert "<th>× cuBLAS SGEMM (informational)</th>" in html
    assert "1.200 [1.200, 1.200] (99%) · 10.00 µs" in html and "cuBLAS not found" in html
