"""The integer expression language of suite files: what it computes and what it refuses."""

from __future__ import annotations

import pytest

from pytest_cudagate.suite.expr import ExprError, evaluate, launch_problems, parse


@pytest.mark.parametrize(
    ("text", "scalars", "value"),
    [
        ("cdiv(n, 16)", {"n": 33}, 3),
        ("cdiv(n, 16)", {"n": 32}, 2),
        ("cdiv(n, 16)", {"n": 1}, 1),
        ("cdiv(0, 16)", {}, 0),
        ("min(a, b)", {"a": 7, "b": 3}, 3),
        ("max(a, b, 11)", {"a": 7, "b": 3}, 11),
        ("n // 4", {"n": 15}, 3),
        ("-n // 4", {"n": 15}, -4),  # floor division, as Python
        ("n % 7", {"n": 15}, 1),
        ("2 ** k", {"k": 10}, 1024),
        ("-n", {"n": 5}, -5),
        ("+n", {"n": 5}, 5),
        ("-(a - b)", {"a": 2, "b": 9}, 7),
        ("rows * cols + 1", {"rows": 3, "cols": 50}, 151),
        ("(a + b) * c", {"a": 1, "b": 2, "c": 4}, 12),
        ("a + b * c", {"a": 1, "b": 2, "c": 4}, 9),
        ("n / 2", {"n": 8}, 4),  # true division is fine when the result is whole
        ("ceil(n / 4)", {"n": 9}, 3),
        ("floor(n / 4)", {"n": 9}, 2),
        ("1.5 * 2", {}, 3),
        ("  n  ", {"n": 4}, 4),
    ],
)
def test_evaluates(text, scalars, value):
    result = evaluate(text, scalars)
    assert result == value
    assert type(result) is int


@pytest.mark.parametrize("number", [0, 1, 256, 65536])
def test_an_int_is_its_own_expression(number):
    assert evaluate(number, {}) == number
    assert parse(number).text == str(number)
    assert parse(number).names == frozenset()


def test_names_are_the_scalars_read_not_the_functions():
    assert parse("cdiv(n, block) * min(k, 4)").names == frozenset({"n", "block", "k"})
    assert parse("16").names == frozenset()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("n.bit_length()", "only cdiv/min/max/ceil/floor calls"),
        ("n.real", "Attribute is not allowed"),
        ("__import__('os')", "only cdiv/min/max/ceil/floor calls"),
        ("eval('1')", "only cdiv/min/max/ceil/floor calls"),
        ("abs(n)", "only cdiv/min/max/ceil/floor calls"),
        ("min(n, key=1)", "only cdiv/min/max/ceil/floor calls"),
        ("lambda: 1", "Lambda is not allowed"),
        ("n[0]", "Subscript is not allowed"),
        ("'16'", "is not a number"),
        ("True", "is not a number"),
        ("n < 4", "Compare is not allowed"),
        ("n == 4", "Compare is not allowed"),
        ("n if n else 1", "IfExp is not allowed"),
        ("n and 1", "BoolOp is not allowed"),
        ("n << 2", "LShift is not allowed"),
        ("n & 3", "BitAnd is not allowed"),
        ("~n", "Invert is not allowed"),
        ("not n", "Not is not allowed"),
        ("[n]", "List is not allowed"),
        ("(n, 1)", "Tuple is not allowed"),
        ("(n := 3)", "NamedExpr is not allowed"),
    ],
)
def test_refuses_anything_but_arithmetic(text, fragment):
    with pytest.raises(ExprError) as excinfo:
        parse(text)
    assert fragment in str(excinfo.value)


def test_refused_calls_never_run():
    # If the call were evaluated, the exception below would not be an ExprError.
    with pytest.raises(ExprError):
        evaluate("__import__('os').getpid()", {})


@pytest.mark.parametrize("text", ["", "   ", "n +", "cdiv(n,", "1 2", "n ** ", "import os"])
def test_syntax_errors_say_what_is_allowed(text):
    with pytest.raises(ExprError) as excinfo:
        parse(text)
    message = str(excinfo.value)
    assert "empty expression" in message or ("cannot parse" in message and "cdiv/min/max" in message)


def test_unknown_name_lists_the_known_scalars():
    with pytest.raises(ExprError) as excinfo:
        evaluate("rows * colz", {"rows": 3, "cols": 4})
    message = str(excinfo.value)
    assert "'colz'" in message
    assert "known: cols, rows" in message


def test_unknown_name_with_no_scalars_says_none():
    with pytest.raises(ExprError, match=r"known: none"):
        evaluate("n", {})


def test_a_function_name_is_not_a_value():
    with pytest.raises(ExprError, match="'cdiv'"):
        evaluate("cdiv + 1", {"n": 1})


@pytest.mark.parametrize(("text", "scalars"), [("n / 2", {"n": 7}), ("2 ** -1", {}), ("x * 2", {"x": 1.25})])
def test_non_integral_results_are_refused(text, scalars):
    with pytest.raises(ExprError, match="not a whole number"):
        evaluate(text, scalars)


@pytest.mark.parametrize("text", ["1e308 * 10", "-1e308 * 10", "ceil(1e308*10)", "2.0 ** 1000"])
def test_values_beyond_64_bits_are_refused(text):
    with pytest.raises(ExprError, match="beyond 2|too large"):
        evaluate(text, {})


@pytest.mark.parametrize("text", ["n / 0", "n // z", "n % z", "cdiv(n, z)", "n / (z * 3)"])
def test_division_by_zero(text):
    with pytest.raises(ExprError) as excinfo:
        evaluate(text, {"n": 5, "z": 0})
    assert "division by zero" in str(excinfo.value) or "cdiv()" in str(excinfo.value)


def test_zero_to_a_negative_power_is_an_expr_error():
    with pytest.raises(ExprError):
        evaluate("n ** -1", {"n": 0})


@pytest.mark.parametrize("text", ["2 ** 65", "2 ** n"])
def test_huge_exponents_are_refused(text):
    with pytest.raises(ExprError, match="too large"):
        evaluate(text, {"n": 1000})


@pytest.mark.parametrize("text", ["min()", "cdiv(1)", "ceil(1, 2)", "max(3)"])
def test_bad_function_arity_is_an_expr_error(text):
    with pytest.raises(ExprError):
        evaluate(text, {})


def test_parse_is_independent_of_the_scalars():
    expr = parse("cdiv(n, 128)")
    assert expr.eval({"n": 1}) == 1
    assert expr.eval({"n": 1000}) == 8


@pytest.mark.parametrize("text", ["-" * 1000 + "n", "+".join(["n"] * 5000), "(" * 300 + "n" + ")" * 300,
                                  "-" * 100 + "n", "+".join(["n"] * 100)])
def test_deep_or_long_expressions_are_refused_not_recursed(text):
    with pytest.raises(ExprError, match="characters long|nested|cannot parse"):
        evaluate(text, {"n": 1})


@pytest.mark.parametrize("text", ["(((10**64)**64)**64)**64", "10**30", "2**64 * 2", "9" * 30, "n ** 64"])
def test_results_beyond_64_bits_are_refused_before_they_are_computed(text):
    with pytest.raises(ExprError, match="too large|beyond 2"):
        evaluate(text, {"n": 3})


def test_a_value_of_2_to_the_63_is_fine():
    assert evaluate("2**63 - 1", {}) == 2**63 - 1


def test_launch_limits():
    assert launch_problems([2**31 - 1, 65535, 65535], [1024, 1, 1], 228 * 1024) == []
    problems = launch_problems([2**31, 1, 1], [32, 32, 2], -1)
    assert any("grid.x" in p for p in problems)
    assert any("2048 threads" in p for p in problems)
    assert any("shared_bytes = -1" in p for p in problems)
