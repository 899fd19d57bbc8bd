"""Every command block of README.md and docs/*.md follows the docs' convention, and is run or checked.

- ```console lines run in order, per page, in a scratch copy of the repository (tracked and untracked,
  not ignored files), with the project installed in one fresh venv per session whose bin/ is first on
  PATH, HOME in tmp; each must exit 0, or N where it ends with `# exits N`.
- ```console gpu lines are not run: their programs, cudagate subcommands (`--help` exits 0), pytest
  --cuda-gate options and scripts must exist.
The convention itself is described in tests/doc_blocks.py.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from doc_blocks import (COMMAND_TREE_SCRIPT, check_gpu_command, copy_repository, cuda_gate_options, doc_pages,
                        page_environment, parse_page, run_page, without_test_suite)

ROOT = Path(__file__).resolve().parents[2]
CI_RUN = ROOT / ".ci" / "run"
PAGES = {page.name: page for page in (parse_page(path, ROOT) for path in doc_pages(ROOT))}
INSTALL_TIMEOUT_S = 1200


@dataclass(frozen=True)
class DocsVenv:
    bin: Path
    source: Path  # the scratch copy it was installed from (editable)
    pip_cache: str | None


def _shared_dir(tmp_path_factory) -> Path:
    """One folder for every xdist worker of the session, so the venv is built once."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def _outer_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}


@pytest.fixture(scope="session")
def docs_venv(tmp_path_factory) -> DocsVenv:
    shared = _shared_dir(tmp_path_factory)
    venv, source, ready = shared / "docs-venv", shared / "docs-venv-source", shared / "docs-venv.ready"
    cache = subprocess.run([sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True,
                           env=_outer_env())
    pip_cache = cache.stdout.strip() if cache.returncode == 0 and cache.stdout.strip() else None
    with open(shared / "docs-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ready.exists():
            # No skip: CI must build it. A half-built venv from an earlier failure is replaced.
            subprocess.run(["rm", "-rf", str(venv), str(source)], check=True)
            copy_repository(ROOT, source)
            for step in ([sys.executable, "-m", "venv", str(venv)],
                         [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", f"{source}[test]"]):
                try:
                    made = subprocess.run(step, capture_output=True, text=True, env=_outer_env(),
                                          timeout=INSTALL_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"`{' '.join(step)}` ran past {INSTALL_TIMEOUT_S} s", pytrace=False)
                if made.returncode != 0:
                    pytest.fail(f"`{' '.join(step)}` exited {made.returncode}: the docs' commands need a fresh venv "
                                f"with the project installed\n{(made.stdout + made.stderr)[-3000:]}", pytrace=False)
            ready.touch()
    return DocsVenv(venv / "bin", source, pip_cache)


@pytest.fixture(scope="session")
def pytest_options(docs_venv, tmp_path_factory) -> set[str]:
    home = tmp_path_factory.mktemp("home")
    env = page_environment(home, docs_venv.source, docs_venv.bin)
    shown = subprocess.run([str(docs_venv.bin / "pytest"), "--help"], cwd=docs_venv.source, env=env,
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, f"pytest --help in the docs venv exited {shown.returncode}: {shown.stderr[-2000:]}"
    options = cuda_gate_options(shown.stdout)
    assert "--cuda-gate" in options, "pytest --help in the docs venv lists no --cuda-gate: the plugin did not load"
    return options


@pytest.fixture(scope="session")
def cudagate_commands(docs_venv) -> dict:
    shown = subprocess.run([str(docs_venv.bin / "python"), "-c", COMMAND_TREE_SCRIPT], capture_output=True, text=True,
                           timeout=300, cwd=docs_venv.source)
    assert shown.returncode == 0, f"cudagate's commands could not be listed: {shown.stderr[-2000:]}"
    return json.loads(shown.stdout)


@pytest.mark.parametrize("name", sorted(PAGES))
def test_command_blocks_follow_the_convention(name):
    problems = PAGES[name].problems
    if problems:
        pytest.fail(f"{len(problems)} block(s) of {name} break the convention:\n" + "\n".join(map(str, problems)),
                    pytrace=False)


# Slow (a fresh venv, then every page's commands): the fast run keeps each page's convention check and the
# runner's own tests below; CI runs the pages.
@pytest.mark.docs
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, page in PAGES.items() if page.cpu_commands))
def test_console_commands_run(name, docs_venv, tmp_path):
    copy = tmp_path / "repo"
    copy_repository(ROOT, copy)
    failure = run_page(PAGES[name], copy, tmp_path / "home", docs_venv.bin,
                       runnable=lambda command: without_test_suite(command, CI_RUN), pip_cache=docs_venv.pip_cache)
    if failure is not None:
        pytest.fail(str(failure), pytrace=False)


@pytest.mark.docs
@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(n for n, page in PAGES.items() if page.gpu_commands))
def test_gpu_commands_name_real_programs(name, docs_venv, cudagate_commands, pytest_options, tmp_path):
    env = page_environment(tmp_path / "home", docs_venv.source, docs_venv.bin)  # no checkout's .venv on PATH
    helped: dict = {}
    problems = [problem for command in PAGES[name].gpu_commands
                for problem in check_gpu_command(command, ROOT, docs_venv.bin, env, cudagate_commands, pytest_options,
                                                 helped)]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


# --- the reader and the runner themselves -------------------------------------------------------------

def _page(tmp_path: Path, text: str):
    (tmp_path / "docs").mkdir(exist_ok=True)
    path = tmp_path / "docs" / "page.md"
    path.write_text(text, encoding="utf-8")
    return parse_page(path, tmp_path)


def test_shell_blocks_indented_commands_and_stray_lines_are_refused(tmp_path):
    page = _page(tmp_path, "\n".join([
        "# Page",                       # 1
        "",                             # 2
        "```sh",                        # 3
        "cudagate check x",             # 4
        "```",                          # 5
        "",                             # 6
        "    CUDAGATE_X=1 pytest tests",  # 7
        "",                             # 8
        "    .cudagate/history.sqlite",  # 9: not a command
        "",                             # 10
        "```console",                   # 11
        "some output",                  # 12
        "$ cudagate --version",         # 13
        "$",                            # 14
        "```",                          # 15
        "```text",                      # 16
        "$ cudagate check x",           # 17
        "```",                          # 18
        "~~~console cpu",               # 19
        "$ true",                       # 20
        "~~~",                          # 21
        "```yaml file=../outside.yaml",  # 22
        "a: 1",                         # 23
        "```",                          # 24
    ]) + "\n")
    assert [(p.line, p.message.split(":")[0]) for p in page.problems] == [
        (7, "an indented command block ('CUDAGATE_X=1 pytest tests')"),
        (3, "a ```sh block"),
        (12, "output before any command ('some output')"),
        (14, "'$'"),
        (16, "a ```text block of commands ('$ cudagate check x')"),
        (19, "```console cpu"),
        (22, "file=../outside.yaml"),
    ]
    assert str(page.problems[1]).startswith("docs/page.md:3: a ```sh block: write commands in a ```console block")


def test_console_lines_become_commands_in_page_order(tmp_path):
    page = _page(tmp_path, "\n".join([
        "```yaml file=conf/x.yaml",      # 1
        "a: 1",
        "```",
        "```console",                    # 4
        "$ cudagate check \\",           # 5
        "    examples/softmax",
        "shown output",
        "$ cat > y.txt <<'EOF'",         # 8
        "$ not a command",
        "EOF",
        "$ cudagate history show --out h  # exits 2",  # 11
        "```",
        "```console gpu",
        "$ CUDAGATE_REQUIRE_GPU=1 .venv/bin/pytest tests -m gpu && nvidia-smi",  # 14
        "```",
    ]) + "\n")
    assert page.problems == ()
    file_block, check, heredoc, show, gpu = page.steps
    assert (file_block.line, file_block.path, file_block.content) == (1, "conf/x.yaml", "a: 1\n")
    assert (check.line, check.text, check.expected_exit, check.gpu) == (
        5, "cudagate check \\\n    examples/softmax", 0, False)
    assert (heredoc.line, heredoc.head, heredoc.text) == (
        8, "cat > y.txt <<'EOF'", "cat > y.txt <<'EOF'\n$ not a command\nEOF")
    assert (show.line, show.expected_exit) == (11, 2)
    assert (gpu.line, gpu.gpu) == (14, True)


def test_a_page_runs_in_order_in_a_clean_environment_and_fails_naming_its_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDAGATE_SIGNING_KEY", "from the outer run")
    page = _page(tmp_path, "\n".join([
        "```console",
        "$ test -f conf/x.yaml && grep -q 'a: 1' conf/x.yaml  # exits 1",  # 2: before the file block
        "```",
        "```yaml file=conf/x.yaml",
        "a: 1",
        "```",
        "```console",
        "$ grep -q 'a: 1' conf/x.yaml",                                       # 8
        "$ test -z \"$CUDAGATE_SIGNING_KEY\" && test \"$HOME\" = \"$(cd .. && pwd)/home\"",
        "$ exit 3  # exits 3",
        "$ echo one && echo two | false",                                     # 11
        "$ touch never-run",
        "```",
    ]) + "\n")
    copy = tmp_path / "copy"
    copy.mkdir()
    failure = run_page(page, copy, tmp_path / "home", Path(sys.executable).parent)
    assert failure is not None and failure.command.line == 11 and failure.exit_status == 1
    assert "one" in failure.output and not (copy / "never-run").exists()
    assert str(failure).startswith("docs/page.md:11: `echo one && echo two | false` exited 1, expected 0")


def test_the_test_suite_command_is_checked_against_ci_not_run(tmp_path):
    ci_run = tmp_path / "run"
    ci_run.write_text("#!/usr/bin/env bash\n.venv/bin/pytest tests -n auto\n")
    page = _page(tmp_path, "\n".join([
        "```console",
        "$ python3 -m venv .venv && .venv/bin/pytest tests -n auto",
        "$ .venv/bin/pytest tests -n auto",
        "$ pytest tests/acceptance/test_doc_commands.py -q",
        "$ pytest --cuda-gate examples",
        "```",
    ]) + "\n")
    both, alone, other, gate = page.cpu_commands
    assert without_test_suite(both, ci_run) == "python3 -m venv .venv"
    assert without_test_suite(alone, ci_run) is None
    assert without_test_suite(gate, ci_run) == "pytest --cuda-gate examples"
    with pytest.raises(AssertionError, match=r"docs/page.md:4: `pytest tests/acceptance/test_doc_commands.py -q` runs the "
                                             r"project's tests"):
        without_test_suite(other, ci_run)


def test_gpu_commands_are_checked_without_running_them(tmp_path):
    page = _page(tmp_path, "\n".join([
        "```console gpu",
        "$ nvidia-smi && cudagate history record report --db h.sqlite",
        "$ cudagate bisect v1 main examples/softmax --case perf",
        "$ cudagate histroy show --out h",
        "$ pytest --cuda-gate examples --cuda-gate-require-gpu --cuda-gate-skip-latency",
        "$ no-such-program-anywhere --flag",
        "$ python benchmarks/no_such_script.py",
        "```",
    ]) + "\n")
    venv_bin = Path(sys.executable).parent
    env = page_environment(tmp_path / "home", ROOT, venv_bin)
    commands = {"history": {"record": {}, "show": {}}, "bisect": {}, "check": {}}
    helped: dict = {}
    problems = [p for c in page.gpu_commands
                for p in check_gpu_command(c, ROOT, venv_bin, env, commands, {"--cuda-gate", "--cuda-gate-require-gpu"},
                                           helped)]
    assert problems == [
        "docs/page.md:4: `cudagate histroy`: no such command; `cudagate --help` lists them",
        "docs/page.md:5: pytest has no option --cuda-gate-skip-latency (see `pytest --help` with the plugin loaded)",
        "docs/page.md:6: `no-such-program-anywhere` is not a program of the project's venv, of PATH or of the "
        "repository; fix the command in `no-such-program-anywhere --flag`",
        "docs/page.md:7: `benchmarks/no_such_script.py` is not a file of the repository",
    ]
    assert set(helped) == {("history", "record"), ("bisect",)} and all(v is None for v in helped.values())

