"""NVRTC compilation to a cubin for one exact architecture, with an on-disk cache.

A .cu file with host code beside its kernels is compiled by nvcc instead (:mod:`.nvcc`; :func:`chosen`
decides per kernel), through the same caches, limits and confinement.

Always a cubin, never PTX: a newer NVRTC (PyPI's) than the driver produces PTX the driver refuses
(CUDA_ERROR_UNSUPPORTED_PTX_VERSION), while its cubin for the exact SM loads. The cache key covers
everything that changes the binary: source, headers, entry, options, architecture, NVRTC version,
and the CUDA headers' version (:func:`toolkit_headers`).

Kernel text is untrusted. NVRTC runs in a child process (:mod:`.confine`) that the kernel lets read
only the request's header tree (the headers the request carries, written to a private temporary
folder) and the CUDA toolkit's include folders, and whose environment holds no secrets. So whatever
an ``#include`` names, however it is spelled or built, no other file reaches the compile log.

The child is bounded too: an address-space cap (RLIMIT_AS, :data:`DEFAULT_MEMORY_MB` or
$CUDAGATE_COMPILE_MEMORY_MB) and a time limit that follows the case timeout (:class:`CompileLimits`),
since a kilobyte of doubling macros can expand into minutes and gigabytes of compiling. A child
stopped by either fails the compile with one line saying which.

The cache lives in a per-user folder (mode 0700, owned by this user); an entry is used only when
the cubin's SHA-256 matches the one stored beside it, and a mismatch is noted in the log. Failed
compiles are remembered in memory for the process's life only (:func:`compile_kernel`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import posixpath
import re
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path

from . import nvcc, toolkit
from .compile_child import OUT_OF_MEMORY, CompileOptionError, child_env

CACHE_FORMAT = 2  # 2: nvcc builds (its wrapper and flags are this format's)
# -lineinfo maps sanitizer and profiler findings to source lines at no run-time cost; -v makes
# ptxas report registers, spills and shared memory, which the gate shows beside compile results.
DEFAULT_OPTIONS = ("-lineinfo", "--ptxas-options=-v")
# Options the harness owns: the architecture is the device's, and relocatable device code is the
# door to device-side launches that escape the timing events.
_REFUSED = (
    (re.compile(r"^(-arch|--gpu-architecture|-gencode|--generate-code)\b"),
     "the harness compiles for the device's exact architecture; remove it"),
    (re.compile(r"^(-rdc|--relocatable-device-code)(=true|=1)?$|^-dc$|^--device-c$"),
     "relocatable device code (and with it device-side launches) is refused: work launched from "
     "the kernel would escape the timing events"),
    (re.compile(r"^(-dlto|--dlink-time-opt)$"), "link-time optimisation needs relocatable code; remove it"),
    (re.compile(r"^(-ewp|--extensible-whole-program)(=true|=1)?$"),
     "extensible whole-program mode allows device-side launches, which would escape the timing events"),
    # The compiler reads the suite's headers (carried in the request) and the CUDA headers only.
    (re.compile(r"^(-I|--include-path|-isystem|--system-include|-include\b|--pre-include|-optf|--options-file)"),
     "include paths and pre-included files are the harness's: a kernel includes headers from its suite "
     "folder with #include \"...\", and CUDA headers with #include <...>"),
    (re.compile(r"^(-time|--time|-fdevice-time-trace|--fdevice-time-trace|--pch|--create-pch|--use-pch|--pch-dir)\b"),
     "options that read or write files are refused"),
    # NVRTC trims an option before reading it, so " -I/x" would pass the anchored patterns above.
    (re.compile(r"^\s|\s$|[\x00-\x1f\x7f]"), "an option may not start or end with whitespace or hold control "
                                              "characters; write it as one clean word such as -DNAME=value"),
)
# The time a compile may take where no case timeout is known (``cudagate compile``, request files).
COMPILE_TIMEOUT_S = 300
# The compiler child's address space: a normal compile peaks near 200 MiB of it (VmPeak of the examples'
# kernels and sgemm.cu's largest tiles, NVRTC 13 on x86-64; their resident peak is 150-160 MiB), and
# a source that needs ten times that is a bomb, not a kernel.
DEFAULT_MEMORY_MB = 2048
MEMORY_ENV = "CUDAGATE_COMPILE_MEMORY_MB"
REFUSED_TAIL = "a source that expands this much is refused"
_NAME_MAP_ERROR = re.compile(r"^__nv_name_map\(\d+\): error: (.*)$", re.MULTILINE)
_RESOURCE_PATTERNS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "shared_static_bytes": re.compile(r"(\d+) bytes smem"),
    "constant_bytes": re.compile(r"(\d+) bytes cmem\[0\]"),
    "stack_frame_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_store_bytes": re.compile(r"(\d+) bytes spill stores"),
    "spill_load_bytes": re.compile(r"(\d+) bytes spill loads"),
    "barriers": re.compile(r"used (\d+) barriers"),
}


@dataclass(frozen=True)
class CompileLimits:
    """How long one compile may take, and what that follows (said when the limit stops it)."""

    seconds: float = COMPILE_TIMEOUT_S
    why: str = "the default compile time limit"

    @classmethod
    def case_timeout(cls, timeout_s: float | None) -> CompileLimits:
        """The limit of a compile run for a case whose watchdog is ``timeout_s`` (None: the default)."""
        return cls() if timeout_s is None else cls(float(timeout_s), "the case timeout")


def memory_cap_mb() -> tuple[int, str | None]:
    """The compiler child's memory cap in MiB, and why $CUDAGATE_COMPILE_MEMORY_MB cannot be used (or None)."""
    raw = os.environ.get(MEMORY_ENV, "").strip()
    if not raw:
        return DEFAULT_MEMORY_MB, None
    if re.fullmatch(r"[0-9]{1,8}", raw) and 0 < int(raw) <= 1 << 24:
        return int(raw), None
    return DEFAULT_MEMORY_MB, (f"${MEMORY_ENV}={raw[:40]!r} is not a whole number of MiB from 1 to {1 << 24}: "
                               "set it to the compiler's memory cap (for example 4096), or unset it for "
                               f"{DEFAULT_MEMORY_MB}")


@dataclass
class CompileResult:
    ok: bool
    arch: str
    key: str
    cache_hit: bool
    seconds: float
    log: str
    lowered_name: str | None = None
    resources: dict = field(default_factory=dict)
    cubin: bytes | None = field(default=None, repr=False)
    compiler: str = ""  # which compiled it and its exact version: "NVRTC 13.5", "nvcc 13.0.88"

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("cubin")
        return data


@lru_cache(maxsize=1)
def toolkit_headers() -> toolkit.Headers:
    """Where kernels' <cuda_bf16.h>, <cub/...> and <cuda/std/...> come from (:func:`toolkit.headers`):
    NVRTC from PyPI ships no headers, the pinned nvidia-cuda-runtime, -crt and -cccl packages do."""
    return toolkit.headers(int(nvrtc_version().split(".")[0]))


def toolkit_include_dirs() -> tuple[str, ...]:
    """The CUDA include folders, in search order; the confined compiler may read beneath them."""
    return toolkit_headers().dirs


def default_flags() -> list[str]:
    return [*DEFAULT_OPTIONS, *(f"-I{folder}" for folder in toolkit_include_dirs())]


# The harness's own headers for NVRTC, which has no C library (nvrtc_include/): the standard constants,
# pre-included (cudagate_prelude.h), and <stdio.h>, <math.h>, <float.h>, <limits.h>, <stdint.h> (and
# their <c...> spellings) and a device-side <cub/cub.cuh>, searched before the CUDA headers.
NVRTC_INCLUDE = Path(__file__).resolve().parent / "nvrtc_include"
NVRTC_PRELUDE = "cudagate_prelude.h"


def nvrtc_std_flags() -> list[str]:
    return [f"--include-path={NVRTC_INCLUDE}", f"--pre-include={NVRTC_INCLUDE / NVRTC_PRELUDE}"]


@lru_cache(maxsize=1)
def nvrtc_std_identity() -> str:
    """The SHA-256 of nvrtc_include/'s files (names and texts): they change the preprocessed source,
    so they are part of the compile cache key."""
    digest = hashlib.sha256()
    for path in sorted(p for p in NVRTC_INCLUDE.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(NVRTC_INCLUDE).as_posix()}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()


@lru_cache(maxsize=1)
def nvrtc_version() -> str:
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "nvrtcVersion")
    return f"{major}.{minor}"


def check_options(options: list[str]) -> None:
    for option in options:
        for pattern, why in _REFUSED:
            if pattern.search(option):
                raise CompileOptionError(f"option {option!r} is not allowed: {why}")


def cache_dir() -> Path:
    root = os.environ.get("CUDAGATE_CACHE_DIR")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cudagate"
    return base / "nvrtc"


def private_cache_dir() -> Path | None:
    """:func:`cache_dir`, created mode 0700; None (no cache) when it or its parent is not this user's
    alone: a folder other users can write is a folder they can poison."""
    return private_dir(cache_dir())


def private_dir(directory: Path) -> Path | None:
    """``directory`` (a cache), created mode 0700; None when it or its parent is a link or another
    user's (see :func:`private_cache_dir`)."""
    try:
        for folder in (directory.parent, directory):
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            info = os.lstat(folder)
            if stat.S_ISLNK(info.st_mode) or (hasattr(os, "getuid") and info.st_uid != os.getuid()):
                return None
            if stat.S_IMODE(info.st_mode) & 0o077:
                os.chmod(folder, 0o700)
    except OSError:
        return None
    return directory


def cache_key(source: str, *, entry: str, options: list[str], headers: dict[str, str], arch: str,
              source_name: str = "kernel.cu", nvcc_tool: nvcc.Nvcc | None = None) -> str:
    # The source name is an input too: it is __FILE__, and the file named in the cubin's line info.
    # nvcc's builds add the compiler: its exact version, where it lies, and the host compiler's version.
    blob = json.dumps(
        {"format": CACHE_FORMAT, "nvrtc": nvrtc_version(), "arch": arch, "entry": entry, "source_name": source_name,
         "options": default_flags() + list(options), "source": source, "toolkit": toolkit_headers().identity,
         "nvrtc_std": nvrtc_std_identity(), "headers": sorted(headers.items()),
         **({"nvcc": nvcc.identity(nvcc_tool)} if nvcc_tool else {})},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


# This process's failed compiles, by cache key, source name (NVRTC's log names it) and limits: a
# source that failed once (a bomb stopped at its limit above all) fails again at once for the rest of
# the run instead of costing the limit once per item. Never on disk: a limit reached on a busy
# machine says nothing about the next run.
_FAILED: dict[tuple[str, str, float, int], CompileResult] = {}
_FAILED_LOCK = threading.Lock()


def compile_kernel(
    source: str,
    *,
    entry: str | None,
    arch: str,
    source_name: str = "kernel.cu",
    options: list[str] | tuple[str, ...] = (),
    headers: dict[str, str] | None = None,
    use_cache: bool = True,
    limits: CompileLimits | None = None,
    compiler: str = "auto",
) -> CompileResult:
    """Compile ``source`` for ``arch`` (e.g. ``sm_90``) and look up ``entry`` (None: every kernel the
    source defines, for ``cudagate init`` to list; templates only where instantiated), within ``limits``
    (default: :data:`COMPILE_TIMEOUT_S`) and the memory cap (:func:`memory_cap_mb`), with ``compiler``:
    "nvrtc", "nvcc", or "auto" (:func:`chosen`).

    A compile error is a result (``ok=False`` with the compiler's log), not an exception: the gate
    reports it as the item's failure. Refused options raise :class:`CompileOptionError`. With
    ``use_cache``, a compile that failed before in this process is answered from memory (``cache_hit``).
    """
    options = list(options)
    headers = dict(headers or {})
    limits = limits or CompileLimits()
    if source_name.startswith("-"):
        raise CompileOptionError(f"source file {source_name[:80]!r}: a name that starts with '-' reads as an option "
                                 "to the compiler; rename the file")
    check_options(options)
    use_nvcc, why = chosen(compiler, source, headers)
    build = dict(source=source, entry=entry, arch=arch, source_name=source_name, options=options, headers=headers,
                 use_cache=use_cache, limits=limits)
    result = _compiled(**build, nvcc_because=why if use_nvcc else None)
    if compiler == "auto" and not use_nvcc and not result.ok and nvcc.HOST_REFUSAL in result.log:
        result = _compiled(**build, nvcc_because="NVRTC refuses its host functions")
    return result


def chosen(compiler: str, source: str, headers: dict[str, str]) -> tuple[bool, str]:
    """Whether ``compiler`` compiles with nvcc, and why. "auto" takes nvcc where the source or a quoted
    header holds a host-only marker (:func:`nvcc.host_code`), else NVRTC (:func:`compile_kernel` then
    turns to nvcc where NVRTC refuses a host function)."""
    if compiler not in nvcc.COMPILERS:
        raise CompileOptionError(f"compiler {compiler!r} is not one of {', '.join(nvcc.COMPILERS)}")
    if compiler != "auto":
        return compiler == "nvcc", f"compiler: {compiler}"
    marker = nvcc.host_code(source, headers)
    return marker is not None, (f"it holds host code: {marker}" if marker else "it holds device code only")


def _compiled(*, source, entry, arch, source_name, options, headers, use_cache, limits,
              nvcc_because: str | None) -> CompileResult:
    """One compiler's build through the caches: nvcc's where ``nvcc_because`` says why, else NVRTC's."""
    start = time.perf_counter()
    tool = None
    if nvcc_because:
        nvcc.check_options(options)
        try:
            tool = nvcc.find(int(nvrtc_version().split(".")[0]))
        except nvcc.NvccMissing as exc:
            return CompileResult(False, arch, "", False, 0.0, f"{source_name} needs nvcc ({nvcc_because}; the "
                                 f"kernel's `compiler:` field): {exc}", compiler="nvcc")
    label = tool.label if tool else f"NVRTC {nvrtc_version()}"
    key = cache_key(source, entry=entry, options=options, headers=headers, arch=arch, source_name=source_name,
                    nvcc_tool=tool)
    memory_mb, problem = memory_cap_mb()
    if problem:
        return CompileResult(False, arch, key, False, 0.0, problem, compiler=label)
    failed = (key, source_name, limits.seconds, memory_mb)
    note = ""
    if use_cache:
        with _FAILED_LOCK:
            known = _FAILED.get(failed)
        if known is not None:
            return replace(known, cache_hit=True, seconds=time.perf_counter() - start)
        hit, note = _cache_read(key)
        if hit is not None:
            meta, cubin = hit
            return CompileResult(True, arch, key, True, time.perf_counter() - start, meta["log"],
                                 meta["lowered_name"], meta["resources"], cubin, label)
    if tool:
        ok, log, lowered, cubin, resources = _nvcc(tool, source, source_name, entry, arch, options, headers, limits,
                                                   memory_mb)
    else:
        ok, log, lowered, cubin = _nvrtc(source, source_name, entry, arch, options, headers, limits, memory_mb)
        resources = log
        if not ok and nvcc.HOST_REFUSAL in log:
            log += (f"\n{source_name} holds host code, which NVRTC cannot compile: give its kernel `compiler: nvcc` "
                    "(or `compiler: auto`, the default)")
    result = CompileResult(ok, arch, key, False, time.perf_counter() - start, "\n".join(filter(None, [note, log])),
                           lowered, parse_resources(resources) if ok else {}, cubin, label)
    if use_cache:
        if ok:
            _cache_write(key, result)
        else:
            with _FAILED_LOCK:
                _FAILED[failed] = result
    return result


def parse_resources(log: str) -> dict:
    found = {}
    for name, pattern in _RESOURCE_PATTERNS.items():
        match = pattern.search(log)
        if match:
            found[name] = int(match.group(1))
    return found


def _nvrtc(source, source_name, entry, arch, options, headers, limits: CompileLimits, memory_mb: int):
    with tempfile.TemporaryDirectory(prefix="cudagate-headers-") as tree:
        source_dir = _header_tree(Path(tree), headers)
        include = [f"--include-path={source_dir}"] if headers else []
        flags = [f"--gpu-architecture={arch}", *nvrtc_std_flags(), *default_flags(), *include, *options]
        # The working folder is "/" (unreadable to the child), so the binary's line table never names
        # a temporary folder and one source compiles to one cubin.
        request = {"source": source, "source_name": source_name, "entry": entry, "flags": flags,
                   "readable": [str(Path(tree).resolve()), str(NVRTC_INCLUDE), *toolkit_include_dirs()], "memory_bytes": memory_mb << 20}
        reply = _run_confined(request, limits)
        if "log" in reply:
            reply["log"] = _header_names(reply["log"], Path(tree), source_dir)
    if reply.get("stopped"):
        what = (f"stopped after {limits.seconds:g} s ({limits.why})" if reply["stopped"] == "time" else
                f"ran out of its {memory_mb} MiB memory cap (${MEMORY_ENV} sets another)")
        return False, f"compile of {entry or source_name} ({source_name}): {what}: {REFUSED_TAIL}", None, None
    if not reply.get("ok"):
        return False, _explain_log(reply.get("log", ""), entry, source_name), None, None
    return True, reply["log"], reply["lowered_name"], base64.b64decode(reply["cubin"])


def _nvcc(tool: nvcc.Nvcc, source, source_name, entry, arch, options, headers, limits: CompileLimits, memory_mb: int):
    """nvcc's build (:func:`nvcc.build`): ok, log, lowered name, cubin, and the log of the entry's resources."""
    reply = nvcc.build(tool, source, source_name, entry, arch, options, headers, list(DEFAULT_OPTIONS), limits.seconds,
                       memory_mb << 20, _header_tree)
    if reply.get("stopped"):
        what = (f"stopped after {limits.seconds:g} s ({limits.why})" if reply["stopped"] == "time" else
                f"ran out of its {memory_mb} MiB memory cap (${MEMORY_ENV} sets another)")
        return False, f"compile of {entry} ({source_name}): {what}: {REFUSED_TAIL}", None, None, ""
    if not reply.get("ok"):
        return False, reply.get("log", ""), None, None, ""
    return True, reply["log"], reply["lowered_name"], reply["cubin"], reply["resources_log"]


def _header_tree(tree: Path, headers: dict[str, str]) -> Path:
    """Write ``headers`` (paths relative to the source's folder) as real files; the source's folder.

    Real files, not NVRTC's in-memory headers: a header's own quoted includes then resolve from
    its folder, and one file reached under two spellings stays one file for #pragma once. A name
    that passes through a folder ("sub/../ok.h") makes that folder too, since the file system opens
    the name through it. The tree is laid out by name alone (it holds no links), and no step of a
    name may leave it.
    """
    depth = max((Path(name).parts.count("..") for name in headers), default=0)
    base = ["d"] * depth
    source_dir = tree.joinpath(*base)
    source_dir.mkdir(parents=True, exist_ok=True)
    for name, text in headers.items():
        parts = Path(name).parts
        if Path(name).is_absolute() or not parts or parts[-1] in (".", ".."):
            raise CompileOptionError(f"header {name!r} lies outside the request's header tree")
        place = list(base)
        for number, part in enumerate(parts, 1):
            if part == ".." and not place:
                raise CompileOptionError(f"header {name!r} lies outside the request's header tree")
            if part == "..":
                place.pop()
            elif part != ".":
                place.append(part)
                if number < len(parts):
                    _make_folder(tree.joinpath(*place), name)
        try:
            tree.joinpath(*place).write_text(text, encoding="utf-8")
        except OSError as exc:
            raise CompileOptionError(f"header {name!r} cannot be written to the header tree: {exc.strerror}") from None
    return source_dir


def _header_names(log: str, tree: Path, source_dir: Path) -> str:
    """``log`` with each header of the tree named as the request names it (its path from the source's
    folder, ``common/util.cuh``), never by the temporary folder NVRTC opened it in."""
    prefixes = sorted({re.escape(str(tree)), re.escape(str(tree.resolve()))}, key=len, reverse=True)
    pattern = re.compile(rf"(?:{'|'.join(prefixes)})(/[^\s()\"':,]*)")
    return pattern.sub(lambda m: posixpath.normpath(os.path.relpath(f"{tree}{m.group(1)}", source_dir)), log)


def _make_folder(folder: Path, name: str) -> None:
    try:
        folder.mkdir(exist_ok=True)
    except OSError as exc:  # a header of that name is a file there
        raise CompileOptionError(f"header {name!r}: {folder.name!r} is a file and a folder of the header tree "
                                 f"({exc.strerror})") from None


def _run_confined(request: dict, limits: CompileLimits) -> dict:
    """The child's reply; ``stopped`` ("time" or "memory") where a limit ended its compile."""
    try:
        # subprocess.run kills the child at the limit; NVRTC runs in it, with no process of its own.
        done = subprocess.run([sys.executable, "-m", "cudagate_harness.confine"], input=json.dumps(request).encode(),
                              capture_output=True, env=child_env(), cwd="/", timeout=limits.seconds)
    except subprocess.TimeoutExpired:
        return {"ok": False, "stopped": "time"}
    try:
        reply = json.loads(done.stdout)
    except ValueError:
        reply = None
    reply = reply if isinstance(reply, dict) else None
    if (reply is None or not reply.get("ok")) and OUT_OF_MEMORY.search(done.stderr):
        return {"ok": False, "stopped": "memory"}
    # Only the child's exit status: its stderr could quote what the kernel tried to read.
    return reply or {"ok": False, "log": f"the compiler process failed (exit status {done.returncode})"}


def _explain_log(log: str, entry: str, source_name: str) -> str:
    # NVRTC reports an entry that names no kernel (a template that does not instantiate, too) against
    # the synthetic file of its name expression: say it against the source, with NVRTC's own reason.
    if entry is None or "__nv_name_map" not in log:
        return log
    reasons = [found for found in _NAME_MAP_ERROR.findall(log) if not found.startswith("Error in parsing name expression")]
    kept = "\n".join(line for line in log.splitlines() if "__nv_name_map" not in line and "nv_mangled_name" not in line and line.strip() != "^")
    if "<" in entry:
        what, fix = "does not instantiate a kernel", "name a __global__ function template and arguments it accepts"
    else:
        what, fix = "is not defined", "declare it `__global__` there; extern \"C\" or not, it is found by its C++ name"
    because = f": {'; '.join(reasons)}" if reasons else ""
    return f"entry {entry!r} {what} in {source_name}{because} ({fix})\n{kept}".strip()


def _check(err, call: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{call} failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")


def _cache_read(key: str) -> tuple[tuple[dict, bytes] | None, str]:
    """The cached entry for ``key`` if its cubin matches the hash stored beside it; else a note why not."""
    directory = private_cache_dir()
    if directory is None:
        return None, ""
    try:
        meta = json.loads((directory / f"{key}.json").read_text())
        cubin = (directory / f"{key}.cubin").read_bytes()
    except (OSError, ValueError):
        return None, ""
    if not isinstance(meta, dict) or hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        return None, (f"note: the compile cache entry {key[:16]} failed its SHA-256 check (corrupted or tampered "
                      "with); it was ignored and the kernel recompiled")
    return (meta, cubin), ""


def _cache_write(key: str, result: CompileResult) -> None:
    directory = private_cache_dir()
    if directory is None:
        return
    try:
        _atomic_write(directory / f"{key}.cubin", result.cubin)
        meta = {"log": result.log, "lowered_name": result.lowered_name, "resources": result.resources,
                "arch": result.arch, "cubin_sha256": hashlib.sha256(result.cubin).hexdigest()}
        _atomic_write(directory / f"{key}.json", json.dumps(meta).encode())
    except OSError:
        pass  # a read-only or full cache costs speed, never correctness


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
