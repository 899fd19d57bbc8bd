"""Issues 13 and 28's done-when test: every malformed input is refused fast and clearly.

For every input of tests/bad_input_cases.py (expressions, YAML and files, data, signature and
ledger files, settings, harness requests, references; and issue 28's trusted refs and base files
under `cudagate gate --trusted-ref`, report merges, replay folders and tunables), run in its own
process under RLIMIT_AS: refused (exit 2 from the CLI, a failed item or usage error under pytest,
never INTERNALERROR), no Python traceback, within its CPU time (2 s; 10 s for a whole gate run),
five times that in wall time (a loaded 2-core host), and within 512 MB. Valid inputs still pass
`cudagate check`.
"""

from __future__ import annotations


import pytest

from bad_input_cases import INPUTS, request, run_in_subprocess, table, verdict
from helpers import EXAMPLES, write_suite
from pytest_cudagate.cli import main

FAMILIES = sorted({item.family for item in INPUTS})
# Each input is a fresh process (a second or more of CPU, 300-odd in all): the fast run (`-m "not slow"`) refuses
# the first input of every family, CI the rest of each family too.
PARTS = [pytest.param(family, part, id=f"{family}-{part}", marks=pytest.mark.slow if part == "rest" else ())
         for family in FAMILIES for part in ("first", "rest")]


@pytest.mark.parametrize("family, part", PARTS)
def test_every_bad_input_is_refused_fast_and_clearly(family, part, tmp_path, capsys):
    items = [item for item in INPUTS if item.family == family]
    items = items[:1] if part == "first" else items[1:]
    rows = [(item, result, verdict(result)) for item in items for result in [run_in_subprocess(item, tmp_path)]]
    with capsys.disabled():
        print("\n" + table(rows))
    wrong = [f"{item.name}: {v} (exit {result['code']}, {result['seconds']:.2f} s, {result['cpu_s']:.2f} s CPU, "
             f"{result['peak_mb']:.0f} MB)\n"
             f"{result['output'][-1200:]}" for item, result, v in rows if v != "refused"]
    assert not wrong, "\n\n".join(wrong)


@pytest.mark.parametrize("cpu_s, seconds, expected", [
    (1.9, 9.5, "refused"),  # a loaded host: slow on the wall clock, within its CPU time
    (2.5, 2.6, "hang"),  # a busy loop: over its CPU time however idle the host
    (0.1, 10.5, "hang"),  # a blocked read: no CPU spent, over the wall limit
])
def test_the_limits_tell_a_loaded_host_from_a_hang(cpu_s, seconds, expected):
    item = INPUTS[0]
    result = {"entry": "cudagate", "code": 2, "output": "cudagate: refused", "peak_mb": 100, "cpu_s": cpu_s,
              "seconds": seconds, "cpu_limit": item.cpu_s, "wall_limit": item.wall_s}
    assert (item.cpu_s, item.wall_s) == (2.0, 10.0)
    assert verdict(result) == expected


def test_a_leaked_key_or_a_damaged_file_is_its_own_verdict(tmp_path):
    from bad_input_cases import SIGNING_KEY, damage, leaked, special_files

    body = SIGNING_KEY.splitlines()[1]
    assert leaked(f"x{body[20:36]}y") and leaked(body) and not leaked(body[20:35]) and not leaked("no key here")
    (tmp_path / "out.md").symlink_to(tmp_path / "elsewhere.md")
    (tmp_path / "fifo").parent.mkdir(exist_ok=True)
    import os
    os.mkfifo(tmp_path / "fifo")
    before = special_files(tmp_path)
    assert damage(before, tmp_path) == []
    (tmp_path / "fifo").unlink()
    (tmp_path / "fifo").write_text("replaced")
    (tmp_path / "out.md").write_text("written through")
    assert sorted(damage(before, tmp_path)) == [f"{tmp_path}/elsewhere.md written through the link {tmp_path}/out.md",
                                                f"{tmp_path}/fifo (special) replaced"]
    item = INPUTS[0]
    result = {"entry": "cudagate", "code": 2, "output": "", "peak_mb": 1, "cpu_s": 0.1, "seconds": 0.1,
              "cpu_limit": item.cpu_s, "wall_limit": item.wall_s}
    assert verdict({**result, "leaked": True}) == "leak" and verdict({**result, "damaged": ["x"]}) == "damaged"
    assert verdict(result) == "refused"


def test_the_generator_covers_every_family_of_the_issue():
    assert set(FAMILIES) == {"expressions", "yaml", "data", "trust", "settings", "requests", "references",
                             "gate", "merge", "replay", "tunables", "history", "options", "includes", "links", "comment", "init", "compiler",
                             "kernel_cases", "derived", "inputs", "tolerances", "layouts", "instantiate", "steps"}
    assert len(INPUTS) >= 140


@pytest.mark.parametrize("suite", ["matmul", "softmax"])
def test_the_examples_still_pass_check(suite, capsys, monkeypatch):
    monkeypatch.chdir(EXAMPLES.parent)
    assert main(["check", str(EXAMPLES / suite / "cudagate.yaml")]) == 0, capsys.readouterr().out


def test_the_test_suite_still_passes_check(tmp_path, capsys):
    path = write_suite(tmp_path / "scale")
    assert main(["check", "--allow-unsigned", str(path)]) == 0, capsys.readouterr().out


def test_a_request_beside_its_data_is_accepted_up_to_the_gpu(tmp_path, capsys):
    """The request checks refuse only what is unsafe: a sound request gets as far as the device."""
    _, args = request(tmp_path, "cudagate", lambda body: body)
    assert main(args) == 3  # no CUDA device here; on a GPU it runs
    assert "cudagate:" in capsys.readouterr().err
