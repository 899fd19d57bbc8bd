"""``cudagate report merge OUT_DIR DIR...``: one report from the reports of several jobs;
``cudagate report comment REPORT_DIR``: a report as a pull-request comment (Markdown)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from pytest_cudagate.commands import COMMANDS
from pytest_cudagate.boundary.options import NAME, PATH, nonempty
from pytest_cudagate.host import output
from pytest_cudagate.host.paths import display_path
from pytest_cudagate.reports import comment, fmt, github
from pytest_cudagate.reports.merge import merge_reports
from pytest_cudagate.host.scrub import Scrubber
from pytest_cudagate.boundary.wire import to_json
from pytest_cudagate.reports.writer import REPORT_HTML, read_report, typed, write_report

EXIT_FAILED = 1


def cmd_merge(args: argparse.Namespace) -> int:
    out_dir = Path(args.out_dir)
    built = merge_reports([Path(p) for p in args.reports], out_dir)
    scrubber = Scrubber()
    path = write_report(out_dir, built, scrubber)
    document = typed(scrubber.data(to_json(built.document)), path)  # scrubbed as report.json is
    print(f"merged {len(args.reports)} report(s), {len(document.runs)} run(s): "
          f"{document.verdict.upper()} ({fmt.counts_line(document.counts)})")
    print(f"wrote {display_path(path)} and {display_path(out_dir / REPORT_HTML)}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if github.in_actions() and summary:
        with open(summary, "a", encoding="utf-8") as handle:
            handle.write(scrubber.text(github.summary_markdown(document)))
    return EXIT_FAILED if args.check and document.verdict == "fail" else 0


def cmd_comment(args: argparse.Namespace) -> int:
    out = None if args.out is None else Path(args.out)
    if out is not None:
        output.check_file(out, "comment")  # before the report is read: a wrong --out is said first
    document = read_report(Path(args.report))
    body = Scrubber().text(comment.render(document, report_url=args.report_url, comment_id=args.id))
    if out is None:
        sys.stdout.write(body)
        return 0
    output.write_text(out, body, "comment")
    print(f"wrote {display_path(out)}: {len(document.items)} case(s), {len(body):,} characters")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help=COMMANDS["report"].help)
    actions = report.add_subparsers(dest="report_command", required=True, metavar="ACTION")
    merge = actions.add_parser("merge", help="merge the reports of several jobs (e.g. one per GPU model) into one "
                                             "report.json + report.html; also re-renders a single report")
    merge.add_argument("out_dir", type=PATH, metavar="OUT_DIR", help="folder to write the merged report into")
    merge.add_argument("reports", nargs="+", type=PATH, metavar="DIR", help="report folders (or their report.json files)")
    merge.add_argument("--check", action="store_true", help="exit 1 when the merged verdict is FAIL")
    merge.set_defaults(func=cmd_merge)
    markdown = actions.add_parser("comment", help="a report as Markdown for a pull-request comment: regressions and "
                                                   "failures first, then improvements, the unchanged cases folded")
    markdown.add_argument("report", type=PATH, metavar="REPORT_DIR", help="report folder (or its report.json)")
    markdown.add_argument("--report-url", type=nonempty("a URL"), metavar="URL", help="link to the HTML report, e.g. the report artifact's URL")
    markdown.add_argument("--id", type=NAME, metavar="ID", help="names the comment among others on the pull request (one per "
                                                     "workflow, say): the marker later runs find it by")
    markdown.add_argument("--out", type=PATH, metavar="FILE", help="write the Markdown here instead of printing it")
    markdown.set_defaults(func=cmd_comment)
