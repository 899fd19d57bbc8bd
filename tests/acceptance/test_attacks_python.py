"""Python of a pull request's own, planted where the gate might run it (issue 28, routes 1-3): a
package ``__init__.py``, a doctest file, a module shadowing one the gate imports late, bytecode
beside the signed reference, a spelling of the reference's path that names another file, and a
reference changed after its trust check. Each payload writes a marker file; none may run, and the
honest pull request's result stays what it was: trusted, and its two compile items pass.

On a CPU runner the gate never runs the Python reference (its fresh inputs need a worker), so the
routes through the reference are also tried on :class:`ReferenceRunner` itself, where it does run.
"""

from __future__ import annotations

import importlib.util
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import write_suite
from pytest_cudagate.defences.reference import ReferenceFailure, ReferenceRunner
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import load_trusted_keys, verify_suite
from test_attacks import Repo, repo  # noqa: F401 - the fixture

SIGNED_FUNCTION = "softmax_rows"


def payload(marker: Path, *, function: bool = False) -> str:
    """Python that leaves ``marker`` behind if it ever runs (and, as a reference, still gives right answers)."""
    text = f"open({str(marker)!r}, 'w').write('ran')\n"
    if function:
        text += ("import numpy as np\n\n\ndef softmax_rows(x, rows, cols):\n"
                 "    e = np.exp(x.astype(np.float64).reshape(rows, cols))\n"
                 "    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)\n")
    return text


def honest(repo: Repo, *args: str) -> str:
    """The gate's output on the pull request as it stands, asserting it reads as the honest PR's."""
    code, out = repo.gate("-rA", *args)
    assert code == 0, out
    assert "2 passed" in out and "NOT TRUSTED" not in out and "refuses" not in out, out
    return out


def forge_pyc(source: Path, marker: Path, mode: py_compile.PycInvalidationMode) -> Path:
    """The attacker's bytecode for ``source``: the payload compiled, stamped with the signed source's
    hash (for a checked pyc, Python then takes it for the source it checks against)."""
    cache = Path(importlib.util.cache_from_source(str(source)))
    cache.parent.mkdir(exist_ok=True)
    planted = source.parent / "payload_src.py"
    planted.write_text(payload(marker, function=True))
    py_compile.compile(str(planted), cfile=str(cache), invalidation_mode=mode, doraise=True)
    planted.unlink()
    data = bytearray(cache.read_bytes())
    data[8:16] = importlib.util.source_hash(source.read_bytes())
    cache.write_bytes(bytes(data))
    return cache


X = np.arange(6, dtype=np.float32).reshape(2, 3)


def signed_answer(x: np.ndarray) -> np.ndarray:
    """What the signed examples/softmax/reference.py returns."""
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)


# -------------------------------------------------------------------------------- pytest's collectors


@pytest.mark.parametrize("folder", ["softmax", "."])
def test_a_package_init_in_the_suite_folder_or_the_repo_root_is_never_imported(repo, tmp_path, folder):
    marker = tmp_path / "init-ran"
    (repo.path / folder / "__init__.py").write_text(payload(marker))
    honest(repo)
    assert not marker.exists()


def test_a_doctest_file_beside_the_suite_is_not_collected(repo, tmp_path):
    marker = tmp_path / "doctest-ran"
    (repo.suite_dir / "test_notes.txt").write_text(f">>> _ = open({str(marker)!r}, 'w').write('ran')\n")
    out = honest(repo)
    assert not marker.exists()
    assert "test_notes.txt" not in out


def test_python_files_of_the_checkout_are_not_collected_without_a_trusted_ref_either(repo, tmp_path):
    """Plain ``cudagate gate`` (no --trusted-ref) isolates collection the same way."""
    marker = tmp_path / "ran"
    (repo.suite_dir / "__init__.py").write_text(payload(marker))
    (repo.suite_dir / "test_notes.txt").write_text(f">>> _ = open({str(marker)!r}, 'w').write('ran')\n")
    (repo.suite_dir / "test_payload.py").write_text(payload(marker) + "\n\ndef test_x():\n    pass\n")
    repo.commit("pull request")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDAGATE_"))}
    env.update(CUDA_VISIBLE_DEVICES="", CUDAGATE_CACHE_DIR=str(repo.cache))
    done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                           "gate", "--", "-rA"], cwd=repo.path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "2 passed" in out, out
    assert not marker.exists()


@pytest.mark.parametrize("module", ["pdb.py", "cuda/__init__.py"])
def test_a_module_in_the_checkout_does_not_shadow_one_the_gate_imports(repo, tmp_path, module):
    """Run as ``python -c`` (or ``-m``) from the checkout, the current folder leads sys.path: pdb
    (pytest's debugging plugin) and cuda (the CUDA bindings) are first imported during the run."""
    marker = tmp_path / "shadow-ran"
    (repo.path / module).parent.mkdir(exist_ok=True)
    (repo.path / module).write_text(payload(marker))
    honest(repo)
    assert not marker.exists()


@pytest.mark.parametrize("option", ["--doctest-modules", "--doctest-glob=*.md", "-p"])
def test_options_that_collect_more_of_the_checkout_are_refused_under_a_trusted_ref(repo, option):
    code, out = repo.gate(option)
    assert code != 0 and f"{option.split('=')[0]}: refused under --trusted-ref" in out, out


# -------------------------------------------------------------------------------- bytecode


@pytest.mark.parametrize("mode", [py_compile.PycInvalidationMode.CHECKED_HASH,
                                  py_compile.PycInvalidationMode.UNCHECKED_HASH], ids=["checked", "unchecked"])
def test_bytecode_beside_the_reference_is_never_run_by_the_reference_runner(repo, tmp_path, mode):
    marker = tmp_path / "pyc-ran"
    forge_pyc(repo.suite_dir / "reference.py", marker, mode)
    function = ReferenceRunner(repo.suite()).python_function()
    np.testing.assert_array_equal(function(x=X, rows=2, cols=3), signed_answer(X))
    assert not marker.exists()


@pytest.mark.parametrize("mode", [py_compile.PycInvalidationMode.CHECKED_HASH,
                                  py_compile.PycInvalidationMode.UNCHECKED_HASH], ids=["checked", "unchecked"])
def test_bytecode_beside_the_reference_leaves_the_gate_s_verdict_unchanged(repo, tmp_path, mode):
    """Never read, so neither a reason to distrust the suite nor a way in: ``verify`` and the gate agree."""
    marker = tmp_path / "pyc-ran"
    forge_pyc(repo.suite_dir / "reference.py", marker, mode)
    honest(repo)
    assert verify_suite(repo.suite(), load_trusted_keys(repo.path)).ok
    assert not marker.exists()


def test_the_reference_runner_writes_no_bytecode_into_the_checkout(repo, monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    ReferenceRunner(repo.suite()).python_function()
    assert not (repo.suite_dir / "__pycache__").exists()


# -------------------------------------------------------------------------------- the path it names


def test_a_reference_path_that_resolves_to_another_file_is_not_run(repo, tmp_path):
    """``sub/../reference.py`` signs as ``reference.py`` (the manifest normalises the spelling), but
    with ``sub`` a link into another folder it resolves to that folder's ``reference.py``."""
    marker = tmp_path / "path-ran"
    other = repo.suite_dir / "elsewhere"
    (other / "inner").mkdir(parents=True)
    (other / "reference.py").write_text(payload(marker, function=True))
    (repo.suite_dir / "sub").symlink_to(other / "inner", target_is_directory=True)
    repo.edit_yaml(lambda raw: raw["reference"].update(python=f"sub/../reference.py:{SIGNED_FUNCTION}"))
    function = ReferenceRunner(repo.suite()).python_function()  # the file the manifest hashed
    np.testing.assert_array_equal(function(x=X, rows=2, cols=3), signed_answer(X))
    assert not marker.exists()


def test_a_reference_changed_after_its_signature_is_not_run(repo, tmp_path):
    """The text run is the text whose hash is signed: a reference edited since (here, after the trust
    check read it) is refused, naming the file and both hashes."""
    marker = tmp_path / "changed-ran"
    suite = repo.suite()
    (repo.suite_dir / "reference.py").write_text(payload(marker, function=True))
    signed = r"reference\.py: its sha256 \w+… differs from the reference signed in .*softmax/cudagate\.sig\.json"
    with pytest.raises(ReferenceFailure, match=signed):
        ReferenceRunner(suite).python_function()
    assert not marker.exists()


# -------------------------------------------------------------------------------- still a reference


def test_the_python_reference_runs_from_its_source_and_names_its_own_lines(tmp_path):
    path = write_suite(tmp_path / "s", data=False)
    reference = path.parent / "reference.py"
    suite = load_suite(path)
    case = suite.case("small")
    x = np.arange(150, dtype=np.float32).reshape(3, 50)
    np.testing.assert_array_equal(ReferenceRunner(suite).python(case, {"x": x})["y"], x * 2)

    reference.write_text("import numpy as np\n\n\ndef scale_rows(x, rows, cols):\n    raise ValueError('no')\n")
    with pytest.raises(ReferenceFailure, match=rf"^{reference}:5: the Python reference failed on case 'small': "
                                               r"ValueError: no$"):
        ReferenceRunner(suite).python(case, {"x": x})
    reference.write_text("import numpy as np\nraise RuntimeError('at import')\n")
    with pytest.raises(ReferenceFailure, match=rf"^{reference}:2: the Python reference cannot be imported: "
                                               r"RuntimeError: at import$"):
        ReferenceRunner(suite).python_function()
    reference.write_text("def scale_rows(x, rows, cols):\n    return (\n")
    with pytest.raises(ReferenceFailure, match=rf"^{reference}:2: the Python reference cannot be imported: "
                                               r"SyntaxError"):
        ReferenceRunner(suite).python_function()
    reference.write_bytes(b"x = 1\ny = '\xff'\n")
    with pytest.raises(ReferenceFailure, match=rf"^{reference}:2: the Python reference cannot be imported: "
                                               r"SyntaxError: .*'utf-8' codec can't decode"):
        ReferenceRunner(suite).python_function()

