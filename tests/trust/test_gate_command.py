"""``cudagate gate`` without a trusted ref, the trust root's bounded git reads, the include scan the
optimizer's filter shares with the request builder, and ``cudagate sign``'s key message."""

from __future__ import annotations

import os
from pathlib import Path

import git
import pytest

from pytest_cudagate.cli import main
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.optimize.candidate import include_problems
from pytest_cudagate.trust import generate_key_pair
from pytest_cudagate.trust.base_ref import TrustRoot, read_trust_root

ROOT = Path(__file__).resolve().parents[2]


def _repo(tmp_path: Path) -> git.Repo:
    repo = git.Repo.init(tmp_path / "repo")
    repo.config_writer().set_value("user", "name", "t").set_value("user", "email", "t@example.com").release()
    return repo


def _commit(repo: git.Repo) -> str:
    repo.git.add("-A")
    repo.index.commit("c")
    return repo.head.commit.hexsha


def test_without_a_trusted_ref_the_gate_is_pytest_cuda_gate_with_its_own_configuration(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("PYTEST_ADDOPTS", "--cuda-gate-allow-unsigned")
    code = main(["gate", "--repo", str(ROOT), "--", "-rs", str(ROOT / "examples" / "softmax")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "1 passed, 5 skipped" in out and "trust checks are OFF" not in out
    assert os.environ["PYTEST_ADDOPTS"] == "--cuda-gate-allow-unsigned"  # restored afterwards


def test_the_trust_root_comes_from_git_objects_and_round_trips(tmp_path):
    repo = _repo(tmp_path)
    work = Path(repo.working_tree_dir)
    generate_key_pair("alice", private_path=tmp_path / "alice.key", public_path=work / ".cudagate/trusted_keys/alice.pub")
    (work / "pyproject.toml").write_text('[tool.cudagate]\nsuites = ["s"]\n')
    base = _commit(repo)
    generate_key_pair("mallory", private_path=tmp_path / "m.key", public_path=work / ".cudagate/trusted_keys/mallory.pub")
    (work / "pyproject.toml").write_text('[tool.cudagate]\nsuites = []\n')  # the working tree, not committed
    root = read_trust_root(work, base)
    assert [Path(s[0]).name for s in root.keys.sources.values()] == ["alice.pub at " + base[:12]]
    assert root.policy == {"suites": ["s"]}
    root.save(tmp_path / "root.json")
    again = TrustRoot.load(tmp_path / "root.json")
    assert set(again.keys) == set(root.keys) and again.settings().suites == ("s",)


def test_a_symlinked_key_in_the_trusted_commit_is_not_followed(tmp_path):
    repo = _repo(tmp_path)
    work = Path(repo.working_tree_dir)
    (work / ".cudagate/trusted_keys").mkdir(parents=True)
    (work / ".cudagate/trusted_keys/evil.pub").symlink_to(tmp_path / "alice.pub")
    generate_key_pair("alice", private_path=tmp_path / "alice.key", public_path=tmp_path / "alice.pub")
    base = _commit(repo)
    assert read_trust_root(work, base).keys == {}  # the link is not followed to a key outside the commit


def test_an_unknown_trusted_ref_is_one_clear_error(tmp_path):
    repo = _repo(tmp_path)
    (Path(repo.working_tree_dir) / "x").write_text("x")
    _commit(repo)
    with pytest.raises(CudagateError, match="--trusted-ref '0{40}': not a commit"):
        read_trust_root(Path(repo.working_tree_dir), "0" * 40)


@pytest.mark.parametrize("text", ['#\finclude "/etc/passwd"', '#\vinclude "/etc/passwd"', '#\rinclude "/etc/passwd"',
                                  '??=include "/etc/passwd"', '#inc\\\nlude "/etc/passwd"', '%:include "x.h"',
                                  '#define P "/etc/passwd"\n#include P', "# /* c */ include_next <cuda_fp16.h>"])
def test_the_optimizer_include_filter_sees_what_the_preprocessor_sees(text):
    assert include_problems(text + "\n", set()), text


def test_sign_without_a_key_does_not_claim_to_use_the_variable(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("CUDAGATE_SIGNING_KEY", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert main(["sign", str(ROOT / "examples" / "softmax")]) == 2
    captured = capsys.readouterr()
    assert "$CUDAGATE_SIGNING_KEY" not in captured.out
    assert "no signing key" in captured.err


def test_gate_help_lists_the_options_pytest_help_lists_and_no_skip_options(capsys, tmp_path):
    """`cudagate gate --help` shows the --cuda-gate-* options it forwards, the same set `pytest --help`
    shows (one definition, plugin.add_gate_options); neither names an option that does not exist."""
    import re
    import subprocess
    import sys

    with pytest.raises(SystemExit) as exit_info:
        main(["gate", "--help"])
    assert exit_info.value.code == 0
    gate_help = capsys.readouterr().out
    pytest_help = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"], cwd=tmp_path,
                                 capture_output=True, text=True, check=True).stdout
    named = [set(re.findall(r"^ +(--cuda-gate[\w-]*)", text, re.MULTILINE)) for text in (gate_help, pytest_help)]
    assert named[0] == named[1] - {"--cuda-gate"} and "--cuda-gate-lock-timeout" in named[0], named
    assert "--cuda-gate-skip" not in gate_help + pytest_help and "trust-root" not in gate_help + pytest_help
    assert ("these are refused: --cuda-gate-allow-unsigned, --cuda-gate-fresh-seed, --cuda-gate-class"
            in " ".join(gate_help.split()))
