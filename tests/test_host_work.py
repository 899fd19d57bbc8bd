"""The gate's host-side shortcuts give exactly the answers of the plain formulas they replace."""

from __future__ import annotations

import numpy as np
import pytest

from cudagate_harness.protocol import POISON_FIRST, POISON_SECOND, all_bytes, unwritten_mask
from cudagate_harness.runner import _changed
from pytest_cudagate import trash


def bytewise_all(array: np.ndarray, byte: int) -> np.ndarray:
    return np.all(array.reshape(-1).view(np.uint8).reshape(-1, array.dtype.itemsize) == byte, axis=1)


def bytewise_changed(a: np.ndarray, b: np.ndarray) -> int:
    width = a.dtype.itemsize
    return int(np.count_nonzero(np.any(a.view(np.uint8).reshape(-1, width) != b.view(np.uint8).reshape(-1, width),
                                       axis=1)))


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int8, np.uint16, np.int32, np.int64])
def test_poison_and_changed_elements_are_found_per_element_not_per_byte(dtype):
    rng = np.random.default_rng(7)
    width = np.dtype(dtype).itemsize
    raw = rng.choice([POISON_FIRST, POISON_SECOND, 0, 0x80], size=400 * width).astype(np.uint8)
    raw[: 8 * width] = POISON_FIRST  # some elements wholly poisoned, the rest partly or not at all
    first = raw.view(dtype)
    second = rng.permutation(raw).view(dtype)
    for array in (first, second):
        for byte in (POISON_FIRST, POISON_SECOND):
            assert np.array_equal(all_bytes(array, byte), bytewise_all(array, byte))
    assert np.array_equal(unwritten_mask(first, second),
                          bytewise_all(first, POISON_FIRST) & bytewise_all(second, POISON_SECOND))
    assert _changed(first, second) == bytewise_changed(first, second) > 0
    assert _changed(first, first.copy()) == _changed(first, first) == 0


def test_changed_tells_nan_payloads_and_signed_zeros_apart():
    a = np.array([0.0, np.nan, 1.0], dtype=np.float32)
    b = np.array([-0.0, np.nan, 1.0], dtype=np.float32)
    b.view(np.uint32)[1] ^= 1  # another NaN payload
    assert _changed(a, b) == 2


def test_a_discarded_folder_is_gone_from_view_at_once_and_deleted_in_the_background(tmp_path):
    folder = tmp_path / "ref"
    (folder / "c0" / "case").mkdir(parents=True)
    np.save(folder / "c0" / "case" / "a.npy", np.zeros(1000, np.float32))
    trash.discard(folder)
    assert not folder.exists()
    folder.mkdir()  # the name is free again at once
    trash.wait()
    assert [p.name for p in tmp_path.iterdir()] == ["ref"] and not any(folder.iterdir())


def test_a_folder_that_cannot_be_renamed_is_deleted_in_place(tmp_path):
    trash.discard(tmp_path / "missing")  # nothing to rename: nothing happens, nothing raises
    trash.wait()
    assert not any(tmp_path.iterdir())
