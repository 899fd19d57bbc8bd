"""Digests of what each timed launch wrote, computed on the GPU outside the timed interval.

The timed launches see the same inputs as validation launch 1, so every one of them must write the
same outputs, bit for bit (under ``checks.determinism: bitwise``). Downloading each launch's outputs
would cost more than the timing itself; instead a small reduction kernel, enqueued right after each
timed launch's event pair, folds the launch's outputs into one 64-bit digest, and the host compares
all of them with the digest of validation launch 1. A kernel that is wrong on one launch in 64, or
in 256, is then caught on the launch it was wrong, not only if that launch happened to be the last
on its buffer copy.

The digest is a sum, modulo 2^64, of a mixed value per 8-byte word: the mix (splitmix64's
finaliser) takes the word, its index and a key drawn afresh for every case run, so the sum is the
same whatever order the GPU's threads add in (the kernel uses atomics) and a kernel cannot know in
advance which wrong outputs would collide. :func:`digest` is the same function in numpy: the
definition the CUDA source is tested against, and what the CPU test double computes.
"""

from __future__ import annotations

import numpy as np

GOLDEN = 0x9E3779B97F4A7C15
MASK = (1 << 64) - 1
BLOCK = 256
BLOCKS_PER_SM = 4

SOURCE = r"""
__device__ __forceinline__ unsigned long long cudagate_mix(unsigned long long z)
{
    z ^= z >> 30; z *= 0xBF58476D1CE4E5B9ull;
    z ^= z >> 27; z *= 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Adds the digest of nbytes at data (8-byte aligned) to *out. blockDim.x is a multiple of 32.
extern "C" __global__ void cudagate_digest(const unsigned char* data, unsigned long long nbytes,
                                           unsigned long long key, unsigned long long* out)
{
    const unsigned long long words = nbytes >> 3;
    const unsigned long long* w = (const unsigned long long*)data;
    unsigned long long acc = 0;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride)
        acc += cudagate_mix(w[i] ^ (key + i * 0x9E3779B97F4A7C15ull));
    const unsigned int rest = (unsigned int)(nbytes & 7);
    if (rest && blockIdx.x == 0 && threadIdx.x == 0) {
        unsigned long long tail = 0;
        for (unsigned int k = 0; k < rest; ++k) tail |= (unsigned long long)data[words * 8 + k] << (8 * k);
        acc += cudagate_mix(tail ^ (key + words * 0x9E3779B97F4A7C15ull));
    }
    for (int offset = 16; offset; offset >>= 1) acc += __shfl_down_sync(0xFFFFFFFFu, acc, offset);
    if ((threadIdx.x & 31) == 0 && acc) atomicAdd(out, acc);
}
"""
ENTRY = "cudagate_digest"


def buffer_key(key: int, index: int) -> int:
    """The key of the ``index``-th digested buffer of a launch: the buffers' digests add into one."""
    return int(_mix(np.array([(key + (index + 1) * GOLDEN) & MASK], dtype=np.uint64))[0])


def _mix(z: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = z ^ (z >> np.uint64(30))
        z = z * np.uint64(0xBF58476D1CE4E5B9)
        z = z ^ (z >> np.uint64(27))
        z = z * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def digest(data: np.ndarray, key: int) -> int:
    """The digest of ``data``'s bytes under ``key``, as ``cudagate_digest`` computes it."""
    raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    words = raw.size // 8
    index = np.arange(words + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        salted = np.uint64(key) + index * np.uint64(GOLDEN)
        total = int(_mix(raw[:words * 8].view("<u8") ^ salted[:words]).sum(dtype=np.uint64))
    if raw.size % 8:
        tail = int.from_bytes(raw[words * 8:].tobytes(), "little")
        total += int(_mix(np.array([tail], dtype=np.uint64) ^ salted[words:])[0])
    return total & MASK


def grid_for(nbytes: int, sm_count: int) -> int:
    """Blocks for one digest: enough threads for the words, at most a few blocks per SM."""
    words = max(1, nbytes // 8)
    return max(1, min(-(-words // BLOCK), BLOCKS_PER_SM * max(1, sm_count)))


class Digester:
    """Enqueues ``cudagate_digest`` launches on a device's stream (the worker builds one)."""

    def __init__(self, device, function, sm_count: int):
        self.device = device
        self.function = function
        self.sm_count = sm_count
        # (ptr, nbytes, key) -> (argument values, their pointers, grid): built once per buffer copy, as
        # the digest runs after every timed launch and the host's time there is the gate's.
        self._prepared: dict[tuple[int, int, int], tuple[np.ndarray, np.ndarray, tuple[int, int, int]]] = {}

    def add(self, ptr: int, nbytes: int, key: int, out: int) -> None:
        """Add the digest of ``nbytes`` at ``ptr`` under ``key`` to the word at ``out``."""
        prepared = self._prepared.get((ptr, nbytes, key))
        if prepared is None:
            values = np.array([ptr, nbytes, key, 0], dtype=np.uint64)
            params = np.array([values.ctypes.data + 8 * i for i in range(4)], dtype=np.uint64)
            prepared = self._prepared[ptr, nbytes, key] = values, params, (grid_for(nbytes, self.sm_count), 1, 1)
        values, params, grid = prepared
        values[3] = out  # the launch copies its arguments when it is enqueued
        self.device.launch(self.function, grid, (BLOCK, 1, 1), 0, params)

    def forget(self) -> None:
        """Drop the prepared arguments (their buffers are freed at the end of a case run)."""
        self._prepared.clear()
