"""`cudagate sign` and `cudagate check` recompute a Python reference over the stored cases: after a
reference change, expected outputs not generated again are refused, not signed; a CUDA reference and
the cases a time budget leaves are said to be not rechecked; `sign` also refuses a kernel that cannot
take the suite's signature (issue 41, item 10)."""

from __future__ import annotations

from pytest_cudagate.cli import main
from pytest_cudagate.trust import SIGNATURE_FILENAME
from trust_project import clean_env, cuda_project, project  # noqa: F401 (fixtures)

STALE = "disagrees with the reference run now at"


def _change_reference(project, marker=None) -> None:
    """The reference now returns 1 % more: every stored expected output is stale."""
    path = project.suite_dir / "reference.py"
    text = path.read_text().replace("return (e / e.sum(axis=1, keepdims=True))", "return (1.01 * e / e.sum(axis=1, keepdims=True))")
    assert "1.01" in text
    if marker is not None:
        text += f"\nopen({str(marker)!r}, 'w').close()\n"
    path.write_text(text)


def _fix(project) -> str:
    shown = "kernels/softmax/cudagate.yaml"
    return f"fix: run `cudagate cases generate {shown}`, review the data, then have a maintainer run `cudagate sign {shown}`"


def _sign(project, *more: str) -> int:
    return main(["sign", "kernels/softmax", "--key", str(project.keys_dir / "alice.key"), *more])


def test_sign_after_a_reference_change_refuses_the_stale_outputs_until_cases_generate(project, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    _change_reference(project)
    signed = (project.suite_dir / SIGNATURE_FILENAME).read_bytes()
    assert _sign(project) == 2
    err = capsys.readouterr().err
    assert ("case correct_7x33: the stored expected output 'y' (kernels/softmax/cases/correct_7x33/expected/y.npy) "
            f"{STALE} ") in err, err
    assert "worst at index [" in err and "stale, or not made by this reference" in err
    assert err.count(STALE) == 5 and _fix(project) in err
    assert (project.suite_dir / SIGNATURE_FILENAME).read_bytes() == signed  # nothing signed
    assert main(["cases", "generate", "kernels/softmax"]) == 0
    assert _sign(project) == 0
    assert "expected outputs of 5 case(s) agree with the reference reference.py:softmax_rows run now" in \
        capsys.readouterr().out
    assert project.verify().ok


def test_check_refuses_stale_outputs_a_maintainer_signed(project, monkeypatch, capsys):
    """Signed as `cudagate sign` once signed them, without `cases generate`: `verify` passes, `check`
    does not, for a stored case and for a generated one (against its signed sample)."""
    monkeypatch.chdir(project.root)
    project.edit(lambda raw: project.case(raw, "perf_256x1024").update(generated=True))
    assert main(["cases", "generate", "kernels/softmax", "--case", "perf_256x1024"]) == 0
    assert _sign(project) == 0
    _change_reference(project)
    project.sign()
    assert project.verify().ok
    capsys.readouterr()
    assert main(["check", "kernels/softmax"]) == 1
    out = capsys.readouterr().out
    assert f"  case correct_3x5000: the stored expected output 'y' (kernels/softmax/cases/correct_3x5000/expected/y.npy) " \
           f"{STALE} " in out, out
    assert ("  case perf_256x1024: generated case perf_256x1024: the reference's output 'y' disagrees with the signed "
            "sample at ") in out
    assert f"  {_fix(project)}" in out


def test_verify_after_a_reference_change_says_to_generate_the_cases_first(project, monkeypatch, capsys, tmp_path):
    """And `check` runs no reference its trusted signature does not sign."""
    monkeypatch.chdir(project.root)
    marker = tmp_path / "the reference ran"
    _change_reference(project, marker)
    assert main(["verify", "kernels/softmax"]) == 1
    out = capsys.readouterr().out
    assert "reference.py: sha256 changed (the Python reference)" in out and f"  {_fix(project)}" in out, out
    assert main(["check", "kernels/softmax"]) == 1
    out = capsys.readouterr().out
    assert "  note: expected outputs not rechecked with the reference: the suite is not trusted (above)" in out, out
    assert not marker.exists()


def test_the_cases_a_budget_leaves_are_named(project, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    assert main(["check", "kernels/softmax", "--recheck-budget", "0"]) == 0
    out = capsys.readouterr().out
    assert ("  note: case(s) correct_7x33, correct_3x5000, holdout_300x700, perf_256x1024, perf_2048x128: expected "
            "outputs not rechecked with the reference: its 0 s were spent (raise them with --recheck-budget S)") in out, out


def test_a_cuda_reference_is_said_not_rechecked(cuda_project, monkeypatch, capsys):
    monkeypatch.chdir(cuda_project.root)
    main(["check", "kernels/softmax"])
    assert ("  note: expected outputs not rechecked: the reference is a CUDA kernel, which runs on a GPU only; after "
            "changing it, run `cudagate cases generate kernels/softmax/cudagate.yaml` on one, then "
            "`cudagate sign kernels/softmax/cudagate.yaml`") in capsys.readouterr().out


def test_sign_refuses_a_kernel_that_cannot_take_the_signature(project, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    source = project.suite_dir / "softmax.cu"
    source.write_text(source.read_text().replace("int rows, int cols)", "int rows, int cols, int stride)"))
    signed = (project.suite_dir / SIGNATURE_FILENAME).read_bytes()
    assert _sign(project) == 2
    err = capsys.readouterr().err
    assert ("  - softmax_rows: entry 'softmax_rows' does not take the parameters the suite's signature lists: "
            "the kernel takes 5 parameters, the signature lists 4 (x, y, rows, cols)") in err, err
    assert "fix: make the kernel's parameters those the signature lists" in err
    assert (project.suite_dir / SIGNATURE_FILENAME).read_bytes() == signed
