"""Attacks on the gate by the pull request it gates (issue 12), each run against
``cudagate gate --trusted-ref BASE`` in a temporary git repository: a base commit a maintainer signed
with a trusted key, and a pull-request commit made by someone holding no trusted key.

There is no GPU here (and CUDA_VISIBLE_DEVICES is emptied): every attack must be refused at the
trust or compile stage, on the CPU, naming the file and the reason; the honest pull request (a
kernel change only) gets past trust and compiles, and its replays skip for want of a device.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import git
import pytest
import yaml

from cudagate_harness import compiler
from pytest_cudagate.trust.approvals import Ledger, approval_for
from pytest_cudagate.optimize.proposers.openai import public_url
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.trust import generate_key_pair, load_private_key, sign_suite
from pytest_cudagate.errors import WorkerUnavailable
from pytest_cudagate.worker.client import HarnessClient
from pytest_cudagate.worker.gpulock import GpuLock

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "softmax"
SECRET = "sk-attack-visible-secret-0123456789"
PASSWD_LINE = "root:x:0:0"


class Repo:
    """A repository with a signed base commit; the test edits files and commits them as the PR.

    ``cache``: the compile and generated-data cache the gate runs with (``$CUDAGATE_CACHE_DIR``); by
    default one of its own, empty."""

    _template: tempfile.TemporaryDirectory | None = None  # the signed base, built once per process

    def __init__(self, tmp_path: Path, cache: Path | None = None):
        self.path = tmp_path / "repo"
        self.keys = tmp_path / "keys"
        self.suite_dir = self.path / "softmax"
        self.cache = cache or tmp_path / "cache"
        template = Path(self._base_template(tmp_path))
        # A copy of one base: its keys, signatures and commits are the same in every test; what a test
        # changes is its own.
        shutil.copytree(template / "repo", self.path, symlinks=True)
        shutil.copytree(template / "keys", self.keys)
        self.git = git.Repo(self.path)
        self.first, self.base = (template / "commits").read_text().split()

    @classmethod
    def _base_template(cls, tmp_path: Path) -> str:
        if cls._template is None or not Path(cls._template.name, "commits").is_file():
            # beside the test's folder (pytest's basetemp): a killed process leaves its keys there, not in /tmp
            folder = tempfile.TemporaryDirectory(prefix="attack-base-", dir=tmp_path.parent)
            cls._build(Path(folder.name))
            cls._template = folder
        return cls._template.name

    @classmethod
    def _build(cls, root: Path) -> None:
        self = cls.__new__(cls)
        self.path, self.keys, self.suite_dir = root / "repo", root / "keys", root / "repo" / "softmax"
        self.git = git.Repo.init(self.path)
        self.git.config_writer().set_value("user", "name", "test").set_value("user", "email", "t@example.com").release()
        shutil.copytree(EXAMPLE, self.suite_dir,
                        ignore=shutil.ignore_patterns("cudagate.approvals.json", "approved", "*.sig.json", "__pycache__"))
        shutil.copy(self.suite_dir / "softmax.cu", self.suite_dir / "softmax_alt.cu")
        raw = yaml.safe_load((self.suite_dir / "cudagate.yaml").read_text())
        raw["kernels"].append({"name": "softmax_alt", "source": "softmax_alt.cu", "entry": "softmax_rows", "launch": {"grid": ["rows"],
                                                                                              "block": [256]}})
        self.write_yaml(raw)
        (self.path / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.cudagate]\nsuites = ["softmax"]\n')
        generate_key_pair("alice", private_path=self.keys / "alice.key",
                          public_path=self.path / ".cudagate/trusted_keys/alice.pub")
        generate_key_pair("mallory", private_path=self.keys / "mallory.key", public_path=self.keys / "mallory.pub")
        suite = self.suite()
        ledger = Ledger.for_suite(suite)
        for program in suite.kernels:
            ledger.approvals[program.name] = approval_for(ledger, program, approved_by="alice", approved_at="2026-11-29",
                                                          git={"commit": None, "dirty": None}, tool_version="test")
        ledger.save()
        self.sign("alice")
        first = self.commit("base: signed suite, ledger sequence 1")
        self.sign("alice")  # a second signing: the trusted ledger is at sequence 2
        base = self.commit("base: re-signed, ledger sequence 2")
        (root / "commits").write_text(f"{first} {base}\n")

    def suite(self):
        return load_suite(self.suite_dir / "cudagate.yaml")

    def write_yaml(self, raw: dict) -> None:
        (self.suite_dir / "cudagate.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))

    def edit_yaml(self, edit) -> None:
        raw = yaml.safe_load((self.suite_dir / "cudagate.yaml").read_text())
        edit(raw)
        self.write_yaml(raw)

    def sign(self, who: str, pull_request: int | None = None, suite_dir: Path | None = None) -> None:
        suite = load_suite((suite_dir or self.suite_dir) / "cudagate.yaml")
        sign_suite(suite, load_private_key(self.keys / f"{who}.key"), who, pull_request)

    def commit(self, message: str) -> str:
        self.git.git.add("-A")
        self.git.index.commit(message)
        return self.git.head.commit.hexsha

    def gate(self, *args: str, ref: str | None = None, pull_request: int | None = None) -> tuple[int, str]:
        """``cudagate gate --trusted-ref BASE`` on the checkout; ``pull_request``: the number the workflow passes."""
        self.commit("pull request")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDAGATE_"))}
        env.update(CUDA_VISIBLE_DEVICES="", CUDAGATE_CACHE_DIR=str(self.cache), OPENAI_API_KEY=SECRET)
        done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                               "gate", "--trusted-ref", self.base if ref is None else ref,
                               *(["--pull-request", str(pull_request)] if pull_request is not None else []), "--", *args],
                              cwd=self.path, env=env, capture_output=True, text=True, timeout=300)
        return done.returncode, done.stdout + done.stderr


@pytest.fixture
def repo(tmp_path, shared_cache) -> Repo:
    return Repo(tmp_path, cache=shared_cache)


def refused(repo: Repo, *needles: str, args=(), pull_request: int | None = None) -> str:
    code, out = repo.gate(*args, pull_request=pull_request)
    assert code != 0, out
    for needle in needles:
        assert needle in out, out
    assert SECRET not in out and PASSWD_LINE not in out, out
    return out


# -------------------------------------------------------------------------------- the honest PR


def test_the_honest_pull_request_passes_trust_and_skips_for_want_of_a_gpu(repo):
    source = repo.suite_dir / "softmax.cu"
    source.write_text(source.read_text() + "\n// a faster kernel, one day\n")
    code, out = repo.gate("-rs")
    assert code == 0, out
    assert "no CUDA device" in out and "2 passed" in out, out  # the two compile items
    assert "NOT TRUSTED" not in out and "refuses" not in out


# -------------------------------------------------------------------------------- the trust root


LOOSENINGS = {
    "atol": lambda raw: raw["tolerance"]["y"].update(atol=1),
    "threshold": lambda raw: raw.setdefault("gate", {}).update(threshold=0.9),
    "holdout": lambda raw: raw["cases"][-1].update(holdout=False),
}


@pytest.mark.parametrize("loosen", sorted(LOOSENINGS))
def test_a_key_the_pull_request_adds_to_trusted_keys_is_not_trusted(repo, loosen):
    shutil.copy(repo.keys / "mallory.pub", repo.path / ".cudagate/trusted_keys/mallory.pub")
    repo.edit_yaml(LOOSENINGS[loosen])
    repo.sign("mallory")
    out = refused(repo, "softmax/cudagate.sig.json: signed by key", "(signer mallory), which is not trusted")
    assert "mallory.pub" not in out  # the PR's .pub file is not among the keys the gate trusts


def test_a_key_the_pull_request_lists_in_pyproject_is_not_trusted(repo):
    (repo.path / "keys").mkdir()
    shutil.copy(repo.keys / "mallory.pub", repo.path / "keys" / "mallory.pub")
    (repo.path / "pyproject.toml").write_text('[project]\nname = "demo"\n\n[tool.cudagate]\nsuites = ["softmax"]\n'
                                              'trusted_keys = ["keys"]\n')
    repo.edit_yaml(LOOSENINGS["atol"])
    repo.sign("mallory")
    refused(repo, "softmax/cudagate.sig.json: signed by key", "(signer mallory), which is not trusted")


# -------------------------------------------------------------------------------- the pytest configuration


def test_addopts_in_pyproject_do_not_reach_the_gate(repo):
    (repo.path / "pyproject.toml").write_text(
        '[project]\nname = "demo"\n\n[tool.cudagate]\nsuites = ["softmax"]\n\n[tool.pytest.ini_options]\n'
        'addopts = "--cuda-gate-allow-unsigned --cuda-gate-threshold 0.99"\n')
    repo.edit_yaml(LOOSENINGS["atol"])
    refused(repo, "ignoring [tool.pytest.ini_options] in pyproject.toml", "the gate refuses to judge this suite",
            "tolerance.y.atol: 1e-06 → 1.0")


def test_a_conftest_is_not_loaded(repo):
    marker = repo.path.parent / "conftest-ran"
    (repo.path / "conftest.py").write_text(
        f"open({str(marker)!r}, 'w').close()\n"
        "def pytest_collection_modifyitems(config, items):\n    items.clear()\n")
    repo.edit_yaml(LOOSENINGS["atol"])
    refused(repo, "ignoring conftest.py", "the gate refuses to judge this suite")
    assert not marker.exists()


@pytest.mark.parametrize("args, needle", [
    (["--cuda-gate-allow-unsigned"], "--cuda-gate-allow-unsigned: refused under --trusted-ref"),
    (["--cuda-gate-threshold", "0.99"], "--cuda-gate-threshold 0.99: refused under --trusted-ref: wider than the "
                                        "threshold 0.02 signed in softmax/cudagate.yaml"),
    (["--cuda-gate-skip-release-checks"], "--cuda-gate-skip-release-checks: refused under --trusted-ref: no such "
                                          "option, and none skips a check: the trusted gate runs them all; "
                                          "`cudagate gate --help` lists the options it forwards"),
    (["-p", "evil_plugin"], "-p: refused under --trusted-ref"),
    (["--cuda-gate-trust-root=/tmp/mine.json"], "--cuda-gate-trust-root: refused under --trusted-ref"),
])
def test_weakening_options_are_refused_naming_the_option(repo, args, needle):
    code, out = repo.gate(*args)
    assert code == 2 and needle in out, out


def test_deleting_a_suite_is_refused(repo):
    shutil.rmtree(repo.suite_dir)
    refused(repo, "softmax/cudagate.yaml: deleted by this change")


# -------------------------------------------------------------------------------- the ledger


def _ledger(repo: Repo) -> dict:
    return json.loads((repo.suite_dir / "cudagate.approvals.json").read_text())


def _write_ledger(repo: Repo, raw: dict) -> None:
    (repo.suite_dir / "cudagate.approvals.json").write_text(json.dumps(raw, indent=1))


def test_a_deleted_ledger_is_refused(repo):
    (repo.suite_dir / "cudagate.approvals.json").unlink()
    refused(repo, "softmax/cudagate.approvals.json: deleted; the trusted ref has a signed ledger (sequence 2)")


def test_a_deleted_entry_is_refused_naming_the_kernel(repo):
    raw = _ledger(repo)
    del raw["approvals"]["softmax_alt"]
    _write_ledger(repo, raw)
    refused(repo, "softmax/cudagate.approvals.json: kernel 'softmax_alt' has no entry")


def test_swapped_entries_are_refused_naming_the_kernel(repo):
    raw = _ledger(repo)
    approvals = raw["approvals"]
    approvals["softmax_rows"], approvals["softmax_alt"] = approvals["softmax_alt"], approvals["softmax_rows"]
    _write_ledger(repo, raw)
    refused(repo, "softmax/cudagate.approvals.json: the entry of kernel 'softmax_alt' holds the approval of kernel "
                  "'softmax_rows' (entries swapped)")


def test_a_rolled_back_ledger_is_refused(repo):
    older = repo.git.git.show(f"{repo.first}:softmax/cudagate.approvals.json")
    (repo.suite_dir / "cudagate.approvals.json").write_text(older)
    refused(repo, "softmax/cudagate.approvals.json: sequence 1 is lower than 2 at the trusted ref")


def test_a_maintainer_signed_ledger_in_the_pull_request_is_accepted(repo):
    """A maintainer may sign an oracle or ledger change inside a pull request: the sequence grows."""
    repo.sign("alice")
    code, out = repo.gate()
    assert code == 0, out


def test_a_maintainer_signing_twice_in_the_pull_request_is_accepted(repo):
    """Each signing chains onto the ledger it replaces, so the second still extends the base's."""
    repo.edit_yaml(lambda raw: raw["tolerance"]["y"].update(atol=1e-7))
    repo.sign("alice")
    repo.commit("a tighter tolerance, signed")
    repo.sign("alice")
    code, out = repo.gate()
    assert code == 0, out


SIGNED_STATE = ("cudagate.yaml", "cudagate.sig.json", "cudagate.approvals.json")


def _signed_state(repo: Repo) -> dict[str, bytes]:
    return {name: (repo.suite_dir / name).read_bytes() for name in SIGNED_STATE}


def _put(repo: Repo, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (repo.suite_dir / name).write_bytes(data)


def test_a_signature_from_a_branch_the_base_has_moved_past_is_refused(repo):
    """A maintainer signed a looser tolerance on a branch that was closed unmerged; the base has been
    re-signed since. Copied into a new pull request, the looser oracle and its ledger (a sequence no
    lower than the base's) were signed over the older base ledger, not this one."""
    repo.git.git.checkout("-q", "-b", "closed")
    repo.edit_yaml(LOOSENINGS["atol"])
    repo.sign("alice")
    repo.sign("alice")
    repo.commit("a looser tolerance, signed twice (sequence 4), never merged")
    closed = _signed_state(repo)
    repo.git.git.checkout("-q", "-")
    repo.sign("alice")
    repo.base = repo.commit("base: re-signed (sequence 3)")
    _put(repo, closed)
    source = repo.suite_dir / "softmax.cu"
    source.write_text(source.read_text() + "\n// 1 % wrong, within the looser tolerance\n")
    refused(repo, "softmax/cudagate.approvals.json: sequence 4 was not signed over the ledger at the trusted ref "
                  "(sequence 3): a signature made on another branch",
            f"fix: a maintainer starts from the trusted ref's ledger (`git checkout {repo.base[:12]} -- "
            "softmax/cudagate.approvals.json`)")


def test_a_ledger_recreated_at_the_base_lets_no_older_signed_pair_in(repo):
    """The base deleted its ledger and signed a new one (sequence 1); an older signed oracle-and-ledger
    pair from its history (sequence 3, a looser tolerance) is not lower than that, but was signed over
    a ledger the base has replaced."""
    repo.edit_yaml(LOOSENINGS["atol"])
    repo.sign("alice")
    older = _signed_state(repo)
    repo.commit("base: a looser tolerance, signed (sequence 3)")
    repo.edit_yaml(lambda raw: raw["tolerance"]["y"].update(atol=1e-6))
    (repo.suite_dir / "cudagate.approvals.json").unlink()
    repo.sign("alice")
    repo.base = repo.commit("base: the tolerance restored, the ledger re-created (sequence 1)")
    _put(repo, older)
    refused(repo, "softmax/cudagate.approvals.json: sequence 3 was not signed over the ledger at the trusted ref "
                  "(sequence 1)")


def _closed_pull_request(repo: Repo, pull_request: int | None) -> dict[str, bytes]:
    """The reported route: on the branch of a pull request, a maintainer signed a looser tolerance over
    the base's current ledger (so its chain names the base's); the pull request was closed unmerged.
    The signed files it left, and the base checked out again, unchanged."""
    repo.git.git.checkout("-q", "-b", "closed")
    repo.edit_yaml(LOOSENINGS["atol"])
    repo.sign("alice", pull_request)
    repo.commit("a looser tolerance, signed over the base's ledger, never merged")
    closed = _signed_state(repo)
    repo.git.git.checkout("-q", "-")
    return closed


def _one_percent_wrong(repo: Repo) -> None:
    source = repo.suite_dir / "softmax.cu"
    source.write_text(source.read_text() + "\n// 1 % wrong, within the looser tolerance\n")


@pytest.mark.parametrize("signed_for", [1, None], ids=["signed for pull request 1", "signed for none"])
def test_a_state_signed_in_a_closed_pull_request_does_not_count_in_a_new_one(repo, signed_for):
    """Copied into pull request 2 over the same base, the closed branch's state extends the base's
    ledger (the chain alone takes it), but was not signed for pull request 2."""
    _put(repo, _closed_pull_request(repo, signed_for))
    _one_percent_wrong(repo)
    said = "pull request 1" if signed_for else "no pull request"
    out = refused(repo, f"softmax/cudagate.approvals.json: signed for {said}, not for this pull request (2): a "
                        "changed signed state counts only in the pull request it was signed for; fix: a maintainer "
                        "reviews this pull request and runs `cudagate sign softmax/cudagate.yaml --pull-request 2`",
                  pull_request=2)
    assert "was not signed over the ledger at the trusted ref" not in out  # the chain names the base


def test_a_pull_request_number_edited_into_a_copied_state_breaks_its_signature(repo):
    closed = _closed_pull_request(repo, 1)
    closed["cudagate.approvals.json"] = closed["cudagate.approvals.json"].replace(b'"pull_request": 1', b'"pull_request": 2')
    _put(repo, closed)
    refused(repo, "softmax/cudagate.approvals.json: the signature by key",
            "does not match the signed content: it was altered after signing", pull_request=2)


def test_a_state_signed_for_its_pull_request_counts_there(repo):
    _closed_pull_request(repo, 1)
    repo.git.git.checkout("-q", "closed")  # pull request 1 itself, reopened
    code, out = repo.gate(pull_request=1)
    assert code == 0, out
    assert "must be signed for pull request 1" in out, out


def test_signing_twice_for_one_pull_request_counts_there(repo):
    repo.edit_yaml(lambda raw: raw["tolerance"]["y"].update(atol=1e-7))
    repo.sign("alice", 3)
    repo.commit("a tighter tolerance, signed for pull request 3")
    repo.sign("alice", 3)
    code, out = repo.gate(pull_request=3)
    assert code == 0, out


def test_the_base_state_needs_no_pull_request_and_no_number_keeps_the_chain_rule(repo):
    """A pull request that leaves the signed state as the base's needs no signing; without
    --pull-request (a push, a local run) a state signed for another pull request counts on its chain."""
    _one_percent_wrong(repo)
    code, out = repo.gate(pull_request=4)
    assert code == 0, out
    _put(repo, _closed_pull_request(repo, 1))
    code, out = repo.gate()
    assert code == 0, out


def test_a_suite_new_in_the_pull_request_must_be_signed_for_it(repo):
    """No ledger at the base to equal: the new suite's signed state is a change, so it needs the number."""
    new = repo.path / "softmax2"
    shutil.copytree(repo.suite_dir, new, ignore=shutil.ignore_patterns("cudagate.approvals.json", "approved", "*.sig.json"))
    raw = yaml.safe_load((new / "cudagate.yaml").read_text())
    raw["suite"] = "softmax2"
    (new / "cudagate.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    repo.sign("alice", 5, suite_dir=new)
    refused(repo, "softmax2/cudagate.approvals.json: signed for pull request 5, not for this pull request (6)",
            args=("softmax", "softmax2"), pull_request=6)
    code, out = repo.gate("softmax", "softmax2", pull_request=5)
    assert code == 0, out


def test_every_sign_command_the_gate_prints_under_a_pull_request_names_it(repo):
    """An unsigned suite new in pull request 6: each fix line asks for a signing for 6, since one
    without the number would be refused in turn."""
    new = repo.path / "softmax2"
    shutil.copytree(repo.suite_dir, new, ignore=shutil.ignore_patterns("cudagate.approvals.json", "approved", "*.sig.json"))
    raw = yaml.safe_load((new / "cudagate.yaml").read_text())
    raw["suite"] = "softmax2"
    (new / "cudagate.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    code, out = repo.gate("softmax", "softmax2", pull_request=6)
    assert code != 0, out
    signs = re.findall(r"`(cudagate sign [^`]*)`", out)
    assert signs and set(signs) == {"cudagate sign softmax2/cudagate.yaml --pull-request 6"}, out


# -------------------------------------------------------------------------------- host files


VARIANTS = {
    "etc_passwd": '#include "/etc/passwd"',
    "proc_environ": '#include "/proc/self/environ"',
    "dot_dot": '#include "../../../../../../../../etc/passwd"',
    "form_feed": '#\finclude "/etc/passwd"',
    "vertical_tab": '#\vinclude "/etc/passwd"',
    "carriage_return": '#\rinclude "/etc/passwd"',
    "trigraph": '??=include "/etc/passwd"',
    "line_continuation": '#inc\\\nlude "/etc/passwd"',
    "macro_built": '#define P "/etc/passwd"\n#include P',
    "macro_built_environ": '#define E "/proc/self/environ"\n#include E',
    "angle_absolute": '#include </etc/passwd>',
}


# Each is a whole gate run (seconds): the fast run tries one spelling of each kind (a path, a climb, a
# trigraph, a macro), CI every spelling.
FAST_VARIANTS = {"etc_passwd", "dot_dot", "trigraph", "macro_built"}


@pytest.mark.parametrize("variant", [pytest.param(v, marks=() if v in FAST_VARIANTS else pytest.mark.slow)
                                     for v in sorted(VARIANTS)])
def test_kernel_text_cannot_read_host_files(repo, variant):
    source = repo.suite_dir / "softmax.cu"
    source.write_text(VARIANTS[variant] + "\n" + source.read_text())
    out = refused(repo, "softmax.cu")
    assert "does not compile" in out or "outside the suite folder" in out or "absolute path" in out, out


def test_nvrtc_itself_is_denied_host_files_and_the_log_never_quotes_them(tmp_path, monkeypatch):
    """Below the host-side include resolver: the compiler child cannot open a file outside its tree."""
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    kernel = 'extern "C" __global__ void k(float* y) { y[0] = 1; }\n'
    for include in ('#include "/etc/passwd"', '#define P "/proc/self/environ"\n#include P', '#include "/etc/hostname"'):
        result = compiler.compile_kernel(include + "\n" + kernel, entry="k", arch="sm_90", use_cache=False)
        assert not result.ok and "Permission denied" in result.log, result.log
        assert PASSWD_LINE not in result.log and SECRET not in result.log
    inside = compiler.compile_kernel('#include "two.cuh"\n' + kernel.replace("= 1", "= TWO"), entry="k", arch="sm_90",
                                     headers={"two.cuh": "#define TWO 2.0f\n"}, use_cache=False)
    assert inside.ok, inside.log  # the request's own headers stay readable


def test_a_source_outside_the_suite_folder_is_refused(repo):
    repo.edit_yaml(lambda raw: raw["kernels"][0].update(source="../../x.cu"))
    refused(repo, "'../../x.cu' lies outside the suite folder")


def test_a_source_symlink_leaving_the_suite_folder_is_refused(repo):
    source = repo.suite_dir / "softmax.cu"
    source.unlink()
    source.symlink_to("/etc/passwd")
    refused(repo, "'softmax.cu' lies outside the suite folder")


def test_a_header_symlink_leaving_the_suite_folder_is_refused(repo):
    (repo.suite_dir / "common.cuh").symlink_to("/etc/passwd")
    source = repo.suite_dir / "softmax.cu"
    source.write_text('#include "common.cuh"\n' + source.read_text())
    refused(repo, 'softmax.cu:1: #include "common.cuh" leads to /etc/passwd, outside the suite folder')


@pytest.mark.parametrize("option", ["-include", "--options-file=/etc/passwd", *[
    pytest.param(o, marks=pytest.mark.slow) for o in ("--pre-include=/etc/passwd", "-I/", "--include-path=/etc", "-isystem/etc")]])
def test_include_options_are_refused(repo, option):
    repo.edit_yaml(lambda raw: raw["kernels"][0].update(options=[option]))
    refused(repo, f"option {option!r} is not allowed: include paths and pre-included files are the harness's")


def test_compile_items_run_the_trust_check(repo):
    repo.edit_yaml(LOOSENINGS["atol"])
    refused(repo, "the gate refuses to compile this suite's kernels")


# -------------------------------------------------------------------------------- smaller points


def test_a_poisoned_cache_entry_is_ignored_with_a_note(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "cache"))
    kernel = 'extern "C" __global__ void k(float* y) { y[0] = 1; }\n'
    first = compiler.compile_kernel(kernel, entry="k", arch="sm_90")
    cubin = tmp_path / "cache" / "nvrtc" / f"{first.key}.cubin"
    cubin.write_bytes(b"\x7fELF poisoned")
    again = compiler.compile_kernel(kernel, entry="k", arch="sm_90")
    assert again.ok and not again.cache_hit and again.cubin == first.cubin
    assert f"note: the compile cache entry {first.key[:16]} failed its SHA-256 check" in again.log


def test_the_compile_cache_is_private_to_its_user(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir(mode=0o777)
    os.chmod(tmp_path / "cache", 0o777)
    compiler.compile_kernel('extern "C" __global__ void k() {}\n', entry="k", arch="sm_90")
    for folder in (tmp_path / "cache", tmp_path / "cache" / "nvrtc"):
        assert folder.stat().st_mode & 0o777 == 0o700


def test_a_symlink_at_the_lock_path_is_not_followed(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    locks = tmp_path / "locks"
    locks.mkdir()
    (locks / "GPU-1.lock").symlink_to(victim)
    with pytest.raises(OSError):
        GpuLock("GPU-1", lock_dir=locks, timeout_s=0).acquire()
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("url", ["https://llm.example/v1?api-key=SECRET", "https://llm.example/v1#SECRET",
                                 "https://llm.example/v1?x=1&api-key=SECRET#frag"])
def test_the_base_url_keeps_no_query_or_fragment(url):
    assert public_url(url) == "https://llm.example/v1"


@pytest.mark.parametrize("planted", ["numpy.py", "cudagate_harness/__init__.py", "cudagate_harness/worker.py"])
def test_modules_in_the_checkout_never_run_as_the_worker(tmp_path, monkeypatch, planted):
    """`python -m` puts the working folder first on sys.path: a PR's numpy.py or cudagate_harness/ at the
    root of the checkout the gate runs in must not be what the worker imports (it would run with the
    job's secrets). The worker starts, and says it has no GPU here, without touching them."""
    marker = tmp_path / "ran"
    module = tmp_path / "checkout" / planted
    module.parent.mkdir(parents=True)
    module.write_text(f"open({str(marker)!r}, 'w').write('the pull request ran')\n")
    monkeypatch.chdir(module.parent if "/" not in planted else tmp_path / "checkout")
    client = HarnessClient(timeout_s=60)
    try:
        client.start()
    except WorkerUnavailable:
        pass  # no GPU here: what matters is which code said so
    finally:
        client.close()
    assert not marker.exists()


def test_an_older_signed_oracle_cannot_come_back(repo):
    """The base tightens a tolerance and re-signs; the PR restores the older, looser suite file with its
    own valid signature. The ledger binds the oracle it was signed with, and an older ledger to go with
    the older oracle is a rollback by its sequence."""
    older = {name: (repo.suite_dir / name).read_bytes() for name in ("cudagate.yaml", "cudagate.sig.json")}
    older_ledger = (repo.suite_dir / "cudagate.approvals.json").read_bytes()
    repo.edit_yaml(lambda raw: raw["tolerance"]["y"].update(atol=1e-7))
    repo.sign("alice")
    repo.base = repo.commit("base: a tighter tolerance, re-signed")
    for name, data in older.items():
        (repo.suite_dir / name).write_bytes(data)
    refused(repo, "softmax/cudagate.approvals.json: signed for another version of the suite's signed oracle")
    (repo.suite_dir / "cudagate.approvals.json").write_bytes(older_ledger)
    refused(repo, "softmax/cudagate.approvals.json: sequence 2 is lower than 3 at the trusted ref")


@pytest.mark.parametrize("options, said", [
    (["--cuda-gate-threshold", "0.01", "--cuda-gate-threshold", "0.99"], "--cuda-gate-threshold: given twice"),
    (["--cuda-gate-budget", "0"], "--cuda-gate-budget 0: refused under --trusted-ref: less measurement"),
    (["--cuda-gate-fresh-seed", "1"], "--cuda-gate-fresh-seed: refused under --trusted-ref: a seed known in advance"),
    (["--cuda-gate-class", "small"], "--cuda-gate-class: refused under --trusted-ref: it leaves the performance cases"),
    (["--cuda-gate-class=small"], "--cuda-gate-class: refused under --trusted-ref: it leaves the performance cases"),
])
def test_options_that_weaken_the_gate_are_refused(repo, options, said):
    refused(repo, said, args=[*options, "softmax"])
