"""`cudagate init KERNEL.cu [ENTRY]`: a suite skeleton from the kernel's parameters, which every command
refuses, one line per value, until a user fills it in; filled in, it checks and gates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from fake_worker import fake_gpu_project
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT

pytest_plugins = ["pytester"]

SAXPY_CU = """\
__global__ void saxpy(const float* x, float* y, float a, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"""

FILLED = {  # each TODO of the saxpy skeleton, as a user writes it
    "size": "n",
    "atol": "1.0e-6",
    "rtol": "1.0e-6",
    "grid": "cdiv(n, 256)",
    "block": "256",
}

REFERENCE_BODY = """\
    return (np.float64(a) * x + y).astype(np.float32)
"""


def cli(capsys, *argv) -> tuple[int, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out + captured.err


def fill_in(folder: Path) -> None:
    """Edit the skeleton as a user would: each TODO replaced, y made inout, the reference written."""
    suite = folder / "cudagate.yaml"
    text = suite.read_text()
    for pattern, value in ((r'size: "TODO:[^"]*"', f"size: {FILLED['size']}"),
                           (r'atol: "TODO:[^"]*"', f"atol: {FILLED['atol']}"),
                           (r'rtol: "TODO:[^"]*"', f"rtol: {FILLED['rtol']}"),
                           (r'grid: \["TODO:[^"]*"\]', f"grid: [\"{FILLED['grid']}\"]"),
                           (r'block: \["TODO:[^"]*"\]', f"block: [{FILLED['block']}]"),
                           (r'a: "TODO:[^"]*"', "a: 2.5")):
        text = re.sub(pattern, value, text)
    text = text.replace('n: "TODO: n in this case"}}  # odd', "n: 1001}}  # odd")
    text = text.replace('n: "TODO: n in this case"}}  # sizes', "n: 65536}}  # sizes")
    text = text.replace("intent: out", "intent: inout")
    suite.write_text(text)
    reference = folder / "reference.py"
    stub = reference.read_text()
    lines = [line for line in stub.splitlines(keepends=True) if "NotImplementedError" not in line]
    reference.write_text("".join(lines).replace("def saxpy(x, a, n):", "def saxpy(x, y, a, n):") + REFERENCE_BODY)


@pytest.mark.slow
def test_init_check_fill_in_check_and_gate(pytester, capsys):
    folder = pytester.path / "kernels" / "saxpy"
    folder.mkdir(parents=True)
    (folder / "saxpy.cu").write_text(SAXPY_CU)
    code, out = cli(capsys, "init", folder / "saxpy.cu")
    assert code == 0, out
    assert "a suite skeleton for saxpy (4 parameters)" in out
    suite = yaml.safe_load((folder / "cudagate.yaml").read_text())
    assert [(p["name"], p.get("buffer") or p.get("scalar"), p.get("intent")) for p in suite["signature"]] == [
        ("x", "float32", "in"), ("y", "float32", "out"), ("a", "float32", None), ("n", "int32", None)]
    assert [(c["name"], c["kind"]) for c in suite["cases"]] == [("small", "correctness"), ("perf", "performance")]
    assert "types from the cubin (the entry's mangled name); names from saxpy.cu, line 1" in \
        (folder / "cudagate.yaml").read_text()

    code, out = cli(capsys, "check", folder)
    assert code == EXIT_INPUT
    left = [line for line in out.splitlines() if "left to fill in" in line]
    assert left == [
        "  - line 8: signature[0].size: left to fill in: x's element count, an expression over n",
        "  - line 9: signature[1].size: left to fill in: y's element count, an expression over n",
        "  - line 15: tolerance.y.atol: left to fill in: the absolute error allowed, such as 1.0e-6",
        "  - line 15: tolerance.y.rtol: left to fill in: the relative error allowed, such as 1.0e-5",
        "  - line 19: kernels[0].launch.grid[0]: left to fill in: the grid, an expression over n, such as cdiv(n, 256)",
        "  - line 19: kernels[0].launch.block[0]: left to fill in: threads per block, such as 256",
        "  - line 21: cases[0].scalars.a: left to fill in: a in this case",
        "  - line 21: cases[0].scalars.n: left to fill in: n in this case",
        "  - line 22: cases[1].scalars.a: left to fill in: a in this case",
        "  - line 22: cases[1].scalars.n: left to fill in: n in this case",
        "  - line 13: reference.python: left to fill in: the reference's body (reference.py:saxpy, line 18, still "
        "raises the stub's NotImplementedError): compute the outputs with numpy",
    ]
    # Generating cases from the skeleton is refused the same way, before the stub is ever called.
    assert cli(capsys, "cases", "generate", folder)[0] == EXIT_INPUT

    fill_in(folder)
    assert cli(capsys, "cases", "generate", folder)[0] == 0
    code, out = cli(capsys, "check", "--allow-unsigned", folder)
    assert code == 0, out
    assert "saxpy: compiles for sm_90" in out

    fake_gpu_project(pytester.path)
    result = pytester.runpytest_subprocess("--cuda-gate", "--cuda-gate-allow-unsigned", "-p", "no:cacheprovider",
                                           "-v", "-k", "compile", "kernels", timeout=120)
    result.stdout.fnmatch_lines(["*cudagate.yaml::saxpy::compile PASSED*"])


EXTERN_C_CU = """\
#include <cuda_fp16.h>
struct Pair { float lo, hi; };
// An extern "C" symbol names no types: they are read from this declaration.
extern "C" __global__ void __launch_bounds__(128)
mixed(const __half* __restrict__ in, unsigned char* flags, const void* table, int4 box, unsigned count,
      double scale, Pair pair, long long offset)
{
}
"""


def test_an_extern_c_entrys_types_come_from_its_declaration_and_unknown_types_are_todos(tmp_path, capsys):
    (tmp_path / "mixed.cu").write_text(EXTERN_C_CU)
    assert cli(capsys, "init", tmp_path / "mixed.cu")[0] == 0
    text = (tmp_path / "cudagate.yaml").read_text()
    assert 'types from the declaration in mixed.cu (line 4; an extern "C" symbol names none)' in text
    signature = yaml.safe_load(text)["signature"]
    assert [(p["name"], p.get("buffer", p.get("scalar")), p.get("intent")) for p in signature][:2] == [
        ("in", "float16", "in"), ("flags", "uint8", "out")]
    assert [p.get("scalar") for p in signature][4:6] == ["uint32", "float64"]
    assert signature[7] == {"name": "offset", "scalar": "int64"}
    code, out = cli(capsys, "check", tmp_path)
    assert code == EXIT_INPUT
    assert ("signature[2].buffer: left to fill in: the kernel takes 'const void*', whose elements no dtype names: "
            "write the dtype of the elements it reads") in out
    assert ("signature[3].scalar: left to fill in: the kernel takes 'int4' by value, which no dtype names: make the "
            "kernel take its fields as scalars (or a buffer), then list them") in out
    assert "signature[6].scalar: left to fill in: the kernel takes 'Pair' by value" in out


TEMPLATE_CU = """\
template <typename T, int N>
__global__ void scale(T* y, const T* x, unsigned long n) { if (n) y[0] = x[0] * T(N); }
__global__ void other(int* z) {}
"""


def test_a_template_entry_is_named_with_its_arguments(tmp_path, capsys):
    (tmp_path / "scale.cu").write_text(TEMPLATE_CU)
    assert cli(capsys, "init", tmp_path / "scale.cu", "scale<double, 4>")[0] == 0
    suite = yaml.safe_load((tmp_path / "cudagate.yaml").read_text())
    assert suite["kernels"][0]["name"] == "scale" and suite["kernels"][0]["entry"] == "scale<double, 4>"
    assert [(p["name"], p.get("buffer", p.get("scalar"))) for p in suite["signature"]] == [
        ("y", "float64"), ("x", "float64"), ("n", "uint64")]


def test_the_suite_may_live_above_the_kernel_file(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "saxpy.cu").write_text(SAXPY_CU)
    assert cli(capsys, "init", tmp_path / "src" / "saxpy.cu", "--out", tmp_path)[0] == 0
    assert yaml.safe_load((tmp_path / "cudagate.yaml").read_text())["kernels"][0]["source"] == "src/saxpy.cu"


REFUSED = {
    "missing file": (None, [], "nosuch.cu:\n  - no such file: name the .cu file that defines the kernel"),
    "no kernel": ("__device__ float twice(float x) { return 2 * x; }\n", [],
                  "k.cu:\n  - defines no kernel to gate; declare the kernel __global__"),
    "only a template": ("template <class T> __global__ void t(T* x) {}\n", [],
                        "k.cu:\n  - defines no kernel to gate; a template kernel needs its arguments: "
                        "`cudagate init K 't<float>'`"),
    "several kernels": (TEMPLATE_CU + "__global__ void third(float* w) {}\n", [],
                        "k.cu:\n  - defines 2 kernels (other, third); name the one to gate: `cudagate init K other`"),
    "an entry that names none": (SAXPY_CU, ["nosuch"],
                                 "k.cu:\n  - does not compile with NVRTC for sm_90: entry 'nosuch' is not defined in "
                                 "k.cu"),
    "does not compile": ("__global__ void k(float* x) { x[0] = undefined_name; }\n", [],
                         'k.cu:\n  - does not compile with NVRTC for sm_90: k.cu(1): error: identifier '
                         '"undefined_name" is undefined (fix it, then run init again)'),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_bad_input_is_refused_in_one_line_and_writes_nothing(tmp_path, capsys, monkeypatch, name):
    source, extra, message = REFUSED[name]
    monkeypatch.chdir(tmp_path)
    if source is not None:
        Path("k.cu").write_text(source)
    code, out = cli(capsys, "init", "nosuch.cu" if source is None else "k.cu", *extra)
    assert code == EXIT_INPUT
    assert message.replace(" K ", " k.cu ") in out, out
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if source is None else ["k.cu"])


@pytest.mark.parametrize("existing", ["cudagate.yaml", "reference.py"])
def test_an_existing_suite_is_never_overwritten(tmp_path, capsys, monkeypatch, existing):
    monkeypatch.chdir(tmp_path)
    Path("saxpy.cu").write_text(SAXPY_CU)
    Path(existing).write_text("mine\n")
    code, out = cli(capsys, "init", "saxpy.cu")
    assert code == EXIT_INPUT
    assert (f"{existing}:\n  - exists: `cudagate init` never overwrites a suite; edit it, or move it away and run "
            "init again (or pass --out DIR)") in out
    assert Path(existing).read_text() == "mine\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["saxpy.cu", existing])


def test_a_file_of_many_kernels_names_the_first_few(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("k.cu").write_text("".join(f'extern "C" __global__ void k{n:02}(float* x) {{}}\n' for n in range(20)))
    code, out = cli(capsys, "init", "k.cu")
    assert code == EXIT_INPUT
    assert "defines 20 kernels (k00, k01, k02, k03, k04, k05, k06, k07, k08, k09, k10, k11, and 8 more); " in out, out


def test_a_kernel_file_named_like_an_option_is_refused_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("-x.cu").write_text(SAXPY_CU)
    code, out = cli(capsys, "init", "--", "-x.cu")
    assert code == EXIT_INPUT
    assert "source file '-x.cu': a name that starts with '-' reads as an option to the compiler; rename the file" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["-x.cu"]


def test_an_out_folder_that_does_not_hold_the_kernel_is_refused(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "a" / "saxpy.cu").write_text(SAXPY_CU)
    code, out = cli(capsys, "init", tmp_path / "a" / "saxpy.cu", "--out", tmp_path / "b")
    assert code == EXIT_INPUT
    assert "saxpy.cu lies outside it, and a suite's kernel source must lie inside the suite's folder" in out
    assert list((tmp_path / "b").iterdir()) == []
