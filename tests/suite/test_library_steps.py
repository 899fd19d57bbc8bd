"""Steps beyond launches (issue 44): memset, copy and cuBLAS GEMM steps, and a scratch buffer's ``init:``.

On the simulated GPU, the real harness worker and gate run examples/attention (GEMM -> memset ->
two softmax kernels -> GEMM) with its kernels as Python bodies and cuBLAS as a column-major GEMM in
numpy behind the real adapter's ctypes calls, so the adapter's row-major mapping is checked too."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil

import numpy as np
import pytest

from fake_worker import SCALE_PARAMS, FakeDevice, FakeKernel, FakeWorker
from helpers import EXAMPLES, SUITE_YAML, line_of, replace_once, write_suite
from test_hardening_gate import Fingerprint
from test_padded_buffers import PADDED_YAML, padded_suite

from cudagate_harness import library
from cudagate_harness.library import ADAPTERS, CublasGemm, LibraryUnavailable
from cudagate_harness.protocol import encode, numpy_dtype, values
from cudagate_harness.request_checks import request_problems
from pytest_cudagate.cli import main
from pytest_cudagate.gate import Gate, GateOptions
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import launch_from_record
from pytest_cudagate.trust.approvals import Ledger, build_identity
from pytest_cudagate.trust.manifest import suite_manifest
from pytest_cudagate.worker.requests import run_request

ATTENTION_YAML = (EXAMPLES / "attention" / "cudagate.yaml").read_text(encoding="utf-8")
MEMSET = "      - memset: {buffer: rowmax, value: -inf}\n"
TYPES = {0: "float32", 2: "float16", 14: "bfloat16"}


# -- cuBLAS as numpy: the column-major GEMM the adapter's ctypes calls reach ------------------------------
class FakeCublas:
    """cublasGemmEx and cublasGemmStridedBatchedEx, column-major as cuBLAS documents them, on a
    :class:`FakeDevice`'s memory (or host arrays by address)."""

    def __init__(self, read, write):
        self.read, self.write, self.calls = read, write, []

    def cublasGemmEx(self, handle, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo):
        return self.cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, alpha, a, at, lda, 0, b, bt, ldb, 0, beta, c,
                                               ct, ldc, 0, 1, compute, algo)

    def cublasGemmStridedBatchedEx(self, handle, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb, beta, c, ct,
                                   ldc, sc, batch, compute, algo):
        assert compute == library.CUBLAS_COMPUTE_32F
        self.calls.append({"m": m, "n": n, "k": k, "batch": batch, "types": (TYPES[at], TYPES[bt], TYPES[ct])})
        alpha, beta = alpha._obj.value, beta._obj.value
        size = {t: numpy_dtype(TYPES[t]).itemsize for t in (at, bt, ct)}
        for h in range(batch):
            op_a = self.read(a + h * sa * size[at], TYPES[at], *((m, k) if ta == 0 else (k, m)), lda)
            op_b = self.read(b + h * sb * size[bt], TYPES[bt], *((k, n) if tb == 0 else (n, k)), ldb)
            product = (op_a if ta == 0 else op_a.T) @ (op_b if tb == 0 else op_b.T)
            old = self.read(c + h * sc * size[ct], TYPES[ct], m, n, ldc) if beta else 0.0
            self.write(c + h * sc * size[ct], TYPES[ct], alpha * product + beta * old, ldc)
        return 0


def device_memory(device: FakeDevice):
    """Column-major reads and writes of a rows × cols matrix with leading dimension ld, as float64."""
    def place(rows, cols, ld):
        i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        return i + j * ld, (cols - 1) * ld + rows

    def read(ptr, dtype, rows, cols, ld):
        index, extent = place(rows, cols, ld)
        return values(device.view(ptr, numpy_dtype(dtype), extent).copy()).astype(np.float64)[index]

    def write(ptr, dtype, matrix, ld):
        index, extent = place(*matrix.shape, ld)
        view = device.view(ptr, numpy_dtype(dtype), extent)
        view[index] = encode(matrix, dtype) if dtype == "bfloat16" else matrix.astype(numpy_dtype(dtype))

    return read, write


def fake_gemm(device: FakeDevice) -> CublasGemm:
    gemm = CublasGemm.__new__(CublasGemm)  # the real enqueue, without loading a library
    gemm.lib, gemm.handle = FakeCublas(*device_memory(device)), None
    return gemm


@pytest.fixture
def fake_cublas(monkeypatch):
    made: list[CublasGemm] = []

    def load(device):
        made.append(fake_gemm(device))
        return made[-1]

    monkeypatch.setitem(ADAPTERS, "cublas_gemm", dataclasses.replace(ADAPTERS["cublas_gemm"], load=load))
    return made


# -- the GEMM adapter's row- and column-major mapping -------------------------------------------------------
def expected_gemm(a, b, c, o):
    """The meaning the docs give, computed directly: C = alpha·op(A)·op(B) + beta·C per batch."""
    row = o["layout"] == "row"

    def matrix(flat, rows, cols, ld, offset):
        i, j = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        return flat[offset + (i * ld + j if row else i + j * ld)]

    out = c.copy()
    for h in range(o["batch"]):
        (ra, ca), (rb, cb), _ = library._stored(o).values()
        op_a = matrix(a, ra, ca, o["lda"], h * o["stride_a"])
        op_b = matrix(b, rb, cb, o["ldb"], h * o["stride_b"])
        product = (op_a.T if o["trans_a"] else op_a) @ (op_b.T if o["trans_b"] else op_b)
        i, j = np.meshgrid(np.arange(o["m"]), np.arange(o["n"]), indexing="ij")
        where = h * o["stride_c"] + (i * o["ldc"] + j if row else i + j * o["ldc"])
        out[where] = o["alpha"] * product + o["beta"] * c[where]
    return out


@pytest.mark.parametrize("layout, trans_a, trans_b, batch, dtype", [
    *itertools.product(["row", "col"], [False, True], [False, True], [1], ["float32"]),
    ("row", False, True, 3, "float32"), ("col", True, False, 2, "float32"),
    ("row", False, False, 1, "bfloat16"), ("col", False, True, 2, "float16")])
def test_the_gemm_adapter_computes_what_the_docs_say_in_every_layout(layout, trans_a, trans_b, batch, dtype):
    device = FakeDevice()
    options = library._gemm_complete({"m": 5, "n": 3, "k": 4, "layout": layout, "trans_a": trans_a,
                                      "trans_b": trans_b, "alpha": 0.5, "beta": -2.0, "batch": batch,
                                      **({"lda": 9} if layout == "row" and not trans_a else {})})
    rng = np.random.default_rng(1)
    counts = {"a": (batch - 1) * options["stride_a"] + 9 * 5, "b": batch * 12, "c": batch * 15}
    assert library._gemm_fits(counts, options) is None
    host = {role: rng.integers(-4, 5, counts[role]).astype(np.float64) for role in counts}
    pointers = {}
    for role, data in host.items():
        pointers[role] = device.alloc(data.size * numpy_dtype(dtype).itemsize)
        stored = encode(data, dtype) if dtype == "bfloat16" else data.astype(numpy_dtype(dtype))
        device.upload(pointers[role], stored)
    fake_gemm(device).enqueue(pointers, dict.fromkeys("abc", dtype), options)
    got = values(device.download(pointers["c"], np.empty(counts["c"], numpy_dtype(dtype)))).astype(np.float64)
    np.testing.assert_array_equal(got, expected_gemm(host["a"], host["b"], host["c"], options))


def test_the_gemm_adapter_refuses_a_call_past_its_buffers_and_overlapping_batches():
    options = library._gemm_complete({"m": 4, "n": 4, "k": 4, "batch": 2, "stride_c": 8})
    assert library._gemm_fits({"a": 32, "b": 32, "c": 32}, options) == (
        "stride_c = 8: the batch's matrices of c overlap (each spans 16 elements)")
    options = library._gemm_complete({"m": 4, "n": 4, "k": 4, "layout": "col", "lda": 2})
    assert "lda = 2: a col-major 4×4 a needs a leading dimension of 4 to" in library._gemm_fits(
        {"a": 16, "b": 16, "c": 16}, options)


# -- the attention example on the simulated GPU ---------------------------------------------------------------
def row_max(launch):
    t = launch.args["T"]
    rows = launch.grid[1]
    scores = launch.array("scores", np.float32, rows * t).reshape(rows, t)
    rowmax = launch.array("rowmax", np.float32, rows)
    causal = np.arange(t)[None, :] <= (np.arange(rows) % t)[:, None]
    most = np.where(causal, scores, -np.inf).max(axis=1)
    rowmax[:] = np.where(np.isnan(rowmax), np.nan, np.fmax(rowmax, most))  # atomicMax on what is there


def softmax_rows(launch):
    t = launch.args["T"]
    rows = launch.grid[0]
    scores = launch.array("scores", np.float32, rows * t).reshape(rows, t)
    most = launch.array("rowmax", np.float32, rows)[:, None].astype(np.float64)
    causal = np.arange(t)[None, :] <= (np.arange(rows) % t)[:, None]
    e = np.where(causal, np.exp(scores - most), 0.0)
    with np.errstate(invalid="ignore"):  # a row maximum left NaN gives NaN, as on a GPU
        scores[:] = (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


def attention_suite(folder, text=ATTENTION_YAML):
    shutil.copytree(EXAMPLES / "attention", folder, ignore=shutil.ignore_patterns("approved", "cudagate.*.json"))
    (folder / "cudagate.yaml").write_text(text + "checks: {sanitizer: off}\n", encoding="utf-8")
    return load_suite(folder / "cudagate.yaml")


def attention_worker(suite, **bodies) -> FakeWorker:
    params = {p.name: p.protocol() for p in suite.signature}
    chosen = {"row_max": row_max, "softmax_rows": softmax_rows, **bodies}
    return FakeWorker({s.entry: FakeKernel(chosen[s.entry], [params[a] for a in s.args])
                       for s in suite.kernels[0].launch_steps})


def replay(suite, worker, tmp_path, case="correct_2x37x16"):
    gate = Gate(worker, Fingerprint(), GateOptions(fresh_seed=7), tmp_path / "out")
    return gate.replay(suite, suite.kernels[0], suite.case(case), Ledger.for_suite(suite))


def test_the_attention_operation_passes_with_its_library_and_memset_steps_in_order(tmp_path, fake_cublas):
    suite = attention_suite(tmp_path / "attention")
    worker = attention_worker(suite)
    outcome = replay(suite, worker, tmp_path)
    assert not outcome.failed, outcome.message
    launch = worker.requests[0]["cases"][0]["launch"]
    assert [next(k for k in ("library", "memset", "entry") if k in s) for s in launch] == [
        "library", "memset", "entry", "entry", "library"]
    assert launch[0]["options"] == {"m": 37, "n": 37, "k": 16, "trans_b": True, "alpha": 0.25, "batch": 2,
                                    "layout": "row", "trans_a": False, "beta": 0.0, "lda": 16, "ldb": 16, "ldc": 37,
                                    "stride_a": 592, "stride_b": 592, "stride_c": 1369}
    assert launch[1] == {"memset": {"buffer": "rowmax", "bits": 0xFF800000}}
    assert worker.requests[0]["kernel"]["entries"] == ["row_max", "softmax_rows"]
    calls = fake_cublas[0].lib.calls
    assert calls and all(call["batch"] == 2 for call in calls)


def test_without_its_memset_the_row_maxima_start_poisoned_and_the_operation_fails(tmp_path, fake_cublas):
    suite = attention_suite(tmp_path / "attention", replace_once(ATTENTION_YAML, MEMSET, ""))
    outcome = replay(suite, attention_worker(suite), tmp_path)
    assert outcome.failed and "out" in outcome.message, outcome.message


@pytest.mark.slow
def test_a_scratch_init_is_set_before_every_launch_timed_ones_too(tmp_path, fake_cublas):
    text = replace_once(replace_once(ATTENTION_YAML, MEMSET, ""), "{name: rowmax, buffer: float32, intent: scratch,",
                        "{name: rowmax, buffer: float32, intent: scratch, init: -inf,")
    suite = attention_suite(tmp_path / "attention", text + "timing: {warmup: 2, repeat: 5, warmup_ms: 0}\n")
    seen = []

    def watching(launch):
        seen.append(launch.array("rowmax", np.float32, launch.grid[1]).copy())
        row_max(launch)

    worker = attention_worker(suite, row_max=watching)
    outcome = replay(suite, worker, tmp_path, case="perf_8x512x64")
    assert not outcome.failed, outcome.message
    assert worker.requests[0]["signature"][4] == {"name": "rowmax", "kind": "buffer", "dtype": "float32",
                                                  "intent": "scratch", "init": 0xFF800000}
    assert len(seen) > 10 and all(np.all(np.isneginf(start)) for start in seen)


def test_a_library_that_is_missing_fails_the_case_with_its_hint(tmp_path, monkeypatch):
    def missing(device):
        raise LibraryUnavailable("cuBLAS not found (nowhere): " + library.CUBLAS_HINT)

    monkeypatch.setitem(ADAPTERS, "cublas_gemm", dataclasses.replace(ADAPTERS["cublas_gemm"], load=missing))
    suite = attention_suite(tmp_path / "attention")
    outcome = replay(suite, attention_worker(suite), tmp_path)
    assert outcome.failed and "LIBRARY_UNAVAILABLE" in outcome.message and "CUDAGATE_CUBLAS" in outcome.message


def test_the_sanitizer_launch_replays_every_step(tmp_path, fake_cublas):
    suite = attention_suite(tmp_path / "attention")
    request = run_request(suite, suite.kernels[0], [suite.case("correct_2x37x16")], output_dir=tmp_path / "o")
    request["cases"][0]["sanitize"] = True
    body = attention_worker(suite).run(request).cases["correct_2x37x16"]
    assert body["status"] == "ok", body
    expected = np.load(suite.expected_path(suite.case("correct_2x37x16"), suite.signature[5]))
    np.testing.assert_allclose(np.load(body["outputs"]["out"]["path"]), expected.reshape(-1), rtol=1e-5, atol=1e-6)


COPY_YAML = (SUITE_YAML
             .replace("  - {name: rows, scalar: int32}\n",
                      "  - {name: t, buffer: float32, intent: scratch, size: rows*cols}\n  - {name: rows, scalar: int32}\n")
             .replace("    launch: {grid: [rows], block: [128]}\n",
                      "    steps:\n      - copy: {from: x, to: t}\n      - entry: scale2\n        args: [t, y, rows, cols]\n"
                      "        launch: {grid: [rows], block: [128]}\n"))


def test_a_copy_step_feeds_the_kernel_after_it(tmp_path):
    suite = load_suite(write_suite(tmp_path / "scale", yaml_text=COPY_YAML + "checks: {sanitizer: off}\n"))

    def from_t(launch):
        n = launch.args["rows"] * launch.args["cols"]
        launch.array("y", np.float32, n)[:] = 2 * launch.array("t", np.float32, n)

    params = [dict(p, name="t") if p["name"] == "x" else p for p in SCALE_PARAMS]
    worker = FakeWorker({"scale2": FakeKernel(from_t, params)})
    gate = Gate(worker, Fingerprint(), GateOptions(fresh_seed=7), tmp_path / "out")
    outcome = gate.replay(suite, suite.kernels[0], suite.case("small"), Ledger.for_suite(suite))
    assert not outcome.failed, outcome.message
    assert worker.requests[0]["cases"][0]["launch"][0] == {"copy": {"from": "x", "to": "t", "count": 150}}


# -- identity: signed, pinned, recorded ---------------------------------------------------------------------
@pytest.mark.parametrize("old, new", [("value: -inf}", "value: 0}"), ("alpha: scale,", "alpha: 1,"),
                                      ("trans_b: true,", "trans_b: true, layout: row,")])
def test_memset_and_library_steps_are_part_of_the_kernels_identity_and_manifest(tmp_path, old, new):
    suite = attention_suite(tmp_path / "a")
    changed = attention_suite(tmp_path / "b", replace_once(ATTENTION_YAML, old, new))
    assert build_identity(changed.kernels[0]) != build_identity(suite.kernels[0])
    assert suite_manifest(changed)["kernels"] != suite_manifest(suite)["kernels"]
    launch = suite.kernels[0].launch
    assert launch_from_record(launch.to_json()) == launch  # what an approval pins reads back the same


def test_the_signed_example_keeps_its_steps_in_its_manifest():
    suite = load_suite(EXAMPLES / "attention" / "cudagate.yaml")
    steps = suite_manifest(suite)["kernels"]["attention_causal"]["launch"]["steps"]
    assert [s.get("kind", "launch") for s in steps] == ["library", "memset", "launch", "launch", "library"]
    assert main(["verify", str(suite.path)]) == 0


# -- the worker refuses what would fault or write an input ----------------------------------------------------
@pytest.mark.parametrize("edit, says", [
    (lambda r: r["cases"][0]["launch"][1]["memset"].update(buffer="q"), "step 2: it writes q, an input"),
    (lambda r: r["cases"][0]["launch"][1]["memset"].update(bits=1 << 32), "memset bits must be an integer of 32 bits"),
    (lambda r: r["cases"][0]["launch"][0].update(library="cublas_hgemm"), "unknown library step adapter 'cublas_hgemm'"),
    (lambda r: r["cases"][0]["launch"][0]["options"].update(batch=3), "step 1: a: the call reads or writes"),
    (lambda r: r["cases"][0]["launch"][1].update(copy={"from": "q", "to": "out", "count": 1}),
     "a step is one of a launch (entry), memset, copy or library call"),
    (lambda r: r["cases"][0]["launch"].insert(0, {"copy": {"from": "q", "to": "out", "count": 10**6}}),
     "copy count must be an integer from 0 to the smaller buffer's element count"),
    (lambda r: r["signature"][5].update(init=0), "signature[5].init: a scratch buffer's initial element"),
])
def test_the_worker_refuses_a_step_that_could_fault_or_write_an_input(tmp_path, edit, says):
    suite = attention_suite(tmp_path / "attention")
    request = run_request(suite, suite.kernels[0], [suite.case("correct_2x37x16")], output_dir=tmp_path)
    assert request_problems(request) == []
    edit(request)
    assert any(says in problem for problem in request_problems(request)), request_problems(request)



def harness_file(tmp_path, capsys, request) -> tuple[int, str]:
    """``python -m cudagate_harness REQUEST.json`` (a request file may come from anyone): its exit code and stderr."""
    from cudagate_harness.__main__ import main as harness

    path = tmp_path / "request.json"
    path.write_text(json.dumps(request), encoding="utf-8")
    code = harness([str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("edit, says", [
    (lambda r: r["cases"][0]["launch"].__setitem__(1, "memset"), "case 'correct_2x37x16': each step must be an object"),
    (lambda r: r["cases"][0]["launch"][2].update(entry=["row_max"]), "each step must be an object: a launch (its entry a"),
    (lambda r: r["cases"][0].update(buffers=["q"]), "case 'correct_2x37x16': buffers must be an object"),
    (lambda r: r["cases"][0].update(fresh=[{"inputs": ["q.npy"]}]), "fresh inputs must be an object of buffer name"),
    (lambda r: r.update(cases=7), "cases: must be a list of case objects"),
    (lambda r: r["signature"][0].update(dtype=["float32"]),
     'signature[0].dtype: "[\'float32\']" is not a dtype cudagate knows; write one of'),
    (lambda r: r["cases"][0]["launch"][0]["options"].update(alpha=10**400), "options must give every option of "
     "cublas_gemm as a plain value (a number finite, within float32)"),
    (lambda r: r["cases"][0]["launch"][0]["options"].update(alpha=float("nan")), "a number finite, within float32"),
])
def test_a_malformed_request_file_is_one_line_never_a_traceback(tmp_path, capsys, edit, says):
    """The worker checked a request's steps assuming their shape: a step that is no object, an entry that is
    a list, buffers given as a list, a library option beyond float were a traceback here, and killed the worker
    serving the protocol (its checks run before the request's own error handling)."""
    suite = attention_suite(tmp_path / "attention")
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("correct_2x37x16")],
                                                output_dir=tmp_path / "out"), default=str))
    assert request_problems(request) == []
    edit(request)
    code, err = harness_file(tmp_path, capsys, request)
    assert code == 2 and says in err and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("value", ["nope", '["x"]', '{"mine": 3}'])
def test_a_malformed_adapters_variable_is_one_line_never_a_traceback(tmp_path, capsys, monkeypatch, value):
    suite = attention_suite(tmp_path / "attention")
    request = json.loads(json.dumps(run_request(suite, suite.kernels[0], [suite.case("correct_2x37x16")],
                                                output_dir=tmp_path / "out"), default=str))
    request["cases"][0]["launch"][0]["library"] = "mine"
    monkeypatch.setenv(library.ADAPTERS_ENV, value)
    code, err = harness_file(tmp_path, capsys, request)
    assert code == 2 and "$CUDAGATE_LIBRARY_ADAPTERS is not a JSON object of name to" in err, err
    assert "Traceback" not in err and err.count("\n") == 1


def test_a_worker_outside_a_gate_run_imports_no_adapter_the_environment_names(tmp_path, monkeypatch):
    """The gate run tells its worker its plugins' adapters; every other command's worker (`cudagate run`,
    `approve`, `bisect`, `cases generate`) is told none, whatever the environment it inherits says."""
    from pytest_cudagate import session
    from pytest_cudagate.worker import client

    started = []

    class Stop(Exception):
        pass

    class Client(client.HarnessClient):
        def start(self):
            started.append(self.env)
            raise Stop

    monkeypatch.setattr(session, "HarnessClient", Client)
    monkeypatch.setenv(library.ADAPTERS_ENV, json.dumps({"mine": "planted:ADAPTER"}))
    with pytest.raises(Stop):
        session.open_worker()
    assert json.loads(started[0][library.ADAPTERS_ENV]) == {}

# -- what `cudagate check` says of each bad step: one line, its file, line and field -------------------------
BAD = {
    "unknown adapter": ("  - library: cublas_gemm\n        args: {a: q", "  - library: cublas_hgemm\n        args: {a: q",
                        "kernels[0].steps[0].library: unknown library step adapter 'cublas_hgemm'; known adapters: "
                        "cublas_gemm", "library: cublas_hgemm"),
    "buffer type": ("{name: out, buffer: float32", "{name: out, buffer: int32",
                    "kernels[0].steps[4].args: cublas_gemm multiplies float32, bfloat16 or float16 matrices, a and b "
                    "of one type and c of theirs or float32; here a is float32, b is float32, c is int32; map buffers "
                    "of types it takes", "args: {a: scores, b: v, c: out}"),
    "layout": ("trans_b: true,", "trans_b: true, layout: diagonal,",
               "kernels[0].steps[0].options.layout: 'diagonal' is not one of row, col", "layout: diagonal"),
    "memset value": ("value: -inf}", "value: 1.0e+39}", "kernels[0].steps[1].memset.value: buffer 'rowmax' is float32: "
                     "1e+39 is beyond float32's largest value 3.40282e+38; write a value within ±3.40282e+38",
                     "value: 1.0e+39"),
    "memset of an input": ("memset: {buffer: rowmax", "memset: {buffer: q",
                           "kernels[0].steps[1].memset.buffer: the memset writes 'q', an input buffer, which must come "
                           "back unchanged; write an output or scratch buffer", "memset: {buffer: q"),
    "two kinds": (MEMSET, MEMSET + "        copy: {from: q, to: out}\n",
                  "kernels[0].steps[1]: a step is one of a launch (`entry`), `memset`, `copy` or `library`; this one is "
                  "memset and copy: split it into one step each", "memset: {buffer: rowmax"),
    "output unwritten": ("args: {a: scores, b: v, c: out}", "args: {a: scores, b: v, c: scores}",
                         "kernels[0].steps: output buffer 'out' is written by no step; add it to the `args` of the step "
                         "that writes it (a memset, copy or library call into it counts)", "- library: cublas_gemm"),
    "no kernel launch": ("      - entry: row_max\n        args: [scores, rowmax, T]\n        launch: "
                         "{grid: [\"cdiv(T, 256)\", H*T], block: [256]}\n      - entry: softmax_rows\n        args: "
                         "[scores, rowmax, T]\n        launch: {grid: [H*T], block: [256]}\n", "",
                         "kernels[0].steps: no step launches an entry of attention.cu: the operation gated is the "
                         "kernel's; add its launch step (`- entry: NAME`)", "- library: cublas_gemm"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_cudagate_check_names_each_bad_step_in_one_line(tmp_path, capsys, name):
    old, new, says, on_line = BAD[name]
    folder = tmp_path / "attention"
    shutil.copytree(EXAMPLES / "attention", folder, ignore=shutil.ignore_patterns("cases", "approved", "*.json"))
    text = replace_once(ATTENTION_YAML, old, new)
    (folder / "cudagate.yaml").write_text(text, encoding="utf-8")
    assert main(["check", "--allow-unsigned", str(folder)]) == 2
    err = capsys.readouterr().err
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert problems == [f"  - line {line_of(text, on_line)}: {says}"], err


@pytest.mark.parametrize("value, dtype, says", [
    (0.1, "bfloat16", "0.1 is not a bfloat16 value (the nearest is 0.10009765625); write 0.10009765625"),
    ("-inf", "float8_e4m3fn", "float8_e4m3fn has no infinity; write its largest value 448"),
    (300, "int8", "300 does not fit int8 (-128 to 127); write a whole number within it"),
    (1.5, "int32", "1.5 does not fit int32"),
])
def test_a_value_a_buffer_cannot_hold_is_refused_naming_the_fix(value, dtype, says):
    from pytest_cudagate.suite.steps import element_bits

    bits, problem = element_bits(value, dtype)
    assert bits is None and problem.startswith(says), problem


@pytest.mark.parametrize("value, dtype, bits", [(0, "float32", 0), ("-inf", "float32", 0xFF800000),
                                                 (1.0, "bfloat16", 0x3F80), ("-inf", "float64", 0xFFF0000000000000),
                                                 (-1, "int16", 0xFFFF), (448, "float8_e4m3fn", 0x7E)])
def test_a_value_is_sent_as_the_bits_of_one_element(value, dtype, bits):
    from pytest_cudagate.suite.steps import element_bits

    assert element_bits(value, dtype) == (bits, None)


@pytest.mark.parametrize("step, fields", [
    ("- memset: {buffer: y, value: 0}", ["steps[0].memset.buffer"]),
    ("- copy: {from: x, to: y}", ["steps[0].copy.from", "steps[0].copy.to"]),
])
def test_a_step_other_than_a_launch_on_a_padded_buffer_is_one_line(tmp_path, capsys, step, fields):
    """A memset writes (a copy reads) a padded buffer's elements in one run, padding included: the worker
    then found the padding changed and blamed an honest kernel for writing it. Refused where it is written."""
    text = PADDED_YAML.replace("""  - name: honest
    source: scale.cu
    launch: {grid: [rows], block: [128]}
""", f"""  - name: honest
    source: scale.cu
    steps:
      {step}
      - entry: honest
        args: [x, y, rows, cols, ldx, ldy]
        launch: {{grid: [rows], block: [128]}}
""")
    path = padded_suite(tmp_path / "padded", text, data=False)
    assert main(["check", "--allow-unsigned", str(path)]) == 2
    err = capsys.readouterr().err
    assert all(f"kernels[0].{field}: " in err for field in fields) and "a padded buffer (ld)" in err, err
    assert err.count("\n  - ") == len(fields) and "Traceback" not in err


def test_a_client_process_imports_no_adapter_its_environment_names(tmp_path, monkeypatch):
    """Only the harness imports a plugin's adapter: `cudagate run` checking a request in its own process
    (request_problems) does not import a module an inherited environment names."""
    (tmp_path / "planted.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(library.ADAPTERS_ENV, json.dumps({"mine": "planted:ADAPTER"}))
    monkeypatch.setattr(library, "_plugin_adapters", False)  # as in a client: harness_file above ran the harness here
    suite = attention_suite(tmp_path / "attention")
    request = run_request(suite, suite.kernels[0], [suite.case("correct_2x37x16")], output_dir=tmp_path)
    request["cases"][0]["launch"][0]["library"] = "mine"
    assert any("unknown library step adapter 'mine'" in p for p in request_problems(request))
    assert not (tmp_path / "imported").exists()
