"""Where the CUDA toolkit's pieces are on this machine (headers, compute-sanitizer, ncu)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

# The NVIDIA packages on PyPI that hold what a kernel includes with <...>, each with a file that says
# it is there: nvidia-cuda-runtime the CUDA headers (cuda_fp16.h, cuda_bf16.h, cuda_fp8.h, ...),
# nvidia-cuda-crt the crt/ headers they reach (mma.h includes crt/mma.h), nvidia-cuda-cccl CUB,
# libcu++ (cuda/std/...) and Thrust under include/cccl, its own include root. NVRTC needs no more:
# it builds <nv/target> in, and its default dialect (C++17) is the one CCCL 3 requires.
HEADER_PACKAGES = (("nvidia-cuda-runtime", "cuda_fp16.h", ""), ("nvidia-cuda-crt", "crt/host_defines.h", ""),
                   ("nvidia-cuda-cccl", "cccl/cuda/std/version", "cccl"))
# Lines that name a header tree's version where no package or version.json does.
_VERSION_DEFINES = (("cuda.h", re.compile(rb"#define\s+(CUDA_VERSION)\s+(\d+)")),
                    ("cuda/std/__cccl/version.h", re.compile(rb"#define\s+(CCCL_VERSION)\s+(\d+)")))
_READ_LIMIT = 1 << 20  # version.json is a few KiB; CUDA_VERSION sits in cuda.h's first 20 KiB


@dataclass(frozen=True)
class Headers:
    """The include folders NVRTC is given, in search order, and what names their version (for the
    compile cache key: an upgrade of the headers must never reuse a cubin built from the old ones)."""

    dirs: tuple[str, ...] = ()
    identity: tuple[str, ...] = ()


def headers(nvrtc_major: int) -> Headers:
    """The CUDA headers kernels include with <...>, from one place, never mixed.

    A toolkit wins (:func:`header_roots`: the first whose include/ holds cuda_fp16.h; its CCCL too,
    under include/cccl since CUDA 13). Else the header packages of
    NVRTC's major, installed beside it: nvidia-cuda-nvrtc is published for CUDA 13 only, and within
    one major these headers compile with any NVRTC of it (13.0 headers with NVRTC 13.5 and 13.5 with
    13.0 were tried: cuda_bf16.h, cuda_fp8.h, mma.h, CUB, libcu++). Headers of another major (CUDA
    12's nvidia/cuda_runtime/include of other wheels) are never taken. None: no folders, and an
    #include <...> fails with NVRTC's "cannot open source file".
    """
    for root in header_roots():
        include = root / "include"
        if (include / "cuda_fp16.h").is_file():
            cccl = include / "cccl"
            found = (include, cccl) if cccl.is_dir() else (include,)
            return Headers(_resolved(found), (f"toolkit {_toolkit_version(root, found)}",))
    return wheel_headers(nvrtc_major)


def wheel_headers(nvrtc_major: int) -> Headers:
    """:data:`HEADER_PACKAGES` of major ``nvrtc_major`` that are installed, each by name and version."""
    dirs, identity = [], []
    for name, marker, sub in HEADER_PACKAGES:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        version = dist.version or ""
        if version.split(".")[0] != str(nvrtc_major):
            continue
        include = Path(str(dist.locate_file(f"nvidia/cu{nvrtc_major}/include")))
        if (include / marker).is_file():
            dirs.append(include / sub if sub else include)
            identity.append(f"{name} {version}")
    return Headers(_resolved(dirs), tuple(identity))


def _resolved(folders) -> tuple[str, ...]:
    """Real paths (what the confined compiler is allowed to read), each once, in order."""
    return tuple(dict.fromkeys(str(Path(folder).resolve()) for folder in folders))


def _toolkit_version(root: Path, includes) -> str:
    """version.json's SHA-256 (NVIDIA's installers write it), else the headers' version defines."""
    data = _head(root / "version.json")
    if data:
        return f"version.json sha256 {hashlib.sha256(data).hexdigest()}"
    return _defines_version(includes)


def _defines_version(includes) -> str:
    found = []
    for name, pattern in _VERSION_DEFINES:
        for include in includes:
            match = pattern.search(_head(include / name))
            if match:
                found.append(f"{match.group(1).decode()} {match.group(2).decode()}")
                break
    return ", ".join(found) or "of unknown version"


def _head(path: Path) -> bytes:
    """The start of a regular file (never a FIFO that would block), or nothing."""
    try:
        if not path.is_file():
            return b""
        with open(path, "rb") as handle:
            return handle.read(_READ_LIMIT)
    except OSError:
        return b""


def header_roots() -> list[Path]:
    """Toolkits whose headers kernels may get: $CUDA_HOME and $CUDA_PATH where either is set (the
    toolkit a user names is the one meant: ``CUDA_HOME=/nowhere`` picks the header packages even on a
    machine with /usr/local/cuda), else /usr/local/cuda."""
    named = [Path(r) for r in (os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")) if r]
    return named or [Path("/usr/local/cuda")]


def roots() -> list[Path]:
    """Toolkit folders to look in, in order: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda."""
    named = [os.environ.get(v) for v in ("CUDA_HOME", "CUDA_PATH")]
    return [Path(r) for r in [*named, "/usr/local/cuda"] if r]


def find_tool(name: str, override_env: str) -> str | None:
    """A toolkit binary: ``$override_env`` when set (None if it names no file), the PATH, the roots."""
    explicit = os.environ.get(override_env)
    if explicit:
        return explicit if Path(explicit).is_file() else None
    found = shutil.which(name)
    if found:
        return found
    for root in roots():
        candidate = root / "bin" / name
        if candidate.is_file():
            return str(candidate)
    return None
