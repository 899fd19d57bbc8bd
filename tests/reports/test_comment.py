"""`cudagate report comment`: the pull-request comment's order, folding, intervals, link, marker and
length cap; its escaping, checked on the Markdown as GitHub renders it (cmark-gfm); and the posting
script that finds the earlier comment by its marker."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import cmarkgfm
import pytest
import yaml
from cmarkgfm.cmark import Options

from report_fixtures import build_scenario, built_report
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT
from pytest_cudagate.reports.document import Built
from pytest_cudagate.reports.writer import REPORT_JSON, dumps, write_report

ROOT = Path(__file__).resolve().parents[2]
ACTION = ROOT / "action.yml"
COMMENT_ACTION = ROOT / ".github" / "actions" / "pr-comment" / "action.yml"
WORKFLOW = ROOT / "examples" / "workflows" / "gpu-gate.yml"
LIMIT = 65_536
URL = "https://github.com/octo/kernels/actions/runs/12/artifacts/34"
ZWSP = "\u200b"


def _improved(item: dict, case: str, ratio: float) -> dict:
    improved = copy.deepcopy(item)
    latency = improved["latency"]
    latency["verdict"] = "improved"
    latency["estimate"].update(ratio=ratio, low=ratio - 0.01, high=ratio + 0.01)
    return {**improved, "case": case, "nodeid": f"{item['nodeid']}-{case}", "status": "passed", "category": None,
            "message": "", "passed": True, "headline": f"latency improved: ratio {ratio}"}


def _regressed(item: dict, case: str, ratio: float) -> dict:
    worse = copy.deepcopy(item)
    worse["latency"]["estimate"].update(ratio=ratio, low=ratio - 0.02, high=ratio + 0.02)
    return {**worse, "case": case, "nodeid": f"{item['nodeid']}-{case}"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The fixture scenario's report (two failures, two warnings, a pass, a skip), with a second
    regression and two improvements added."""
    folder = tmp_path_factory.mktemp("comment")
    scenario = build_scenario(folder / "scale")
    built = built_report(scenario)
    write_report(folder / "written", built)  # as the gate writes it: the schema holds
    items = built.document["items"]
    regressed = next(i for i in items if (i["latency"] or {}).get("verdict") == "regressed")
    items += [_regressed(regressed, "perf_big", 1.5), _improved(regressed, "perf_fast", 0.8),
              _improved(regressed, "perf_faster", 0.6)]
    return built


def write(built: Built, folder: Path, edit=None) -> Path:
    """A report folder: report.json alone (the comment reads nothing else), checked when it is read."""
    document = copy.deepcopy(built.document)
    if edit:
        edit(document)
    folder.mkdir(parents=True)
    (folder / REPORT_JSON).write_text(dumps(document), encoding="utf-8")
    return folder


def comment(capsys, folder: Path, *args: str) -> str:
    assert main(["report", "comment", str(folder), *args]) == 0
    return capsys.readouterr().out


def rows(markdown: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in markdown.splitlines()
            if line.startswith("| ") and not line.startswith(("| result", "| ---"))]


def units(text: str) -> int:
    return len(text.encode("utf-16-le")) // 2


def test_failures_first_then_improvements_then_warnings_and_the_rest_folded(base, tmp_path, capsys):
    markdown = comment(capsys, write(base, tmp_path / "r"))
    titles = ["Regressions and failures (3)", "Improvements (2)", "Warnings (2)", "<details><summary>Unchanged (1)",
              "<details><summary>Not replayed (1)"]
    places = [markdown.index(title) for title in titles]
    assert places == sorted(places)
    cases = [row[1] for row in rows(markdown)]
    # Regressions by ratio, largest first, then the correctness failure; improvements, largest first.
    assert cases == ["scale2 × perf_big", "scale2 × perf", "scale2 × edge",
                     "scale2 × perf_faster", "scale2 × perf_fast", "scale2 × perf_tall", "scale2 × perf_wide",
                     "scale2 × small", "scale2 × perf_odd"]
    details = markdown[markdown.index("<details>"):]
    assert "scale2 × small" in details and "scale2 × small" not in markdown[:markdown.index("<details>")]
    assert details.count("<details>") == details.count("</details>") == 2


def test_each_comparison_shows_its_ratio_and_interval(base, tmp_path, capsys):
    markdown = comment(capsys, write(base, tmp_path / "r"))
    regressed = next(i for i in base.document["items"] if i["case"] == "perf")
    estimate = regressed["latency"]["estimate"]
    row = next(r for r in rows(markdown) if r[1] == "scale2 × perf")
    assert row[0] == "**❌ latency regressed**"
    assert row[4] == f"{estimate['ratio']:.3f} [{estimate['low']:.3f}, {estimate['high']:.3f}] at 99%"
    assert row[5] == f"+{(estimate['ratio'] - 1) * 100:.1f}% (slower)"
    assert row[3].endswith(" µs") and " → " in row[3]
    faster = next(r for r in rows(markdown) if r[1] == "scale2 × perf_faster")
    assert faster[4] == "0.600 [0.590, 0.610] at 99%" and faster[5] == "-40.0% (faster)"
    assert next(r for r in rows(markdown) if r[1] == "scale2 × edge")[4] == "–"  # a correctness failure: no timing


def test_release_comparison_and_several_gpus(base, tmp_path, capsys):
    def edit(document):
        document["runs"].append(copy.deepcopy(document["runs"][0]))
        document["runs"][1]["fingerprint"]["fields"]["gpu_name"] = "NVIDIA H100"
        perf = next(i for i in document["items"] if i["case"] == "perf")
        release = copy.deepcopy(perf["latency"])
        release["estimate"].update(ratio=1.1, low=1.05, high=1.15)
        perf["latency"]["release"] = release
        perf["run"] = 1

    markdown = comment(capsys, write(base, tmp_path / "r", edit))
    header = next(line for line in markdown.splitlines() if line.startswith("| result"))
    assert header.split(" | ")[3] == "GPU"
    row = next(r for r in rows(markdown) if r[1] == "scale2 × perf")
    assert row[3] == "NVIDIA H100"
    assert row[5].endswith("<br>release 1.100 [1.050, 1.150] at 99%")
    assert row[6].endswith("<br>release +10.0% (slower)")
    assert "- run 1: " in markdown and "- run 2: " in markdown


def test_the_report_link_and_the_marker(base, tmp_path, capsys):
    folder = write(base, tmp_path / "r")
    plain = comment(capsys, folder)
    assert plain.splitlines()[0] == "<!-- cudagate-comment -->"
    assert "`report.html` in the run's report artifact" in plain and "](" not in plain
    linked = comment(capsys, folder, "--report-url", URL, "--id", "h100")
    assert linked.splitlines()[0] == "<!-- cudagate-comment: h100 -->"
    assert Links.of(linked) == [URL]
    html = render(linked)
    assert "cudagate-comment" not in re.sub(r"<!--.*?-->", "", html)  # the marker is hidden


@pytest.mark.parametrize("args, named", [
    (["--report-url", "https://x.example/a) [evil](https://evil.example"], "--report-url"),
    (["--report-url", "javascript:alert(1)"], "--report-url"),
    (["--id", "a --> <script>"], "--id"),
])  # an empty --id: refused as the command line is read, as every empty value (tests/boundary/test_options.py)
def test_a_bad_link_or_id_is_one_line_and_writes_nothing(base, tmp_path, capsys, args, named):
    folder = write(base, tmp_path / "r")
    out = tmp_path / "comment.md"
    out.write_text("an earlier comment\n")
    assert main(["report", "comment", str(folder), "--out", str(out), *args]) == EXIT_INPUT
    error = capsys.readouterr().err
    assert error.startswith(f"cudagate: {named} ") and error.count("\n") == 1
    assert out.read_text() == "an earlier comment\n"


def test_a_report_that_fails_its_schema_is_one_line(base, tmp_path, capsys):
    folder = write(base, tmp_path / "r")
    document = json.loads((folder / REPORT_JSON).read_text())
    document["items"][0]["latency"]["verdict"] = "much slower"
    document["counts"]["total"] = -1
    (folder / REPORT_JSON).write_text(json.dumps(document))
    out = tmp_path / "comment.md"
    out.write_text("kept\n")
    assert main(["report", "comment", str(folder), "--out", str(out)]) == EXIT_INPUT
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    assert f"{folder / REPORT_JSON}: counts.total: -1 is less than the minimum of 0 (and 1 more problem)" in error
    assert out.read_text() == "kept\n"
    (folder / REPORT_JSON).write_text("[" * 100 + "]" * 100)  # bounded before it is parsed
    assert main(["report", "comment", str(folder)]) == EXIT_INPUT
    assert "nests 100 levels deep" in capsys.readouterr().err


def test_out_writes_the_comment(base, tmp_path, capsys):
    folder = write(base, tmp_path / "r")
    printed = comment(capsys, folder, "--id", "x")
    out = tmp_path / "deeper" / "comment.md"
    assert main(["report", "comment", str(folder), "--id", "x", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == printed
    assert "wrote " in capsys.readouterr().out
    assert main(["report", "comment", str(folder), "--out", str(tmp_path)]) == EXIT_INPUT
    assert "is a folder" in capsys.readouterr().err


def _many(kind: str, count: int):
    def edit(document):
        items = document["items"]
        model = copy.deepcopy(next(i for i in items if i["case"] == ("small" if kind == "passed" else "perf")))
        model["samples_ms"] = {}  # the timings' samples: megabytes over thousands of cases, and not shown
        items[:] = [{**copy.deepcopy(model), "case": f"case_{n:05d}_" + "w" * 100, "nodeid": f"{model['nodeid']}{n}"}
                    for n in range(count)] + [i for i in items if i["case"] == "perf"][: kind == "passed"]
    return edit


@pytest.mark.slow
def test_a_long_report_is_cut_to_fit_most_important_first(base, tmp_path, capsys):
    markdown = comment(capsys, write(base, tmp_path / "r", _many("passed", 600)), "--report-url", URL)
    assert units(markdown) <= LIMIT
    assert "scale2 × perf" in [r[1] for r in rows(markdown)]  # the failure is shown whole
    shown = sum(1 for r in rows(markdown) if r[1].startswith("scale2 × case_"))
    assert 0 < shown < 600
    assert f"…and {600 - shown} more cases not shown here" in markdown
    assert markdown.rstrip().endswith("</sub>") and markdown.count("<details>") == markdown.count("</details>") == 1
    failures = comment(capsys, write(base, tmp_path / "f", _many("failed", 600)))
    assert units(failures) <= LIMIT and "more cases not shown here" in failures
    assert failures.rstrip().endswith("</sub>")


# -- escaping, as GitHub renders it ---------------------------------------------------------------

HOSTILE = [
    "@octocat and @org/team", "<script>alert(1)</script>", "<img src=x onerror=alert(1)>", "a|b||c",
    "``x`` `y` ```", "[click](https://evil.example)", "![img](https://evil.example/x.png)",
    "https://evil.example/p?q=1", "www.evil.example", "user@evil.example", "mailto:user@evil.example",
    "fixes #123, GH-7, org/repo#5", "$\\href{https://evil.example}{x}$", "<!-- cudagate-comment -->",
    "</details></table>", "&lt;script&gt; &#64;octocat", "back\\slash\\", "two\nlines\rand\ttab",
    "<details open><summary>x</summary>", "<https://evil.example>", "[ref]: https://evil.example",
]


def render(markdown: str) -> str:
    """GitHub's renderer (cmark-gfm with its extensions), raw HTML let through so that any leaks."""
    return cmarkgfm.github_flavored_markdown_to_html(markdown, options=Options.CMARK_OPT_UNSAFE)


class Links(HTMLParser):
    """Elements, link targets, table rows and text of rendered HTML."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.hrefs: list[str] = []
        self.cells: list[int] = []
        self.text: list[str] = []
        self.comments: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "a":
            self.hrefs.append(dict(attrs).get("href"))
        elif tag == "tr":
            self.cells.append(0)
        elif tag in ("td", "th"):
            self.cells[-1] += 1

    def handle_data(self, data):
        self.text.append(data)

    def handle_comment(self, data):
        self.comments.append(data)

    @classmethod
    def parsed(cls, markdown: str) -> Links:
        parser = cls()
        parser.feed(render(markdown))
        return parser

    @classmethod
    def of(cls, markdown: str) -> list[str]:
        return cls.parsed(markdown).hrefs


# What GitHub links in rendered text (mentions, issue references) and what cmark-gfm would autolink.
GITHUB_LINKED = re.compile(r"(?:^|[^\w`])@[A-Za-z0-9]|(?:^|[^\w&])#\d|\bGH-\d|https?://|\bwww\.|\w@\w", re.IGNORECASE)


def test_names_from_the_pull_request_open_nothing(base, tmp_path, capsys):
    def edit(document):
        items = document["items"]
        for n, (item, name) in enumerate(zip(items * 3, HOSTILE)):
            target = copy.deepcopy(item) if n >= len(items) else item
            target.update(kernel=f"k{n} {name}", case=name, suite=name, headline=name, category=name,
                          nodeid=f"{item['nodeid']}{n}")
            if n >= len(items):
                items.append(target)
        document["runs"][0]["fingerprint"]["description"] = " ".join(HOSTILE)
        document["suites"][0]["name"] = HOSTILE[0]

    markdown = comment(capsys, write(base, tmp_path / "r", edit), "--report-url", URL)
    page = Links.parsed(markdown)
    # Only the elements the comment itself writes: no script, image, code span, raw HTML from a name.
    assert set(page.tags) <= {"h3", "h4", "p", "ul", "li", "a", "code", "table", "thead", "tbody", "tr", "th", "td",
                              "strong", "em", "del", "br", "details", "summary", "sub"}, set(page.tags)
    assert page.hrefs == [URL]
    assert page.tags.count("code") == 1  # the fingerprint key; a backtick in a name opened none
    assert page.tags.count("details") == 2  # the comment's own folds: no name opened or closed one
    assert len(set(page.cells)) == 1, page.cells  # every row has the header's columns: no | broke one
    text = "".join(page.text)
    assert not GITHUB_LINKED.search(text), GITHUB_LINKED.search(text)
    shown = text.replace(ZWSP, "")
    for name in HOSTILE:  # every character is shown as it is (on one line)
        assert " ".join(name.split()) in shown, name
    assert markdown.count("$") == markdown.count("\\$")  # GitHub's math: every $ escaped
    assert markdown.splitlines()[0] == "<!-- cudagate-comment -->" and page.comments == [" cudagate-comment "]


# -- posting: the script both actions run ---------------------------------------------------------

FAKE_GH = """\
#!{python}
import json, os, sys
path = os.environ["FAKE_GH_STATE"]
state = json.load(open(path))
args, method, paginate, body, rest = sys.argv[2:], "GET", False, None, []
while args:
    arg = args.pop(0)
    if arg == "--paginate":
        paginate = True
    elif arg == "--method":
        method = args.pop(0)
    elif arg == "--input":
        body = json.load(open(args.pop(0)))
    else:
        rest.append(arg)
state["calls"].append({{"method": method, "endpoint": rest[0], "body": body, "token": os.environ.get("GH_TOKEN")}})
json.dump(state, open(path, "w"))
pages = state["pages"] if paginate else state["pages"][:1]
sys.stdout.write("".join(json.dumps(page) for page in pages) if method == "GET" else "{{}}")
"""


def _step(action: Path, name: str) -> dict:
    return next(s for s in yaml.safe_load(action.read_text())["runs"]["steps"] if s.get("name") == name)


@pytest.fixture
def gh(tmp_path):
    if not (shutil.which("bash") and shutil.which("jq")):
        pytest.skip("the posting script needs bash and jq (apt-get install jq)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "gh"
    fake.write_text(FAKE_GH.format(python=sys.executable))
    fake.chmod(0o755)
    state = tmp_path / "gh.json"

    def run(step: dict, action_path: Path, pages: list[list[dict]], **env: str) -> tuple[subprocess.CompletedProcess, list]:
        state.write_text(json.dumps({"pages": pages, "calls": []}))
        environ = {"PATH": os.pathsep.join([str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]),
                   "FAKE_GH_STATE": str(state), "GITHUB_ACTION_PATH": str(action_path), "GH_TOKEN": "t0ken-for-test",
                   "REPO": "octo/kernels", "PR_NUMBER": "7", "HOME": str(tmp_path), "PYTHON": sys.executable, **env}
        result = subprocess.run(["bash", "-c", step["run"]], capture_output=True, text=True, env=environ, timeout=120)
        return result, json.loads(state.read_text())["calls"]
    return run


CALLERS = {"pr-comment action": (COMMENT_ACTION, "Post or update the comment", COMMENT_ACTION.parent),
           "gate action (pull_request)": (ACTION, "Comment on the pull request", ROOT)}


@pytest.mark.parametrize("caller", CALLERS)
def test_posting_updates_the_comment_an_earlier_run_posted(base, tmp_path, capsys, gh, caller):
    folder = write(base, tmp_path / "r")
    expected = comment(capsys, folder, "--id", "h100", "--report-url", URL)
    action, name, action_path = CALLERS[caller]
    step = _step(action, name)
    marker = "<!-- cudagate-comment: h100 -->"
    others = [{"id": 1, "user": {"login": "mallory"}, "body": f"{marker}\nforged"},  # not the bot's
              {"id": 2, "user": {"login": "github-actions[bot]"}, "body": "<!-- cudagate-comment -->\nanother id"}]
    ours = {"id": 3, "user": {"login": "github-actions[bot]"}, "body": f"{marker}\r\nlast run"}
    env = {"REPORT": str(folder), "REPORT_URL": URL, "COMMENT_ID": "h100"}

    result, calls = gh(step, action_path, [others, [ours]], **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [(c["method"], c["endpoint"]) for c in calls] == [
        ("GET", "repos/octo/kernels/issues/7/comments?per_page=100"), ("PATCH", "repos/octo/kernels/issues/comments/3")]
    assert calls[1]["body"] == {"body": expected} and calls[1]["token"] == "t0ken-for-test"

    result, calls = gh(step, action_path, [others], **env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [(c["method"], c["endpoint"]) for c in calls][1:] == [("POST", "repos/octo/kernels/issues/7/comments")]
    assert calls[1]["body"] == {"body": expected}


def test_posting_refuses_what_is_not_a_pull_request(base, tmp_path, gh):
    step = _step(COMMENT_ACTION, "Post or update the comment")
    result, calls = gh(step, COMMENT_ACTION.parent, [[]], REPORT=str(write(base, tmp_path / "r")), PR_NUMBER="")
    assert result.returncode == 2 and "PR_NUMBER '' is not a pull request number" in result.stderr
    assert calls == []


# -- who holds write scope ------------------------------------------------------------------------


def test_the_gate_action_refuses_to_comment_from_a_pull_request_target_job(tmp_path):
    install = _step(ACTION, "Install cudagate")
    env = {"PATH": os.environ["PATH"], "PACKAGE": "pytest-cudagate==0.1.0", "COMMENT": "true",
           "EVENT": "pull_request_target"}
    result = subprocess.run(["bash", "-c", install["run"]], capture_output=True, text=True, env=env, timeout=60,
                            cwd=tmp_path)
    assert result.returncode == 2 and "must not hold write scope" in result.stdout


def test_only_the_comment_job_may_write_and_it_runs_no_pull_request_code():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    assert workflow["permissions"] == {"contents": "read"}
    writers = {name: job["permissions"] for name, job in workflow["jobs"].items()
               if "write" in (job.get("permissions") or {}).values()}
    assert writers == {"comment": {"contents": "read", "pull-requests": "write"}}
    job = workflow["jobs"]["comment"]
    assert job["runs-on"] == "ubuntu-latest" and job["needs"] == "merge-reports"
    checkouts = [s["with"] for s in job["steps"] if s.get("uses", "").startswith("actions/checkout")]
    assert checkouts == [{"ref": "${{ github.event.pull_request.base.sha }}", "path": "trusted",
                          "persist-credentials": False}]
    post = next(s for s in job["steps"] if s.get("uses", "").endswith(".github/actions/pr-comment"))
    # cudagate comes from the trusted checkout the action is part of, never from a package name alone
    assert post["uses"].startswith("./trusted/") and "package" not in post["with"]
