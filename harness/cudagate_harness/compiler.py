"""NVRTC compilation to a cubin for one exact architecture, with an on-disk cache.

Always a cubin, never PTX: a newer NVRTC (PyPI's) than the driver produces PTX the driver refuses
(CUDA_ERROR_UNSUPPORTED_PTX_VERSION), while its cubin for the exact SM loads. The cache key covers
everything that changes the binary: source, headers, entry, options, architecture, NVRTC version.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path

from . import toolkit

CACHE_FORMAT = 1
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
)
_RESOURCE_PATTERNS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "shared_static_bytes": re.compile(r"(\d+) bytes smem"),
    "constant_bytes": re.compile(r"(\d+) bytes cmem\[0\]"),
    "stack_frame_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_store_bytes": re.compile(r"(\d+) bytes spill stores"),
    "spill_load_bytes": re.compile(r"(\d+) bytes spill loads"),
    "barriers": re.compile(r"used (\d+) barriers"),
}


class CompileOptionError(ValueError):
    """An NVRTC option the harness refuses; the message says why."""


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

    def to_json(self) -> dict:
        data = asdict(self)
        data.pop("cubin")
        return data


@lru_cache(maxsize=1)
def toolkit_include_flags() -> tuple[str, ...]:
    """``-I`` for a CUDA toolkit include folder, so kernels can use <cuda_fp16.h> and friends.

    NVRTC from PyPI ships no headers; the first folder holding cuda_fp16.h wins: $CUDA_HOME,
    $CUDA_PATH, /usr/local/cuda, then the nvidia-* wheels in site-packages.
    """
    candidates = [root / "include" for root in toolkit.roots()]
    try:
        import nvidia

        for root in nvidia.__path__:
            candidates.extend(sorted(Path(root).glob("*/include")))
    except ImportError:
        pass
    for folder in candidates:
        if (folder / "cuda_fp16.h").is_file():
            return (f"-I{folder}",)
    return ()


def default_flags() -> list[str]:
    return [*DEFAULT_OPTIONS, *toolkit_include_flags()]


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


def cache_key(source: str, *, entry: str, options: list[str], headers: dict[str, str], arch: str) -> str:
    blob = json.dumps(
        {"format": CACHE_FORMAT, "nvrtc": nvrtc_version(), "arch": arch, "entry": entry,
         "options": default_flags() + list(options), "source": source,
         "headers": sorted(headers.items())},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def compile_kernel(
    source: str,
    *,
    entry: str,
    arch: str,
    source_name: str = "kernel.cu",
    options: list[str] | tuple[str, ...] = (),
    headers: dict[str, str] | None = None,
    use_cache: bool = True,
) -> CompileResult:
    """Compile ``source`` for ``arch`` (e.g. ``sm_90``) and look up ``entry``.

    A compile error is a result (``ok=False`` with NVRTC's log), not an exception: the gate reports
    it as the item's failure. Refused options raise :class:`CompileOptionError`.
    """
    options = list(options)
    headers = dict(headers or {})
    check_options(options)
    key = cache_key(source, entry=entry, options=options, headers=headers, arch=arch)
    start = time.perf_counter()
    if use_cache:
        hit = _cache_read(key)
        if hit is not None:
            meta, cubin = hit
            return CompileResult(True, arch, key, True, time.perf_counter() - start, meta["log"],
                                 meta["lowered_name"], meta["resources"], cubin)
    ok, log, lowered, cubin = _nvrtc(source, source_name, entry, arch, options, headers)
    result = CompileResult(ok, arch, key, False, time.perf_counter() - start, log, lowered,
                           parse_resources(log) if ok else {}, cubin)
    if ok and use_cache:
        _cache_write(key, result)
    return result


def parse_resources(log: str) -> dict:
    found = {}
    for name, pattern in _RESOURCE_PATTERNS.items():
        match = pattern.search(log)
        if match:
            found[name] = int(match.group(1))
    return found


def _nvrtc(source, source_name, entry, arch, options, headers):
    with tempfile.TemporaryDirectory(prefix="cudagate-headers-") as tree:
        return _nvrtc_in(source, source_name, entry, arch, options, _header_tree(Path(tree), headers))


def _header_tree(tree: Path, headers: dict[str, str]) -> list[str]:
    """Write ``headers`` (paths relative to the source's folder) as real files; the -I to use.

    Real files, not NVRTC's in-memory headers: a header's own quoted includes then resolve from
    its folder, and one file reached under two spellings stays one file for #pragma once.
    """
    if not headers:
        return []
    depth = max(Path(name).parts.count("..") for name in headers)
    source_dir = tree.joinpath(*(["d"] * depth)) if depth else tree
    for name, text in headers.items():
        target = (source_dir / name).resolve()
        if tree.resolve() not in target.parents:
            raise CompileOptionError(f"header {name!r} lies outside the request's header tree")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    return [f"--include-path={source_dir}"]


def _nvrtc_in(source, source_name, entry, arch, options, include_flags):
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), source_name.encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        # A name expression both finds C++-mangled entries and makes a missing entry a compile error.
        _check(nvrtc.nvrtcAddNameExpression(prog, entry.encode())[0], "nvrtcAddNameExpression")
        flags = [f"--gpu-architecture={arch}", *default_flags(), *include_flags, *options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), [f.encode() for f in flags])
        log = _program_log(prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, _explain_log(log, entry, source_name), None, None
        err, lowered = nvrtc.nvrtcGetLoweredName(prog, entry.encode())
        _check(err, "nvrtcGetLoweredName")
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        # A fresh mutable buffer: NVRTC writes into it, and `b" " * n` may hand out CPython's shared
        # one-byte object (n == 1), corrupting every b" " in the process.
        cubin = bytearray(size)
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
        return True, log, lowered.decode(), bytes(cubin)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _program_log(prog) -> str:
    from cuda.bindings import nvrtc

    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    _check(err, "nvrtcGetProgramLogSize")
    buf = bytearray(size)  # see _nvrtc: never let NVRTC write into a shared bytes object
    _check(nvrtc.nvrtcGetProgramLog(prog, buf)[0], "nvrtcGetProgramLog")
    return bytes(buf).rstrip(b"\x00").decode(errors="replace").strip()


def _explain_log(log: str, entry: str, source_name: str) -> str:
    # The name-expression pragma reports a missing entry against a synthetic file; say it plainly.
    if "__nv_name_map" in log:
        kept = "\n".join(line for line in log.splitlines() if "__nv_name_map" not in line and "nv_mangled_name" not in line and line.strip() != "^")
        return (f"entry {entry!r} is not defined in {source_name} (declare it `extern \"C\" __global__`)\n" + kept).strip()
    return log


def _check(err, call: str) -> None:
    from cuda.bindings import nvrtc

    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"{call} failed: {nvrtc.nvrtcGetErrorString(err)[1].decode()}")


def _cache_read(key: str):
    directory = cache_dir()
    try:
        meta = json.loads((directory / f"{key}.json").read_text())
        cubin = (directory / f"{key}.cubin").read_bytes()
    except (OSError, ValueError):
        return None
    if hashlib.sha256(cubin).hexdigest() != meta.get("cubin_sha256"):
        return None  # torn or corrupted entry: recompile rather than load a bad binary
    return meta, cubin


def _cache_write(key: str, result: CompileResult) -> None:
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
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
