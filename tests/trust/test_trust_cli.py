"""trust.cli: keygen, sign and verify through the command line, their output and exit codes."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.trust import SIGNING_KEY_ENV, generate_key_pair, key_id, load_private_key, load_public_key
from pytest_cudagate.trust.cli import main as trust_main
from pytest_cudagate.trust.cli import register
from trust_project import clean_env, project  # noqa: F401 (fixtures)


# --------------------------------------------------------------------------- keygen, private keys, the CLI


def test_keygen_writes_0600_private_key_and_refuses_to_overwrite(project, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    assert trust_main(["keygen", "--name", "dave"]) == 0
    out = capsys.readouterr().out
    private = Path(os.environ["XDG_CONFIG_HOME"]) / "cudagate" / "keys" / "dave.key"
    public = project.root / ".cudagate" / "trusted_keys" / "dave.pub"
    assert private.is_file() and public.is_file()
    if sys.platform != "win32":
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    kid = key_id(load_private_key(private))
    assert kid in out and key_id(load_public_key(public)) == kid
    before = private.read_bytes(), public.read_bytes()
    assert trust_main(["keygen", "--name", "dave"]) == 2
    err = capsys.readouterr().err
    assert "already exists" in err and "dave.key" in err
    assert (private.read_bytes(), public.read_bytes()) == before
    # the public half alone existing also stops it (replacing it would silently revoke)
    private.unlink()
    assert trust_main(["keygen", "--name", "dave"]) == 2
    assert "dave.pub" in capsys.readouterr().err and not private.exists()


def test_keygen_out_dir_and_bad_name(tmp_path, capsys):
    assert trust_main(["keygen", "--name", "ci", "--out", str(tmp_path / "k")]) == 0
    assert (tmp_path / "k" / "ci.key").is_file() and (tmp_path / "k" / "ci.pub").is_file()
    if sys.platform != "win32":
        assert stat.S_IMODE((tmp_path / "k" / "ci.key").stat().st_mode) == 0o600
    assert trust_main(["keygen", "--name", "../evil", "--out", str(tmp_path / "k")]) == 2
    assert "key name" in capsys.readouterr().err


def test_cli_verify_output_and_exit_codes(project, monkeypatch, capsys):
    monkeypatch.chdir(project.root)
    assert trust_main(["verify", "kernels"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and "OK" in out and project.alice.key_id in out and "alice" in out
    np.save(project.suite_dir / "cases" / "perf_256x1024" / "x.npy", np.ones((256, 1024), dtype=np.float32))
    project.edit(lambda r: r["tolerance"]["y"].update(atol=1e-2))
    assert trust_main(["verify", str(project.suite_file)]) == 1
    out = capsys.readouterr().out
    assert "NOT TRUSTED" in out
    assert "cases/perf_256x1024/x.npy: sha256 changed" in out
    assert "tolerance.y.atol: 1e-06 → 0.01" in out
    assert "cudagate sign kernels/softmax/cudagate.yaml" in out


def test_cli_sign_warns_when_key_not_trusted(project, tmp_path, capsys):
    frank = generate_key_pair("frank", private_path=tmp_path / "f" / "frank.key", public_path=tmp_path / "f" / "frank.pub")
    assert trust_main(["sign", str(project.suite_file), "--key", str(frank.private_path), "--signer", "frank"]) == 0
    err = capsys.readouterr().err
    assert frank.key_id in err and "not among the project's trusted keys" in err


def test_cli_sign_without_any_key_is_a_clear_error(project, capsys):
    assert trust_main(["sign", str(project.suite_file)]) == 2
    err = capsys.readouterr().err
    assert "no signing key" in err and SIGNING_KEY_ENV in err


def test_register_sets_func_for_each_subcommand():
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    for argv in (["keygen", "--name", "x"], ["sign", "s.yaml", "--key", "k", "--signer", "n"], ["verify", "s.yaml"]):
        assert callable(parser.parse_args(argv).func)


def test_check_outside_a_project_names_where_keygen_writes(tmp_path, capsys):
    """No pyproject.toml or .git above the suite: keygen would refuse there, so check says to make a project
    root rather than naming a trusted_keys folder beside the suite that nothing writes."""
    from helpers import write_suite
    from pytest_cudagate.cli import main

    path = write_suite(tmp_path / "suites" / "saxpy")
    assert not any((d / "pyproject.toml").is_file() or (d / ".git").exists() for d in path.parents)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out
    assert "no project root (a folder holding pyproject.toml or .git) at or above" in out, out
    assert "<project root>/.cudagate/trusted_keys/*.pub" in out and "fix: make the project's top folder a repository" in out
    assert "saxpy/.cudagate/trusted_keys" not in out


def test_cli_sign_records_the_pull_request_it_is_signed_for(project, capsys):
    key = str(project.alice.private_path)
    assert trust_main(["sign", str(project.suite_file), "--key", key, "--pull-request", "7"]) == 0
    assert "signed as one document, sequence 2, for pull request 7;" in capsys.readouterr().out
    assert Ledger.for_suite(project.load()).pull_request == 7
    assert trust_main(["sign", str(project.suite_file), "--key", key]) == 0  # each signing says what it is for
    assert Ledger.for_suite(project.load()).pull_request is None


def test_cli_sign_refuses_a_bad_pull_request_number_in_one_line_and_writes_nothing(project, capsys):
    before = {p.name: p.read_bytes() for p in project.suite_dir.glob("cudagate.*")}
    with pytest.raises(SystemExit) as exited:
        trust_main(["sign", str(project.suite_file), "--key", str(project.alice.private_path), "--pull-request", "12a"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == ("cudagate sign: --pull-request: '12a' is not a whole number from 1 to "
                                       "1,000,000,000 (the pull request's number; in a workflow "
                                       "github.event.pull_request.number); see `cudagate sign --help`\n")
    assert {p.name: p.read_bytes() for p in project.suite_dir.glob("cudagate.*")} == before
