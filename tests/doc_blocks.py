"""The command blocks of README.md and docs/*.md, read by the docs' convention, and a runner for them.

Convention (tests/acceptance/test_doc_commands.py enforces it):

- ```console blocks hold shell commands, each on a line starting with `$ `; a line ending in `\\`
  continues on the next, and a here-document (`<<'EOF'`) runs to its terminator. Other lines are
  shown output. Each command must exit 0, or N when it ends with the comment `# exits N`.
- ```console gpu blocks need a GPU (or a real CI runner): they are not run, only their programs and
  subcommands are checked.
- A block whose info string has `file=PATH` (```yaml file=suite/cudagate.yaml) is written to PATH,
  relative to the repository root, before the page's later commands run.
- No ```sh/```bash/```shell/```zsh blocks, and no 4-space-indented command blocks.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

SHELL_LANGUAGES = {"sh", "bash", "shell", "zsh", "shell-session", "shellsession"}
# First words that make an indented block a command block (after `$ ` and VAR=value prefixes).
COMMAND_WORD = re.compile(r"((cudagate|pytest|python3?|pip3?|git|gh|nvidia-smi|compute-sanitizer)(\s|$)|\.venv/)")
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
EXITS = re.compile(r"\s#\s*exits\s+(\d+)\s*$")
HEREDOC = re.compile(r"(?<!<)<<(-?)\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\2")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
FIX_SHELL = ("write commands in a ```console block, one per line as `$ command` (```console gpu where it needs a GPU "
             "or a CI runner); a file's contents as ```yaml/```python/```cuda, with file=PATH when a later command "
             "needs it")


@dataclass(frozen=True)
class Command:
    """One `$ ` command of a console block, as bash gets it (continuations and here-documents kept)."""
    page: str
    line: int
    text: str
    head: str  # the command line itself: continuations joined, without here-document bodies
    expected_exit: int
    gpu: bool


@dataclass(frozen=True)
class FileBlock:
    """A fenced block with `file=PATH`: written to PATH in the page's scratch copy."""
    page: str
    line: int
    path: str
    content: str


@dataclass(frozen=True)
class Problem:
    page: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.message}"


@dataclass(frozen=True)
class Page:
    name: str
    steps: tuple[Command | FileBlock, ...]  # in page order
    problems: tuple[Problem, ...]

    @property
    def cpu_commands(self) -> list[Command]:
        return [s for s in self.steps if isinstance(s, Command) and not s.gpu]

    @property
    def gpu_commands(self) -> list[Command]:
        return [s for s in self.steps if isinstance(s, Command) and s.gpu]


@dataclass(frozen=True)
class _Fence:
    line: int  # 1-based line of the opening fence
    info: str
    body: list[str]


def doc_pages(root: Path) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def parse_page(path: Path, root: Path) -> Page:
    name = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    steps: list[Command | FileBlock] = []
    problems: list[Problem] = []
    fences = _fences(lines, name, problems)
    for fence in fences:
        _read_fence(fence, name, steps, problems)
    return Page(name, tuple(steps), tuple(problems))


def _fences(lines: list[str], page: str, problems: list[Problem]) -> list[_Fence]:
    """Fenced blocks (``` and ~~~, CommonMark's closing rule); flags indented command blocks outside them."""
    fences: list[_Fence] = []
    i, previous_blank = 0, True
    while i < len(lines):
        match = FENCE.match(lines[i])
        if match and not (match.group(2)[0] == "`" and "`" in match.group(3)):
            indent, marker, info = len(match.group(1)), match.group(2), match.group(3).strip()
            closing = re.compile(rf"^\s*{re.escape(marker[0])}{{{len(marker)},}}\s*$")
            start, body = i + 1, []
            i += 1
            while i < len(lines) and not closing.match(lines[i]):
                body.append(_dedent(lines[i], indent))
                i += 1
            if i >= len(lines):
                problems.append(Problem(page, start, f"the block opened here is never closed: end it with {marker}"))
            fences.append(_Fence(start, info, body))
            i += 1
            previous_blank = False
            continue
        line = lines[i]
        if previous_blank and line.startswith(("    ", "\t")) and _looks_like_command(line):
            problems.append(Problem(page, i + 1, f"an indented command block ({line.strip()[:60]!r}): {FIX_SHELL}"))
        previous_blank = not line.strip()
        i += 1
    return fences


def _dedent(line: str, indent: int) -> str:
    stripped = len(line) - len(line.lstrip(" "))
    return line[min(indent, stripped):]


def _looks_like_command(line: str) -> bool:
    text = line.strip()
    if text.startswith("$ "):
        return True
    words = text.split()
    while words and ENV_ASSIGNMENT.match(words[0]):
        words.pop(0)
    return bool(words) and bool(COMMAND_WORD.match(" ".join(words)))


def _read_fence(fence: _Fence, page: str, steps: list, problems: list[Problem]) -> None:
    words = fence.info.split()
    language = words[0].lower() if words else ""
    attributes = words[1:]
    target = [w[len("file="):] for w in attributes if w.startswith("file=")]
    if language in SHELL_LANGUAGES:
        problems.append(Problem(page, fence.line, f"a ```{language} block: {FIX_SHELL}"))
        return
    if language == "console":
        unknown = [w for w in attributes if w != "gpu"]
        if unknown:
            problems.append(Problem(page, fence.line, f"```{fence.info}: unknown word(s) {' '.join(unknown)}; write "
                                                      "```console (run on CPU) or ```console gpu (needs a GPU)"))
        steps.extend(_console(fence, page, "gpu" in attributes, problems))
        return
    if target:
        path = target[0]
        pure = PurePosixPath(path)
        if not path or pure.is_absolute() or ".." in pure.parts:
            problems.append(Problem(page, fence.line, f"file={path}: name a path relative to the repository root, "
                                                      "inside it (no leading / and no ..)"))
            return
        steps.append(FileBlock(page, fence.line, path, "\n".join(fence.body) + "\n"))
        return
    first = next((line.strip() for line in fence.body if line.strip()), "")
    if language in {"", "text", "txt"} and first.startswith("$ "):
        problems.append(Problem(page, fence.line, f"a ```{language or ''} block of commands ({first[:60]!r}): "
                                                  f"{FIX_SHELL}"))


def _console(fence: _Fence, page: str, gpu: bool, problems: list[Problem]) -> list[Command]:
    commands: list[Command] = []
    body, i = fence.body, 0
    if not any(line.strip() for line in body):
        problems.append(Problem(page, fence.line, "an empty console block: put commands in it as `$ command`, "
                                                  "or remove it"))
    while i < len(body):
        line, number = body[i], fence.line + 1 + i
        if line.startswith("$ ") and line[2:].strip():
            logical = [line[2:]]
            while logical[-1].rstrip().endswith("\\"):
                if logical[-1] != logical[-1].rstrip():
                    problems.append(Problem(page, fence.line + 1 + i, "whitespace after the `\\`: end the line with "
                                                                      "`\\` so the command continues"))
                i += 1
                if i >= len(body):
                    problems.append(Problem(page, number, "the command's last line ends with `\\` but nothing "
                                                          "follows in the block"))
                    break
                logical.append(body[i])
            logical = [part.rstrip() for part in logical]
            exits = EXITS.search(logical[-1])
            parts = list(logical)
            for heredoc in HEREDOC.finditer("\n".join(logical)):
                terminator, strip_tabs = heredoc.group(3), heredoc.group(1) == "-"
                while True:
                    i += 1
                    if i >= len(body):
                        problems.append(Problem(page, number, f"the here-document never ends: close it with a line "
                                                              f"{terminator}"))
                        break
                    parts.append(body[i])
                    if (body[i].lstrip("\t") if strip_tabs else body[i]) == terminator:
                        break
            commands.append(Command(page, number, "\n".join(parts), "\n".join(logical),
                                    int(exits.group(1)) if exits else 0, gpu))
        elif line.strip() == "$" or (line.startswith("$") and not line.startswith("$ ")):
            problems.append(Problem(page, number, f"{line.strip()[:60]!r}: a command line is `$ ` then the command"))
        elif not commands and line.strip():
            problems.append(Problem(page, number, f"output before any command ({line.strip()[:60]!r}): a "
                                                  "console block starts with `$ command`; show output alone in a "
                                                  "```text block"))
        i += 1
    return commands


def simple_commands(head: str) -> list[list[str]]:
    """The simple commands of a command line (split at && || | ; &), each without its VAR=value prefixes."""
    lexer = shlex.shlex(head.replace("\\\n", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in {"&&", "||", "|", ";", "&", "(", ")"}:
            commands.append([])
        else:
            commands[-1].append(token)
    result = []
    for words in commands:
        while words and ENV_ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


# --- running a page -----------------------------------------------------------------------------------

LINE_TIMEOUT_S = 600  # generous: the 2-core CI machine is slow, and a page may install the project
DROPPED_ENV = ("CUDAGATE_", "PYTEST_", "GITHUB_", "RUNNER_", "XDG_", "COV_CORE_")
DROPPED_VARS = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTEST_ADDOPTS"}


@dataclass(frozen=True)
class Failure:
    command: Command
    exit_status: int | None  # None: it ran past the timeout
    output: str

    def __str__(self) -> str:
        tail = "\n".join(self.output.rstrip().splitlines()[-30:])
        what = (f"exited {self.exit_status}, expected {self.command.expected_exit}" if self.exit_status is not None
                else f"did not finish within {LINE_TIMEOUT_S} s")
        return (f"{self.command.page}:{self.command.line}: `{self.command.text}` {what}\n"
                f"--- last lines of its output ---\n{tail}")


def copy_repository(root: Path, dest: Path) -> None:
    """The files a fresh clone with the author's uncommitted work would have: tracked and untracked,
    not ignored."""
    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                                capture_output=True, check=True).stdout.decode()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise AssertionError(f"cannot list the files of {root} with git ({exc}): the docs' commands run in a copy "
                             "of a git checkout; run the tests in one, with git installed") from None
    for name in filter(None, listed.split("\0")):
        source = root / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target, follow_symlinks=False)


def page_environment(home: Path, copy: Path, venv_bin: Path) -> dict[str, str]:
    """A clean environment: HOME in tmp, no cudagate/pytest/CI variables of the outer run, the docs venv's
    bin first on PATH (and the copy's own .venv/bin once a page has made one)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV) and k not in DROPPED_VARS}
    outer = [p for p in os.environ.get("PATH", "").split(os.pathsep)
             if p and not (Path(p).parent / "pyvenv.cfg").exists()]  # no other venv's programs
    first = [str(copy / ".venv" / "bin")] if (copy / ".venv" / "bin").is_dir() else []
    env["PATH"] = os.pathsep.join([*first, str(venv_bin), *outer])
    env["HOME"] = str(home)
    return env


def run_page(page: Page, copy: Path, home: Path, venv_bin: Path, *,
             runnable: Callable[[Command], str | None] | None = None, pip_cache: str | None = None) -> Failure | None:
    """Write the page's file blocks and run its CPU commands in order in ``copy``; the first failure.

    ``runnable(command)`` gives the text to run instead (e.g. with one part left out), or None to run
    nothing; without it every command runs as written."""
    home.mkdir(parents=True, exist_ok=True)
    for step in page.steps:
        if isinstance(step, FileBlock):
            target = copy / step.path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(step.content, encoding="utf-8")
            continue
        if step.gpu:
            continue
        text = runnable(step) if runnable else step.text
        if text is None:
            continue
        env = page_environment(home, copy, venv_bin)
        if pip_cache:
            env.setdefault("PIP_CACHE_DIR", pip_cache)  # HOME is new: keep pip's usual cache
        status, output = _bash(text, copy, env)
        if status != step.expected_exit:
            return Failure(step, status, output)
    return None


def _bash(text: str, cwd: Path, env: dict[str, str]) -> tuple[int | None, str]:
    process = subprocess.Popen(["bash", "-o", "pipefail", "-c", text], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        output, _ = process.communicate(timeout=LINE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the whole group: a hung pytest's workers too
        output, _ = process.communicate()
        return None, output.decode(errors="replace")
    return process.returncode, output.decode(errors="replace")


# --- the test-suite command, and the commands of GPU blocks ------------------------------------------

SHELL_BUILTINS = {"cd", "export", "source", ".", "set", "unset", "echo", "test", "[", "true", "false", "exit", "printf"}
# Programs of a GPU machine or a CI runner that a CPU machine need not have: their names are taken on trust.
RUNNER_ONLY = {"nvidia-smi", "compute-sanitizer", "ncu", "nsys", "gh"}


def _pytest_arguments(words: list[str]) -> list[str] | None:
    name = Path(words[0]).name
    if name in {"pytest", "py.test"}:
        return words[1:]
    if name.startswith("python") and words[1:3] == ["-m", "pytest"]:
        return words[3:]
    return None


def runs_project_tests(part: str) -> bool:
    """A pytest over tests/: running it inside this test would run this test again."""
    for words in simple_commands(part):
        arguments = _pytest_arguments(words)
        if arguments and any(a == "tests" or a.startswith("tests/") for a in arguments):
            return True
    return False


def without_test_suite(command: Command, ci_run: Path) -> str | None:
    """The command with its test-suite part left out, once that part is shown to be what ``ci_run`` runs
    (CI runs it; this test cannot run the suite inside itself). None when nothing is left to run."""
    parts = re.split(r"\s+&&\s+", command.head)
    suite = [part for part in parts if runs_project_tests(part)]
    if not suite:
        return command.text
    ci_lines = {line.strip() for line in ci_run.read_text(encoding="utf-8").splitlines()}
    for part in suite:
        shown = EXITS.sub("", part).strip()
        if shown not in ci_lines:
            raise AssertionError(
                f"{command.page}:{command.line}: `{shown}` runs the project's tests, which this test cannot run inside "
                f"itself; make it the command {ci_run.name} runs (a line of {ci_run}), or put it in a ```console gpu "
                "block")
    kept = [part for part in parts if part not in suite]
    return " && ".join(kept) if kept else None


# Run by the docs venv's python: cudagate's subcommands as nested JSON objects ({"history": {"record": {}}}).
# argparse keeps them in a private list; it is the only way to walk the tree.
COMMAND_TREE_SCRIPT = """
import argparse, json
from pytest_cudagate.cli import build_parser
def tree(parser):
    groups = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return {name: tree(sub) for name, sub in groups[0].choices.items()} if groups else {}
print(json.dumps(tree(build_parser())))
"""


def subcommand_path(arguments: list[str], tree: dict) -> tuple[list[str], str | None]:
    """The cudagate subcommands that ``arguments`` name (``history record``), or the word that is none."""
    path: list[str] = []
    words = [a for a in arguments if not a.startswith("-")]
    while tree and len(path) < len(words):
        word = words[len(path)]
        if word not in tree:
            return path, word
        tree = tree[word]
        path.append(word)
    return path, None


def check_gpu_command(command: Command, root: Path, venv_bin: Path, env: dict[str, str], commands: dict,
                      pytest_options: set[str], helped: dict[tuple[str, ...], str | None]) -> list[str]:
    """What is wrong with a GPU block's command without running it: a program that is not there, a
    cudagate subcommand whose --help fails, a --cuda-gate option pytest does not know, a script not in the
    repository. ``commands`` is cudagate's subcommand tree; ``helped`` caches the --help runs."""
    problems, where = [], f"{command.page}:{command.line}"
    try:
        parts = simple_commands(command.head)
    except ValueError as exc:  # an unclosed quote
        return [f"{where}: `{command.head}` is not a shell command line ({exc}); close its quotes"]
    for words in parts:
        program, name = words[0], Path(words[0]).name
        if program.startswith(".venv/bin/"):
            found = (venv_bin / name).exists()  # the project's venv: the docs venv stands in for it
        elif "/" in program:
            found = (root / program).exists()
        else:
            found = (program in SHELL_BUILTINS or name in RUNNER_ONLY
                     or shutil.which(program, path=env["PATH"]) is not None)
        if not found:
            problems.append(f"{where}: `{program}` is not a program of the project's venv, of PATH or of the "
                            f"repository; fix the command in `{command.head}`")
            continue
        if name == "cudagate":
            path, wrong = subcommand_path(words[1:], commands)
            if wrong is not None:
                problems.append(f"{where}: `cudagate {' '.join([*path, wrong])}`: no such command; "
                                f"`{' '.join(['cudagate', *path, '--help'])}` lists them")
                continue
            key = tuple(path)
            if key not in helped:
                run = subprocess.run([str(venv_bin / "cudagate"), *path, "--help"], env=env, cwd=root,
                                     capture_output=True, text=True, timeout=120)
                said = (run.stderr or run.stdout)[-400:]
                helped[key] = None if run.returncode == 0 else f"exit {run.returncode}: {said}"
            if helped[key] is not None:
                problems.append(f"{where}: `{' '.join(['cudagate', *path, '--help'])}` failed ({helped[key]})")
        arguments = _pytest_arguments(words)
        if arguments is not None:
            unknown = sorted({a.split("=")[0] for a in arguments if a.startswith("--cuda-gate")} - pytest_options)
            if unknown:
                problems.append(f"{where}: pytest has no option {', '.join(unknown)} (see `pytest --help` with the "
                                "plugin loaded)")
        elif name.startswith("python") and len(words) > 1 and words[1].endswith(".py"):
            if not (root / words[1]).is_file():
                problems.append(f"{where}: `{words[1]}` is not a file of the repository")
    return problems


def cuda_gate_options(help_text: str) -> set[str]:
    return set(re.findall(r"--cuda-gate[\w-]*", help_text))
