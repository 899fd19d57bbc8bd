"""The kernel's own parameter list, read from NVRTC's cubin on the CPU, checked against the signature by
`cudagate check` and the compile item; templated entries found through their lowered names."""

from __future__ import annotations

import random
import struct

import pytest

from helpers import EXAMPLES, SUITE_YAML, replace_once, write_suite
from cudagate_harness.compiler import compile_kernel
from cudagate_harness.params import KernelParam, ParamInfoError, ParamLayout, entry_params, signature_problems
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_FAILED, FileError
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer
from pytest_cudagate.defences.expected import generate
from pytest_cudagate.suite.loader import discover, load_suite
from pytest_cudagate.worker.build import compile_program, parameter_problems

pytest_plugins = ["pytester"]

LAYOUTS_CU = r"""
struct S3 { char a, b, c; };
struct alignas(16) S16 { float x; };
struct Big { double d[5]; int i; };
struct Huge { float v[4000]; };
extern "C" __global__ void scalars(char a, short b, int c, long long d, float e, double f, unsigned char g,
                                   float* p, const double* q) {}
extern "C" __global__ void none() {}
extern "C" __global__ void structs(char a, S3 s, int b, S16 t, char c, Big big, float* p) {}
extern "C" __global__ void grid_constant(const __grid_constant__ Big big, int n, float* y) { y[0] = big.d[n]; }
extern "C" __global__ void huge(int a, Huge h, float* y) { y[0] = h.v[a]; }
"""

# (offset, size) of each parameter, as the C ABI lays the lists above out, and the total size.
LAYOUTS = {
    "scalars": ([(0, 1), (2, 2), (4, 4), (8, 8), (16, 4), (24, 8), (32, 1), (40, 8), (48, 8)], 56),
    "none": ([], 0),
    "structs": ([(0, 1), (1, 3), (4, 4), (16, 16), (32, 1), (40, 48), (88, 8)], 96),
    "grid_constant": ([(0, 48), (48, 4), (56, 8)], 64),
    "huge": ([(0, 4), (4, 16000), (16008, 8)], 16016),  # past 4 KiB NVRTC writes another record kind
}

TEMPLATE_CU = """\
template <int N, typename T, typename Index = int>
__global__ void scale(T* y, const T* x, Index n)
{
    static_assert(N > 0, "N must be positive");
    const Index i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * T(N);
}
"""

TEMPLATE_YAML = """\
suite: scale4
signature:
  - {name: y, buffer: float32, intent: out, size: n}
  - {name: x, buffer: float32, intent: in, size: n}
  - {name: n, scalar: int32}
reference:
  python: reference.py:times4
tolerance:
  y: {atol: 1.0e-6, rtol: 1.0e-6}
kernels:
  - name: scale4
    source: scale.cu
    entry: "scale<4, float>"
    launch: {grid: ["cdiv(n, 128)"], block: [128]}
cases:
  - {name: small, kind: correctness, scalars: {n: 300}}
  - {name: perf, kind: performance, scalars: {n: 4096}}
"""

TEMPLATE_REFERENCE = """\
import numpy as np


def times4(x, n):
    return (x * 4).astype(np.float32)
"""


def layout(entry: str, source: str = LAYOUTS_CU) -> ParamLayout:
    result = compile_kernel(source, entry=entry, arch="sm_90")
    assert result.ok, result.log
    return entry_params(result.cubin, result.lowered_name)


def run_check(capsys, *argv) -> tuple[int, str]:
    code = main(["check", "--allow-unsigned", *map(str, argv)])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out + captured.err


def template_suite(folder, entry: str = "scale<4, float>"):
    path = write_suite(folder, yaml_text=replace_once(TEMPLATE_YAML, "scale<4, float>", entry),
                       kernel_source=TEMPLATE_CU, data=False)
    (folder / "reference.py").write_text(TEMPLATE_REFERENCE, encoding="utf-8")
    generate(load_suite(path))
    return path


# -- the parser -------------------------------------------------------------------------------------

@pytest.mark.parametrize("entry", sorted(LAYOUTS))
def test_the_cubin_gives_each_parameters_offset_and_size(entry):
    found = layout(entry)
    expected, total = LAYOUTS[entry]
    assert [(p.offset, p.size) for p in found.params] == expected
    assert [p.ordinal for p in found.params] == list(range(len(expected)))
    assert found.total_bytes == total


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_100", "sm_120"])
def test_other_architectures_lay_parameters_out_alike(arch):
    result = compile_kernel(LAYOUTS_CU, entry="structs", arch=arch)
    found = entry_params(result.cubin, result.lowered_name)
    assert [(p.offset, p.size) for p in found.params] == LAYOUTS["structs"][0]


def test_a_templated_entry_is_read_by_its_lowered_name():
    result = compile_kernel(TEMPLATE_CU, entry="scale<4, float, long long>", arch="sm_90")
    assert result.ok and result.lowered_name.startswith("_Z5scaleILi4EfxEv")
    assert [(p.offset, p.size) for p in entry_params(result.cubin, result.lowered_name).params] == \
        [(0, 8), (8, 8), (16, 8)]


def _record(attribute: int, payload: bytes) -> bytes:
    return struct.pack("<BBH", 4, attribute, len(payload)) + payload


def _cubin_with_info(info: bytes, name: bytes = b".nv.info.k") -> bytes:
    """A minimal ELF64 holding a section name table and one section named ``name`` with ``info``."""
    names = b"\x00.shstrtab\x00" + name + b"\x00"
    body = names + info
    shoff = 64 + len(body)
    null = bytes(64)
    strtab = struct.pack("<IIQQQQIIQQ", 1, 3, 0, 0, 64, len(names), 0, 0, 1, 0)
    section = struct.pack("<IIQQQQIIQQ", 11, 0x70000000, 0, 0, 64 + len(names), len(info), 0, 0, 4, 0)
    header = bytearray(64)
    header[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHH", header, 0x3A, 64, 3, 1)
    return bytes(header) + body + null + strtab + section


def test_a_handmade_cubin_reads_as_the_records_say():
    info = (_record(0x17, struct.pack("<IHHI", 0, 1, 8, (4 << 18) | 0x1F000))
            + _record(0x17, struct.pack("<IHHI", 0, 0, 0, (8 << 18) | 0x1F000))
            + struct.pack("<BBH", 3, 0x19, 12) + _record(0x0A, struct.pack("<IHH", 12, 0x210, 12)))
    assert entry_params(_cubin_with_info(info), "k") == ParamLayout((KernelParam(0, 0, 8), KernelParam(1, 8, 4)), 12)


@pytest.mark.parametrize("cubin, words", [
    (b"", "not an ELF file"),
    (b"\x7fELF\x01\x01" + bytes(60), "not a 64-bit little-endian ELF"),
    (_cubin_with_info(b"")[:-10], "section header table is malformed"),
    (_cubin_with_info(b"", b".nv.info.other"), "no .nv.info.k section"),
    (_cubin_with_info(b"\x04\x17"), "cut short"),
    (_cubin_with_info(struct.pack("<BBH", 4, 0x17, 400) + bytes(12)), "runs past its section"),
    (_cubin_with_info(struct.pack("<BBH", 9, 0x17, 0)), "unknown parameter-info record format 9"),
    (_cubin_with_info(_record(0x17, bytes(4))), "a parameter record of 4 bytes"),
    (_cubin_with_info(_record(0x17, struct.pack("<IHHI", 0, 1, 0, 4 << 18))), "ordinals [1] are not 0..0"),
    (_cubin_with_info(_record(0x17, struct.pack("<IHHI", 0, 0, 0, 4 << 18))), "past the parameters' total size of 0"),
])
def test_a_malformed_cubin_is_one_clear_error(cubin, words):
    with pytest.raises(ParamInfoError, match=None) as caught:
        entry_params(cubin, "k")
    assert words in str(caught.value)


def test_corrupted_cubins_never_crash_the_parser():
    result = compile_kernel(LAYOUTS_CU, entry="structs", arch="sm_90")
    rng = random.Random(29)
    for _ in range(400):
        data = bytearray(result.cubin)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        cut = bytes(data[:rng.randrange(len(data))]) if rng.random() < 0.3 else bytes(data)
        try:
            entry_params(cut, result.lowered_name)
        except ParamInfoError:
            pass


# -- the check against a signature ------------------------------------------------------------------

SIGNATURE = [{"name": "x", "kind": "buffer", "dtype": "float32"}, {"name": "a", "kind": "scalar", "dtype": "int16"},
             {"name": "b", "kind": "scalar", "dtype": "int32"}]


def test_a_matching_kernel_has_no_problems():
    source = 'extern "C" __global__ void k(const float* x, short a, int b) {}'
    assert signature_problems(layout("k", source), SIGNATURE) == []


def test_each_wrong_size_is_one_line_naming_the_parameter():
    source = 'extern "C" __global__ void k(float x, short a, long long b) {}'
    assert signature_problems(layout("k", source), SIGNATURE) == [
        "parameter 1 'x': the kernel takes 4 bytes (int, float), the signature says a float32 buffer (a pointer, 8 bytes)",
        "parameter 3 'b': the kernel takes 8 bytes (long long, double or a pointer), the signature says int32 (4 bytes)",
    ]


def test_a_struct_of_the_right_size_but_another_alignment_is_refused():
    source = 'struct Two { short lo, hi; };\nextern "C" __global__ void k(const float* x, short a, Two b) {}'
    assert signature_problems(layout("k", source), SIGNATURE) == [
        "parameter 3 'b': the kernel's parameter sits at byte 10, where int32 (4 bytes) would sit at byte 12: the "
        "kernel takes a struct or array of the same size but a smaller alignment"]


def test_a_missing_parameter_is_counted():
    source = 'extern "C" __global__ void k(const float* x) {}'
    assert signature_problems(layout("k", source), SIGNATURE) == [
        "the kernel takes 1 parameter, the signature lists 3 (x, a, b)"]


# -- cudagate check and the compile item ------------------------------------------------------------

THREE = 'extern "C" __global__ void scale2(const float* x, float* y, int n) { y[0] = x[n]; }\n'
LONG_LONG = 'extern "C" __global__ void scale2(const float* x, float* y, int rows, long long cols) { y[0] = x[cols]; }\n'
DOUBLE_POINTER = 'extern "C" __global__ void scale2(const double* x, double* y, int rows, int cols) { y[0] = x[0]; }\n'


@pytest.mark.parametrize("source, line", [
    (THREE, "- the kernel takes 3 parameters, the signature lists 4 (x, y, rows, cols)"),
    (LONG_LONG, "- parameter 4 'cols': the kernel takes 8 bytes (long long, double or a pointer), the signature "
                "says int32 (4 bytes)"),
])
def test_check_refuses_a_kernel_whose_parameters_differ(capsys, tmp_path, source, line):
    code, out = run_check(capsys, write_suite(tmp_path / "s", kernel_source=source))
    assert code == EXIT_FAILED
    assert "scale2: entry 'scale2' does NOT take the parameters the suite's signature lists:" in out
    assert line in out


def test_an_extern_c_pointer_to_another_element_type_cannot_be_told_apart(capsys, tmp_path):
    # Both are 8-byte pointers and extern "C" names no types: suite-format.md says so; the GPU's comparison catches it.
    assert run_check(capsys, write_suite(tmp_path / "s", kernel_source=DOUBLE_POINTER))[0] == 0


# A C++ entry's mangled name spells its parameter types, so what sizes cannot tell apart is refused.
CPP_SWAPS = {
    "float_rows": ("const float* x, float* y, float rows, int cols",
                   "- parameter 3 'rows': the kernel takes 'float' (a float32 scalar), the signature says an int32 "
                   "scalar: write `scalar: float32`, or make the kernel's parameter int"),
    "double_pointer": ("const double* x, float* y, int rows, int cols",
                       "- parameter 1 'x': the kernel takes 'double const*' (a float64 buffer), the signature says a "
                       "float32 buffer: write `buffer: float64`, or make the kernel's parameter float*"),
    "unsigned_cols": ("const float* x, float* y, int rows, unsigned cols",
                      "- parameter 4 'cols': the kernel takes 'unsigned int' (a uint32 scalar), the signature says an "
                      "int32 scalar: write `scalar: uint32`, or make the kernel's parameter int"),
}


def cpp_kernel(params: str) -> str:
    return f"__global__ void scale2({params}) {{}}\n"


@pytest.mark.parametrize("name", sorted(CPP_SWAPS))
def test_check_refuses_a_cpp_entry_whose_parameter_types_differ(capsys, tmp_path, name):
    params, line = CPP_SWAPS[name]
    code, out = run_check(capsys, write_suite(tmp_path / "s", kernel_source=cpp_kernel(params)))
    assert code == EXIT_FAILED, out
    assert "scale2: entry 'scale2' does NOT take the parameters the suite's signature lists:\n      " + line in out


def test_a_pointer_where_the_signature_has_a_scalar_is_refused_by_type(capsys, tmp_path):
    text = replace_once(SUITE_YAML, "{name: cols, scalar: int32}", "{name: cols, scalar: int64}")
    # A type the signature cannot name (void*) is not judged.
    code, out = run_check(capsys, write_suite(tmp_path / "s", yaml_text=text,
                                              kernel_source=cpp_kernel("const void* x, float* y, int rows, int* cols")))
    assert code == EXIT_FAILED and "parameter 1" not in out
    assert ("- parameter 4 'cols': the kernel takes 'int*' (a pointer), the signature says an int64 scalar: make it a "
            "buffer (`buffer: int32` with its intent and size), or make the kernel's parameter a long long") in out


def test_the_compile_item_fails_a_cpp_entry_of_another_type(pytester):
    write_suite(pytester.path, kernel_source=cpp_kernel(CPP_SWAPS["float_rows"][0]))
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-rfs")
    result.stdout.fnmatch_lines(["*scale.cu: entry 'scale2' does not take the parameters the suite's signature lists:",
                                 "*" + CPP_SWAPS["float_rows"][1], "FAILED cudagate.yaml::scale2::compile*"])


@pytest.mark.parametrize("source, line", [
    (THREE, "*- the kernel takes 3 parameters, the signature lists 4 (x, y, rows, cols)"),
    pytest.param(LONG_LONG, "*- parameter 4 'cols': the kernel takes 8 bytes (long long, double or a pointer), the "
                            "signature says int32 (4 bytes)", marks=pytest.mark.slow),  # `check` above says it too
])
def test_the_compile_item_fails_a_kernel_whose_parameters_differ(pytester, source, line):
    write_suite(pytester.path, kernel_source=source)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-rfs")
    result.stdout.fnmatch_lines(["*scale.cu: entry 'scale2' does not take the parameters the suite's signature lists:",
                                 line, "FAILED cudagate.yaml::scale2::compile*"])
    assert "Traceback" not in result.stdout.str()


def test_every_example_build_takes_its_signatures_parameters():
    for path in discover([EXAMPLES]):
        suite = load_suite(path)
        builds = [build for kernel in suite.kernels for build in kernel.builds(suite.cases)]
        for program in builds + ([suite.reference.program] if suite.reference.program else []):
            result = compile_program(program, "sm_90")
            assert result.ok and parameter_problems(program, result, suite.signature, "sm_90") == [], (path, program.name)


def test_the_sgemm_templates_candidates_take_the_matmul_signature():
    suite = load_suite(EXAMPLES / "matmul" / "cudagate.yaml")
    tuner = AutotuneProposer(suite, suite.kernel("matmul_f32"), [c for c in suite.cases if not c.holdout])
    for point in tuner.feasible()[:2]:
        candidate = tuner.candidate(point)
        program = candidate.program(tuner.program)
        result = compile_program(program, "sm_90", candidate.text)
        assert result.ok and parameter_problems(program, result, suite.signature, "sm_90") == []


# -- templated entries ------------------------------------------------------------------------------

def test_a_templated_entry_compiles_and_its_parameters_check_out(capsys, tmp_path):
    code, out = run_check(capsys, template_suite(tmp_path / "t"))
    assert code == 0, out
    assert "scale4: compiles for sm_90" in out and "does NOT" not in out


def test_the_compile_item_of_a_templated_entry_passes(pytester):
    template_suite(pytester.path)
    result = pytester.runpytest("--cuda-gate", "--cuda-gate-allow-unsigned", "-v", "-k", "compile")
    result.stdout.fnmatch_lines(["*cudagate.yaml::scale4::compile PASSED*"])


def test_a_templated_entry_with_the_wrong_parameters_is_refused(capsys, tmp_path):
    code, out = run_check(capsys, template_suite(tmp_path / "t", "scale<4, float, long long>"))
    assert code == EXIT_FAILED
    assert ("- parameter 3 'n': the kernel takes 8 bytes (long long, double or a pointer), the signature says int32 "
            "(4 bytes)") in out


def test_a_templated_entry_of_another_element_type_is_refused(capsys, tmp_path):
    code, out = run_check(capsys, template_suite(tmp_path / "t", "scale<4, double>"))
    assert code == EXIT_FAILED
    assert ("- parameter 1 'y': the kernel takes 'double*' (a float64 buffer), the signature says a float32 buffer: "
            "write `buffer: float64`, or make the kernel's parameter float*") in out


@pytest.mark.parametrize("entry, words", [
    ("scale<4, nosuch>", ["entry 'scale<4, nosuch>' does not instantiate a kernel in ", "scale.cu: ",
                          'identifier "nosuch" is undefined']),
    ("scale<4>", ["entry 'scale<4>' does not instantiate a kernel in ", "cannot determine which instance"]),
    ("scale<-1, float>", ["scale.cu(4): error: static assertion failed", "N must be positive"]),
])
def test_a_template_that_does_not_instantiate_gives_nvrtcs_reason(capsys, tmp_path, entry, words):
    code, out = run_check(capsys, template_suite(tmp_path / "t", entry))
    assert code == EXIT_FAILED and "does NOT compile for sm_90" in out
    for word in words:
        assert word in out
    assert "__nv_name_map" not in out


def test_a_missing_entry_says_extern_c_is_not_needed(capsys, tmp_path):
    text = replace_once(SUITE_YAML, "source: scale.cu", "source: scale.cu\n    entry: scale3")
    code, out = run_check(capsys, write_suite(tmp_path / "s", yaml_text=text))
    assert code == EXIT_FAILED
    assert "entry 'scale3' is not defined in " in out and 'identifier "scale3" is undefined' in out
    assert 'extern "C" or not, it is found by its C++ name' in out


def test_an_entry_that_is_not_a_cpp_name_is_refused_at_its_line(tmp_path):
    text = replace_once(TEMPLATE_YAML, '"scale<4, float>"', '"scale<4, float>; int x"')
    path = write_suite(tmp_path / "t", yaml_text=text, kernel_source=TEMPLATE_CU, data=False)
    with pytest.raises(FileError) as caught:
        load_suite(path)
    assert ("line 13: kernels[0].entry: 'scale<4, float>; int x' is not a C++ name of a __global__ function"
            in str(caught.value))


def test_cpp_names_are_accepted_as_entries(tmp_path):
    for entry in ("ns::scale<4, float>", "::scale< 4 , float >", "scale<(1 << 2), float, unsigned int>"):
        path = write_suite(tmp_path / "t", yaml_text=replace_once(TEMPLATE_YAML, '"scale<4, float>"', f'"{entry}"'),
                           kernel_source=TEMPLATE_CU, data=False)
        assert load_suite(path).kernels[0].entry == entry


@pytest.mark.gpu
def test_a_templated_entry_runs_and_passes_on_a_gpu(tmp_path):
    from gpu_support import gate

    path = template_suite(tmp_path / "t")
    result = gate(path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for node in ("cudagate.yaml::scale4::compile", "cudagate.yaml::scale4::small", "cudagate.yaml::scale4::perf"):
        assert f"PASSED {node}" in output, output
