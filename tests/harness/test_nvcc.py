"""nvcc beside NVRTC (issue 42, item 1): a .cu file as a team keeps it, host code and all, gated
without editing it. Real compiles on the CPU: nvcc from a CUDA toolkit or the nvidia-cuda-nvcc package
(the `test` extra installs it), with the host's gcc; NVRTC from PyPI."""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from cudagate_harness import compiler, nvcc
from helpers import SUITE_YAML, replace_once, write_suite
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.trust.release import BuildRecord, build_drift
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.worker.build import build_record, compile_program, parameter_problems
from pytest_cudagate.worker.requests import current_version

pytest_plugins = ["pytester"]


def _nvcc_problem() -> str | None:
    try:
        nvcc.find(int(compiler.nvrtc_version().split(".")[0]))
    except nvcc.NvccMissing as exc:
        return str(exc)
    return None


needs_nvcc = pytest.mark.skipif(_nvcc_problem() is not None, reason=f"no usable nvcc: {_nvcc_problem()}")

# A project's file: its kernels beside host code. ops::scale_t is instantiated only by the host
# wrapper's launch, ops::scale_u by nothing in the file.
HOST_CU = """\
// scale.cu: kernels and the program that runs them
#include <stdio.h>
#include <cuda_runtime.h>

extern "C" __global__ void scale2(const float* __restrict__ x, float* __restrict__ y, int rows, int cols)
{
    const int r = blockIdx.x;
    if (r >= rows) return;
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
        y[r * cols + c] = 2.0f * x[r * cols + c];
}

namespace ops {
template <typename T>
__global__ void scale_t(const T* __restrict__ x, T* __restrict__ y, int rows, int cols)
{
    const int r = blockIdx.x;
    for (int c = threadIdx.x; r < rows && c < cols; c += blockDim.x)
        y[r * cols + c] = T(2) * x[r * cols + c];
}

template <int UNROLL>
__global__ void scale_u(const float* x, float* y, int rows, int cols)
{
    const int r = blockIdx.x;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        for (int c = threadIdx.x * UNROLL + u; r < rows && c < cols; c += blockDim.x * UNROLL)
            y[r * cols + c] = 2.0f * x[r * cols + c];
}
}  // namespace ops

void launch_scale(const float* x, float* y, int rows, int cols)
{
    ops::scale_t<float><<<rows, 128>>>(x, y, rows, cols);
}

int main()
{
    float *x, *y;
    cudaMalloc(&x, 64 * sizeof(float));
    cudaMalloc(&y, 64 * sizeof(float));
    launch_scale(x, y, 1, 64);
    printf("%s\\n", cudaGetErrorString(cudaDeviceSynchronize()));
    return 0;
}
"""
KERNEL = "  - name: scale2\n    source: scale.cu\n    launch: {grid: [rows], block: [128]}\n"
TEMPLATES = ("  - name: scale_t\n    source: scale.cu\n    entry: 'ops::scale_t<float>'\n"
             "    launch: {grid: [rows], block: [128]}\n"
             "  - name: scale_u\n    source: scale.cu\n    entry: 'ops::scale_u<2>'\n"
             "    launch: {grid: [rows], block: [128]}\n")


def host_suite(folder: Path, *, source: str = HOST_CU, kernels: str = KERNEL + TEMPLATES, data: bool = False) -> Path:
    return write_suite(folder, yaml_text=replace_once(SUITE_YAML, KERNEL, kernels), kernel_source=source, data=data)


def kernel_named(path: Path, name: str):
    return load_suite(path).kernel(name)


# --------------------------------------------------------------------------- choosing the compiler


def test_auto_takes_nvcc_for_host_code_and_nvrtc_for_device_code():
    assert compiler.chosen("auto", HOST_CU, {}) == (True, "it holds host code: #include <stdio.h>")
    device_only = HOST_CU.split("void launch_scale")[0].replace("#include <stdio.h>\n", "")
    assert compiler.chosen("auto", device_only, {}) == (False, "it holds device code only")
    # A header's host code counts; a commented-out one does not.
    assert compiler.chosen("auto", device_only, {"io.h": "int main() { return 0; }"})[0]
    assert not compiler.chosen("auto", "// #include <vector>\n/* int main() */\n" + device_only, {})[0]
    assert compiler.chosen("nvrtc", HOST_CU, {}) == (False, "compiler: nvrtc")
    with pytest.raises(compiler.CompileOptionError, match="compiler 'gcc' is not one of auto, nvcc, nvrtc"):
        compiler.chosen("gcc", HOST_CU, {})


def test_a_kernel_without_the_field_keeps_its_identity_and_request(tmp_path):
    """Suites written before the field: their kernels' identities (what approvals pin) and requests
    are what they were; naming a compiler makes the kernel another version."""
    plain = current_version(load_suite(write_suite(tmp_path / "old", data=False)).kernels[0])
    assert "compiler" not in plain.identity and "compiler" not in plain.kernel(None)
    assert set(plain.identity) == {"source_sha256", "headers", "entry", "options", "launch", "launch_overrides",
                                   "arch_suffix"}
    named = current_version(load_suite(write_suite(tmp_path / "new", data=False, yaml_text=replace_once(
        SUITE_YAML, KERNEL, KERNEL + "    compiler: nvrtc\n"))).kernels[0])
    assert named.identity == {**plain.identity, "compiler": "nvrtc"}
    assert named.kernel(None)["compiler"] == "nvrtc"


# --------------------------------------------------------------------------- a file with host code


@needs_nvcc
def test_a_file_with_host_code_passes_check_with_nvcc(tmp_path, capsys):
    path = host_suite(tmp_path / "scale", data=True)
    code = main(["check", "--allow-unsigned", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out
    for name in ("scale2", "scale_t", "scale_u"):  # scale_u: instantiated by nothing in the file
        assert re.search(rf"  {name}: compiles for sm_90 with nvcc 1\d\.\d+\.\d+ in \d+ ms", out), out


@needs_nvcc
def test_nvcc_finds_a_cpp_entry_by_its_symbol_and_caches_the_cubin(tmp_path):
    path = host_suite(tmp_path / "scale")
    kernel = kernel_named(path, "scale_t")
    first = compile_program(kernel, "sm_90")
    assert first.ok, first.log
    assert first.lowered_name == "_ZN3ops7scale_tIfEEvPKT_PS1_ii" and first.compiler.startswith("nvcc ")
    assert first.resources["registers"] > 0
    again = compile_program(kernel, "sm_90")
    assert again.cache_hit and again.key == first.key and again.cubin == first.cubin
    assert again.compiler == first.compiler and again.lowered_name == first.lowered_name
    # One source, one cubin: the temporary folder it was built in leaves no trace in it.
    fresh = compiler.compile_kernel(current_version(kernel).source, entry="ops::scale_t<float>", arch="sm_90",
                                    source_name="scale_t.cu", use_cache=False)
    assert hashlib.sha256(fresh.cubin).digest() == hashlib.sha256(first.cubin).digest()
    assert b"cudagate-nvcc-" not in first.cubin


@needs_nvcc
def test_the_cache_key_holds_the_compiler_and_its_version(tmp_path, monkeypatch):
    source = current_version(kernel_named(host_suite(tmp_path / "scale"), "scale2")).source
    tool = nvcc.find(int(compiler.nvrtc_version().split(".")[0]))
    key = compiler.cache_key(source, entry="scale2", options=[], headers={}, arch="sm_90", nvcc_tool=tool)
    assert key != compiler.cache_key(source, entry="scale2", options=[], headers={}, arch="sm_90")
    for changed in ({"version": "13.9.1"}, {"host": "gcc 14.1.0 (/usr/bin/gcc-14)"}):
        other = nvcc.Nvcc(**{**tool.__dict__, **changed})
        assert compiler.cache_key(source, entry="scale2", options=[], headers={}, arch="sm_90", nvcc_tool=other) != key


@needs_nvcc
def test_a_compile_error_names_the_users_file_and_line(tmp_path, capsys):
    broken = HOST_CU.replace("y[r * cols + c] = T(2) *", "y[r * cols + c] = undefined_here *")
    path = host_suite(tmp_path / "scale", source=broken, data=True)
    code = main(["check", "--allow-unsigned", str(path)])
    out = capsys.readouterr().out
    line = broken.splitlines().index(next(l for l in broken.splitlines() if "undefined_here" in l)) + 1
    assert code == 1 and f"{display_path(path.parent / 'scale.cu')}({line}): error: identifier \"undefined_here\"" in out, out
    assert "cudagate-entry" not in out and "cudagate-nvcc-" not in out and "header tree" not in out, out


@needs_nvcc
def test_an_entry_the_file_does_not_define_is_said_against_the_file(tmp_path):
    path = host_suite(tmp_path / "scale", kernels=KERNEL.replace("    launch", "    entry: 'ops::scale_v<4>'\n    launch"))
    result = compile_program(load_suite(path).kernels[0], "sm_90")
    assert not result.ok
    assert result.log.startswith(f"entry 'ops::scale_v<4>' does not instantiate a kernel in "
                                 f"{display_path(path.parent / 'scale.cu')}: "), result.log
    assert "cudagate-entry" not in result.log and "cudagate_entry_address" not in result.log


@needs_nvcc
def test_a_host_function_nvrtc_refuses_is_compiled_by_nvcc(tmp_path):
    """No standard header, no main: `auto` tries NVRTC, which refuses the host wrapper, then nvcc."""
    source = HOST_CU.split("int main()")[0].replace("#include <stdio.h>\n", "").replace("#include <cuda_runtime.h>\n", "")
    assert nvcc.host_code(source, {}) is None
    result = compile_program(kernel_named(host_suite(tmp_path / "scale", source=source), "scale2"), "sm_90")
    assert result.ok and result.compiler.startswith("nvcc "), result.log
    named = host_suite(tmp_path / "nvrtc", source=source, kernels=KERNEL + "    compiler: nvrtc\n")
    refused = compile_program(load_suite(named).kernels[0], "sm_90")
    assert not refused.ok and refused.compiler.startswith("NVRTC ")
    assert refused.log.endswith("holds host code, which NVRTC cannot compile: give its kernel `compiler: nvcc` "
                                "(or `compiler: auto`, the default)"), refused.log


@needs_nvcc
def test_a_kernel_that_needs_relocatable_device_code_is_refused_in_one_line(tmp_path):
    source = HOST_CU.replace("int main()", "extern \"C\" __global__ void parent(const float* x, float* y, int rows, "
                             "int cols) { ops::scale_t<float><<<1, 1>>>(x, y, rows, cols); }\n\nint main()")
    result = compile_program(kernel_named(host_suite(tmp_path / "scale", source=source), "scale2"), "sm_90")
    assert not result.ok
    assert result.log == (f"{display_path(tmp_path / 'scale' / 'scale.cu')}: a kernel here needs relocatable device "
                          "code (-rdc: a kernel launching another, or an extern __device__ defined in another file), "
                          "which is refused: work launched from a kernel escapes the timing events. Launch each "
                          "kernel from the host (a kernel of `steps:`), and define device variables in the file "
                          "that uses them")
    extern = HOST_CU.replace("int main()", "extern __device__ float gain;\n__global__ void g(float* y) { y[0] = gain; }"
                             "\n\nint main()")
    result = compile_program(kernel_named(host_suite(tmp_path / "extern", source=extern), "scale2"), "sm_90")
    assert not result.ok and "needs relocatable device code" in result.log, result.log


# --------------------------------------------------------------------------- parameter types


SWAPPED = """\
template <typename T>
__global__ void scale_t(const T* __restrict__ x, T* __restrict__ y, float rows, int cols)
{
    y[0] = x[0] * rows * cols;
}
"""


@pytest.mark.parametrize("host", [pytest.param(False, id="nvrtc"), pytest.param(True, id="nvcc", marks=needs_nvcc)])
def test_a_cpp_entry_of_other_types_than_the_signature_is_caught(tmp_path, host):
    """A float/int swap keeps every size: the mangled name's types tell them apart, for both compilers."""
    source = ("#include <stdio.h>\n" if host else "") + SWAPPED
    kernels = "  - name: scale_t\n    source: scale.cu\n    entry: 'scale_t<int>'\n    launch: {grid: [rows], block: [128]}\n"
    suite = load_suite(host_suite(tmp_path / "scale", source=source, kernels=kernels))
    result = compile_program(suite.kernels[0], "sm_90")
    assert result.ok and result.compiler.split()[0] == ("nvcc" if host else "NVRTC"), result.log
    assert parameter_problems(suite.kernels[0], result, suite.signature, "sm_90") == [
        "parameter 1 'x': the kernel takes 'int const*' (an int32 buffer), the signature says a float32 buffer: "
        "write `buffer: int32`, or make the kernel's parameter float*",
        "parameter 2 'y': the kernel takes 'int*' (an int32 buffer), the signature says a float32 buffer: "
        "write `buffer: int32`, or make the kernel's parameter float*",
        "parameter 3 'rows': the kernel takes 'float' (a float32 scalar), the signature says an int32 scalar: "
        "write `scalar: float32`, or make the kernel's parameter int",
    ]


# --------------------------------------------------------------------------- confinement


@needs_nvcc
def test_a_host_code_file_reads_nothing_outside_its_headers(tmp_path):
    """The host refuses an absolute #include before compiling (suite/includes.py); a request reaches
    the harness unfiltered, and there the confined nvcc, its host compiler and cicc cannot open the file."""
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("TOKEN-5f1e2d3c\n")
    home = Path.home() / f".cudagate-test-{os.getpid()}"
    home.write_text("HOMESECRET-8a7b6c\n")
    spelled = '#define STR(x) #x\n#define PATH(a, b) STR(a/b)\n#include PATH(/etc, passwd)'
    try:
        for include, word in (('#include "/etc/passwd"', "root:"), ("#include </etc/passwd>", "root:"),
                              (spelled, "root:"), (f'#include "{secret}"', "TOKEN-5f1e2d3c"),
                              (f'#include "{home}"', "HOMESECRET"), ('#include "/proc/self/environ"', "PATH=")):
            source = HOST_CU.replace("#include <stdio.h>", f"#include <stdio.h>\n{include}")
            result = compiler.compile_kernel(source, entry="scale2", arch="sm_90", source_name="scale.cu",
                                             use_cache=False)
            assert not result.ok and result.compiler.startswith("nvcc") and word not in result.log, result.log
            assert re.search(r"^scale\.cu:\d+:\d+: fatal error: .*: (Permission denied|No such file)", result.log,
                             re.MULTILINE), result.log
    finally:
        home.unlink()


@needs_nvcc
def test_nvcc_options_that_run_or_write_are_refused_as_bad_input(tmp_path, capsys):
    for option, why in (("-Xcompiler=-fplugin=/tmp/p.so", "options passed on to the host compiler"),
                        ("-ccbin=/tmp/evil", "nvcc uses the runner's host compiler"),
                        ("--keep", "options that choose nvcc's steps, run a program, or read or write files")):
        path = host_suite(tmp_path / option.strip("-")[:4], kernels=KERNEL + f"    options: ['{option}']\n")
        assert main(["check", "--allow-unsigned", str(path)]) == EXIT_INPUT
        out = capsys.readouterr().err
        assert f"kernels[0].options[0]: option {option!r} is not allowed with nvcc: {why}" in out, out
    # Under NVRTC (a device-only file) the same words are NVRTC's business, not nvcc's.
    with pytest.raises(compiler.CompileOptionError, match="not allowed with nvcc"):
        nvcc.check_options(["-o", "x"])
    nvcc.check_options(["-lineinfo", "-O3", "--use_fast_math", "-DTILE=4", "-maxrregcount=64", "-std=c++17"])


@pytest.mark.parametrize("option", [
    "-DX=$(touch PWNED)", "-DX=`touch PWNED`", '-DX="a b"', "-forward-unknown-to-host-compiler", "-specs=evil.specs",
    "-r", "--relocatable-link", "-reloc-ptx", "-dlink", "--split-compile=8", "--threads=8", "-ldir=/tmp",
], ids=["dollar paren", "backticks", "quotes", "forward to gcc", "gcc specs", "relocatable link", "relocatable link long",
        "reloc ptx", "device link", "split compile", "threads", "ldir"])
def test_only_the_nvcc_options_a_kernel_needs_are_taken(option, tmp_path):
    """nvcc runs its steps through /bin/sh with -D values in double quotes, and passes what it does not
    know to gcc under -forward-unknown-to-host-compiler: an option outside the allow-list is refused
    before nvcc runs, by the harness itself (a request reaches it from `cudagate run` unfiltered)."""
    marker = tmp_path / "PWNED"
    with pytest.raises(compiler.CompileOptionError, match="not allowed with nvcc"):
        compiler.compile_kernel(HOST_CU, entry="scale2", arch="sm_90", source_name="scale.cu", options=[option],
                                use_cache=False, compiler="nvcc")
    assert not marker.exists() and not Path("PWNED").exists()


def test_a_missing_nvcc_says_how_to_install_one(tmp_path, monkeypatch):
    monkeypatch.setenv(nvcc.NVCC_ENV, str(tmp_path / "no-such-nvcc"))
    result = compile_program(kernel_named(host_suite(tmp_path / "scale"), "scale2"), "sm_90")
    major = compiler.nvrtc_version().split(".")[0]
    assert not result.ok and result.log == (
        f"{display_path(tmp_path / 'scale' / 'scale.cu')} needs nvcc (it holds host code: #include <stdio.h>; the "
        f"kernel's `compiler:` field): ${nvcc.NVCC_ENV} names no nvcc (looked in $PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and "
        f"the nvidia-cuda-nvcc package): install the CUDA {major} toolkit (or point ${nvcc.NVCC_ENV} at its nvcc), or "
        f"`pip install 'nvidia-cuda-nvcc=={major}.*'`")


def fake_nvcc(folder: Path, release: str) -> Path:
    """A script that answers as an nvcc of ``release`` would to --version and -dryrun."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "nvcc"
    script.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release.rsplit('.', 1)[0]}, V{release}'\n"
                      f"echo '#$ _HERE_={folder}' >&2\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_nvcc_of_another_major_than_nvrtc_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(nvcc.NVCC_ENV, str(fake_nvcc(tmp_path / "cuda12" / "bin", "12.4.131")))
    result = compile_program(kernel_named(host_suite(tmp_path / "scale"), "scale2"), "sm_90")
    major = compiler.nvrtc_version().split(".")[0]
    assert not result.ok and (f"`compiler:` field): nvcc and NVRTC must be of one CUDA major: NVRTC is {major}, "
                              f"{tmp_path}/cuda12/bin/nvcc is nvcc 12.4.131: install the CUDA {major} toolkit") in result.log


# --------------------------------------------------------------------------- approvals and the gate


@needs_nvcc
def test_a_build_record_names_the_compiler_and_a_change_of_it_is_reported(tmp_path):
    record = build_record(current_version(kernel_named(host_suite(tmp_path / "scale"), "scale2")), "sm_90")
    assert record["compiler"].startswith("nvcc ") and record["nvrtc_version"] == compiler.nvrtc_version()
    built = BuildRecord.from_json(record)
    old = BuildRecord.from_json({"nvrtc_version": "13.5", "options": [], "cubin_sha256": {}})  # before the field
    assert old.built_by == "NVRTC 13.5"
    assert build_drift(old, built).describe("v1") == (
        f"toolchain: NVRTC 13.5 -> {record['compiler']} since v1: NOT measured (the release's cubin was not kept and "
        "today's compiler cannot rebuild it; both versions were built with today's compiler)")
    assert not build_drift(built, built).changed


def test_an_approval_pins_the_compiler_and_reads_back_as_the_same_version(tmp_path):
    path = host_suite(tmp_path / "scale", kernels=KERNEL + "    compiler: nvcc\n")
    suite = load_suite(path)
    ledger = Ledger.for_suite(suite)
    ledger.approvals["scale2"] = approval_for(ledger, suite.kernels[0], approved_by="a", approved_at="now", git={},
                                              tool_version="test")
    ledger.save()
    assert json.loads(ledger.path.read_text())["approvals"]["scale2"]["compiler"] == "nvcc"
    again = Ledger.for_suite(suite)
    approved = again.approved_version(again.approvals["scale2"])
    assert approved.compiler == "nvcc" and approved.kernel(None)["compiler"] == "nvcc"
    assert again.approvals["scale2"].identity() == approved.identity == current_version(suite.kernels[0]).identity
    # Without the field (auto), the ledger entry has none: as approvals written before it.
    plain = load_suite(host_suite(tmp_path / "plain"))
    entry = approval_for(Ledger.for_suite(plain), plain.kernels[0], approved_by="a", approved_at="now", git={},
                         tool_version="test")
    assert "compiler" not in entry.signed_payload() and "compiler" not in entry.identity()


@needs_nvcc
def test_an_nvcc_compile_stops_at_its_time_limit_with_every_process_it_started(tmp_path):
    levels = ["#define A0 acc = sinf(acc) * acc + acc / (acc + 1.0f);",
              *(f"#define A{i} A{i - 1} A{i - 1}" for i in range(1, 15))]
    bomb = HOST_CU.replace("    const int r = blockIdx.x;\n    if (r >= rows) return;",
                           "    float acc = threadIdx.x;\n    A14\n    y[0] = acc;\n    const int r = blockIdx.x;\n"
                           "    if (r >= rows) return;", 1)
    bomb = "\n".join(levels) + "\n" + bomb
    began = time.perf_counter()
    result = compiler.compile_kernel(bomb, entry="scale2", arch="sm_90", source_name="scale.cu", use_cache=False,
                                     limits=compiler.CompileLimits(3, "the case timeout"))
    assert not result.ok and time.perf_counter() - began < 8, result.log
    assert result.log == ("compile of scale2 (scale.cu): stopped after 3 s (the case timeout): a source that expands "
                          "this much is refused")
    # nvcc's steps run in its private folder; once killed, none of them is left (SIGKILL takes a moment).
    for _ in range(20):
        left = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout.splitlines()
        left = [line for line in left if "cudagate-nvcc-" in line and not line.startswith("Z")]
        if not left:
            break
        time.sleep(0.25)
    assert not left, left


CONFTEST = """
import os
import sys

sys.path.insert(0, {tests!r})
from fake_worker import FakeKernel, SCALE_PARAMS, FakeWorker, honest, use_client  # noqa: E402

kernels = {{entry: FakeKernel(honest, SCALE_PARAMS) for entry in ("scale2", "ops::scale_t<float>", "ops::scale_u<2>")}}
use_client(lambda **options: FakeWorker(kernels, **options))
os.environ["CUDAGATE_LOCK_DIR"] = os.path.join(os.path.dirname(__file__), ".locks")
"""


@needs_nvcc
def test_pytest_cuda_gate_compiles_the_host_code_file_and_runs_its_kernels(pytester):
    host_suite(pytester.path / "scale", data=True)
    (pytester.path / "conftest.py").write_text(CONFTEST.format(tests=str(Path(__file__).resolve().parents[1])))
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-rA", "--junitxml=report.xml", "scale", timeout=300)
    out = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, out
    assert re.search(r"(\d+) passed", out) and "failed" not in out, out
    for name in ("scale2", "scale_t", "scale_u"):
        assert re.search(rf"PASSED .*{name}.*compile", out), out
        assert re.search(rf"PASSED .*{name}.*small", out), out  # its correctness case, on the fake GPU
    compiles = [case for case in ET.parse(pytester.path / "report.xml").iter("testcase") if case.get("name") == "compile"]
    assert len(compiles) == 3
    for case in compiles:
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert properties["compiler"].startswith("nvcc ") and int(properties["registers"]) > 0, properties
