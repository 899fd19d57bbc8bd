"""Integer expressions over a case's scalars: buffer sizes, shapes, grid and block dimensions.

Suite files are reviewed text, but they still must never run arbitrary Python: expressions are
parsed with :mod:`ast` and only a whitelist of node types is evaluated.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

_FUNCTIONS = {
    "cdiv": lambda a, b: -(-a // b),
    "min": min,
    "max": max,
    "ceil": math.ceil,
    "floor": math.floor,
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Div: lambda a, b: a / b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}
ALLOWED = "integers, scalar names, + - * / // % **, parentheses and cdiv/min/max/ceil/floor"


class ExprError(ValueError):
    """An expression that cannot be parsed or evaluated; the message says which and why."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression; ``names`` are the scalars it reads."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    def eval(self, scalars: Mapping[str, int | float]) -> int:
        value = _eval(self.tree.body, scalars, self.text)
        if isinstance(value, float):
            if not value.is_integer():
                raise ExprError(f"expression {self.text!r} gives {value}, not a whole number")
            value = int(value)
        return value


@lru_cache(maxsize=4096)
def parse(text: str | int) -> Expr:
    """Parse ``text`` (an int is accepted as its own expression)."""
    source = str(text).strip()
    if not source:
        raise ExprError("empty expression")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {source!r}: {exc.msg}; allowed: {ALLOWED}") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS or node.keywords:
                raise ExprError(f"{source!r}: only cdiv/min/max/ceil/floor calls are allowed")
        elif isinstance(node, ast.Name):
            if node.id not in _FUNCTIONS:
                names.add(node.id)
        elif isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                raise ExprError(f"{source!r}: constant {node.value!r} is not a number")
        elif isinstance(node, ast.BinOp):
            if type(node.op) not in _BINOPS:
                raise ExprError(f"{source!r}: operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.UnaryOp):
            if not isinstance(node.op, (ast.USub, ast.UAdd)):
                raise ExprError(f"{source!r}: operator {type(node.op).__name__} is not allowed")
        elif not isinstance(node, (ast.Expression, ast.Load, ast.operator, ast.unaryop)):
            raise ExprError(f"{source!r}: {type(node).__name__} is not allowed; allowed: {ALLOWED}")
    return Expr(source, tree, frozenset(names))


def evaluate(text: str | int, scalars: Mapping[str, int | float]) -> int:
    return parse(text).eval(scalars)


def _eval(node: ast.AST, scalars: Mapping[str, int | float], text: str):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in scalars:
            known = ", ".join(sorted(scalars)) or "none"
            raise ExprError(f"{text!r} uses {node.id!r}, which is not a scalar of this case (known: {known})")
        return scalars[node.id]
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, scalars, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _eval(node.left, scalars, text)
        right = _eval(node.right, scalars, text)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ExprError(f"{text!r}: division by zero")
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ExprError(f"{text!r}: exponent {right} is too large")
        try:
            value = _BINOPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError) as exc:
            raise ExprError(f"{text!r}: {exc}") from None
        if isinstance(value, complex):
            raise ExprError(f"{text!r}: the result is not a real number")
        return value
    if isinstance(node, ast.Call):
        args = [_eval(arg, scalars, text) for arg in node.args]
        try:
            return _FUNCTIONS[node.func.id](*args)
        except (TypeError, ZeroDivisionError) as exc:
            raise ExprError(f"{text!r}: {node.func.id}(): {exc}") from None
    raise ExprError(f"{text!r}: cannot evaluate {type(node).__name__}")
