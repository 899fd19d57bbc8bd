"""Integer expressions over a case's scalars: buffer sizes, shapes, grid and block dimensions.

Suite files are reviewed text, but they still must never run arbitrary Python: expressions are
parsed with :mod:`ast` and only a whitelist of node types is evaluated. They come from pull requests
and from a model's answers too, so evaluation is bounded: the text's length and nesting are capped
before anything recurses, every operand and intermediate value must lie within ±2**64 (a power is
refused before it is computed when its result would not), and every float must be finite. The
results are then checked against what they feed: the device's launch limits and buffer sizes.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

# What a result feeds: the device's launch limits and buffer sizes, as the worker enforces them.
from cudagate_harness.protocol import BLOCK_MAX, BLOCK_THREADS_MAX, BUFFER_BYTES_MAX, GRID_MAX, SHARED_BYTES_MAX

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

MAX_LENGTH = 512  # characters; a launch or size expression is a line at most
MAX_NESTING = 32  # AST depth; `a+b+c+...` nests one level per term
BOUND = 2**64  # every operand and intermediate value lies within ±BOUND



class ExprError(ValueError):
    """An expression that cannot be parsed or evaluated; the message says which and why."""


@dataclass(frozen=True)
class Expr:
    """A parsed expression; ``names`` are the scalars it reads."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    def eval(self, scalars: Mapping[str, int | float]) -> int:
        value = self.value(scalars)
        if isinstance(value, float):
            if not value.is_integer():
                raise ExprError(f"expression {self.text!r} gives {value}, not a whole number")
            value = int(value)
        return value

    def value(self, scalars: Mapping[str, int | float]) -> int | float:
        """The value as computed, a float left as it is (a derived scalar such as ``1 - 0.9**step``)."""
        return _eval(self.tree.body, scalars, self.text)


def _depth(tree: ast.AST) -> int:
    """The AST's depth, measured with an explicit stack (the tree may be deep)."""
    deepest, todo = 0, [(tree, 1)]
    while todo:
        node, level = todo.pop()
        deepest = max(deepest, level)
        if deepest > MAX_NESTING:
            break
        todo.extend((child, level + 1) for child in ast.iter_child_nodes(node))
    return deepest


@lru_cache(maxsize=4096)
def parse(text: str | int) -> Expr:
    """Parse ``text`` (an int is accepted as its own expression)."""
    if isinstance(text, int) and not isinstance(text, bool) and abs(text) > BOUND:
        raise ExprError(f"the number {_short(text)} is out of range (at most 2**64 in size)")
    source = str(text).strip()
    if not source:
        raise ExprError("empty expression")
    if len(source) > MAX_LENGTH:
        raise ExprError(f"expression {source[:40]!r}... is {len(source)} characters long (at most {MAX_LENGTH}); "
                        "simplify it")
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {source!r}: {exc.msg}; allowed: {ALLOWED}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExprError(f"{source[:40]!r}... is nested too deeply to parse; simplify it") from None
    if _depth(tree) > MAX_NESTING:
        raise ExprError(f"{source[:40]!r}: nested more than {MAX_NESTING} levels (operators or terms); simplify it")
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
            _bounded(node.value, source)
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


def _short(value) -> str:
    """A number for a message; a huge int is never formatted in full (that alone can take seconds)."""
    if isinstance(value, int) and abs(value) > BOUND:
        return f"an integer of {value.bit_length()} bits"
    return repr(value)


def _bounded(value, text: str):
    if isinstance(value, float) and not math.isfinite(value):
        raise ExprError(f"{text!r}: a value is not finite ({value})")
    if abs(value) > BOUND:
        raise ExprError(f"{text!r}: a value ({_short(value)}) is beyond 2**64; check the expression")
    return value


def _power(left, right, text: str):
    """``left ** right``, refused before computing when the result would be beyond BOUND. A power that
    cannot grow (a base within ±1 to a positive exponent, e.g. a bias correction ``0.9**step``) takes
    any exponent within BOUND: it costs at most 64 squarings."""
    magnitude = abs(left)
    if magnitude <= 1 and right >= 0:
        return left**right
    if abs(right) > 64:
        raise ExprError(f"{text!r}: exponent {_short(right)} is too large")
    if right > 0 and magnitude > 1 and right * math.log2(magnitude) > 64:
        raise ExprError(f"{text!r}: {_short(left)} ** {_short(right)} is too large (beyond 2**64)")
    if left == 0 and right < 0:
        raise ExprError(f"{text!r}: division by zero (0 to a negative power)")
    return left**right


def _eval(node: ast.AST, scalars: Mapping[str, int | float], text: str):
    # Recursion is bounded: parse() refused trees deeper than MAX_NESTING.
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in scalars:
            known = ", ".join(sorted(scalars)) or "none"
            raise ExprError(f"{text!r} uses {node.id!r}, which is not a scalar of this case (known: {known})")
        value = scalars[node.id]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ExprError(f"{text!r}: scalar {node.id!r} is {type(value).__name__}, not a number")
        return _bounded(value, text)
    if isinstance(node, ast.UnaryOp):
        value = _eval(node.operand, scalars, text)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left = _eval(node.left, scalars, text)
        right = _eval(node.right, scalars, text)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ExprError(f"{text!r}: division by zero")
        try:
            if isinstance(node.op, ast.Pow):
                value = _power(left, right, text)
            else:
                value = _BINOPS[type(node.op)](left, right)
        except (ZeroDivisionError, OverflowError) as exc:
            raise ExprError(f"{text!r}: {exc}") from None
        if isinstance(value, complex):
            raise ExprError(f"{text!r}: the result is not a real number")
        return _bounded(value, text)
    if isinstance(node, ast.Call):
        args = [_eval(arg, scalars, text) for arg in node.args]
        try:
            return _bounded(_FUNCTIONS[node.func.id](*args), text)
        except (TypeError, ZeroDivisionError, ValueError, OverflowError) as exc:
            raise ExprError(f"{text!r}: {node.func.id}(): {exc}") from None
    raise ExprError(f"{text!r}: cannot evaluate {type(node).__name__}")


def launch_problems(grid: list[int], block: list[int], shared_bytes: int) -> list[str]:
    """How a resolved launch breaks the device's limits (empty when it fits)."""
    problems = []
    for what, dims, limits in (("grid", grid, GRID_MAX), ("block", block, BLOCK_MAX)):
        for axis, value, limit in zip("xyz", dims, limits):
            if not 1 <= value <= limit:
                problems.append(f"{what}.{axis} = {_short(value)} is outside 1..{limit}")
    if all(1 <= b for b in block) and math.prod(block) > BLOCK_THREADS_MAX:
        problems.append(f"block {list(block)} has {math.prod(block)} threads, over the {BLOCK_THREADS_MAX} a block may hold")
    if not 0 <= shared_bytes <= SHARED_BYTES_MAX:
        problems.append(f"shared_bytes = {_short(shared_bytes)} is outside 0..{SHARED_BYTES_MAX} (228 KiB)")
    return problems


def buffer_problem(count: int, itemsize: int) -> str | None:
    """Why ``count`` elements of ``itemsize`` bytes cannot be a buffer, or None."""
    if count < 0:
        return f"gets a negative size ({count})"
    if count * itemsize > BUFFER_BYTES_MAX:
        return f"gets {_short(count)} elements, over the {BUFFER_BYTES_MAX} bytes a buffer may hold"
    return None


# Conditions (a kernel's `requires:`): comparisons of the expressions above, joined by and/or/not.
_COMPARE = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
CONDITION = "a comparison (== != < <= > >=) of integer expressions over the scalars, joined by and, or, not"


@dataclass(frozen=True)
class Condition:
    """A parsed condition; ``names`` are the scalars it reads. Its comparisons' operands are
    expressions :func:`parse` accepts, with every bound of theirs."""

    text: str
    tree: ast.Expression
    names: frozenset[str]

    def holds(self, scalars: Mapping[str, int | float]) -> bool:
        return _holds(self.tree.body, scalars, self.text)


def _operands(node: ast.AST, source: str) -> list[ast.AST]:
    """The arithmetic operands of a condition's boolean nodes; refuses a node that is not boolean."""
    if isinstance(node, ast.BoolOp):
        return [leaf for value in node.values for leaf in _operands(value, source)]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return _operands(node.operand, source)
    if isinstance(node, ast.Compare):
        for op in node.ops:
            if type(op) not in _COMPARE:
                raise ExprError(f"{source!r}: comparison {type(op).__name__} is not allowed; allowed: {CONDITION}")
        return [node.left, *node.comparators]
    raise ExprError(f"{source!r} is not a condition (true or false); write {CONDITION}, e.g. 'C % 4 == 0'")


@lru_cache(maxsize=1024)
def parse_condition(text: str) -> Condition:
    """Parse a condition: its length and nesting capped as :func:`parse` caps them, each operand
    checked by :func:`parse`."""
    if not isinstance(text, str):
        raise ExprError(f"{text!r} is not a condition (true or false); write {CONDITION}, e.g. 'C % 4 == 0'")
    source = text.strip()
    if len(source) > MAX_LENGTH:
        raise ExprError(f"condition {source[:40]!r}... is {len(source)} characters long (at most {MAX_LENGTH}); "
                        "split it into several `requires` entries")
    shown = repr(source) if len(source) <= 40 else f"{source[:40]!r}..."
    try:
        tree = ast.parse(source, mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse {shown}: {exc.msg}; allowed: {CONDITION}") from None
    except (RecursionError, MemoryError, ValueError):
        raise ExprError(f"{shown} is nested too deeply to parse; simplify it") from None
    if _depth(tree) > MAX_NESTING:
        raise ExprError(f"{shown}: nested more than {MAX_NESTING} levels; simplify it")
    names: set[str] = set()
    for operand in _operands(tree.body, source):
        try:
            names |= parse(ast.unparse(operand)).names
        except ExprError as exc:
            raise ExprError(f"in {source!r}: {exc}") from None
    return Condition(source, tree, frozenset(names))


def _holds(node: ast.AST, scalars: Mapping[str, int | float], text: str) -> bool:
    # Recursion is bounded: parse_condition() refused trees deeper than MAX_NESTING.
    if isinstance(node, ast.BoolOp):
        values = (_holds(value, scalars, text) for value in node.values)
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp):  # `not`, the only unary operator _operands lets through here
        return not _holds(node.operand, scalars, text)
    left = _eval(node.left, scalars, text)
    for op, comparator in zip(node.ops, node.comparators):
        right = _eval(comparator, scalars, text)
        if not _COMPARE[type(op)](left, right):
            return False
        left = right
    return True
