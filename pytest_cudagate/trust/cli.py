"""``cudagate keygen`` / ``sign`` / ``verify`` (and ``gate``, from :mod:`.gate_command`). ``register(subparsers)`` adds them to the main parser.

Exit codes follow ``cudagate``: 0 good, 1 verification failed, 2 bad input (raised as
:class:`CudagateError`, which the main command prints).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from pytest_cudagate.boundary.options import NAME, PATH, PULL_REQUEST, OneLineParser
from pytest_cudagate.config import project_config
from pytest_cudagate.errors import CudagateError, FileError
from pytest_cudagate.defences.recheck import add_recheck_budget
from pytest_cudagate.defences.recheck_child import recheck_expected
from pytest_cudagate.worker.build import signature_refusals
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.trust.keys import (SIGNING_KEY_ENV, TRUSTED_IDS_ENV, TRUSTED_KEYS_DIR, default_key_dir, find_project_root, generate_key_pair, key_id,
                   load_private_key, load_trusted_keys, private_key_mode_warning)
from pytest_cudagate.trust.approvals import Ledger
from pytest_cudagate.judge.output_scale import flag_cases
from pytest_cudagate.trust import gate_command
from pytest_cudagate.trust.ledger import ledger_problems
from pytest_cudagate.trust.manifest import instance_manifest
from pytest_cudagate.trust.suite_signing import sign_suite, signer_from_keys, verify_suite
from pytest_cudagate.config import load_settings
from pytest_cudagate.suite.loader import discover, load_suite
from pytest_cudagate.commands import COMMANDS

EXIT_FAILED = 1


def _suites(paths: list[str]) -> list:
    found = discover([Path(p) for p in paths])
    if not found:
        raise CudagateError(f"no cudagate.yaml found in {', '.join(paths)}")
    return [load_suite(p) for p in found]


def _project(suite):
    root = find_project_root(suite.root) or suite.root
    return root, load_settings(root)


def _is_within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
        return True
    except ValueError:
        return False


def cmd_keygen(args) -> int:
    name = args.name
    cwd_root = find_project_root(Path.cwd())
    if args.out:
        out = Path(args.out)
        private_path, public_path = out / f"{name}.key", out / f"{name}.pub"
    else:
        if cwd_root is None:
            raise CudagateError(f"no project root (a folder holding pyproject.toml or .git) at or above {Path.cwd()}; "
                                "run inside the repository, or pass --out DIR")
        private_path = default_key_dir() / f"{name}.key"
        public_path = cwd_root / TRUSTED_KEYS_DIR / f"{name}.pub"
    generated = generate_key_pair(name, private_path=private_path, public_path=public_path)
    print(f"generated Ed25519 key pair {name!r}, key id {generated.key_id}")
    print(f"  private key: {display_path(generated.private_path)} (mode 0600): keep it secret, never commit it")
    print(f"  public key:  {display_path(generated.public_path)}")
    if args.out:
        print(f"  to trust it, copy {name}.pub into {TRUSTED_KEYS_DIR.as_posix()}/ at the project root and commit it")
    else:
        print("  commit the public key (reviewed) so the project trusts signatures by this key")
    # Signing happens where the private key is; CI only verifies, so it gets no secret.
    print("  sign with it on a maintainer's machine (`cudagate sign`); CI verifies with the public key alone "
          "and needs no secret")
    print(f"  to make CI trust only listed keys, add key id {generated.key_id} to {TRUSTED_IDS_ENV} "
          "(a repository secret the CI workflow passes to the gate; docs/ci.md)")
    if cwd_root is not None and _is_within(generated.private_path, cwd_root):
        print(f"warning: the private key is inside the project folder {display_path(cwd_root)}; make sure it is "
              "git-ignored and never committed", file=sys.stderr)
    return 0


def _key_file(args) -> Path | None:
    """Which key signs, before anything runs and before it is read: --key FILE, else None for
    $CUDAGATE_SIGNING_KEY, else keygen's default folder (by --signer, or its only key)."""
    path = Path(args.key) if args.key else None
    if path is None and not os.environ.get(SIGNING_KEY_ENV, "").strip():
        folder = default_key_dir()
        named = folder / f"{args.signer}.key" if args.signer else None
        candidates = sorted(folder.glob("*.key")) if folder.is_dir() else []
        if named is not None and named.is_file():
            path = named
        elif len(candidates) == 1:
            path = candidates[0]
        elif len(candidates) > 1:
            raise CudagateError(f"several keys in {display_path(folder)} ({', '.join(p.stem for p in candidates)}); "
                                f"pass --key FILE or --signer NAME")
        else:
            load_private_key(None)  # no key anywhere: reads nothing, raises the message that says where one comes from
    return path


def _signing_key(path: Path | None):
    """The key :func:`_key_file` chose, read."""
    if path is not None:
        warning = private_key_mode_warning(path)
        if warning:
            print(warning, file=sys.stderr)
        print(f"using the private key in {display_path(path)}")
    elif os.environ.get(SIGNING_KEY_ENV, "").strip():
        print(f"using the private key in ${SIGNING_KEY_ENV}")
    return load_private_key(path)


def _refusals(suite, budget_s: float) -> list[str]:
    """What stops ``cudagate sign`` from vouching for ``suite``: expected outputs its Python reference
    no longer gives, and kernels that cannot take its signature. Says what it could not check."""
    recheck = recheck_expected(suite, budget_s=budget_s, signed=False)  # as `cases generate` runs it
    problems, notes = signature_refusals(suite, project_config(suite).arch)
    for line in recheck.said(suite) + [f"note: {note}" for note in notes]:
        print(f"{display_path(suite.path)}: {line}")
    return recheck.problems + problems


def cmd_sign(args) -> int:
    suites = _suites(args.suites)
    key_file = _key_file(args)
    # Before the key is read: the recheck runs the suites' Python references (code a pull request may
    # have changed), in a child process without the key's variables (defences/recheck_child.py).
    refused = [FileError(display_path(suite.path), found) for suite in suites
               if (found := _refusals(suite, args.recheck_budget))]
    if refused:  # checked before any is signed: a refusal leaves every file as it was
        raise CudagateError("refused to sign:\n" + "\n".join(map(str, refused)))
    key = _signing_key(key_file)
    kid = key_id(key)
    for suite in suites:
        root, settings = _project(suite)
        try:
            trusted = load_trusted_keys(root, settings)
        except CudagateError as exc:
            print(f"warning: cannot load the trusted keys, so this signature cannot be checked yet: {exc}",
                  file=sys.stderr)
            trusted = {}
        signer = args.signer or signer_from_keys(key, trusted) or ""
        path = sign_suite(suite, key, signer, args.pull_request)
        for flag in flag_cases(suite):
            print(f"  warning: {flag}")
        manifest = json.loads(path.read_text(encoding="utf-8"))["manifest"]
        files = sum(len(c["files"]) for one in suite.instances for c in instance_manifest(manifest, one)["cases"].values())
        print(f"{display_path(suite.path)}: signed {len(suite.cases)} case(s), {files} data file(s) as {signer or 'unnamed signer'} "
              f"with key {kid} -> {display_path(path)}")
        ledger = Ledger.for_suite(suite)
        print(f"{display_path(ledger.path)}: signed as one document, sequence {ledger.sequence}"
              + (f", for pull request {args.pull_request}" if args.pull_request else "") + "; approved: "
              f"{', '.join(sorted(ledger.approvals)) or 'none'}; not yet approved: {', '.join(ledger.pending) or 'none'}")
        if kid not in trusted:
            print(f"warning: key {kid} is not among the project's trusted keys ({getattr(trusted, 'where', lambda: 'none')()}); "
                  f"`cudagate verify` and the gate will refuse this signature until its .pub is committed under "
                  f"{display_path(root / TRUSTED_KEYS_DIR)}/", file=sys.stderr)
    return 0


def cmd_verify(args) -> int:
    failed = False
    for suite in _suites(args.suites):
        root, settings = _project(suite)
        trusted = load_trusted_keys(root, settings)
        result = verify_suite(suite, trusted)
        print(result.summary())
        failed |= not result.ok
        problems = ledger_problems(Ledger.for_suite(suite), trusted, suite)
        for problem in problems:
            print(f"  {problem}")
        failed |= bool(problems)
    return EXIT_FAILED if failed else 0


def register(subparsers) -> None:
    """Add ``keygen``, ``sign``, ``verify`` and ``gate`` to an argparse subparsers object (each sets ``func``)."""
    keygen = subparsers.add_parser("keygen", help=COMMANDS["keygen"].help)
    keygen.add_argument("--name", required=True, type=NAME, help="whose key (names NAME.key and NAME.pub)")
    keygen.add_argument("--out", type=PATH, metavar="DIR",
                        help="write NAME.key and NAME.pub into DIR (default: the private key under "
                             "~/.config/cudagate/keys/, the public key in .cudagate/trusted_keys/ of the project)")
    keygen.set_defaults(func=cmd_keygen)

    sign = subparsers.add_parser("sign", help=COMMANDS["sign"].help)
    sign.add_argument("suites", nargs="+", type=PATH, metavar="SUITE", help="cudagate.yaml files or folders holding them")
    sign.add_argument("--key", type=PATH, metavar="FILE",
                      help=f"private key file (default: ${SIGNING_KEY_ENV}, else the key in ~/.config/cudagate/keys/)")
    sign.add_argument("--signer", type=NAME, metavar="NAME", help="who signs (default: the name of the trusted .pub of the key)")
    add_recheck_budget(sign)
    sign.add_argument("--pull-request", type=PULL_REQUEST, metavar="N",
                      help="record in the signed ledger that it is signed for pull request N: under `cudagate gate "
                           "--pull-request N` a changed signed state counts only in the pull request it was signed for")
    sign.set_defaults(func=cmd_sign)

    verify = subparsers.add_parser("verify", help=COMMANDS["verify"].help)
    verify.add_argument("suites", nargs="+", type=PATH, metavar="SUITE", help="cudagate.yaml files or folders holding them")
    verify.set_defaults(func=cmd_verify)

    gate_command.register(subparsers)


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m pytest_cudagate.trust.cli``) until the main command wires these in."""
    parser = OneLineParser(prog="cudagate")
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except CudagateError as exc:
        print(f"cudagate: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
