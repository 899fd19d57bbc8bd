"""A thin, checked face on the CUDA Driver API (cuda.bindings) for one device and one context.

Every call's CUresult is checked and turned into :class:`CudaError` carrying the error's name, so
the worker can tell a sticky fault (context lost: exit and be restarted) from a recoverable one
(launch refused, out of memory: report and carry on).
"""

from __future__ import annotations

import ctypes

import numpy as np

# Sticky CUDA errors corrupt the context: the worker reports the case and exits so the client starts
# a fresh worker for the remaining cases.
STICKY_ERRORS = frozenset({
    "CUDA_ERROR_ILLEGAL_ADDRESS",
    "CUDA_ERROR_LAUNCH_FAILED",
    "CUDA_ERROR_MISALIGNED_ADDRESS",
    "CUDA_ERROR_ILLEGAL_INSTRUCTION",
    "CUDA_ERROR_INVALID_ADDRESS_SPACE",
    "CUDA_ERROR_INVALID_PC",
    "CUDA_ERROR_HARDWARE_STACK_ERROR",
    "CUDA_ERROR_ASSERT",
    "CUDA_ERROR_LAUNCH_TIMEOUT",
    "CUDA_ERROR_TRAP",
    "CUDA_ERROR_ECC_UNCORRECTABLE",
    "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    "CUDA_ERROR_UNKNOWN",
})


class CudaError(RuntimeError):
    def __init__(self, code: str, call: str, detail: str = ""):
        self.code = code
        self.call = call
        super().__init__(f"{call}: {code}{': ' + detail if detail else ''}")

    @property
    def sticky(self) -> bool:
        return self.code in STICKY_ERRORS


def _cu():
    from cuda.bindings import driver

    return driver


def check(result, call: str):
    """Unpack a cuda.bindings ``(CUresult, *values)`` tuple, raising on error."""
    cu = _cu()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        _, text = cu.cuGetErrorString(err)
        raise CudaError(name.decode() if name else str(err), call, text.decode() if text else "")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class Device:
    """The primary context of one device, made current, with one non-blocking stream."""

    def __init__(self, ordinal: int = 0):
        cu = _cu()
        check(cu.cuInit(0), "cuInit")
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if count == 0:
            raise CudaError("CUDA_ERROR_NO_DEVICE", "cuDeviceGetCount", "no CUDA device")
        self.handle = check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        self.ordinal = ordinal
        self.context = check(cu.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        check(cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING), "cuStreamCreate")
        self._hold: tuple[int, object] | None = None  # (host address, device address) of the hold's word
        self._holds = 0

    def attribute(self, name: str) -> int:
        cu = _cu()
        attr = getattr(cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return check(cu.cuDeviceGetAttribute(attr, self.handle), f"cuDeviceGetAttribute({name})")

    @property
    def arch(self) -> str:
        return f"sm_{self.attribute('COMPUTE_CAPABILITY_MAJOR')}{self.attribute('COMPUTE_CAPABILITY_MINOR')}"

    def describe(self) -> dict:
        cu = _cu()
        name = check(cu.cuDeviceGetName(256, self.handle), "cuDeviceGetName")
        version = check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        uuid = check(cu.cuDeviceGetUuid(self.handle), "cuDeviceGetUuid")
        raw = bytes(uuid.bytes) if hasattr(uuid, "bytes") else bytes(uuid)
        hexed = raw.hex()
        return {
            "ordinal": self.ordinal,
            "name": name.split(b"\x00", 1)[0].decode(),
            "arch": self.arch,
            "compute_capability": f"{self.attribute('COMPUTE_CAPABILITY_MAJOR')}.{self.attribute('COMPUTE_CAPABILITY_MINOR')}",
            "sm_count": self.attribute("MULTIPROCESSOR_COUNT"),
            "l2_bytes": self.attribute("L2_CACHE_SIZE"),
            "memory_total_bytes": check(cu.cuDeviceTotalMem(self.handle), "cuDeviceTotalMem"),
            "max_threads_per_block": self.attribute("MAX_THREADS_PER_BLOCK"),
            "max_shared_per_block_optin": self.attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
            "warp_size": self.attribute("WARP_SIZE"),
            "cuda_driver_version": f"{version // 1000}.{(version % 1000) // 10}",
            "pci_bus_id": check(cu.cuDeviceGetPCIBusId(32, self.handle), "cuDeviceGetPCIBusId").split(b"\x00", 1)[0].decode(),
            "uuid": f"GPU-{hexed[:8]}-{hexed[8:12]}-{hexed[12:16]}-{hexed[16:20]}-{hexed[20:32]}",
        }

    # -- memory -------------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> int:
        return int(check(_cu().cuMemAlloc(max(int(nbytes), 1)), "cuMemAlloc"))

    def free(self, ptr: int) -> None:
        _cu().cuMemFree(ptr)  # best effort: after a sticky fault frees fail and that is fine

    def upload(self, ptr: int, array: np.ndarray) -> None:
        array = np.ascontiguousarray(array)
        if array.nbytes:
            check(_cu().cuMemcpyHtoD(ptr, array, array.nbytes), "cuMemcpyHtoD")

    def download(self, ptr: int, array: np.ndarray) -> np.ndarray:
        if array.nbytes:
            check(_cu().cuMemcpyDtoH(array, ptr, array.nbytes), "cuMemcpyDtoH")
        return array

    def pinned(self, count: int) -> np.ndarray:
        """``count`` 64-bit words of page-locked host memory, for copies the stream makes itself."""
        host = int(check(_cu().cuMemHostAlloc(8 * max(1, count), 0), "cuMemHostAlloc"))
        return np.frombuffer((ctypes.c_uint64 * max(1, count)).from_address(host), dtype=np.uint64)

    def free_pinned(self, array: np.ndarray) -> None:
        _cu().cuMemFreeHost(array.ctypes.data)  # best effort, as free

    def download_async(self, ptr: int, array: np.ndarray) -> None:
        """Copy into ``array`` (pinned) in stream order; it holds the bytes once the stream has synchronised."""
        check(_cu().cuMemcpyDtoHAsync(array.ctypes.data, ptr, array.nbytes, self.stream), "cuMemcpyDtoHAsync")

    def fill(self, ptr: int, byte: int, nbytes: int) -> None:
        if nbytes:
            check(_cu().cuMemsetD8Async(ptr, byte, nbytes, self.stream), "cuMemsetD8Async")

    def fill2d(self, ptr: int, pitch: int, byte: int, width: int, height: int) -> None:
        """``height`` rows of ``width`` bytes, ``pitch`` bytes apart, filled with ``byte`` (a padded
        buffer's rows, its padding left as it is)."""
        if width and height:
            check(_cu().cuMemsetD2D8Async(ptr, pitch, byte, width, height, self.stream), "cuMemsetD2D8Async")
    def set_elements(self, ptr: int, bits: int, itemsize: int, count: int) -> None:
        """Set ``count`` elements of ``itemsize`` bytes to the element ``bits``, in stream order. An
        8-byte element whose halves differ is set half by half: a 2D memset of 4-byte words one word
        wide with a pitch of 8 bytes, once for the low words and once for the high ones."""
        cu = _cu()
        if not count:
            return
        if itemsize == 8:
            low, high = bits & 0xFFFFFFFF, bits >> 32
            if low == high:
                itemsize, count, bits = 4, 2 * count, low
            else:
                for offset, word in ((0, low), (4, high)):
                    check(cu.cuMemsetD2D32Async(ptr + offset, 8, word, 1, count, self.stream), "cuMemsetD2D32Async")
                return
        memset = {1: (cu.cuMemsetD8Async, "cuMemsetD8Async"), 2: (cu.cuMemsetD16Async, "cuMemsetD16Async"),
                  4: (cu.cuMemsetD32Async, "cuMemsetD32Async")}[itemsize]
        check(memset[0](ptr, bits, count, self.stream), memset[1])

    def copy(self, dst: int, src: int, nbytes: int) -> None:
        if nbytes:
            check(_cu().cuMemcpyDtoDAsync(dst, src, nbytes, self.stream), "cuMemcpyDtoDAsync")

    def synchronize(self) -> None:
        check(_cu().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    # -- modules and launches --------------------------------------------------------------------
    def load(self, cubin: bytes, name: str) -> tuple[object, object]:
        cu = _cu()
        module = check(cu.cuModuleLoadData(cubin), "cuModuleLoadData")
        function = check(cu.cuModuleGetFunction(module, name.encode()), "cuModuleGetFunction")
        return module, function

    def allow_dynamic_shared(self, function, nbytes: int) -> None:
        cu = _cu()
        attr = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(cu.cuFuncSetAttribute(function, attr, nbytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")

    def launch(self, function, grid, block, shared_bytes: int, params: np.ndarray) -> None:
        check(_cu().cuLaunchKernel(function, *grid, *block, shared_bytes, self.stream, params.ctypes.data, 0),
              "cuLaunchKernel")

    # -- a host-released hold -------------------------------------------------------------------------
    def hold(self) -> None:
        """Stop the stream here until :meth:`release`: a wait on a host-mapped word. Work enqueued in
        between then runs back to back, so an event pair around a call whose host side is slow (a
        library's dispatch) times the GPU's work, not the host's enqueueing (nvbench holds its stream
        alike). Raises CudaError where the driver has no stream memory operations."""
        cu = _cu()
        if self._hold is None:
            host = int(check(cu.cuMemHostAlloc(4, cu.CU_MEMHOSTALLOC_DEVICEMAP), "cuMemHostAlloc"))
            ctypes.c_uint32.from_address(host).value = 0
            self._hold = host, check(cu.cuMemHostGetDevicePointer(host, 0), "cuMemHostGetDevicePointer")
        self._holds = (self._holds + 1) & 0xFFFFFFFF
        check(cu.cuStreamWaitValue32(self.stream, self._hold[1], self._holds,
                                     cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ), "cuStreamWaitValue32")

    def release(self) -> None:
        ctypes.c_uint32.from_address(self._hold[0]).value = self._holds

    def can_hold(self) -> bool:
        """Whether :meth:`hold` works here (the driver's stream memory operations): one hold tried."""
        try:
            self.hold()
            self.release()
            self.synchronize()
        except CudaError as exc:
            if exc.sticky:
                raise
            return False
        return True

    # -- events ------------------------------------------------------------------------------------
    def event(self):
        return check(_cu().cuEventCreate(_cu().CUevent_flags.CU_EVENT_DEFAULT), "cuEventCreate")

    def record(self, event) -> None:
        check(_cu().cuEventRecord(event, self.stream), "cuEventRecord")

    def elapsed_ms(self, start, end) -> float:
        return float(check(_cu().cuEventElapsedTime(start, end), "cuEventElapsedTime"))

    def destroy_event(self, event) -> None:
        _cu().cuEventDestroy(event)
