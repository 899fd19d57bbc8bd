"""The gate's host-side shortcuts give exactly the answers of the plain formulas they replace."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

import cudagate_schemas

from cudagate_harness.protocol import POISON_FIRST, POISON_SECOND, all_bytes, unwritten_mask
from cudagate_harness.runner import _changed
from helpers import EXAMPLES
from pytest_cudagate.boundary import schema
from pytest_cudagate.host import trash
from pytest_cudagate.judge.elementwise import BLOCK, check_output
from pytest_cudagate.suite.model import Tolerance
from test_fast_paths import oracle_check, outputs


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


@pytest.mark.parametrize("bad", [-1.0, 0, float("nan"), "1.5", True, None, [1.0]])
def test_the_schema_shortcut_for_sample_arrays_reports_exactly_what_jsonschema_reports(bad):
    ledger = json.loads((EXAMPLES / "softmax" / "cudagate.approvals.json").read_text())
    plain = jsonschema.validators.validator_for(cudagate_schemas.load("approvals"))(cudagate_schemas.load("approvals"))
    assert schema.problems(ledger, "approvals") == [] == list(plain.iter_errors(ledger))
    baseline = next(iter(ledger["approvals"]["softmax_rows"]["baselines"].values()))
    samples = baseline["cases"]["perf_2048x128"]["samples_ms"]
    samples[len(samples) // 2] = bad
    want = sorted(f"{schema.format_path(e.absolute_path)}: {e.message}" for e in plain.iter_errors(ledger))
    assert sorted(schema.problems(ledger, "approvals")) == want
    assert want or bad != bad  # every bad value is an error, but NaN, which jsonschema lets through both ways


@pytest.mark.parametrize("kind", ["right", "exact", "wrong", "zeros", "tiny", "nearly-constant"])
@pytest.mark.parametrize("dtypes", [(np.float16, np.float16), (np.float64, np.float64), (np.float64, np.float32),
                                    (np.int32, np.float32)])
def test_the_one_pass_check_equals_the_oracle_on_other_dtypes_and_block_remainders(kind, dtypes):
    size = 3 * BLOCK + 17
    expected, actual = outputs(kind, size, np.random.default_rng([size, len(kind)]))
    expected, actual = expected.astype(dtypes[1]), actual.astype(dtypes[0])
    tol = Tolerance(atol=1e-3, rtol=1e-3)
    with np.errstate(all="ignore"):
        want = oracle_check("c", actual, expected, tol, (size,), 0)
    assert repr(check_output("c", actual, expected, tol, (size,))) == repr(want)
