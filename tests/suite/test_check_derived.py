"""`derived:` (suite/check_derived.py): names of their own, no cycle, expressions over the case's scalars,
values that fit their types; each problem one line of `cudagate check`."""

from __future__ import annotations

import pytest

from pytest_cudagate.cli import main


@pytest.mark.parametrize("name, message", [
    ("a cycle", "derived.a: derived scalars form a cycle (a -> b -> a)"),
    ("one that reads itself", "derived.a: derived scalars form a cycle (a -> a)"),
    ("one named as a buffer", "derived.x: 'x' is a buffer of the signature"),
    ("an unknown scalar", "derived.n: 'rows * depth' uses depth, which is neither a scalar the cases give nor a "
                          "derived scalar"),
    ("a case that gives a derived scalar", "cases[0].scalars.n: 'n' is derived by the suite (n = rows * cols); "
                                           "remove it from the case"),
    ("a case scalar shadowed", "cases[1].scalars.rows: 'rows' is derived by the suite (rows = cols * 2)"),
    ("an int32 overflow", "derived.n: case 'perf': n = rows * cols * 2**40 gives 18014398509481984, which does not "
                          "fit n's type int32"),
    ("a device fact's name", "derived.warp_size: 'warp_size' is a device fact"),
    ("a fraction for an integer", "derived: case 'small': derived scalar n = 'rows / 7' gives 0.42857142857142855, "
                                  "but n is int32: write a whole-number expression"),
])
def test_bad_derived_scalars_are_refused_in_one_line_each(tmp_path, capsys, name, message):
    """The `derived` family of tests/bad_input_cases.py, each refused by `cudagate check` naming the
    file, the field and the fix."""
    from bad_input_cases import INPUTS

    item = next(i for i in INPUTS if i.family == "derived" and i.name == name)
    entry, args = item.build(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/s/cudagate.yaml" in err and message in err, err
