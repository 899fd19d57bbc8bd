"""Commands cudagate prints for a maintainer to paste (``cudagate sign PATH``, ``git checkout REF -- PATH``,
...) quote every path and name a pull request chose (issue 41 follow-up).

A pull request that adds a suite folder named ``x$(touch${IFS}PWNED)`` must not get, from the gate, a fix
line that runs its command on the maintainer's machine, beside the signing key. Each test pastes every
backticked command of the output into bash, with ``cudagate`` and ``git`` replaced by functions that print
their arguments, and checks that nothing ran and the path arrived as one argument."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import git
import pytest

from fake_worker import install, scale_kernels
from helpers import write_suite
from pytest_cudagate.cli import main
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import SIGNING_KEY_ENV, generate_key_pair, load_private_key, sign_suite

# Command substitution both ways, and a quote that ends a naively quoted word.
HOSTILE = ["x$(touch${IFS}PWNED)", "x`touch${IFS}PWNED`", "it's; touch PWNED #"]
PRINTER = 'cudagate() { printf "%s\\0" cudagate "$@"; }; git() { printf "%s\\0" git "$@"; }\n'


def pasted(text: str, cwd: Path) -> dict[str, list[str]]:
    """Each backticked ``cudagate``/``git`` command of ``text``: the arguments bash gives it when pasted."""
    commands = [c for c in re.findall(r"`([^`]+)`", text) if c.startswith(("cudagate ", "git "))]
    assert commands, text
    found = {}
    for command in commands:
        done = subprocess.run(["bash", "-c", PRINTER + command], cwd=cwd, capture_output=True, text=True)
        assert not (cwd / "PWNED").exists(), f"pasting `{command}` ran the pull request's command"
        found[command] = done.stdout.split("\0")[:-1]
    return found


def project(root: Path, name: str, **suite) -> Path:
    """A project with alice's public key trusted and the `scale` suite under kernels/NAME; its yaml path,
    relative to ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text('[tool.cudagate]\nsuites = ["kernels"]\n')
    generate_key_pair("alice", private_path=root.parent / "alice.key",
                      public_path=root / ".cudagate" / "trusted_keys" / "alice.pub")
    write_suite(root / "kernels" / name, **suite)
    return Path("kernels", name, "cudagate.yaml")


@pytest.mark.parametrize("name", HOSTILE)
def test_verify_prints_a_sign_command_that_runs_nothing_of_the_pull_requests(tmp_path, monkeypatch, capsys, name):
    suite = project(tmp_path / "proj", name)
    monkeypatch.chdir(tmp_path / "proj")
    assert main(["verify", str(suite)]) == 1
    commands = pasted(capsys.readouterr().out, tmp_path / "proj")
    assert set(map(tuple, commands.values())) == {("cudagate", "sign", str(suite))}, commands


def test_a_path_that_starts_with_a_dash_is_printed_so_that_it_is_not_read_as_an_option(tmp_path, monkeypatch,
                                                                                        capsys):
    suite = tmp_path / "proj" / project(tmp_path / "proj", "--key=x")
    monkeypatch.chdir(suite.parent.parent)  # the suite's path from here starts with "-"
    assert main(["verify", str(suite)]) == 1
    commands = pasted(capsys.readouterr().out, tmp_path / "proj")
    assert set(map(tuple, commands.values())) == {("cudagate", "sign", "./--key=x/cudagate.yaml")}, commands


@pytest.mark.parametrize("name", HOSTILE)
def test_check_prints_generate_and_sign_commands_that_run_nothing_of_the_pull_requests(tmp_path, monkeypatch,
                                                                                       capsys, name):
    suite = project(tmp_path / "proj", name, data=False)
    monkeypatch.chdir(tmp_path / "proj")
    assert main(["check", str(suite)]) == 2
    commands = pasted(capsys.readouterr().out, tmp_path / "proj")
    assert set(map(tuple, commands.values())) == {("cudagate", "sign", str(suite)),
                                                  ("cudagate", "cases", "generate", str(suite))}, commands


@pytest.mark.parametrize("name", HOSTILE)
def test_approve_and_diff_print_commands_that_run_nothing_of_the_pull_requests(tmp_path, monkeypatch, capsys, name):
    suite = project(tmp_path / "proj", name)
    monkeypatch.chdir(tmp_path / "proj")
    monkeypatch.delenv(SIGNING_KEY_ENV, raising=False)
    assert main(["diff", str(suite), "scale2"]) == 2  # nothing approved yet: how to approve it
    install(monkeypatch, tmp_path, scale_kernels())
    assert main(["approve", str(suite), "--runs", "1"]) == 0
    out = capsys.readouterr()
    commands = pasted(out.out + out.err, tmp_path / "proj")
    assert set(map(tuple, commands.values())) == {("cudagate", "approve", str(suite), "scale2"),
                                                  ("cudagate", "sign", str(suite))}, commands


class Repo:
    """A repository whose base commit a maintainer signed; the pull request's changes are committed on top
    and gated with ``cudagate gate --trusted-ref BASE --pull-request 12``, as CI runs it."""

    def __init__(self, root: Path, name: str):
        self.root = root
        self.suite = project(root, name)
        self.git = git.Repo.init(root)
        self.git.config_writer().set_value("user", "name", "test").set_value("user", "email", "t@example.com").release()

    def sign(self) -> None:
        sign_suite(load_suite(self.root / self.suite), load_private_key(self.root.parent / "alice.key"), "alice")

    def commit(self) -> str:
        self.git.git.add("-A")
        self.git.index.commit("commit")
        return self.git.head.commit.hexsha

    def gate(self, base: str) -> tuple[int, str]:
        self.commit()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDAGATE_"))}
        env.update(CUDA_VISIBLE_DEVICES="", CUDAGATE_CACHE_DIR=str(self.root.parent / "cache"))
        done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                               "gate", "--trusted-ref", base, "--pull-request", "12", "--", "kernels"],
                              cwd=self.root, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout + done.stderr


def test_the_gates_fix_for_a_suite_the_pull_request_adds_runs_nothing_of_its(tmp_path):
    repo = Repo(tmp_path / "repo", HOSTILE[0])
    (repo.root / "kernels").rename(tmp_path / "added")  # the base holds no suite yet
    base = repo.commit()
    (tmp_path / "added").rename(repo.root / "kernels")
    code, out = repo.gate(base)
    assert code != 0, out
    commands = pasted(out, repo.root)
    assert set(map(tuple, commands.values())) == {("cudagate", "sign", str(repo.suite), "--pull-request", "12")}, out


def test_the_gates_git_checkout_of_the_trusted_ledger_runs_nothing_of_the_pull_requests(tmp_path):
    repo = Repo(tmp_path / "repo", HOSTILE[1])
    repo.sign()
    ledger = repo.root / repo.suite.parent / "cudagate.approvals.json"
    older = ledger.read_bytes()
    repo.sign()  # the trusted ledger is at sequence 2
    base = repo.commit()
    ledger.write_bytes(older)  # the pull request rolls it back
    code, out = repo.gate(base)
    assert "sequence 1 is lower than 2 at the trusted ref" in out, out
    commands = pasted(out, repo.root)
    assert ["git", "checkout", base[:12], "--", str(ledger.relative_to(repo.root))] in commands.values(), out
    assert ["cudagate", "sign", str(repo.suite), "--pull-request", "12"] in commands.values(), out
