"""`cudagate sign` and `cudagate check` run the suite's Python reference (the recheck of stored expected
outputs) in a child process: `python -I`, in the suite's folder, without the signing key's variables or
any other secret-named variable, started before the key is read and, where Landlock works, unable to
read the private keys' folder or write outside a scratch folder. A child that crashes, hangs or
answers garbage is one line that refuses the signing (issue 41 follow-up: the review found `sign`
running the reference in the process that had loaded the key)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REFERENCE_PY, write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.defences import recheck_child
from pytest_cudagate.trust import SIGNATURE_FILENAME, SIGNING_KEY_ENV, default_key_dir, generate_key_pair

PASSPHRASE_ENV = "CUDAGATE_SIGNING_KEY_PASSPHRASE"
TOKEN = "ghp_not-a-real-token-0123456789abcdef"

# What a reference a pull request changed could look for, printed where the test can see it.
PRYING_REFERENCE = REFERENCE_PY + f"""

import os as _os
import sys as _sys
print("SEEN", {{name: _os.environ.get(name) for name in ({SIGNING_KEY_ENV!r}, {PASSPHRASE_ENV!r}, "GITHUB_TOKEN")}},
      _sys.argv, _os.getcwd(), file=_sys.stderr)
"""

# ... and what it could read and write, where Landlock confines the child.
READING_REFERENCE = REFERENCE_PY + """

import os as _os
import sys as _sys
import tempfile as _tempfile


def _outcome(path, mode):
    try:
        with open(path, mode) as handle:
            handle.read() if "r" in mode else handle.write(b"x")
        return "ok"
    except OSError as exc:
        return type(exc).__name__


for _what, _path, _mode in [("key file", _os.path.expanduser("~/.config/cudagate/keys/alice.key"), "rb"),
                            ("parent environ", f"/proc/{_os.getppid()}/environ", "rb"),
                            ("write beside the suite", "planted.txt", "wb"),
                            ("write the scratch folder", _os.path.join(_tempfile.gettempdir(), "scratch.txt"), "wb")]:
    print(f"{_what}: {_outcome(_path, _mode)}", file=_sys.stderr)
"""


def _project(tmp_path: Path, reference: str, key_path: Path | None = None) -> tuple[Path, Path, Path]:
    """A project root with a trusted key, the `scale` suite (its data generated) and ``reference``
    as the pull request's reference.py; (root, suite file, private key)."""
    root = tmp_path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text("[tool.cudagate]\n")
    private = key_path or tmp_path / "keys" / "alice.key"
    generate_key_pair("alice", private_path=private, public_path=root / ".cudagate" / "trusted_keys" / "alice.pub")
    suite = write_suite(root / "scale")
    (root / "scale" / "reference.py").write_text(reference)
    return root, suite, private


@pytest.fixture(autouse=True)
def no_keys(monkeypatch, tmp_path):
    for name in (SIGNING_KEY_ENV, PASSPHRASE_ENV):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))


def test_sign_runs_the_reference_where_no_signing_key_is(tmp_path, monkeypatch, capfd):
    """The reviewer's reproduction: the key in CUDAGATE_SIGNING_KEY, a token beside it."""
    root, suite, private = _project(tmp_path, PRYING_REFERENCE)
    monkeypatch.setenv(SIGNING_KEY_ENV, private.read_text())
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.chdir(root)
    assert main(["sign", str(suite), "--pull-request", "12"]) == 0
    out, err = capfd.readouterr()
    seen = [line for line in err.splitlines() if line.startswith("SEEN")]
    assert len(seen) == 1, err  # it ran, once
    assert "PRIVATE KEY" not in err and TOKEN not in err and str(private) not in err
    assert seen[0].startswith(f"SEEN {{'{SIGNING_KEY_ENV}': None, '{PASSPHRASE_ENV}': None, 'GITHUB_TOKEN': None}} "), seen
    assert seen[0].endswith(f" {root / 'scale'}"), seen  # in the suite's folder
    assert "expected outputs of 2 case(s) agree with the reference reference.py:scale_rows run now" in out
    assert (root / "scale" / SIGNATURE_FILENAME).is_file()


def test_check_runs_a_trusted_reference_in_the_same_child(tmp_path, monkeypatch, capfd):
    root, suite, private = _project(tmp_path, PRYING_REFERENCE)
    monkeypatch.chdir(root)
    assert main(["sign", str(suite), "--key", str(private)]) == 0
    monkeypatch.setenv(SIGNING_KEY_ENV, private.read_text())
    monkeypatch.setenv(PASSPHRASE_ENV, "correct horse battery staple")
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    capfd.readouterr()
    main(["check", str(suite)])
    out, err = capfd.readouterr()
    assert "  expected outputs of 2 case(s) agree with the reference reference.py:scale_rows run now" in out, out
    assert f"SEEN {{'{SIGNING_KEY_ENV}': None, '{PASSPHRASE_ENV}': None, 'GITHUB_TOKEN': None}} " in err, err
    assert "PRIVATE KEY" not in err and "correct horse" not in err and TOKEN not in err


def test_under_landlock_the_reference_cannot_read_the_key_folder(tmp_path, monkeypatch, capfd):
    """The key where `cudagate keygen` puts it, under a fake HOME; `sign` finds it there, after the recheck."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME")
    root, suite, private = _project(tmp_path, READING_REFERENCE, key_path=default_key_dir() / "alice.key")
    assert private == home / ".config" / "cudagate" / "keys" / "alice.key"
    monkeypatch.chdir(root)
    code = main(["sign", str(suite)])
    out, err = capfd.readouterr()
    unconfined = [line for line in out.splitlines() if "but not confined" in line]
    if unconfined:
        pytest.skip(f"Landlock does not confine the child here: {unconfined[0]}")
    assert code == 0, out + err
    assert "key file: PermissionError" in err and "parent environ: PermissionError" in err, err
    assert "write beside the suite: PermissionError" in err and "write the scratch folder: ok" in err, err
    assert not (root / "scale" / "planted.txt").exists()
    assert f"using the private key in {private}" in out and (root / "scale" / SIGNATURE_FILENAME).is_file()


def _sign_in_a_process(root: Path, suite: Path, private: Path, *more: str) -> subprocess.CompletedProcess:
    """`cudagate sign` as a user runs it: a reference that kills its process kills this one, not pytest."""
    return subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                           "sign", str(suite), "--key", str(private), *more],
                          cwd=root, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("body, line", [
    ("import os, signal\n    os.kill(os.getpid(), signal.SIGSEGV)",
     "expected outputs not rechecked: the process that runs the Python reference reference.py:scale_rows ended "
     "with signal SIGSEGV before it answered: fix the reference (what it printed, if anything, is above)"),
    ("import os\n    os._exit(0)",
     "expected outputs not rechecked: the process that runs the Python reference reference.py:scale_rows ended "
     "with exit status 0 before it answered: fix the reference (what it printed, if anything, is above)"),
    ("import os\n    for fd in range(3, 64):\n        try:\n            os.write(fd, b'{not json')\n"
     "        except OSError:\n            pass\n    os._exit(0)",
     "expected outputs not rechecked: the process that runs the Python reference reference.py:scale_rows answered "
     "with something other than a recheck result (exit status 0, "),
], ids=["crashes", "exits", "writes garbage"])
def test_a_reference_that_crashes_or_answers_garbage_refuses_the_signing_in_one_line(tmp_path, body, line):
    root, suite, private = _project(tmp_path, f"def scale_rows(x, rows, cols):\n    {body}\n")
    done = _sign_in_a_process(root, suite, private)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"cudagate: refused to sign:\nscale/cudagate.yaml:\n  - {line}"), done.stderr
    assert done.stderr.count("\n") == 3 and "Traceback" not in done.stderr, done.stderr
    assert "using the private key" not in done.stdout and not (root / "scale" / SIGNATURE_FILENAME).exists()


def test_a_reference_that_hangs_is_stopped_after_the_budget_and_a_margin(tmp_path, monkeypatch, capsys):
    """Twenty seconds of sleep stand for a hang: the child is stopped at 0.5 + 3 s."""
    root, suite, private = _project(tmp_path, "import time\n\n\n" + REFERENCE_PY.replace(
        "def scale_rows(x, rows, cols):\n", "def scale_rows(x, rows, cols):\n    time.sleep(20)\n"))
    monkeypatch.setattr(recheck_child, "MARGIN_S", 3.0)
    monkeypatch.chdir(root)
    assert main(["sign", str(suite), "--key", str(private), "--recheck-budget", "0.5"]) == 2
    err = capsys.readouterr().err
    assert ("  - expected outputs not rechecked: the process that runs the Python reference reference.py:scale_rows "
            "did not finish in 3.5 s (--recheck-budget 0.5 s, plus 3 s to start and to end the case the budget ran "
            "out in) and was stopped: fix a reference that hangs, or raise --recheck-budget\n") in err, err
    assert not (root / "scale" / SIGNATURE_FILENAME).exists()
