"""Issue 41, item 9: a report.json whose every string a pull request controls is hostile, through every
writer of it: report.html, the merged report.html, the job summary, annotations, the pull-request
comment and the history page (after `history record`).

The strings are found by walking schemas/report.schema.json beside the document: every string the
schema leaves free (no enum, const or pattern), every key of an object that takes keys of its own,
and a value there. A field added to the schema later is filled too; one the fixture document does not
carry fails :func:`test_the_hostile_report_reaches_every_free_string_of_the_schema` until it does.

Each writer renders the document twice: once with the hostile text, once with text of the same shape
(its white space kept, every other character an ``x``). The two outputs must hold the same elements
and attributes (the HTML parsed, the Markdown rendered by cmark-gfm as GitHub renders it), so no
string opened, closed or linked anything; the rendered Markdown's text must hold nothing GitHub
links (a mention, reference, bare URL or address); every annotation must be one workflow command of
the gate's own, with the properties the gate wrote.
"""

from __future__ import annotations

import copy
import re
import unicodedata
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest

import cudagate_schemas
from report_fixtures import as_report, build_scenario, built_report
from test_attacks_output import RUNNER_COMMANDS, _parse
from test_history import Project
from test_release import commit
from test_comment import GITHUB_LINKED, render
from pytest_cudagate.cli import main
from pytest_cudagate.reports import github
from pytest_cudagate.reports.document import Built
from pytest_cudagate.host.scrub import Scrubber
from pytest_cudagate.boundary.schema import validate
from pytest_cudagate.reports.writer import REPORT_HTML, write_report

SCHEMA = cudagate_schemas.load("report")
# Each piece opens, links or commands something where it is not escaped; every field gets all of them,
# rotated so that each leads in some field (a name cut to 40 characters keeps its first pieces).
PIECES = ["<img src=x onerror=alert(1)>", "www.cudagate-login.example", "[a](javascript:alert(1))",
          "\n::error::pwned\r\n::add-mask::the", "%0A::warning::x %0D", "`tick` ``two``", "| cell |",
          "@admin #1 GH-2 org/repo#3", "https://evil.example/p", "<script>alert(1)</script>", "</td></tr></table>",
          "<!-- x --> -->", "$x$ \\(y\\)", "##[error]legacy", "&lt;b&gt; &#64;a", "user@evil.example",
          "<details open><summary>s</summary>", "![i](https://evil.example/i.png)", "\x1b[31mred\u202e"]
NOT_FREE = {"enum", "const", "pattern", "format"}


def _deref(node: dict, at: str) -> tuple[dict, str]:
    while "$ref" in node:
        at = node["$ref"]
        node = SCHEMA["$defs"][at.rsplit("/", 1)[1]]
    return node, at


def _branches(node: dict, at: str) -> list[tuple[dict, str]]:
    node, at = _deref(node, at)
    for key in ("oneOf", "anyOf"):
        if key in node:
            return [found for n, branch in enumerate(node[key]) for found in _branches(branch, f"{at}/{key}/{n}")]
    return [(node, at)]


def _types(node: dict) -> set[str]:
    if "type" not in node:
        return set() if NOT_FREE & node.keys() else {"string", "object", "array", "number", "integer", "boolean", "null"}
    return {node["type"]} if isinstance(node["type"], str) else set(node["type"])


def _free(node: dict) -> bool:
    return "string" in _types(node) and not NOT_FREE & node.keys()


def _extra(node: dict) -> dict | None:
    """The schema of keys an object takes beyond its named properties; None where it takes none."""
    extra = node.get("additionalProperties", {})
    return None if extra is False else ({} if extra is True else extra)


def free_places() -> set[str]:
    """Where the schema lets a pull request write text: free strings, and the keys and values of
    objects that take keys of their own."""
    found, seen, todo = set(), set(), [(SCHEMA, "#")]
    while todo:
        node, at = todo.pop()
        for branch, where in _branches(node, at):
            if where in seen:
                continue
            seen.add(where)
            if _free(branch):
                found.add(where)
            if not branch:  # anything at all: the filler writes a string there, and looks no deeper
                continue
            if "object" in _types(branch):
                todo += [(sub, f"{where}/properties/{name}") for name, sub in branch.get("properties", {}).items()]
                if _extra(branch) is not None:
                    found.add(f"{where}/(key)")
                    todo.append((_extra(branch), f"{where}/additionalProperties"))
            if "array" in _types(branch) and isinstance(branch.get("items"), dict):
                todo.append((branch["items"], f"{where}/items"))
    return found


class Filler:
    """Every free string of a document replaced by hostile text (or text of its shape), numbered; the
    same string in the same place gets the same text (two items' library label stays one label)."""

    def __init__(self, hostile: bool):
        self.hostile = hostile
        self.reached: set[str] = set()
        self.given: dict[tuple[str, str | None], str] = {}

    def text(self, where: str, was: str | None = None) -> str:
        """The text for a string ``was`` at ``where`` (None: a new key or value, always new text)."""
        self.reached.add(where)
        key = (where, was if was is not None else f"new {len(self.given)}")
        if key not in self.given:
            number = len(self.given) + 1
            turn = number % len(PIECES)
            text = f"f{number} " + " ".join(PIECES[turn:] + PIECES[:turn])
            self.given[key] = text if self.hostile else re.sub(r"\S", "x", text)
        return self.given[key]

    def fill(self, value, node: dict, at: str):
        for branch, where in _branches(node, at):
            if isinstance(value, str) and _free(branch):
                return self.text(where, value)
            if isinstance(value, dict) and "object" in _types(branch):
                return self._object(value, branch, where)
            if isinstance(value, list) and "array" in _types(branch):
                return [self.fill(v, branch.get("items", {}), f"{where}/items") for v in value]
        return value

    def _object(self, value: dict, node: dict, at: str) -> dict:
        named, extra = node.get("properties", {}), _extra(node)
        out = {k: self.fill(v, named[k], f"{at}/properties/{k}") if k in named
               else self.fill(v, extra or {}, f"{at}/additionalProperties") for k, v in value.items()}
        if extra is not None:
            key = self.text(f"{at}/(key)")
            if _free(extra) or not extra:
                out[key] = self.text(f"{at}/additionalProperties")
            elif value:  # a value of its own kind (a sha256 of an input): a copy of one there
                out[key] = next(v for k, v in value.items() if k not in named)
        return out


def carrying_every_field(document: dict) -> dict:
    """The fixture report with the optional parts it lacks: a library baseline (and one that failed),
    a release comparison, a run-spread judgement, the comparison split by inputs, notes, discarded and
    kept chunks, a class selection, a report folder, GitHub's run facts, compile facts and a plugin's
    extra field."""
    document = copy.deepcopy(document)
    items = {item["case"]: item for item in document["items"]}
    regressed, incomparable, failed = items["perf"], items["perf_tall"], items["edge"]
    latency = regressed["latency"]
    latency.update(note="a note", discarded=["chunk 2: throttled"], kept_disturbed=["chunk 3: throttled by itself"],
                   inputs={"signed": copy.deepcopy(latency["estimate"]), "fresh": copy.deepcopy(latency["estimate"]),
                           "shift": copy.deepcopy(latency["estimate"]), "keyed": False})
    latency["release"] = {**copy.deepcopy(latency), "headline": "against the release"}
    regressed["library"] = {"adapter": "cublas_sgemm", "label": "cuBLAS SGEMM", "headline": "0.9× of cuBLAS",
                            "error": None, "estimate": copy.deepcopy(latency["estimate"]),
                            "library": copy.deepcopy(latency["approved"]), "current": copy.deepcopy(latency["current"])}
    items["perf_wide"]["library"] = {"adapter": "cublas_sgemm", "label": "cuBLAS SGEMM", "headline": "no ratio",
                                     "error": "library not found", "estimate": None, "library": None, "current": None}
    incomparable["latency"]["run_spread"] = {"verdict": "pass", "ratio": 1.01, "low": 0.92, "high": 1.09,
                                             "confidence": 0.99, "runs": 3, "measured_spread": 0.01, "floored": True,
                                             "spread_text": "spread of 3 approval runs"}
    regressed["notes"] = ["sanitizer skipped"]
    latency["telemetry"][0]["other_processes"] = [{"pid": 4242, "used_memory_bytes": 1 << 20}]
    failed["correctness"].update(error_kind="fault", problems=["output y: 3 elements unwritten"])
    run = document["runs"][0]
    run["options"].update(classes=["default"], deselected_by_class=["scale/cudagate.yaml::scale2::perf_odd"])
    run.update(report_dir="report", github={"repository": "octo/kernels", "run_id": "12", "job": "gate", "ref": "refs/pull/7",
                                            "sha": None, "server_url": "https://github.com", "runner": "gpu-1"})
    facts = {"suite": "scale", "kernel": "scale2", "variant": "wide", "entry": "scale2", "arch": "sm_90",
             "compiler": "NVRTC 13.0", "ok": True, "registers": 16, "spill_store_bytes": 0, "spill_load_bytes": 0,
             "shared_static_bytes": 0, "compile_s": 0.5}
    run["compiles"] = [facts, {**facts, "variant": None, "ok": False, "registers": None, "spill_store_bytes": None,
                               "spill_load_bytes": None, "shared_static_bytes": None, "compile_s": None}]
    document["extra"] = {"ci": "a plugin's field"}  # pytest_cudagate_update_report's place
    return document


@pytest.fixture(scope="module")
def fixture_report(tmp_path_factory) -> Built:
    built = built_report(build_scenario(tmp_path_factory.mktemp("hostile") / "scale"))
    return Built(carrying_every_field(Scrubber({}).data(built.document)), built.requests)


def filled(built: Built, hostile: bool) -> tuple[Built, Filler]:
    filler = Filler(hostile)
    document = filler.fill(built.document, SCHEMA, "#")
    validate(document, "report", "report.json")  # still a report the schema allows: what a gate could have written
    return Built(document, built.requests), filler


def test_the_hostile_report_reaches_every_free_string_of_the_schema(fixture_report):
    _, filler = filled(fixture_report, hostile=True)
    missing = free_places() - filler.reached
    assert not missing, f"add these to carrying_every_field(): {sorted(missing)}"


# -- what each writer made of it ------------------------------------------------------------------------


class Shape(HTMLParser):
    """The elements and attribute names of an HTML text, and its text."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.elements: Counter = Counter()
        self.text: list[str] = []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.elements[(tag, tuple(sorted(name for name, _ in attrs)))] += 1

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_data(self, data):
        self.text.append(data)


def writers(built: Built, folder: Path, monkeypatch) -> dict[str, str]:
    """Every writer's output for the report: the HTML pages and the Markdown, by name."""
    folder.mkdir()
    written = folder / "report"
    write_report(written, built, Scrubber({}))
    summary = folder / "summary.md"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["report", "merge", str(folder / "merged"), str(written)]) == 0
    monkeypatch.delenv("GITHUB_ACTIONS")
    assert main(["report", "comment", str(written), "--out", str(folder / "comment.md")]) == 0
    project = Project(folder)  # a git repository of the suite, the history beside it
    commit(project.root, "the pull request")
    assert project.record(written) == 0
    assert project.show(folder / "page") == 0
    return {"report.html": (written / REPORT_HTML).read_text(), "merged report.html": (folder / "merged" / REPORT_HTML).read_text(),
            "history.html": (folder / "page" / "history.html").read_text(),
            "job summary": render(summary.read_text()), "comment": render((folder / "comment.md").read_text())}


@pytest.fixture(scope="module")
def rendered(fixture_report, tmp_path_factory):
    """Each writer's output of the hostile report and of its same-shaped twin."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        root = tmp_path_factory.mktemp("writers")
        return {hostile: writers(filled(fixture_report, hostile)[0], root / str(hostile), monkeypatch)
                for hostile in (True, False)}


@pytest.mark.parametrize("writer", ["report.html", "merged report.html", "history.html", "job summary", "comment"])
def test_no_string_opens_an_element_or_attribute(rendered, writer):
    hostile, twin = Shape(rendered[True][writer]), Shape(rendered[False][writer])
    assert hostile.elements == twin.elements, (hostile.elements - twin.elements, twin.elements - hostile.elements)
    assert not [tag for tag, attrs in hostile.elements if tag in ("img", "iframe") or any(a.startswith("on") for a in attrs)]
    text = "".join(hostile.text)
    assert "alert(1)" in text and "cudagate-login" in text  # the payload is there, as text
    hidden = {c for c in text if unicodedata.category(c) in ("Cc", "Cf") and c not in "\n\r\t\u200b"}
    assert not hidden, hidden  # no escape sequence, no bidirectional override: shown as escapes


@pytest.mark.parametrize("writer", ["job summary", "comment"])
def test_the_markdown_links_and_mentions_nothing(rendered, writer):
    text = "".join(Shape(rendered[True][writer]).text)
    assert not GITHUB_LINKED.search(text), GITHUB_LINKED.search(text)
    assert "<img" in text and "::error::pwned" in text  # shown as written


def test_each_annotation_is_one_command_of_the_gates_own(fixture_report):
    document, _ = filled(fixture_report, hostile=True)
    lines = github.workflow_annotations(as_report(document.document))
    assert len(lines) == 4  # two failed items, two warnings
    for line in lines:
        assert line.isprintable() and "\n" not in line and "\r" not in line, repr(line)
        name, data = _parse(line, RUNNER_COMMANDS)
        assert name in ("error", "warning"), line
        head = line[2:line.index("::", 2)]
        assert re.fullmatch(r"(error|warning) file=[^:,]*,line=1,title=[^:,]*", head), head  # no property added
        assert "%0A" in data and "::error::pwned" in data  # the message's lines, escaped on one line
