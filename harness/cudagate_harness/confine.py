"""NVRTC (or nvcc) in a child process that can read only the request's header tree and the CUDA headers.

Kernel text is untrusted: an ``#include`` of any path makes NVRTC read that file and quote it in its
log. No filter over the text can be complete (``\\f``, trigraphs, line splices, macro-built names...),
so the child confines itself with Landlock before it compiles: once ``landlock_restrict_self``
returns, the kernel refuses every file the child opens outside the folders listed, whatever the
preprocessor was asked to read. Libraries NVRTC loads lazily are loaded by a warm-up compile first.
Before NVRTC is loaded the child caps its own address space (RLIMIT_AS, ``memory_bytes``), so a
source that expands without end fails its allocations instead of taking the host's memory.

nvcc (``"compiler": "nvcc"``, :mod:`.nvcc`) is a driver that runs the host compiler, cicc and ptxas
as processes of its own: Landlock's rules bind them too, so the child may also execute the files and
folders the request names (nvcc's, the host compiler's, /bin/sh) and write its private temporary folder.

Protocol: one JSON request on stdin, one JSON reply on stdout (``cubin`` as base64).
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import platform
import re
import resource
import subprocess
import sys

# Landlock (Linux >= 5.13); the syscall numbers are shared by x86_64 and aarch64.
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_EXECUTE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 2, 1 << 3
# Writing beneath a folder: write, remove a file or folder, make a folder or a regular file (ABI 1);
# link or rename within it (refer, ABI 2) and truncate (ABI 3) where the kernel knows them.
_WRITE = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 7) | (1 << 8)
_REFER, _TRUNCATE = 1 << 13, 1 << 14
# The rights a rule on one file (not a folder) may hold: Landlock refuses the others there.
_FILE_RIGHTS = _EXECUTE | (1 << 1) | (1 << 2) | _TRUNCATE
_PR_SET_NO_NEW_PRIVS = 38
_WARM_UP = b'extern "C" __global__ void cudagate_warm_up() {}'


class ConfinementError(RuntimeError):
    """The child could not be confined; it then compiles nothing."""


class _RulesetAttr(ctypes.Structure):
    # handled_access_net (ABI 4) and scoped (ABI 6) are passed only where the kernel knows them: the
    # size handed to landlock_create_ruleset says which fields it reads.
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


_NET_TCP = 1 | 2  # LANDLOCK_ACCESS_NET_BIND_TCP | CONNECT_TCP: no rule grants either, so both are denied
_SCOPED = 1 | 2  # LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET | SIGNAL: no reaching processes outside the ruleset


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _handled_access(abi: int) -> int:
    """Every filesystem right this kernel's Landlock knows: what is not granted below is denied."""
    handled = (1 << 13) - 1  # ABI 1: execute .. make_sym
    if abi >= 2:
        handled |= 1 << 13  # refer
    if abi >= 3:
        handled |= 1 << 14  # truncate
    if abi >= 5:
        handled |= 1 << 15  # ioctl_dev
    return handled


def restrict_to(readable: list[str], writable: list[str] = (), executable: list[str] = ()) -> None:
    """From now on this process may only read files and list folders beneath ``readable``, also
    create, write and remove files and folders beneath ``writable``, and run the files beneath
    ``executable`` (a folder or one file; read too).

    Everything else on the filesystem (executing any other file included) is denied. Irreversible, inherited
    by threads and processes created later; raises :class:`ConfinementError` when the kernel cannot
    enforce it.
    """
    if platform.system() != "Linux":
        raise ConfinementError(f"confinement needs Linux Landlock; this is {platform.system()}")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    if abi < 1:
        raise ConfinementError(f"Landlock is not available in this kernel ({os.strerror(ctypes.get_errno())}); "
                               "it needs Linux >= 5.13 with landlock in the lsm= boot list")
    # A compiler needs no network and no other process: a program the source smuggled into it (the
    # compiler's own bugs) may not connect out, signal the gate or reach an abstract socket either.
    attr = _RulesetAttr(_handled_access(abi), _NET_TCP if abi >= 4 else 0, _SCOPED if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise ConfinementError(f"landlock_create_ruleset failed: {os.strerror(ctypes.get_errno())}")
    read = _READ_FILE | _READ_DIR
    write = read | _WRITE | (attr.handled_access_fs & (_REFER | _TRUNCATE))
    try:
        for folder, allowed in [*((f, read) for f in readable), *((f, write) for f in writable),
                                *((f, read | _EXECUTE) for f in executable)]:
            fd = os.open(folder, os.O_PATH | os.O_CLOEXEC)
            try:
                if not os.path.isdir(folder):
                    allowed &= _FILE_RIGHTS & attr.handled_access_fs
                rule = _PathBeneathAttr(allowed, fd)
                if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                                ctypes.byref(rule), ctypes.c_uint32(0)) < 0:
                    raise ConfinementError(f"landlock_add_rule({folder}) failed: {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise ConfinementError(f"prctl(NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) < 0:
            raise ConfinementError(f"landlock_restrict_self failed: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(ruleset)


def _log(nvrtc, prog) -> str:
    _, size = nvrtc.nvrtcGetProgramLogSize(prog)
    buf = bytearray(size)  # a fresh buffer: NVRTC writes into it
    nvrtc.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\x00").decode(errors="replace").strip()


def _compile(nvrtc, source: bytes, name: bytes, flags: list[bytes], entry: bytes | None) -> dict:
    err, prog = nvrtc.nvrtcCreateProgram(source, name, 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return {"ok": False, "log": f"nvrtcCreateProgram failed: {err}"}
    try:
        if entry is not None:
            # A name expression both finds C++-mangled entries and makes a missing entry a compile error.
            nvrtc.nvrtcAddNameExpression(prog, entry)
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(flags), flags)
        log = _log(nvrtc, prog)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return {"ok": False, "log": log}
        lowered = None
        if entry is not None:
            _, lowered_bytes = nvrtc.nvrtcGetLoweredName(prog, entry)
            lowered = lowered_bytes.decode()
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        return {"ok": True, "log": log, "lowered_name": lowered, "cubin": base64.b64encode(bytes(cubin)).decode()}
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def cap_memory(limit: int) -> None:
    """Cap this process's address space at ``limit`` bytes, soft and hard (NVRTC cannot raise it again)."""
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def serve(request: dict) -> dict:
    """Cap memory, warm up, confine, compile ``request`` (source, source_name, entry, flags, readable,
    memory_bytes)."""
    if request.get("memory_bytes"):
        cap_memory(int(request["memory_bytes"]))
    from cuda.bindings import nvrtc

    flags = [f.encode() for f in request["flags"]]
    arch_flags = [f for f in flags if f.startswith(b"--gpu-architecture=")]
    _compile(nvrtc, _WARM_UP, b"warm_up.cu", arch_flags, None)
    try:
        restrict_to(request["readable"])
    except ConfinementError as exc:
        return {"ok": False, "log": f"the compiler was not started: {exc}", "confined": False}
    entry = request["entry"]
    return _compile(nvrtc, request["source"].encode(), request["source_name"].encode(), flags,
                    None if entry is None else entry.encode())


# A PTX line that names a source file: nvcc writes the absolute path, which holds the private
# temporary folder; the cubin's line table copies it.
_PTX_FILE = re.compile(r'^(\s*\.file\s+\d+\s+")([^"]*)(")', re.MULTILINE)


def serve_nvcc(request: dict) -> dict:
    """Cap memory, confine, then run nvcc twice in ``cwd`` (the source's folder in the header tree):
    ``ptx_argv`` to PTX, whose file names are made relative to that folder (so one source compiles to
    one cubin wherever its temporary folder lies), then ``cubin_argv`` from that PTX to the cubin."""
    if request.get("memory_bytes"):
        cap_memory(int(request["memory_bytes"]))
    try:
        restrict_to(request["readable"], request["writable"], request["executable"])
    except ConfinementError as exc:
        return {"ok": False, "log": f"the compiler was not started: {exc}", "confined": False}
    logs = []
    for argv in (request["ptx_argv"], request["cubin_argv"]):
        try:
            done = subprocess.run(argv, cwd=request["cwd"], env=request["env"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        except OSError as exc:
            return {"ok": False, "log": "\n".join([*logs, f"nvcc could not be started: {exc.strerror}"])}
        logs.append(done.stdout.decode(errors="replace").strip())
        if done.returncode != 0:
            return {"ok": False, "log": "\n".join(filter(None, logs))}
        if argv is request["ptx_argv"]:
            _relative_files(request["ptx"], request["cwd"], request["tree"])
    with open(request["cubin"], "rb") as handle:
        cubin = handle.read()
    return {"ok": True, "log": "\n".join(filter(None, logs)), "cubin": base64.b64encode(cubin).decode()}


def _relative_files(ptx: str, cwd: str, tree: str) -> None:
    with open(ptx, encoding="utf-8", errors="surrogateescape") as handle:
        text = handle.read()

    def relative(match: re.Match) -> str:
        name = match.group(2)
        if name.startswith(cwd + "/"):
            name = name[len(cwd) + 1:]
        elif name.startswith(tree + "/"):
            name = "cudagate-headers/" + name[len(tree) + 1:]
        return match.group(1) + name + match.group(3)

    with open(ptx, "w", encoding="utf-8", errors="surrogateescape") as handle:
        handle.write(_PTX_FILE.sub(relative, text))


def main() -> int:
    request = json.loads(sys.stdin.buffer.read())
    reply = serve_nvcc(request) if request.get("compiler") == "nvcc" else serve(request)
    sys.stdout.write(json.dumps(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
