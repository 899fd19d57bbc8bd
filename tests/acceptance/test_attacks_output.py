"""Attacks on the job's log (issue 28, routes 5 and 8), run against ``cudagate gate --trusted-ref BASE``
as action.yml runs it: names and compiler logs from the pull request must not become GitHub workflow
commands, and a very deep tree in the checkout must not crash the gate.

GitHub's runner reads a line as a command when it starts with ``::`` after leading white space, or
holds ``##[`` anywhere (the legacy form); ``::stop-commands::TOKEN`` makes it read none until
``::TOKEN::``. :func:`acted_on` replays a log through those rules.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from report_fixtures import as_report, build_scenario, built_report
from test_attacks import SECRET, Repo
from pytest_cudagate import boundary
from pytest_cudagate.cli import main
from pytest_cudagate.errors import FileError
from pytest_cudagate.reports import github
from pytest_cudagate.host.scrub import Scrubber

# A name or source line that, printed as it is, would raise an annotation, mask a word of the log and
# stop the gate's own annotations (each on a line of its own), and the legacy form within a line.
HOSTILE = "x\n::error::pwned\n::add-mask::the\n::stop-commands::y\nz ##[error]legacy"
# The commands GitHub's runner knows (ActionCommandManager), besides the stop token.
RUNNER_COMMANDS = {"set-env", "set-output", "save-state", "add-mask", "add-path", "add-matcher", "remove-matcher",
                   "debug", "warning", "error", "notice", "group", "endgroup", "echo", "stop-commands"}
TOKEN = r"[0-9a-f]{32}"
GATE_OWN = re.compile(rf"::stop-commands::{TOKEN}|::{TOKEN}::|::(error|warning) [^:]*title=cudagate%3A [^:]*::.*")


def _parse(line: str, known: set[str]) -> tuple[str, str] | None:
    """(command, data) as the runner parses ``line`` (ActionCommand.TryParseV2, then TryParse), or None."""
    trimmed = line.lstrip().lstrip("\ufeff")
    if trimmed.startswith("::") and (end := trimmed.find("::", 2)) >= 0:
        name, data = trimmed[2:end].split(" ", 1)[0], trimmed[end + 2:]
    elif (start := line.find("##[")) >= 0 and (end := line.find("]", start)) >= 0:
        name, data = line[start + 3:end].split(" ", 1)[0], line[end + 1:]
    else:
        return None
    return (name.lower(), data) if name.lower() in known else None


def acted_on(log: str) -> list[tuple[str, str]]:
    """The commands the runner carries out in ``log``, in order; a resume reads ("resume", token)."""
    acted, known, token = [], set(RUNNER_COMMANDS), None
    for line in re.split(r"\r\n|\r|\n", log):
        command = _parse(line, known)
        if command is None:
            continue
        if token is not None:
            if command[0] == token:
                acted.append(("resume", token))
                known.discard(token)
                token = None
            continue
        if command[0] == "stop-commands":
            token = command[1].lower()
            known.add(token)
        acted.append(command)
    return acted


def gate_log(repo: Repo, *args: str, actions: bool = True, pull_request: int | None = None) -> tuple[int, str]:
    """The gate's exit code and its log as the runner sees it: stdout and stderr on one pipe, in order."""
    repo.commit("pull request")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDAGATE_", "GITHUB_"))}
    env.update(CUDA_VISIBLE_DEVICES="", CUDAGATE_CACHE_DIR=str(repo.cache), OPENAI_API_KEY=SECRET)
    if actions:
        env.update(GITHUB_ACTIONS="true", GITHUB_WORKSPACE=str(repo.path),
                   GITHUB_STEP_SUMMARY=str(repo.path.parent / "summary.md"))
    done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                           "gate", "--trusted-ref", repo.base,
                           *(["--pull-request", str(pull_request)] if pull_request else []), "--repo", ".", "--", *args],
                          cwd=repo.path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    return done.returncode, done.stdout


def assert_only_the_gates_commands(log: str) -> list[tuple[str, str]]:
    """Commands stopped from the first line to the last, but for the gate's own annotations; no other
    line starts with ``::``, so a CI system that honours no stop token reads none either."""
    lines = log.splitlines()
    assert re.fullmatch(rf"::stop-commands::{TOKEN}", lines[0]), log
    assert re.fullmatch(rf"::{TOKEN}::", lines[-1]), log
    for line in lines:
        if line.lstrip().lstrip("\ufeff").startswith("::"):
            assert GATE_OWN.fullmatch(line), f"not the gate's own: {line!r}\n{log}"
    acted = acted_on(log)
    assert acted[0][0] == "stop-commands" and acted[-1][0] == "resume", acted
    for name, data in acted:
        assert name in ("stop-commands", "resume", "error", "warning"), acted
        assert "pwned" not in data.split("::")[0] and "legacy" not in data, acted
    tokens = [data for name, data in acted if name in ("stop-commands", "resume")]
    assert len(tokens) == len(set(tokens)) * 2, acted  # each stop has its resume, and no token is used twice
    return acted


@pytest.fixture
def repo(tmp_path, shared_cache) -> Repo:
    return Repo(tmp_path, cache=shared_cache)


def test_a_suite_folder_name_with_newlines_is_refused_as_a_visible_name(repo):
    evil = repo.suite_dir / HOSTILE
    evil.mkdir()
    (evil / "cudagate.yaml").write_text((repo.suite_dir / "cudagate.yaml").read_text())
    code, log = gate_log(repo)
    assert code == 2, log
    assert_only_the_gates_commands(log)
    assert repr(f"softmax/{HOSTILE}/cudagate.yaml") in log, log
    assert "control character" in log, log


def test_an_unexpected_data_file_with_newlines_in_its_name_is_named_visibly(repo):
    (repo.suite_dir / "cases" / HOSTILE).write_bytes(b"planted")
    code, log = gate_log(repo)
    assert code == 1, log
    acted = assert_only_the_gates_commands(log)
    assert any(name == "error" for name, _ in acted), acted  # the gate's own annotations still reach GitHub
    assert repr(f"cases/{HOSTILE}") in log and "no case references it" in log, log


def test_a_compiler_log_echoing_hostile_source_lines_and_a_hostile_source_name_stay_inert(repo):
    name = f"kernel{HOSTILE}.cu"
    (repo.suite_dir / name).write_text((repo.suite_dir / "softmax.cu").read_text() + f"\n{HOSTILE}\n#error {HOSTILE}\n")
    repo.edit_yaml(lambda raw: raw["kernels"][1].update(source=name))
    code, log = gate_log(repo, "--cuda-gate-report", str(repo.path.parent / "report"))
    assert code == 1 and "does not compile" in log, log
    assert [name for name, _ in assert_only_the_gates_commands(log)] == ["stop-commands", "resume"]
    assert "|   ::add-mask::the" in log, log  # the source line NVRTC echoes: quoted, still legible


def test_without_github_actions_no_line_starts_like_a_command(repo):
    name = f"kernel{HOSTILE}.cu"
    (repo.suite_dir / name).write_text((repo.suite_dir / "softmax.cu").read_text() + f"\n{HOSTILE}\n")
    repo.edit_yaml(lambda raw: raw["kernels"][1].update(source=name))
    (repo.suite_dir / "cases" / HOSTILE).write_bytes(b"planted")
    code, log = gate_log(repo, actions=False)
    assert code == 1, log
    assert not [line for line in log.splitlines() if line.lstrip().startswith("::")], log
    assert "stop-commands" not in log.splitlines()[0]


@pytest.fixture
def deep_tree():
    """Build ``top/d/d/.../d`` one level at a time (os.makedirs recurses), and take it down the same way
    (shutil.rmtree recurses too: pytest's clean-up of tmp_path would fail on it)."""
    built: list[Path] = []

    def build(top: Path, levels: int) -> None:
        folder = top
        for _ in range(levels + 1):
            folder.mkdir()
            built.append(folder)
            folder = folder / "d"
        (built[-1] / "conftest.py").write_text("raise SystemExit('collected')\n")

    yield build
    if built:
        (built[-1] / "conftest.py").unlink()
    for folder in reversed(built):
        folder.rmdir()


def _untracked(repo: Repo, name: str) -> None:
    """The tree stays out of git (GitPython writes tree objects recursively); the gate reads the files."""
    with open(repo.path / ".git" / "info" / "exclude", "a") as handle:
        handle.write(f"{name}/\n")


def test_a_1500_deep_tree_outside_the_suites_leaves_a_passing_gate_and_its_report(repo, deep_tree):
    _untracked(repo, "deep")
    deep_tree(repo.path / "deep", 1500)
    report = repo.path.parent / "report"
    code, log = gate_log(repo, "--cuda-gate-report", str(report))
    assert code == 0, log[-3000:]
    assert "RecursionError" not in log and "Traceback" not in log
    assert re.search(r"^cudagate gate: not looking for conftest.py files to ignore: deep(/d){64}: more than 64 folders "
                     r"deep in the checkout; cudagate reads no deeper", log, re.M), log[-3000:]
    assert json.loads((report / "report.json").read_text())["counts"] == {  # nothing measured without a GPU
        "failed": 0, "errors": 0, "warning": 0, "passed": 2, "skipped": 10, "regressed": 0, "total": 12}  # 2 compiled
    assert_only_the_gates_commands(log)


def test_a_1500_deep_tree_inside_a_suite_is_refused_in_one_clear_line(repo, deep_tree):
    _untracked(repo, "deep")
    deep_tree(repo.suite_dir / "deep", 1500)
    code, log = gate_log(repo, "--cuda-gate-report", str(repo.path.parent / "report"), actions=False)
    assert code == 2, log[-3000:]
    assert "RecursionError" not in log and "Traceback" not in log
    assert re.search(r"^cudagate: softmax/deep(/d){64}: more than 64 folders deep in the gated folder; cudagate "
                     r"reads no deeper: flatten the tree, or remove it$", log, re.M), log[-3000:]


def test_the_walk_enters_no_link_and_refuses_past_its_entry_bound(tmp_path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f.txt").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path)  # a link to a folder: listed, never entered
    assert boundary.walk(tmp_path, "test folder") == [tmp_path / "a" / "b" / "f.txt", tmp_path / "loop"]
    with pytest.raises(FileError, match="the test folder holds more than 3 files and folders; cudagate reads no more"):
        boundary.walk(tmp_path, "test folder", max_entries=3)


def test_the_job_summary_shows_markup_from_names_and_messages_as_text(tmp_path):
    document = Scrubber({}).data(built_report(build_scenario(tmp_path / "scale")).document)
    document["items"][0]["headline"] = "<img src=x onerror=alert(1)> [click](https://evil.example) `code` | cell"
    row = next(line for line in github.summary_markdown(as_report(document)).splitlines() if "click" in line)
    # the zero-width space after "https:" keeps GitHub from linking the bare URL
    assert r"\<img src=x onerror=alert(1)\> \[click\](https:" + "\u200b" + r"//evil.example) \`code\` \| cell" in row, row
    assert row.count(" | ") == 8, row  # no new column either


def test_a_huge_pyproject_in_the_checkout_is_not_read(repo):
    """The trusted settings come from the ref; the checkout's pyproject.toml only words a note, and a
    link to a large file (or a device) must not be read whole."""
    big = repo.path.parent / "big.toml"
    with open(big, "wb") as handle:
        handle.truncate(64 << 20)
    (repo.path / "pyproject.toml").unlink()
    (repo.path / "pyproject.toml").symlink_to(big)
    code, out = repo.gate()
    assert "not reading pyproject.toml: the project settings file is" in out and "Traceback" not in out, out


def test_the_reproduce_command_of_a_trusted_gate_runs_the_gate_not_the_checkouts_conftest(repo):
    """Issue 41, item 5: under --trusted-ref the report, its merge and the annotations say `cudagate gate
    --trusted-ref BASE -- ...`; `pytest --cuda-gate` in the pull request's checkout would run its
    conftest.py on the maintainer's machine, beside their signing key."""
    (repo.path / "conftest.py").write_text("import pathlib\npathlib.Path(__file__).with_name('conftest-ran').touch()\n")
    report = repo.path.parent / "report"
    code, log = gate_log(repo, "--cuda-gate-report", str(report), actions=False)
    assert code == 0, log
    document = json.loads((report / "report.json").read_text())
    assert document["runs"][0]["options"]["trusted_ref"] == repo.base
    for item in document["items"]:
        assert item["reproduce"][0] == f"cudagate gate --trusted-ref {repo.base} -- '{item['nodeid']}'", item
    merged = repo.path.parent / "merged"
    assert main(["report", "merge", str(merged), str(report)]) == 0
    assert [i["reproduce"][0] for i in json.loads((merged / "report.json").read_text())["items"]] == \
        [i["reproduce"][0] for i in document["items"]]
    item = document["items"][0]
    item.update(status="failed", category="correctness", message="wrong")  # as a GPU run could end
    assert f"reproduce: cudagate gate --trusted-ref {repo.base} -- " in github.workflow_annotations(as_report(document))[0]
    # the command, run as printed in the checkout, gates that case without the checkout's conftest.py
    args = shlex.split(item["reproduce"][0])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CUDAGATE_", "GITHUB_"))}
    env.update(CUDA_VISIBLE_DEVICES="", CUDAGATE_CACHE_DIR=str(repo.cache))
    done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                           *args[1:]], cwd=repo.path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "1 skipped" in done.stdout, done.stdout + done.stderr
    assert not (repo.path / "conftest-ran").exists()


def test_the_reproduce_command_names_the_pull_request_the_gate_was_told(repo):
    """Reproduced without --pull-request, a state signed for another pull request would pass where CI
    failed it."""
    report = repo.path.parent / "report"
    code, log = gate_log(repo, "--cuda-gate-report", str(report), actions=False, pull_request=7)
    assert code == 0, log
    document = json.loads((report / "report.json").read_text())
    assert document["runs"][0]["options"]["pull_request"] == 7
    for item in document["items"]:
        assert item["reproduce"][0] == f"cudagate gate --trusted-ref {repo.base} --pull-request 7 -- '{item['nodeid']}'"
