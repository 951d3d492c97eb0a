"""A safe arithmetic evaluator: the `calculator` tool's engine.

Threat model: the expression is model-written text. It is parsed with `ast`
and walked; only number literals, the binary operators `+ - * / // % **`,
unary `+`/`-` and parentheses are accepted. Names, calls, attribute access,
subscripts, strings and every other node are refused, so nothing is looked up
and nothing runs: `eval`/`exec` are never used. Arithmetic is exact
(`fractions.Fraction`), and bounded so it stays cheap: the expression's length
and node count, the exponent (an integer, at most `MAX_EXPONENT` in size), and
the size of every intermediate value. Anything refused or undefined (division
by zero) raises `ValueError` with a message meant for the model.
"""

from __future__ import annotations

import ast
import decimal
import operator
from collections.abc import Callable
from fractions import Fraction

MAX_EXPRESSION_CHARS = 500
MAX_NODES = 200
MAX_EXPONENT = 1000
MAX_DIGITS = 400  # bound on the digits of any numerator or denominator along the way
DECIMALS = 12  # non-terminating results are shown rounded to this many places

_BINARY: dict[type[ast.operator], Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


def _check_size(value: Fraction) -> Fraction:
    bits = max(value.numerator.bit_length(), value.denominator.bit_length())
    if bits * 0.302 > MAX_DIGITS:  # log10(2) ~= 0.30103
        raise ValueError(f"a value has more than {MAX_DIGITS} digits; too large")
    return value


def _literal(value: object) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"only numbers are allowed, not {value!r}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{value!r} is not a finite number")
        return _check_size(Fraction(repr(value)))  # repr keeps the decimal as written
    return _check_size(Fraction(value))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ValueError("exponents must be whole numbers")
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent {exponent} is larger than {MAX_EXPONENT}")
    size = max(abs(base.numerator), base.denominator)
    if size > 1 and size.bit_length() * 0.302 * abs(int(exponent)) > MAX_DIGITS + 10:
        raise ValueError(f"the power has more than {MAX_DIGITS} digits; too large")
    return base ** int(exponent)


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        return _literal(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _evaluate(node.left), _evaluate(node.right)
        try:
            if isinstance(node.op, ast.Pow):
                return _check_size(_power(left, right))
            if type(node.op) in _BINARY:
                return _check_size(_BINARY[type(node.op)](left, right))
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
    raise ValueError(
        f"unsupported syntax {type(node).__name__!r}: use numbers, + - * / // % ** and parentheses"
    )


def evaluate(expression: str) -> Fraction:
    """The exact value of an arithmetic expression; ValueError if it is refused."""
    if not isinstance(expression, str):
        raise ValueError(f"the expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"invalid expression: {err.msg}") from None
    except (RecursionError, MemoryError):
        raise ValueError("the expression is nested too deeply") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ValueError(f"the expression has more than {MAX_NODES} parts")
    return _evaluate(tree)


def format_number(value: Fraction) -> str:
    """A value as plain decimal text: exact when it terminates, else rounded to DECIMALS."""
    if value.denominator == 1:
        return str(value.numerator)
    with decimal.localcontext() as ctx:
        ctx.prec = MAX_DIGITS + DECIMALS + 10
        ctx.rounding = decimal.ROUND_HALF_EVEN
        quotient = decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)
        text = format(quotient.quantize(decimal.Decimal(1).scaleb(-DECIMALS)), "f")
    text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def calculate(expression: str) -> str:
    """The `calculator` tool's body: the value of `expression` as text."""
    return format_number(evaluate(expression))


def same_value(expected: str, actual: object) -> bool:
    """Whether two expressions evaluate to the same number; False if either is refused."""
    try:
        return evaluate(expected) == evaluate(actual)  # type: ignore[arg-type]
    except ValueError:
        return False
