"""The recheck of expected outputs (:mod:`.recheck`) in a child process that holds no secret.

``cudagate sign`` runs a suite's Python reference before it signs, and the reference is code a pull
request may have changed: run where the private key is, it could read the key and send it anywhere.
So it runs in a child process, started before the key is read: ``python -I`` (no ``PYTHON*``
variables, no user site-packages, no current folder on ``sys.path``), in the suite's folder, its
environment without any variable whose name the report scrubber treats as secret
(``CUDAGATE_SIGNING_KEY``, ``*KEY*``, ``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``...), told on stdin only
the suite file, the budget and a scratch folder. On Linux with Landlock it confines itself after its
imports, before the reference is read: it may read the suite's folder, the Python installation, its
packages and the system's libraries, never a folder that holds the private keys' folder (a home
directory), and write only the scratch folder. Where Landlock is missing it runs unconfined, and
says so in a note. ``cudagate check`` uses the same child.

Wire: one JSON request on stdin; one JSON reply (schemas/recheck-reply.schema.json) on the stdout the
child was started with, which only this module writes: whatever else the child prints (the
reference's own output) goes to stderr. A child that dies, runs past the budget plus
:data:`MARGIN_S`, or answers anything else is one problem line.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from cudagate_harness.confine import ConfinementError, restrict_to

from pytest_cudagate.boundary import schema
from pytest_cudagate.host.paths import show_paths_from
from pytest_cudagate.host.scrub import secret_name
from pytest_cudagate.suite.loader import load_suite
from pytest_cudagate.suite.model import Suite
from pytest_cudagate.defences.recheck import DEFAULT_RECHECK_S, BUDGET_OPTION, Recheck, recheck_in_process
from pytest_cudagate.trust.keys import default_key_dir

# Past the budget: the interpreter's start and imports, and the case the budget ran out in.
MARGIN_S = 30.0
MAX_REPLY_BYTES = 16 << 20
# Where the shared libraries are that a module the reference imports may load.
SYSTEM_LIBRARIES = ("/lib", "/lib64", "/usr/lib", "/usr/lib64")


@dataclass(frozen=True)
class RecheckRequest:
    suite: str  # the suite file, absolute
    budget_s: float
    signed: bool  # run the reference only as the suite's signature signs it
    scratch: str  # the one folder the child may write; its TMPDIR
    shown_from: str  # the folder messages name paths from: the parent's working directory


def recheck_expected(suite: Suite, *, budget_s: float = DEFAULT_RECHECK_S, signed: bool = True) -> Recheck:
    """:func:`.recheck.recheck_in_process` over ``suite``, run in a child process."""
    if not suite.reference.python:  # a CUDA reference is only said to be not rechecked: nothing runs
        return recheck_in_process(suite, budget_s=budget_s, signed=signed)
    scratch = tempfile.mkdtemp(prefix="cudagate-reference-")
    request = RecheckRequest(os.path.abspath(suite.path), budget_s, signed, scratch, os.getcwd())
    limit = budget_s + MARGIN_S
    try:
        with tempfile.TemporaryFile() as reply:
            # its own session, so that stopping it stops what the reference started too
            child = subprocess.Popen([sys.executable, "-I", "-m", __name__], stdin=subprocess.PIPE, stdout=reply,
                                     cwd=suite.root, env=_child_env(scratch), start_new_session=True)
            try:
                child.communicate(json.dumps(asdict(request)).encode(), timeout=limit)
            except subprocess.TimeoutExpired:
                return Recheck(problems=[
                    f"{_not_rechecked(suite)} did not finish in {limit:g} s ({BUDGET_OPTION} {budget_s:g} s, plus "
                    f"{MARGIN_S:g} s to start and to end the case the budget ran out in) and was stopped: fix a "
                    f"reference that hangs, or raise {BUDGET_OPTION}"])
            finally:
                if child.returncode is None:
                    _stop(child)
            reply.seek(0)
            answer = reply.read(MAX_REPLY_BYTES + 1)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _answer(suite, child.returncode, answer)


def _child_env(scratch: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if not secret_name(name)}
    env.update(TMPDIR=scratch, TEMP=scratch, TMP=scratch)
    return env


def _stop(child: subprocess.Popen) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except (AttributeError, OSError):  # no process groups here, or the group is gone
        child.kill()
    child.wait()


def _not_rechecked(suite: Suite) -> str:
    return (f"expected outputs not rechecked: the process that runs the Python reference "
            f"{suite.reference.python}")


def _answer(suite: Suite, status: int, answer: bytes) -> Recheck:
    """The child's reply as a :class:`Recheck`, or one problem line saying why there is none."""
    try:
        document = json.loads(answer) if len(answer) <= MAX_REPLY_BYTES else None
    except ValueError:
        document = None
    if status == 0 and document is not None and not schema.problems(document, "recheck-reply"):
        return Recheck.from_json(document)
    if not answer:
        try:
            how = f"signal {signal.Signals(-status).name}" if status < 0 else f"exit status {status}"
        except ValueError:
            how = f"signal {-status}"
        return Recheck(problems=[f"{_not_rechecked(suite)} ended with {how} before it answered: fix the reference "
                                 "(what it printed, if anything, is above)"])
    return Recheck(problems=[f"{_not_rechecked(suite)} answered with something other than a recheck result (exit "
                             f"status {status}, {len(answer)} bytes): something in it wrote where only cudagate "
                             "writes; fix the reference"])


# -- the child ---------------------------------------------------------------------------------------

def _readable(suite: Suite) -> list[str]:
    """The suite's folder, the Python installation and its packages, and the system's libraries;
    never a folder that holds the private keys' folder (a home directory on ``sys.path``)."""
    import cudagate_harness
    import cudagate_schemas
    import pytest_cudagate

    packages = [Path(module.__file__).parent for module in (pytest_cudagate, cudagate_harness, cudagate_schemas)]
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    keys = default_key_dir().resolve()
    found = {Path(f).resolve() for f in (*sys.path, *prefixes, *packages, *SYSTEM_LIBRARIES) if f and os.path.isdir(f)}
    return [str(suite.root.resolve()), *sorted(str(f) for f in found if not keys.is_relative_to(f))]


def _recheck(request: RecheckRequest) -> Recheck:
    show_paths_from(request.shown_from)
    suite = load_suite(request.suite)
    try:
        restrict_to(_readable(suite), [request.scratch])
        unconfined = []
    except ConfinementError as exc:
        unconfined = [f"the Python reference ran in a child process with no secret in its environment, but not "
                      f"confined ({exc}): it could read any file you can"]
    result = recheck_in_process(suite, budget_s=request.budget_s, signed=request.signed)
    result.notes += unconfined
    return result


def main() -> int:
    reply = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # whatever else this process prints goes to stderr, never into the reply
    try:
        result = _recheck(RecheckRequest(**json.loads(sys.stdin.read())))
    except Exception as exc:  # noqa: BLE001 - one line, never a traceback
        result = Recheck(problems=[f"expected outputs not rechecked: {type(exc).__name__}: {str(exc)[:300]}"])
    with reply:
        reply.write(json.dumps(result.to_json()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
