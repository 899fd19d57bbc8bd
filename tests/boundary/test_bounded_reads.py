"""Issue 28's "Also found": `cudagate report merge`, `--proposer replay:DIR` and a suite's tunables read
within the boundary's rules. Each bad input ends in exit 2 and one message naming the file and the
field, never a traceback, a hang or an unbounded read; a FIFO or a link to /dev/zero runs in a child
process under a memory cap and a timeout, so the old behaviour fails the test instead of stalling it.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import yaml

from helpers import SUITE_YAML, replace_once, write_suite
from optimize_fakes import opt_suite, write_proposals
from report_fixtures import build_scenario, built_report
from test_attacks import Repo
from pytest_cudagate.cli import main
from pytest_cudagate.errors import EXIT_INPUT, EXIT_NO_GPU
from pytest_cudagate.optimize.proposers import RoundContext
from pytest_cudagate.optimize.proposers.autotune import AutotuneProposer
from pytest_cudagate.reports.writer import write_report
from pytest_cudagate.boundary import MAX_SOURCE_BYTES
from pytest_cudagate.suite.includes import MAX_HEADER_BYTES, MAX_HEADERS
from pytest_cudagate.suite.check_kernels import MAX_TUNABLE_VALUES, MAX_TUNABLES
from pytest_cudagate.suite.loader import load_suite

CHILD_MEMORY = 2 * 1024**3


def cli(capsys, *args) -> tuple[int, str]:
    code = main([str(a) for a in args])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def cli_in_child(*args, timeout: float = 60) -> tuple[int, str]:
    """The command in its own process: a read that never ends or never fits cannot take the test with it."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))

    done = subprocess.run([sys.executable, "-c", "import sys; from pytest_cudagate.cli import main; sys.exit(main())",
                           *map(str, args)], capture_output=True, text=True, timeout=timeout, preexec_fn=limit)
    return done.returncode, done.stdout + done.stderr


def refused(result: tuple[int, str], *needles: str) -> str:
    code, out = result
    assert code == EXIT_INPUT, out
    assert "Traceback" not in out and not re.search(r"^\w*Error\b", out, re.MULTILINE), out
    for needle in needles:
        assert needle in out, out
    return out


# -- cudagate report merge ------------------------------------------------------------------------


@pytest.fixture
def report(tmp_path) -> Path:
    """A valid report folder (report.json and its requests/)."""
    folder = tmp_path / "one"
    write_report(folder, built_report(build_scenario(tmp_path / "scale"), folder))
    return folder


def rewrite(report: Path, edit) -> None:
    path = report / "report.json"
    path.write_text(edit(path.read_text()))


def test_a_valid_report_still_merges(report, tmp_path, capsys):
    code, out = cli(capsys, "report", "merge", tmp_path / "out", report)
    assert code == 0 and "merged 1 report(s)" in out, out


@pytest.mark.parametrize("edit, needles", [
    (lambda text: text.replace('"budget_s": 2.0', '"budget_s": NaN', 1), ["report.json", "NaN is not a finite number"]),
    (lambda text: "[" * 100_000 + "]" * 100_000, ["report.json", "nests 100000 levels deep"]),
    (lambda text: text.replace('"run": 0', '"run": 7', 1), ["report.json", "items[0].run: 7", "1 run"]),
    (lambda text: text[: len(text) // 2], ["report.json", "not valid JSON"]),
], ids=["NaN", "nested 100k deep", "items[0].run 7", "truncated"])
def test_report_merge_refuses_a_bad_report_in_one_message(report, tmp_path, capsys, edit, needles):
    rewrite(report, edit)
    refused(cli(capsys, "report", "merge", tmp_path / "out", report), *needles)
    assert not (tmp_path / "out").exists()


def first_request(report: Path) -> Path:
    document = json.loads((report / "report.json").read_text())
    return report / next(name for item in document["items"] for name in item["requests"])


@pytest.mark.parametrize("kind", ["link to /dev/zero", "FIFO"])
def test_report_merge_refuses_a_report_that_is_not_a_regular_file(report, tmp_path, kind):
    path = report / "report.json"
    path.unlink()
    path.symlink_to("/dev/zero") if kind != "FIFO" else os.mkfifo(path)
    refused(cli_in_child("report", "merge", tmp_path / "out", report), "report.json", "not a regular file")


@pytest.mark.parametrize("kind", ["FIFO", "NaN", "not a request"])
def test_report_merge_refuses_a_bad_request_file_naming_it(report, tmp_path, kind):
    request = first_request(report)
    if kind == "FIFO":
        request.unlink()
        os.mkfifo(request)
        needles = ["not a regular file"]
    elif kind == "NaN":
        request.write_text('{"op": NaN}')
        needles = ["NaN is not a finite number"]
    else:
        request.write_text('{"op": "run"}')
        needles = ["kernel"]
    # named where it is: the merged copy's schema check named only the output folder's copy
    refused(cli_in_child("report", "merge", tmp_path / "out", report), f"{request}:", *needles)


# -- cudagate optimize --proposer replay:DIR ------------------------------------------------------


def replay(tmp_path: Path, folder: Path) -> list[str]:
    return ["optimize", opt_suite(tmp_path / "s"), "scale2", "--allow-unsigned", "--quiet",
            "--results", tmp_path / "results", "--proposer", f"replay:{folder}"]


def proposals(tmp_path: Path, edit=None) -> Path:
    folder = write_proposals(tmp_path / "props", [{"marker": "latency=0.010"}])
    if edit:
        path = folder / "01.json"
        path.write_text(edit(path.read_text()))
    return folder


def test_a_sound_replay_folder_gets_as_far_as_the_gpu(tmp_path, capsys):
    code, out = cli(capsys, *replay(tmp_path, proposals(tmp_path)))
    assert code == EXIT_NO_GPU and "Traceback" not in out, out  # on a GPU it runs


def field(name: str, value):
    def edit(text: str) -> str:
        document = json.loads(text)
        document[name] = value
        return json.dumps(document)
    return edit


@pytest.mark.parametrize("edit, needles", [
    (field("launch", 5), ["01.json", "launch: expected an object"]),
    (field("label", 7), ["01.json", "label: expected a string"]),
    (field("notes", ["a"]), ["01.json", "notes: expected a string"]),
    (field("source_file", 3), ["01.json", "source_file: expected a string"]),
    (field("source", {"a": 1}), ["01.json", "source: expected a string"]),
    (field("defines", {"BLOCK": "x"}), ["01.json", "defines.BLOCK: expected an integer"]),
    (field("defines", [1]), ["01.json", "defines: expected an object"]),
    (field("defines", {"not a name": 1}), ["01.json", "defines"]),
    (field("launch_overrides", {"perf": 3}), ["01.json", "launch_overrides[perf]"]),
    (field("classes", 4), ["01.json", "classes: expected an object"]),
    (field("colour", 1), ["01.json", "colour", "allowed keys"]),
    (lambda text: '{"proposals": 5}', ["01.json", "proposals: expected a list"]),
    (lambda text: '{"proposals": [3]}', ["01.json", "proposals[0]: expected an object"]),
    (lambda text: "[]", ["01.json", "an empty list"]),
    (lambda text: "5", ["01.json", "(top level): expected an object"]),
    (lambda text: text.replace("{", '{"defines": {"BLOCK": 1e400}, ', 1), ["01.json", "1e400 is out of range"]),
    (lambda text: "[" * 100_000 + "]" * 100_000, ["01.json", "nests 100000 levels deep"]),
    (lambda text: "{broken", ["01.json", "not valid JSON"]),
    (lambda text: text.replace("{", '{"label": "a", ', 1), ["01.json", "'label' appears twice"]),
], ids=["launch 5", "label 7", "notes a list", "source_file 3", "source an object", "define a string",
        "defines a list", "define not a name", "override 3", "classes 4", "unknown key", "proposals 5",
        "proposal 3", "an empty list", "a number", "1e400", "nested 100k deep", "not JSON", "duplicate key"])
def test_replay_refuses_a_bad_proposal_file_in_one_message(tmp_path, capsys, edit, needles):
    refused(cli(capsys, *replay(tmp_path, proposals(tmp_path, edit))), *needles)


def test_replay_refuses_a_source_file_that_is_not_utf8(tmp_path, capsys):
    folder = proposals(tmp_path)
    (folder / "01.cu").write_bytes(b"// caf\xe9\n")
    refused(cli(capsys, *replay(tmp_path, folder)), "01.cu", "not UTF-8")


def test_replay_refuses_a_fifo_source_file(tmp_path):
    folder = proposals(tmp_path)
    (folder / "01.cu").unlink()
    os.mkfifo(folder / "01.cu")
    refused(cli_in_child(*replay(tmp_path, folder)), "01.cu", "not a regular file")


@pytest.mark.parametrize("text, needles", [
    ("{broken", ["history.json", "not valid JSON"]),
    ('{"attempts": 5}', ["history.json", "attempts"]),
    ("[" * 100_000 + "]" * 100_000, ["history.json", "nests 100000 levels deep"]),
    ('{"format": 1e400}', ["history.json", "1e400 is out of range"]),
    (json.dumps({"format": 1, "tool_version": "0.1.0", "run": "run-001", "suite": "scale", "kernel": "scale2",
                 "ranking": "geomean", "attempts": []}), ["history.json", "nothing to replay"]),
], ids=["not JSON", "attempts 5", "nested 100k deep", "1e400", "no attempt"])
def test_replay_refuses_a_bad_history_in_one_message(tmp_path, capsys, text, needles):
    folder = tmp_path / "pack"
    folder.mkdir()
    (folder / "history.json").write_text(text)
    refused(cli(capsys, *replay(tmp_path, folder)), *needles)


# -- tunables -------------------------------------------------------------------------------------


def with_tunables(folder: Path, count: int, values: int = 1, tuning: str = "") -> Path:
    """The scale suite with its case data, and ``count`` tunables of ``values`` values each."""
    path = write_suite(folder)
    entries = ", ".join(f"T{i}: [{', '.join(str(v + 1) for v in range(values))}]" for i in range(count))
    path.write_text(replace_once(SUITE_YAML, "    launch: {grid: [rows], block: [128]}\n",
                                 f"    launch: {{grid: [rows], block: [128]}}\n    tunables: {{{entries}}}\n{tuning}"))
    return path


@pytest.mark.parametrize("count, values, needles", [
    (MAX_TUNABLES + 1, 1, [f"{MAX_TUNABLES + 1} tunables", f"at most {MAX_TUNABLES}"]),
    (12_000, 1, ["12000 tunables"]),
    (MAX_TUNABLE_VALUES // 64 + 1, 64, [f"{(MAX_TUNABLE_VALUES // 64 + 1) * 64} values", f"{MAX_TUNABLE_VALUES} values per kernel"]),
], ids=["one over the cap", "12,000", "too many values in all"])
def test_too_many_tunables_are_refused_naming_the_suite_kernel_and_field(tmp_path, capsys, count, values, needles):
    path = with_tunables(tmp_path / "s", count, values)
    start = time.process_time()
    out = refused(cli(capsys, "check", "--allow-unsigned", path), str(path), "kernels[0].tunables", "'scale2'", *needles)
    assert time.process_time() - start < 5, out


def test_the_largest_tunables_allowed_load_and_check_each_value_once(tmp_path):
    """At the caps, a tuning launch naming some tunables: every value of those is resolved on every case
    (a value past a limit is still found), the rest cost nothing."""
    tuning = "    tuning_launch: {grid: [rows], block: ['T0 * T1']}\n"
    path = with_tunables(tmp_path / "ok", MAX_TUNABLES, MAX_TUNABLE_VALUES // MAX_TUNABLES, tuning)
    start = time.process_time()
    assert len(load_suite(path).kernel("scale2").tunables) == MAX_TUNABLES
    assert time.process_time() - start < 5
    text = path.read_text().replace("T1: [1, 2, 3, 4]", "T1: [1, 2, 3, 4096]")
    path.write_text(text)
    with pytest.raises(Exception, match=r"tuning_launch \(T1=4096\) in case 'small'"):
        load_suite(path)


@pytest.mark.slow
def test_twelve_thousand_tunables_in_a_pull_request_are_refused_by_the_gate_in_seconds(tmp_path):
    repo = Repo(tmp_path)
    path = repo.suite_dir / "cudagate.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["kernels"][0]["tunables"] = {f"T{i}": [i + 1] for i in range(12_000)}
    path.write_text(yaml.safe_dump(raw, sort_keys=False, default_flow_style=None))  # 180 KB: within the size cap
    start = time.monotonic()
    code, out = repo.gate()
    assert code != 0 and "12000 tunables" in out and "Traceback" not in out, out
    assert time.monotonic() - start < 60, out  # 208 s on 5b892e9, and the suite stayed trusted


def test_three_thousand_tunables_do_not_reach_autotune(tmp_path, capsys):
    path = with_tunables(tmp_path / "s", 3000, 2, "    tuning_launch: {grid: [rows], block: ['T0 * 64']}\n")
    start = time.process_time()
    refused(cli(capsys, "optimize", path, "scale2", "--allow-unsigned", "--proposer", "autotune", "--quiet",
                "--results", tmp_path / "results"), "3000 tunables")
    assert time.process_time() - start < 5


class _Measured:
    def __init__(self, candidate, ms: float):
        self.candidate, self.passed, self.geomean_ms, self.anchored = candidate, True, ms, {"perf": ms}


@pytest.mark.slow
def test_autotune_plans_a_round_of_the_largest_space_allowed_in_bounded_time(tmp_path):
    """Pairs of one-step moves grow with the square of the tunables, for each elite point: a batch of 32
    at the cap spent 8.7 s of CPU in two rounds on 5b892e9; now each elite point draws a bounded sample."""
    tuning = "    tuning_launch: {grid: [rows], block: ['T0 * 32']}\n"
    suite = load_suite(with_tunables(tmp_path / "s", MAX_TUNABLES, MAX_TUNABLE_VALUES // MAX_TUNABLES, tuning))
    proposer = AutotuneProposer(suite, suite.kernel("scale2"), suite.cases, batch=32)
    history = []
    start = time.process_time()
    for number in (1, 2):
        for candidate in proposer.propose(RoundContext(number, 7, None, None, list(history))):
            history.append(_Measured(candidate, 1.0 + sum(candidate.defines.values()) / 1000))
    assert len(history) == 64 and time.process_time() - start < 6


# -- a kernel's headers (issue 41, item 8) --------------------------------------------------------


def with_includes(folder: Path, names: list[str]) -> Path:
    """The scale suite with its case data, its kernel including ``names`` (quoted)."""
    path = write_suite(folder)
    source = path.parent / "scale.cu"
    source.write_text("".join(f'#include "{name}"\n' for name in names) + source.read_text())
    return path


def test_links_to_one_large_header_are_counted_as_carried_and_stop_at_the_byte_cap(tmp_path, capsys):
    """20 links to one 4 MiB header were each read and carried: 80 MiB in every request, 370 MB of RSS
    for `cudagate check`. Each name counts, so the third stops the build: read before the refusal is
    at most the cap and one header."""
    path = with_includes(tmp_path / "s", [f"l{i}.cuh" for i in range(20)])
    header = path.parent / "big.cuh"
    header.write_text("// " + "x" * (MAX_SOURCE_BYTES - 8) + "\n")
    for i in range(20):
        (path.parent / f"l{i}.cuh").symlink_to("big.cuh")
    tracemalloc.start()
    try:
        out = refused(cli(capsys, "check", "--allow-unsigned", path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (f'  scale2: scale.cu:3: #include "l2.cuh": the kernel\'s headers pass {MAX_HEADER_BYTES} bytes in all '
            "(each name a file is included under counts, links included); include less\n") in out, out
    assert peak < MAX_HEADER_BYTES + 4 * MAX_SOURCE_BYTES, peak  # the cap, one header being read, and their copies


def test_more_headers_than_the_count_cap_are_refused_and_the_cap_itself_compiles(tmp_path, capsys):
    names = [f"h{i}.cuh" for i in range(MAX_HEADERS + 1)]
    path = with_includes(tmp_path / "s", names)
    (path.parent / "one.cuh").write_text("#pragma once\n")
    for name in names:
        (path.parent / name).symlink_to("one.cuh")
    out = refused(cli(capsys, "check", "--allow-unsigned", path))
    assert (f'  scale2: scale.cu:{MAX_HEADERS + 1}: #include "h{MAX_HEADERS}.cuh": more than {MAX_HEADERS} headers for '
            "one kernel build (each name a file is included under counts, links included); include fewer headers\n"
            ) in out, out
    source = path.parent / "scale.cu"
    source.write_text(source.read_text().replace(f'#include "h{MAX_HEADERS}.cuh"\n', ""))
    code, out = cli(capsys, "check", "--allow-unsigned", path)
    assert code == 0 and "scale2: compiles for" in out, out
