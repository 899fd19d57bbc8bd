"""nvcc beside NVRTC: a .cu file as a team keeps it, host code and all, compiled to a cubin for one SM.

NVRTC compiles device code only: it cannot open ``<stdio.h>`` and refuses every host function. A
project's .cu file holds its kernels beside ``main``, ``<<<>>>`` launches and ``cudaMalloc``; nvcc
compiles it, with the host compiler the runner has (gcc on Linux). :func:`chosen` decides per kernel.

The entry may be a template instantiation or a namespaced C++ name that the file itself never
instantiates: a generated translation unit (the *wrapper*) includes the user's file unchanged and
takes the entry's address at namespace scope, which makes nvcc emit it. The cubin's symbol table
(:mod:`.symbols`) then names its mangled symbol, the lowered name the driver loads.

nvcc runs in the same confined child as NVRTC (:mod:`.confine`), which may read the request's
header tree, the toolkit, the host compiler and the system headers and libraries, execute nvcc's
tools, the host compiler and ``/bin/sh`` (nvcc starts its steps through it), and write only its
private temporary folder. It compiles in two steps, source to PTX and PTX to cubin, so that the
PTX's file names can be made relative first: the cubin's line table would otherwise hold the random
temporary folder, and one source would give a different cubin on every compile.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from . import symbols, toolkit
from .compile_child import OUT_OF_MEMORY, CompileOptionError, child_env

NVCC_ENV = "CUDAGATE_NVCC"
COMPILERS = ("auto", "nvcc", "nvrtc")
# What NVRTC says of a function without __device__/__global__: the file holds host code.
HOST_REFUSAL = "host functions are not allowed in JIT mode"
# Host-only markers (comments aside) that make `compiler: auto` choose nvcc without trying NVRTC: an
# #include <...> of the C or C++ standard library, which NVRTC has none of; a main function; a call
# of the CUDA runtime API, which device code can make only as relocatable code (refused anyway).
_STANDARD_HEADERS = frozenset("""
assert.h complex.h ctype.h errno.h fenv.h float.h inttypes.h iso646.h limits.h locale.h math.h setjmp.h
signal.h stdalign.h stdarg.h stdbool.h stddef.h stdint.h stdio.h stdlib.h string.h tgmath.h time.h uchar.h
wchar.h wctype.h unistd.h sys/time.h
algorithm any array atomic bitset cassert cctype cerrno cfenv cfloat chrono cinttypes climits clocale cmath
complex condition_variable csetjmp csignal cstdarg cstddef cstdint cstdio cstdlib cstring ctime cwchar deque
exception filesystem forward_list fstream functional future initializer_list iomanip ios iosfwd iostream
istream iterator limits list map memory mutex new numeric optional ostream queue random ratio regex set
sstream stack stdexcept streambuf string string_view system_error thread tuple type_traits typeinfo
unordered_map unordered_set utility valarray variant vector
""".split())
_COMMENTS = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_ANGLE_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include[ \t]*<([^>\n]+)>", re.MULTILINE)
_MAIN = re.compile(r"\bint\s+main\s*\(")
_RUNTIME_CALL = re.compile(r"\b(cuda[A-Z]\w*)\s*\(")
# An entry as the suite schema spells it (no quote, #, ; or brace can reach the wrapper).
_ENTRY = re.compile(r"(::)?[A-Za-z_]\w*(::[A-Za-z_]\w*)*( *<[A-Za-z0-9_ ,:<>()*&+.-]*>)?")
# nvcc options beyond NVRTC's refusals (compiler.check_options): each runs another program, reads or
# writes a file, or changes what nvcc emits.
_REFUSED = (
    (re.compile(r"^(-X\w*|--compiler-options|--linker-options|--ptxas-options(?!=-v$)|--nvlink-options|"
                r"--archive-options|-Wl|-Wp|-Wa)\b"),
     "options passed on to the host compiler, ptxas or the linker are the harness's"),
    (re.compile(r"^(-ccbin|--compiler-bindir|--allow-unsupported-compiler|-allow-unsupported-compiler)\b"),
     "nvcc uses the runner's host compiler; the harness chooses it"),
    (re.compile(r"^(-run|--run|-run-args|--run-args|-o|--output-file|-odir|--output-directory|-keep|--keep|"
                r"-keep-dir|--keep-dir|-save-temps|--save-temps|-M\w*|--generate-dependencies\w*|"
                r"--dependency-output|-MF|-MT|-odep|--dependency-target-name|--list-gpu\w*|-dryrun|--dryrun|"
                r"--version|-V|-h|--help|-v|--verbose|--cuda|-cuda|-ptx|--ptx|-cubin|--cubin|-c|--compile|"
                r"-fatbin|--fatbin|-E|--preprocess|-lib|--lib|-link|--link|--library\w*|"
                r"-x|--x|-code|--gpu-code|-m32|-m64|--machine|--input-drive-prefix|--dependency-drive-prefix|"
                r"--drive-prefix|-noprof|--profile)\b"),
     "options that choose nvcc's steps, run a program, or read or write files are refused"),
)
# What a kernel may pass nvcc: nvcc hands its command lines to /bin/sh, where a value holding $( ),
# backticks or quotes would run, and many of its options run programs or read and write files. So an
# allow-list (macros with plain values, optimisation and math modes, register caps, the dialect,
# diagnostics), not a list of what to refuse.
_ALLOWED = re.compile(
    r"-D[A-Za-z_]\w*(=[A-Za-z0-9_.+-]{0,200})?|-U[A-Za-z_]\w*|-O[0-3]|-w|-G|-lineinfo|--generate-line-info|"
    r"--?use_fast_math|--?(extended-lambda|expt-relaxed-constexpr|expt-extended-lambda|restrict|"
    r"extra-device-vectorization)|--?(ftz|prec-div|prec-sqrt|fmad)=(true|false)|--?maxrregcount=\d{1,3}|"
    r"--?std=c\+\+(14|17|20)|--?diag-suppress=\d{1,6}(,\d{1,6}){0,31}|--?default-stream=(legacy|null|per-thread)|"
    r"--ptxas-options=-v")
ALLOWED_SAID = ("-DNAME[=value of letters, digits, _ . + -], -UNAME, -O0..-O3, -w, -G, -lineinfo, --use_fast_math, "
                "--extended-lambda, --expt-relaxed-constexpr, --restrict, --ftz/--prec-div/--prec-sqrt/--fmad=true|false, "
                "--maxrregcount=N, --std=c++14|17|20, --diag-suppress=N[,N...], --default-stream=...")
_HERE = re.compile(r"^#\$ _HERE_=(.+)$", re.MULTILINE)
_HOST_VERSION = re.compile(r"\d+(\.\d+)+")
_NVCC_RELEASE = re.compile(r"release (\d+)\.(\d+), V(\d+(?:\.\d+)*)")
# nvcc's words where a kernel needs relocatable device code (-rdc): a launch from device code, or an
# extern __device__ variable defined in another file (diagnostic 20044, made an error below).
_NEEDS_RDC = re.compile(r"requires separate compilation mode|extern declaration of the entity \S+ is treated as a "
                        r"static definition")
_DIAG_EXTERN_STATIC = "--diag-error=20044"


class NvccMissing(RuntimeError):
    """No usable nvcc: the message says what was found and how to install one."""


@dataclass(frozen=True)
class Nvcc:
    path: str  # the nvcc binary, real path (not a script that starts it)
    version: str  # "13.0.88"
    host: str  # the host compiler nvcc runs, "gcc 12.2.0 (/usr/bin/x86_64-linux-gnu-gcc-12)"
    host_path: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def label(self) -> str:
        return f"nvcc {self.version}"

    @property
    def root(self) -> Path:
        """The toolkit (or nvidia-cuda-nvcc's nvidia/cuXX folder) nvcc belongs to."""
        return Path(self.path).parent.parent


def host_code(source: str, headers: dict[str, str]) -> str | None:
    """The first host-only marker in ``source`` or its quoted headers (comments aside), said in a
    few words; None where there is none (then `auto` tries NVRTC first)."""
    for text in (source, *headers.values()):
        text = _COMMENTS.sub(" ", text)
        for name in _ANGLE_INCLUDE.findall(text):
            if name.strip() in _STANDARD_HEADERS:
                return f"#include <{name.strip()}>"
        if _MAIN.search(text):
            return "a main function"
        call = _RUNTIME_CALL.search(text)
        if call:
            return f"a CUDA runtime call ({call.group(1)})"
    return None


def check_options(options: list[str]) -> None:
    """Raise :class:`~.compile_child.CompileOptionError` for an option nvcc may not be given (NVRTC's
    refusals are checked first by the caller)."""

    for option in options:
        for pattern, why in _REFUSED:
            if pattern.search(option):
                raise CompileOptionError(f"option {option!r} is not allowed with nvcc: {why}")
        if not _ALLOWED.fullmatch(option):
            raise CompileOptionError(f"option {option[:120]!r} is not allowed with nvcc: nvcc runs its steps through a "
                                     f"shell, so it takes only these options: {ALLOWED_SAID}")


def install_hint(major: int) -> str:
    return (f"install the CUDA {major} toolkit (or point ${NVCC_ENV} at its nvcc), or "
            f"`pip install 'nvidia-cuda-nvcc=={major}.*'`")


def find(nvrtc_major: int) -> Nvcc:
    """The nvcc of NVRTC's major: ``$CUDAGATE_NVCC``, else the PATH's or a toolkit's
    (:func:`toolkit.find_tool`), else the nvidia-cuda-nvcc package's; raises :class:`NvccMissing`."""
    found = []
    # $CUDAGATE_NVCC, where set, is the only nvcc: a named one that is missing is not replaced by another.
    named = [toolkit.find_tool("nvcc", NVCC_ENV)] + ([] if os.environ.get(NVCC_ENV) else [_package_nvcc()])
    for path in dict.fromkeys(filter(None, named)):
        tool = _describe(str(Path(path).resolve()))
        if tool is None:
            continue
        if tool.major == nvrtc_major:
            return tool
        found.append(f"{path} is nvcc {tool.version}")
        if os.environ.get(NVCC_ENV):
            break
    if found:
        raise NvccMissing(f"nvcc and NVRTC must be of one CUDA major: NVRTC is {nvrtc_major}, {'; '.join(found)}: "
                          + install_hint(nvrtc_major))
    where = f"${NVCC_ENV} names no nvcc" if os.environ.get(NVCC_ENV) else "no nvcc was found"
    raise NvccMissing(f"{where} (looked in $PATH, $CUDA_HOME, $CUDA_PATH, /usr/local/cuda and the "
                      f"nvidia-cuda-nvcc package): {install_hint(nvrtc_major)}")


def _package_nvcc() -> str | None:
    try:
        dist = metadata.distribution("nvidia-cuda-nvcc")
    except metadata.PackageNotFoundError:
        return None
    major = (dist.version or "").split(".")[0]
    binary = Path(str(dist.locate_file(f"nvidia/cu{major}/bin/nvcc")))
    return str(binary) if binary.is_file() else None


@lru_cache(maxsize=8)
def _describe(path: str) -> Nvcc | None:
    """nvcc at ``path`` with its exact version and its host compiler's; None where it does not run."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    release = _NVCC_RELEASE.search(out)
    try:  # where nvcc itself lies (its _HERE_), also when `path` is a script that starts it
        plan = subprocess.run([path, "-dryrun", "-ptx", "/nonexistent/cudagate.cu"], capture_output=True, text=True,
                              timeout=60, check=False).stderr
    except (OSError, subprocess.TimeoutExpired):
        plan = ""
    here = _HERE.search(plan)
    if release is None or here is None or not (Path(here.group(1)) / "nvcc").is_file():
        return None
    path = str((Path(here.group(1)) / "nvcc").resolve())
    host_path = shutil.which("gcc") or ""
    host = "no host compiler"
    if host_path:
        host_path = str(Path(host_path).resolve())
        try:
            version = subprocess.run([host_path, "-dumpfullversion"], capture_output=True, text=True, timeout=60,
                                     check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            version = ""
        host = f"gcc {version if _HOST_VERSION.fullmatch(version) else 'of unknown version'} ({host_path})"
    return Nvcc(path, release.group(3), host, host_path)


def identity(tool: Nvcc) -> dict:
    """What of nvcc a cubin depends on, for the compile cache key."""
    return {"nvcc": tool.version, "nvcc_path": tool.path, "host": tool.host}


def build(tool: Nvcc, source: str, source_name: str, entry: str | None, arch: str, options: list[str],
          headers: dict[str, str], flags: list[str], seconds: float, memory_bytes: int,
          header_tree) -> dict:
    """Compile in the confined child; the reply (ok, log, cubin as bytes, lowered_name, resources
    log) or ``stopped`` ("time" or "memory")."""
    if entry is not None and not _ENTRY.fullmatch(entry):
        return {"ok": False, "log": f"entry {entry!r} is not a C++ name nvcc can be asked for: name a __global__ "
                                    "function as `scale`, `ns::scale` or `reduce0<float>`"}
    if not tool.host_path:
        return {"ok": False, "log": "nvcc needs a host compiler and no gcc is on the PATH: install gcc (or g++)"}
    with tempfile.TemporaryDirectory(prefix="cudagate-nvcc-") as folder:
        tree = Path(folder).resolve()
        source_dir = header_tree(tree / "src", headers)
        wrapper = "cudagate-entry.cu"
        for name in (source_name, wrapper):
            if (source_dir / name).exists():
                            raise CompileOptionError(f"header {name!r} has the name of the file nvcc compiles; rename it")
        (source_dir / source_name).write_text(source, encoding="utf-8")
        # The user's file unchanged; the entry's address at namespace scope makes nvcc emit it (no entry:
        # every kernel the file instantiates, for `cudagate init` to list).
        address = f"void *cudagate_entry_address = (void *)&{entry};\n" if entry is not None else ""
        (source_dir / wrapper).write_text(f'#include "{source_name}"\n{address}', encoding="utf-8")
        # ptxas writes each source file's modification time into the cubin's line table: one time for all.
        for written in (tree / "src").rglob("*"):
            os.utime(written, (0, 0))
        temp = tree / "tmp"
        temp.mkdir()
        common = [f"-arch={arch}", *flags, *options]
        request = {
            "compiler": "nvcc", "cwd": str(source_dir), "tree": str(tree), "ptx": str(temp / "out.ptx"),
            "cubin": str(temp / "out.cubin"),
            "ptx_argv": [tool.path, "-ptx", _DIAG_EXTERN_STATIC, *common, "-o", str(temp / "out.ptx"), wrapper],
            "cubin_argv": [tool.path, "-cubin", *common, "-o", str(temp / "out.cubin"), str(temp / "out.ptx")],
            "env": _env(tool, temp), "memory_bytes": memory_bytes,
            "readable": _existing([str(tool.root), *_system_reads(tool)]),
            "writable": [str(tree), *_existing(["/dev/null"])],
            "executable": _existing([str(Path(tool.path).parent), str(tool.root / "nvvm" / "bin"), tool.host_path,
                                     _real("/bin/sh"), "/usr/lib/gcc", "/usr/libexec/gcc", *_loaders()]),
        }
        reply = run_confined(request, seconds)
        log = _plain_paths(reply.get("log", ""), source_dir, tree)
    if reply.get("stopped") or not reply.get("ok"):
        return {**reply, "log": explain(log, entry, source_name, wrapper)}
    cubin = base64.b64decode(reply["cubin"])
    if entry is None:
        return {"ok": True, "log": log, "cubin": cubin, "lowered_name": None, "resources_log": log}
    kernel, every = symbols.find(cubin, entry)
    if kernel is None:
        names = ", ".join(k.name for k in every) or "none"
        return {"ok": False, "log": f"entry {entry!r} is not a __global__ function of {source_name} (its kernels: "
                                    f"{names}); name one of them"}
    return {"ok": True, "log": log, "cubin": cubin, "lowered_name": kernel.symbol,
            "resources_log": entry_log(log, kernel.symbol)}


def run_confined(request: dict, seconds: float) -> dict:
    """The child's reply; ``stopped`` "time" where it ran past ``seconds``. nvcc's own processes are
    in the child's process group, killed with it."""

    child = subprocess.Popen([sys.executable, "-m", "cudagate_harness.confine"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=child_env(), cwd="/",
                             start_new_session=True)
    try:
        out, err = child.communicate(json.dumps(request).encode(), timeout=seconds)
    except subprocess.TimeoutExpired:
        _kill_group(child.pid)
        child.communicate()
        return {"ok": False, "stopped": "time"}
    _kill_group(child.pid)  # nothing nvcc started outlives its compile, finished or not
    try:
        reply = json.loads(out)
    except ValueError:
        reply = None
    reply = reply if isinstance(reply, dict) else None
    if reply is None or not reply.get("ok"):
        if OUT_OF_MEMORY.search(err) or OUT_OF_MEMORY.search((reply or {}).get("log", "").encode()):
            return {"ok": False, "stopped": "memory"}
    return reply or {"ok": False, "log": f"the compiler process failed (exit status {child.returncode})"}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def explain(log: str, entry: str, source_name: str, wrapper: str) -> str:
    """nvcc's log as the user's file shows it: an entry the wrapper could not name said against the
    source, and relocatable device code refused in one line."""
    if _NEEDS_RDC.search(log):
        return (f"{source_name}: a kernel here needs relocatable device code (-rdc: a kernel launching another, or "
                "an extern __device__ defined in another file), which is refused: work launched from a kernel "
                "escapes the timing events. Launch each kernel from the host (a kernel of `steps:`), and define "
                "device variables in the file that uses them")
    reasons = re.findall(rf"^{re.escape(wrapper)}\(\d+\): error: (.*)$", log, re.MULTILINE)
    kept = "\n".join(line for line in log.splitlines()
                     if wrapper not in line and "cudagate_entry_address" not in line and line.strip() != "^")
    if not reasons:  # an error of the user's files: the wrapper that includes them is no part of it
        return kept
    what = "does not instantiate a kernel" if "<" in entry else "is not defined"
    return (f"entry {entry!r} {what} in {source_name}: {'; '.join(reasons) or 'nvcc cannot name it'} (name a "
            f"__global__ function of the file, with template arguments it accepts)\n{kept}").strip()


def entry_log(log: str, symbol: str) -> str:
    """ptxas's lines about ``symbol`` (nvcc builds every kernel of the file; the resources are the entry's)."""
    start = log.find(f"Compiling entry function '{symbol}'")
    if start < 0:
        return ""
    end = log.find("Compiling entry function", start + 1)
    return log[start:end if end >= 0 else len(log)]


def _plain_paths(log: str, source_dir: Path, tree: Path) -> str:
    """Temporary paths out of a log: the source's folder is where names are relative to."""
    return log.replace(f"{source_dir}/", "").replace(str(tree), "<header tree>")


def _env(tool: Nvcc, temp: Path) -> dict[str, str]:
    """nvcc's environment: the child's (no secrets), its temporary files in the private folder, and the
    host compiler's folder first on the PATH (nvcc runs `gcc` by name)."""

    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    path = os.pathsep.join(dict.fromkeys([str(Path(tool.host_path).parent), *env.get("PATH", "").split(os.pathsep)]))
    return {**env, "PATH": path, "TMPDIR": str(temp), "HOME": str(temp)}


def _system_reads(tool: Nvcc) -> list[str]:
    """What nvcc's steps read besides the toolkit: system headers, the host compiler's, shared libraries."""
    reads = ["/usr/include", "/usr/local/include", "/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/libexec",
             "/etc/ld.so.cache"]
    # The nvidia-cuda-nvcc package finds cicc and the headers in sibling packages under one nvidia/cuXX.
    return [*reads, *toolkit.headers(tool.major).dirs]


def _loaders() -> list[str]:
    """The dynamic loader: the kernel opens it to run any program, as it opens the program itself."""
    return [str(path) for folder in ("/lib64", "/lib") for path in sorted(Path(folder).glob("ld-linux*.so*"))]


def _existing(paths: list[str]) -> list[str]:
    return list(dict.fromkeys(str(Path(p).resolve()) for p in paths if p and os.path.exists(p)))


def _real(path: str) -> str:
    return str(Path(path).resolve())
