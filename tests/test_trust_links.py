"""A pull request may put a link to /dev/zero where a signed file belongs: the case data, a pinned
approved source. Each is refused by name, never read (the read would not end, or would fill memory).
Bytecode beside the Python reference is never read at all."""

from __future__ import annotations

import re

import pytest

from trust_project import clean_env, project  # noqa: F401 - fixtures
from pytest_cudagate.approvals.ledger import Ledger
from pytest_cudagate.errors import FileError

pytestmark = pytest.mark.usefixtures("clean_env")
NOT_REGULAR = "not a regular file (a device, FIFO or folder, or a link to one)"


def test_a_case_file_that_is_a_link_to_a_device_is_refused_by_name(project):
    case = sorted((project.suite_dir / "cases").rglob("*.npy"))[0]
    case.unlink()
    case.symlink_to("/dev/zero")
    result = project.verify()
    relative = case.relative_to(project.suite_dir).as_posix()
    assert not result.ok
    assert f"{relative}: the signed file is {NOT_REGULAR}; replace it with the file itself" in result.problems


def test_bytecode_beside_the_reference_that_is_a_link_to_a_device_is_never_read(project):
    cache = project.suite_dir / "__pycache__"
    cache.mkdir()
    (cache / "reference.cpython-311.pyc").symlink_to("/dev/zero")
    assert project.verify().ok


def test_an_approved_source_that_is_a_link_to_a_device_is_refused(project):
    approved = project.suite_dir / "approved"
    approved.mkdir()
    (approved / ("0" * 64 + ".cu")).symlink_to("/dev/zero")
    with pytest.raises(FileError, match=re.escape("the approved source is " + NOT_REGULAR)):
        Ledger.for_suite(project.load()).read_blob(f"approved/{'0' * 64}.cu")
