"""No step of the action, the comment action or the example workflow's pull-request jobs runs anything
the pull request's checkout provides (issue 41).

Each bash step is run as GitHub's runner runs it: its script, with the ``${{ … }}`` expressions it uses
substituted, written to a file and run by ``bash --noprofile --norc -eo pipefail FILE`` in the step's
working directory, with the job's environment under the step's own ``env`` and the runner's files
(GITHUB_OUTPUT, GITHUB_ENV, GITHUB_PATH, GITHUB_STEP_SUMMARY). The checkout is a pull request of the
repository tests/acceptance/test_attacks.py builds, which also commits files that each leave a mark when run:
modules Python would import from the current folder (``json.py``, ``sitecustomize.py``, a shadow
``pytest_cudagate`` and ``pip``), a ``.pth`` file, a ``pip.conf``, a script to source, and programs
(``python3``, ``git``, ``cudagate``, ``gh``, …). Two runners: one as issue 41 found it (the checkout at
the workspace root, where ``python -`` imported its ``json.py``), and a careless one, with the checkout
in ``pr/``, relative PATH entries (``.``, ``bin``, ``.venv/bin``) that find the planted programs
wherever a step runs, the current folder and the checkout on PYTHONPATH, and BASH_ENV naming the
checkout's script (as an earlier step could set them through GITHUB_ENV).

The steps install into a throwaway environment (which sees this test's packages) from a stand-in
project, offline; the gate runs for real on the CPU (no GPU: it fails, and says so in its report).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import yaml

from report_fixtures import build_scenario, built_report
from pytest_cudagate.reports.writer import write_report
from test_attacks import Repo

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
COMMENT_ACTION = ROOT / ".github" / "actions" / "pr-comment" / "action.yml"
WORKFLOW = ROOT / "examples" / "workflows" / "gpu-gate.yml"
BASH = shutil.which("bash")
EXPRESSION = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")

PLANTED_MODULES = ["json.py", "sitecustomize.py", "usercustomize.py", "numpy.py", "yaml.py", "git.py",
                   "pip/__init__.py", "pip/__main__.py", "pytest_cudagate/__init__.py", "pytest_cudagate/cli.py",
                   "conftest.py"]
PLANTED_PROGRAMS = ["python", "python3", "pip", "pip3", "cudagate", "git", "gh", "jq", "rm", "mktemp", "head", "env",
                    "compute-sanitizer", "nvidia-smi"]
RELATIVE_PATH = [".", "bin", ".venv/bin"]  # where the programs are planted, each on PATH as written


def plant(checkout: Path, marks: Path) -> None:
    """Files of the pull request that each write ``marks/<what ran>`` if anything runs them."""
    def mark(name: str) -> str:
        return f"open({str(marks / name.replace('/', '_'))!r}, 'w').close()\n"

    for name in PLANTED_MODULES:
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        (checkout / name).write_text(mark(name))
    (checkout / "zz-planted.pth").write_text("import os; " + mark("zz-planted.pth"))
    (checkout / "pip.conf").write_text(f"[global]\nlog = {marks / 'pip.conf'}\n")  # pip would log there
    (checkout / "ci-env.sh").write_text(f": > {marks / 'BASH_ENV'}\n")
    for folder in RELATIVE_PATH:
        for name in PLANTED_PROGRAMS:
            program = checkout / folder / name
            if program.is_dir():
                continue  # the shadow package pip/ at the root
            program.parent.mkdir(parents=True, exist_ok=True)
            program.write_text(f"#!/bin/sh\n: > {marks / (folder.strip('.').replace('/', '_') + '_' + name)}\nexit 97\n")
            program.chmod(0o755)


STANDIN_BACKEND = '''\
"""A build backend with no requirements, so that pip installs this project offline."""
import os
import zipfile

DIST = "cudagate_standin-1.0.dist-info"


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    name = "cudagate_standin-1.0-py3-none-any.whl"
    files = {"cudagate_standin.py": "",
             f"{DIST}/METADATA": "Metadata-Version: 2.1\\nName: cudagate-standin\\nVersion: 1.0\\n",
             f"{DIST}/WHEEL": "Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)
        wheel.writestr(f"{DIST}/RECORD", "".join(f"{path},,\\n" for path in [*files, f"{DIST}/RECORD"]))
    return name
'''


def standin_project(folder: Path) -> Path:
    """What the install steps install here in place of cudagate (which pip would build from the index)."""
    folder.mkdir(parents=True)
    (folder / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                           'backend-path = ["."]\n\n[project]\nname = "cudagate-standin"\n'
                                           'version = "1.0"\n')
    (folder / "backend.py").write_text(STANDIN_BACKEND)
    return folder


def throwaway_python(folder: Path) -> Path:
    """A virtual environment to install into that also sees this test's packages (cudagate, pip)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "outer.pth").write_text(f"import site; site.addsitedir({sysconfig.get_path('purelib')!r})\n")
    return python


class Runner:
    """One job on a runner: its workspace, RUNNER_TEMP and environment, and the expression contexts."""

    def __init__(self, tmp_path: Path, checkout_in: str, careless: bool):
        self.tmp = tmp_path
        self.workspace = tmp_path / "work" / "repo"
        self.temp = tmp_path / "runner-temp"
        self.files = tmp_path / "runner-files"
        self.marks = tmp_path / "marks"
        for folder in (self.workspace.parent, self.temp, self.files, self.marks, tmp_path / "home"):
            folder.mkdir(parents=True)
        self.repo = Repo(tmp_path / "src")
        source = self.repo.suite_dir / "softmax.cu"
        source.write_text(source.read_text() + "\n// the pull request's change\n")
        plant(self.repo.path, self.marks)
        self.head = self.repo.commit("pull request: a kernel change, and files that must never run")
        # actions/checkout with fetch-depth 0: the base commit's objects come along
        self.checkout = self.workspace / checkout_in if checkout_in else self.workspace
        subprocess.run(["git", "clone", "-q", str(self.repo.path), str(self.checkout)], check=True, timeout=120)
        self.workspace.mkdir(exist_ok=True)
        fake_bin = tmp_path / "fake-bin"
        fake_bin.mkdir()
        (fake_bin / "gh").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp_path / "gh-calls"}\n'
                                     'case "$*" in *--method*) echo "{}" ;; *) echo "[]" ;; esac\n')
        (fake_bin / "gh").chmod(0o755)
        outer = [p for p in os.environ["PATH"].split(os.pathsep) if p]
        self.env = {
            "PATH": os.pathsep.join([*(RELATIVE_PATH if careless else []), str(fake_bin), *outer]),
            **({"PYTHONPATH": os.pathsep.join([".", str(self.checkout)]), "BASH_ENV": str(self.checkout / "ci-env.sh")}
               if careless else {}),
            "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8",
            "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(self.workspace),
            "RUNNER_TEMP": str(self.temp), "GITHUB_REPOSITORY": "octo/kernels", "GITHUB_EVENT_NAME": "pull_request",
            "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1",
            "CUDA_VISIBLE_DEVICES": "", "CUDAGATE_CACHE_DIR": str(tmp_path / "cache"),
            "CUDAGATE_LOCK_DIR": str(tmp_path / "locks"),
        }
        self.python = throwaway_python(tmp_path / "setup-python")  # what the install steps install into
        self.context = {
            "runner.temp": str(self.temp), "github.event_name": "pull_request", "github.token": "t0ken-for-test",
            "github.repository": "octo/kernels", "github.sha": self.head, "github.event.pull_request.number": "7",
            "github.event.pull_request.base.sha": self.repo.base, "github.event.pull_request.head.sha": self.head,
            "vars.CUDAGATE_TRUSTED_KEY_IDS": "", "matrix.gpu": "h100",
            # the other steps run this test's Python, where cudagate is installed (NVRTC included)
            "steps.python.outputs.python-path": sys.executable,
        }
        self.ran = 0

    def evaluate(self, text: str, context: dict) -> str:
        """``${{ a || b }}`` and ``${{ x.y }}`` as GitHub evaluates them: the first non-empty value; an
        expression the test does not know fails it (a step's new expression must be given a value here)."""
        def value(match: re.Match) -> str:
            for name in (part.strip() for part in match[1].split("||")):
                if name.startswith("steps."):
                    found = context.get(name, "")  # a step that did not run: empty, as on GitHub
                else:
                    assert name in context, f"the test gives no value to ${{{{ {name} }}}}"
                    found = context[name]
                if found:
                    return found
            return ""
        return EXPRESSION.sub(value, text)

    def action_context(self, action: Path, given: dict) -> dict:
        context = dict(self.context)
        for name, spec in (yaml.safe_load(action.read_text()).get("inputs") or {}).items():
            context[f"inputs.{name}"] = self.evaluate(str(given.get(name, spec.get("default", ""))), context)
        return context

    def step(self, step: dict, context: dict, action_path: Path | None = None,
             job_env: dict | None = None) -> subprocess.CompletedProcess:
        """Run one `run:` step; its outputs go into ``context`` as ``steps.<id>.outputs.<name>``."""
        assert step.get("shell", "bash") == "bash", step
        if step.get("name", "").startswith("Install cudagate"):
            context = {**context, "steps.python.outputs.python-path": str(self.python)}
        self.ran += 1
        files = {name: self.files / f"{name.lower()}-{self.ran}" for name in
                 ("GITHUB_OUTPUT", "GITHUB_ENV", "GITHUB_PATH", "GITHUB_STEP_SUMMARY")}
        for path in files.values():
            path.touch()
        script = self.files / f"step-{self.ran}.sh"
        script.write_text(self.evaluate(step["run"], context))
        env = {**(self.env if job_env is None else job_env),
               **{k: self.evaluate(str(v), context) for k, v in (step.get("env") or {}).items()},
               **{k: str(v) for k, v in files.items()}}
        if action_path is not None:
            env["GITHUB_ACTION_PATH"] = str(action_path)
        cwd = self.workspace / self.evaluate(step.get("working-directory", "."), context)
        result = subprocess.run([BASH, "--noprofile", "--norc", "-eo", "pipefail", str(script)], cwd=cwd, env=env,
                                capture_output=True, text=True, timeout=600)
        for line in files["GITHUB_OUTPUT"].read_text().splitlines():
            name, _, value = line.partition("=")
            context[f"steps.{step.get('id')}.outputs.{name}"] = value
        return result

    def action(self, action: Path, given: dict) -> tuple[dict, dict]:
        """Every `run:` step of ``action`` in order, whatever its `if:`: (name -> result, the context)."""
        context = self.action_context(action, given)
        return {s["name"]: self.step(s, context, action.parent)
                for s in yaml.safe_load(action.read_text())["runs"]["steps"] if "run" in s}, context

    def marks_left(self) -> list[str]:
        return sorted(path.name for path in self.marks.iterdir())


def said(result: subprocess.CompletedProcess) -> str:
    return f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"


@pytest.fixture(params=[("pr", True), pytest.param(("", False), marks=pytest.mark.slow)],
                ids=["checkout in pr, a careless runner", "checkout at the workspace root, as issue 41 found it"])
def runner(request, tmp_path):
    """A checkout in pr/ on a runner whose PATH has relative entries, whose PYTHONPATH holds the current
    folder and the checkout, and whose BASH_ENV names a script of the checkout; and a checkout at the
    workspace root on a runner with none of that."""
    if BASH is None or not shutil.which("jq"):
        pytest.skip("the steps need bash and jq (apt-get install jq)")
    return Runner(tmp_path, *request.param)


def test_no_step_of_the_action_runs_the_checkouts_files_and_each_does_its_job(runner):
    package = standin_project(runner.tmp / "standin")
    where = os.path.relpath(runner.checkout, runner.workspace)
    results, context = runner.action(ACTION, {"package": str(package), "working-directory": where, "comment": "true"})
    assert runner.marks_left() == [], "\n\n".join(f"{n}: {said(r)}" for n, r in results.items())
    for name in ("Install cudagate", "Read the verdict", "Comment on the pull request"):
        assert results[name].returncode == 0, f"{name}: {said(results[name])}"

    installed = subprocess.run([str(runner.python), "-I", "-c", "import cudagate_standin; print('ok')"],
                               cwd=runner.tmp, capture_output=True, text=True)
    assert installed.stdout.strip() == "ok", installed.stderr
    gate = results["Run the gate"]
    assert gate.returncode == 0, said(gate)  # the gate's own exit code is kept for the last step
    assert f"trust root from {runner.repo.base[:12]}" in gate.stdout, said(gate)
    code = context["steps.gate.outputs.exit-code"]
    assert code not in ("", "0"), said(gate)  # no GPU here: --cuda-gate-require-gpu fails the run
    report = Path(context["steps.gate.outputs.report-path"]) / "report.json"
    assert report.is_file(), said(gate)
    assert context["steps.verdict.outputs.verdict"] == json.loads(report.read_text())["verdict"]
    calls = (runner.tmp / "gh-calls").read_text().splitlines()
    assert calls[-1].startswith("api --method POST repos/octo/kernels/issues/7/comments"), calls
    last = results["Fail the job when the gate failed"]
    assert last.returncode == int(code) and "the gate failed" in last.stdout, said(last)


def test_no_step_of_the_comment_action_or_the_example_workflow_runs_the_checkouts_files(runner):
    package = standin_project(runner.tmp / "standin")
    shutil.copytree(package, runner.workspace / "trusted")  # the base commit, as merge-reports installs it
    report = runner.temp / "reports" / "cudagate-report-h100"  # as download-artifact leaves it
    write_report(report, built_report(build_scenario(runner.tmp / "scenario")))
    results = {}

    comment, _ = runner.action(COMMENT_ACTION, {"report": str(report), "package": str(package)})
    results.update({f"pr-comment: {n}": r for n, r in comment.items()})
    # the gate action's verdict of a failed report (the gate itself stops early here, for want of a GPU)
    verdict = next(s for s in yaml.safe_load(ACTION.read_text())["runs"]["steps"] if s.get("id") == "verdict")
    read = {**runner.action_context(ACTION, {}), "steps.gate.outputs.report-path": str(report)}
    results["action: Read the verdict"] = runner.step(verdict, read, ACTION.parent)
    workflow = yaml.safe_load(WORKFLOW.read_text())
    context = {**runner.context, "steps.cudagate.outputs.verdict": "fail", "steps.cudagate.outputs.regressions": "1"}
    for job, spec in workflow["jobs"].items():
        if "pull_request_target" not in spec.get("if", ""):
            continue
        # a value the gate job's steps wrote to GITHUB_ENV does not reach another job
        env = runner.env if job == "gate" else {k: v for k, v in runner.env.items() if k != "BASH_ENV"}
        for step in spec["steps"]:
            if "run" in step:
                results[f"{job}: {step.get('name', step['run'][:40])}"] = runner.step(step, context, job_env=env)
    assert runner.marks_left() == [], "\n\n".join(f"{n}: {said(r)}" for n, r in results.items())
    for name, result in results.items():
        assert result.returncode == 0, f"{name}: {said(result)}"
    assert (read["steps.verdict.outputs.verdict"], read["steps.verdict.outputs.failed"]) == ("fail", "2")
    assert (runner.temp / "merged" / "report.json").is_file()
    calls = (runner.tmp / "gh-calls").read_text().splitlines()
    assert calls[-1].startswith("api --method POST repos/octo/kernels/issues/7/comments"), calls


def _pull_request_jobs() -> dict[str, list[dict]]:
    """The steps of every job shown in the docs or the examples that checks out a pull request's head."""
    blocks = {"examples/workflows/gpu-gate.yml": WORKFLOW.read_text()}
    for page in ("README.md", "docs/ci.md"):
        for number, block in enumerate(re.findall(r"```yaml\n(.*?)```", (ROOT / page).read_text(), re.S)):
            blocks[f"{page} block {number + 1}"] = textwrap.dedent(block)
    jobs = {}
    for where, text in blocks.items():
        document = yaml.safe_load(text)
        for name, job in (document.get("jobs") or {"": document}).items():
            steps = job.get("steps") or []
            if any("pull_request.head.sha" in str(s.get("with", {}).get("ref")) for s in steps):
                jobs[f"{where} {name}".strip()] = steps
    return jobs


def test_the_docs_and_examples_check_the_pull_request_out_into_a_folder_of_its_own():
    """Issue 42: the workflows shown check the pull request out into pr/ and gate pr/, so that no step
    starts in it; their `run:` steps start Python by its absolute path, isolated, in runner.temp."""
    jobs = _pull_request_jobs()
    assert {"examples/workflows/gpu-gate.yml gate", "README.md block 1", "docs/ci.md block 1 gate"} <= set(jobs), jobs
    for where, steps in jobs.items():
        checkout = next(s for s in steps if "pull_request.head.sha" in str(s.get("with", {}).get("ref")))
        assert checkout["with"].get("path") == "pr", where
        gate = next(s for s in steps if "cudagate@" in s.get("uses", "") or s.get("uses") == "./trusted")
        assert gate["with"].get("working-directory") == "pr", where
    shown = yaml.safe_load(re.findall(r"```yaml\n(.*?)```", (ROOT / "docs/ci.md").read_text(), re.S)[0])
    for step in (s for job in shown["jobs"].values() for s in job["steps"] if "run" in s):
        assert step["working-directory"] == "${{ runner.temp }}" and step["run"].startswith('"$PYTHON" -I -m '), step
