"""``cudagate history record REPORT_DIR`` and ``cudagate history show --out DIR``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pytest_cudagate.commands import COMMANDS
from pytest_cudagate.boundary.options import LOCK_TIMEOUT_S, NAME, PATH, count
from pytest_cudagate.config import project_root
from pytest_cudagate.errors import CudagateError
from pytest_cudagate.history import store
from pytest_cudagate.history.commit import GitFacts
from pytest_cudagate.history.export import export_csv, export_json
from pytest_cudagate.history.page import CSV_NAME, HTML_NAME, JSON_NAME, render
from pytest_cudagate.history.record import read_measured, with_approvals
from pytest_cudagate.host import output
from pytest_cudagate.host.paths import display_path, log_lines

DEFAULT_DB = Path(".cudagate") / "history.sqlite"  # under the project root, beside .cudagate/trusted_keys
MAX_WARNINGS = 10


def _db(args: argparse.Namespace, start: Path) -> Path:
    return Path(args.db) if args.db is not None else project_root(start) / DEFAULT_DB


def cmd_record(args: argparse.Namespace) -> int:
    repo = Path(args.repo or Path.cwd())
    # Every report is read and checked before anything is written: one bad folder records none.
    reports = [(Path(folder), read_measured(Path(folder))) for folder in args.report_dir]
    for folder, measured in reports:
        if not measured.results:
            print(f"{display_path(folder)}: no timed case in the report (nothing was measured: no GPU, or no "
                  "performance case ran); nothing recorded")
    timed = [(folder, measured) for folder, measured in reports if measured.results]
    if not timed:
        return 0
    db = _db(args, repo)
    with store.writing(db, args.lock_timeout) as history, GitFacts(repo) as git:
        for folder, measured in timed:
            _record_one(history, git, folder, measured, db)
        for note in history.notes:
            print(log_lines(f"note: {note}"))
    return 0


def _record_one(history: store.Store, git: GitFacts, folder: Path, measured, db: Path) -> None:
    facts = git.of(measured.sha, measured.ref, {r.suite_path for r in measured.results if r.suite_path},
                   history.ledger)
    results = with_approvals(measured.results, facts.approvals)
    added = history.save(facts.commit, measured.runs, results, facts.release_tags, facts.ledgers)
    commit = facts.commit
    where = f"{commit.sha[:12]}" + (f" ({commit.branch})" if commit.branch else "") + (
        f", tagged {', '.join(commit.tags)}" if commit.tags else "")
    if facts.note:
        print(log_lines(f"note: {facts.note}"))
    # log_lines: branch and tag names come from git or from the report, and CI logs read '::' as a command
    if added:
        print(log_lines(f"recorded {added} timed case(s) of {len(measured.runs)} run(s) at {where} in "
                        f"{display_path(db)}"))
    else:
        print(log_lines(f"already recorded: the {len(results)} timed case(s) of {display_path(folder)} at "
                        f"{where}; nothing added to {display_path(db)}"))


def _warn(skipped: tuple[str, ...]) -> None:
    """One line per row skipped (the first few of them: a history damaged throughout is not a log)."""
    for line in skipped[:MAX_WARNINGS]:
        print(log_lines(f"warning: {line}"), file=sys.stderr)
    if len(skipped) > MAX_WARNINGS:
        print(f"warning: and {len(skipped) - MAX_WARNINGS} more row(s) of the history skipped as above",
              file=sys.stderr)


def cmd_show(args: argparse.Namespace) -> int:
    db = _db(args, Path.cwd())
    with store.reading(db, args.lock_timeout) as history:
        shown = history.history(args.suite, args.kernel, args.last)
    _warn(shown.skipped)
    filters = {"suite": args.suite, "kernel": args.kernel, "last": args.last}
    if not shown.entries:
        asked = ", ".join(f"--{k} {v}" for k, v in filters.items() if v is not None)
        raise CudagateError(f"{display_path(db)}: no timed case recorded" + (f" for {asked}" if asked else "")
                            + "; record reports with `cudagate history record REPORT_DIR`")
    out = Path(args.out)
    targets = [out / name for name in (JSON_NAME, CSV_NAME, HTML_NAME)]
    output.check_folder(out, "history page")
    for path in targets:  # before anything is written: a link or device among them writes nothing
        output.check_file(path, "history page")
    # Built from typed rows of the history alone (tests check it against history-export.schema.json);
    # compact, since indenting makes json use its pure-Python encoder (seconds for 20,000 results).
    document = json.dumps(export_json(shown, filters), ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    page = render(shown, display_path(db))
    for path, text in zip(targets, (document + "\n", export_csv(shown), page)):
        output.write_text(path, text, "history page")
    series = len({(e.result.suite, e.result.kernel, e.result.case, e.run.fingerprint) for e in shown.entries})
    print(f"wrote {display_path(out / HTML_NAME)} ({series} chart(s) over {len(shown.commits)} commit(s)), "
          f"{display_path(out / CSV_NAME)} and {display_path(out / JSON_NAME)} ({len(shown.entries)} result(s))")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    history = subparsers.add_parser("history", help=COMMANDS["history"].help)
    actions = history.add_subparsers(dest="history_command", required=True, metavar="ACTION")
    db_help = f"the history file (default: {DEFAULT_DB} under the project root, the folder of the nearest pyproject.toml)"
    timeout_help = f"wait this long for another writer (default {store.DEFAULT_LOCK_TIMEOUT_S:g})"

    record = actions.add_parser("record", help="store every timed case of a report with its commit, branch, commit "
                                               "time, release tags and approvals (the same report twice: stored once)")
    record.add_argument("report_dir", metavar="REPORT_DIR", nargs="+", type=PATH,
                        help="report folders (or their report.json): one run's, or many at once to fill a history "
                             "from kept artifacts; each is checked before any is stored")
    record.add_argument("--db", type=PATH, metavar="PATH", help=db_help)
    record.add_argument("--repo", type=PATH, metavar="DIR", help="the git checkout the report measured (default: the working "
                                                      "directory); its commit is the report's (GitHub Actions), else HEAD")
    record.add_argument("--lock-timeout", type=LOCK_TIMEOUT_S, default=store.DEFAULT_LOCK_TIMEOUT_S, metavar="S",
                        help=timeout_help)
    record.set_defaults(func=cmd_record)

    show = actions.add_parser("show", help="write history.html (a trend chart per case, the largest moves since the "
                                           "last release) with history.csv and history.json beside it")
    show.add_argument("--db", type=PATH, metavar="PATH", help=db_help)
    show.add_argument("--out", required=True, type=PATH, metavar="DIR", help="folder to write the page and its exports into")
    show.add_argument("--suite", type=NAME, metavar="S", help="only this suite (its name)")
    show.add_argument("--kernel", type=NAME, metavar="K", help="only this kernel")
    show.add_argument("--last", type=count(1, 10**9), metavar="N", help="only the last N commits that have results")
    show.add_argument("--lock-timeout", type=LOCK_TIMEOUT_S, default=store.DEFAULT_LOCK_TIMEOUT_S, metavar="S",
                      help=timeout_help)
    show.set_defaults(func=cmd_show)
