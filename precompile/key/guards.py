"""Size guards checked on every call, compiled from a manifest without ``eval`` of anything but arithmetic.

A graph with symbolic sizes is compiled for a range of sizes, under conditions the compile relied on: each
dynamic dim equals its symbol (``x.size()[0] == n``), each symbol lies in its range (``2 <= n``), and whatever
Dynamo and Inductor assumed (``n % 8 == 0``...).  ``ShapeEnv.produce_guards_expression`` writes them as one
Python expression over ``L['t<i>']``, the i-th placeholder's value; Inductor's FX graph cache evaluates that
string with ``eval``.  Here the expression comes from a manifest, which may come from a shared cache, so it is
parsed with :mod:`ast` and accepted only if every node is arithmetic, a comparison, a boolean operator, a
constant, ``L['t<i>']``, a tensor's ``.size()`` / ``.stride()`` / ``.storage_offset()``, or a call to one of a few
pure functions (``max``, ``min``, ``abs``, ``math.floor``...); anything else (an attribute, a name, a lambda, a
comprehension) is refused before anything runs.  The same parser evaluates a stored size expression
(``"16*s0"``) for given symbol values.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable, Sequence
from typing import Any

_BIN = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_CMP = (ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_UNARY = (ast.Not, ast.USub, ast.UAdd)
_FUNCS = {"max": max, "min": min, "abs": abs, "round": round, "int": int, "float": float}
_MATH = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc, "sqrt": math.sqrt, "log2": math.log2,
         "inf": math.inf, "nan": math.nan}
_TORCH = {"sym_float": float, "_sym_sqrt": math.sqrt, "sym_max": max, "sym_min": min}
_TENSOR_METHODS = ("size", "stride", "storage_offset", "dim")
_MAX_CHARS = 1 << 16
#: Deepest expression accepted (a sum of 200 sizes is 200 deep); deeper ones would exhaust the recursion of
#: Python's compiler and of :mod:`ast`'s visitors.
MAX_DEPTH = 256
#: Most bits any integer an accepted expression computes can have, bounded from the expression alone (a size is
#: below 2**63; ``s0*s1*s2`` is at most 189 bits).  ``((9**64)**64)**64`` would take seconds of CPU and gigabytes
#: on every call.
MAX_BITS = 4096
_SIZE_BITS = 64  # a placeholder's size, stride or number, a symbol's value: below 2**63
_FLOAT_BITS = 1024  # a finite float, as an int


class GuardSyntaxError(ValueError):
    """A guard or size expression holds something other than the arithmetic this module accepts."""


class _Namespace:
    def __init__(self, table: dict[str, Any]):
        self.__dict__.update(table)


_SCOPE = {"__builtins__": {}, **_FUNCS, "math": _Namespace(_MATH), "torch": _Namespace(_TORCH)}


def _bits(node: ast.AST) -> int:
    """An upper bound of the bits of any integer ``node`` (a checked expression, :func:`_check`) evaluates to,
    with every size and symbol below 2**63; a float counts as :data:`_FLOAT_BITS`.

    Raises:
        GuardSyntaxError: the bound of ``node`` or of a subexpression passes :data:`MAX_BITS`.
    """
    bits = _bound(node)
    if bits > MAX_BITS:
        raise GuardSyntaxError(f"a guard or size expression whose values can reach more than {MAX_BITS} bits: "
                               f"{ast.unparse(node)[:200]}")
    return bits


def _bound(node: ast.AST) -> int:
    kids = {id(c): _bits(c) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr)}  # every one checked
    if isinstance(node, ast.Expression):
        return kids[id(node.body)]
    if isinstance(node, ast.Constant):
        v = node.value
        return _FLOAT_BITS if isinstance(v, float) else abs(int(v or 0)).bit_length()
    if isinstance(node, (ast.Name, ast.Subscript)):  # a symbol, a placeholder's value or one of its sizes
        return _SIZE_BITS
    if isinstance(node, ast.Attribute):  # math.inf, math.nan, a tensor's method
        return _FLOAT_BITS
    if isinstance(node, ast.Compare):
        return 1
    if isinstance(node, ast.UnaryOp):
        return 1 if isinstance(node.op, ast.Not) else kids[id(node.operand)]
    if isinstance(node, (ast.BoolOp, ast.IfExp)):  # ``a or b`` is one of its operands
        return max(kids.values())
    if isinstance(node, ast.Call):  # max, min, abs, int, floor...; a tensor's size(): a size
        return max([_SIZE_BITS, *(kids[id(a)] for a in node.args)])
    if isinstance(node, ast.BinOp):
        left, right = kids[id(node.left)], kids[id(node.right)]
        if isinstance(node.op, (ast.Add, ast.Sub)):
            return max(left, right) + 1
        if isinstance(node.op, ast.Mult):
            return left + right
        if isinstance(node.op, ast.Pow):  # the exponent is a constant of at most 64 (_check)
            return left * max(1, node.right.value)  # type: ignore[attr-defined]
        if isinstance(node.op, ast.Div):
            return _FLOAT_BITS
        return left  # FloorDiv, Mod
    return MAX_BITS + 1  # nothing else passes _check


def _depth(node: ast.AST) -> int:
    """The depth of the tree under ``node``, without recursion."""
    deepest, todo = 0, [(node, 1)]
    while todo:
        n, d = todo.pop()
        deepest = max(deepest, d)
        if d <= MAX_DEPTH:
            todo.extend((c, d + 1) for c in ast.iter_child_nodes(n))
    return deepest


def _check(node: ast.AST, names: frozenset[str]) -> None:
    """Raise :class:`GuardSyntaxError` unless every node under ``node`` is allowed (see module docstring) and
    no integer it computes can pass :data:`MAX_BITS` bits."""
    for n in ast.walk(node):
        ok = isinstance(n, (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.UnaryOp, ast.Compare,
                            ast.IfExp, ast.Load, ast.Subscript, ast.Call, ast.Attribute, ast.Name, ast.Constant,
                            *_BIN, *_CMP, *_UNARY))
        if isinstance(n, ast.Constant):
            ok = isinstance(n.value, (int, float, bool)) or n.value is None
        elif isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow):
            # a small constant exponent only: 10**10**10 would stall the caller
            ok = isinstance(n.right, ast.Constant) and isinstance(n.right.value, int) and 0 <= n.right.value <= 64
        elif isinstance(n, ast.Name):
            ok = n.id in names or n.id in _FUNCS or n.id in ("math", "torch")
        elif isinstance(n, ast.Attribute):
            ok = (isinstance(n.value, ast.Name) and ((n.value.id == "math" and n.attr in _MATH)
                                                     or (n.value.id == "torch" and n.attr in _TORCH))) \
                or n.attr in _TENSOR_METHODS
        elif isinstance(n, ast.Call):
            ok = not n.keywords and (
                (isinstance(n.func, ast.Name) and n.func.id in _FUNCS)
                or (isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name)
                    and n.func.value.id in ("math", "torch"))
                or (isinstance(n.func, ast.Attribute) and n.func.attr in _TENSOR_METHODS and not n.args))
        elif isinstance(n, ast.Subscript):
            ok = isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, int)
        if not ok:
            raise GuardSyntaxError(f"{type(n).__name__} is not allowed in a guard: "
                                   f"{ast.unparse(n)[:200] if isinstance(n, ast.expr) else ''}")
    _bits(node)


class _Positional(ast.NodeTransformer):
    """``L['t3']`` -> ``a[3]``: placeholders by position in the flat input list."""

    def visit_Subscript(self, node: ast.Subscript) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.value, ast.Name) and node.value.id == "L":
            key = node.slice.value if isinstance(node.slice, ast.Constant) else None
            if not (isinstance(key, str) and key[:1] == "t" and key[1:].isdigit()):
                raise GuardSyntaxError(f"guard names L[{key!r}], not a placeholder L['t<index>']")
            return ast.copy_location(ast.Subscript(ast.Name("a", ast.Load()), ast.Constant(int(key[1:])),
                                                   ast.Load()), node)
        return node


def _parse(text: str) -> ast.Expression:
    """``text`` parsed, at most :data:`MAX_DEPTH` deep.

    Raises:
        GuardSyntaxError: not a string of at most 64 Ki characters, not an expression, or nested too deep (the
            parser's own MemoryError or RecursionError on deep nesting, ValueError on a huge literal, included).
    """
    if not isinstance(text, str) or len(text) > _MAX_CHARS:
        raise GuardSyntaxError(f"a guard must be a string of at most {_MAX_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
        raise GuardSyntaxError(f"guard does not parse: {type(err).__name__}: {str(err)[:200]}") from err
    if _depth(tree) > MAX_DEPTH:
        raise GuardSyntaxError(f"a guard nested more than {MAX_DEPTH} deep")
    return tree


class Guards:
    """The size guards of an artifact, compiled once; ``failures(flat)`` on every call.

    Args:
        text: ``ShapeEnv.produce_guards_expression`` output over ``L['t<i>']``.
        names: placeholder names, by position, for error messages.

    Raises:
        GuardSyntaxError: the expression holds something not allowed, or names a placeholder out of range.
    """

    def __init__(self, text: str, names: Sequence[str]):
        tree = _Positional().visit(_parse(text))
        _check(tree, frozenset({"a"}))
        for n in ast.walk(tree):
            if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id == "a" \
                    and not 0 <= n.slice.value < len(names):
                raise GuardSyntaxError(f"guard names placeholder {n.slice.value}; the graph has {len(names)}")
        self.text = text
        self._names = list(names)
        body = tree.body
        parts = body.values if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]
        self._all = self._compile(body)
        self._parts = [(self._describe(p), self._compile(p)) for p in parts]

    @staticmethod
    def _compile(expr: ast.expr) -> Callable[[Sequence[Any]], Any]:
        fn = ast.Expression(ast.Lambda(ast.arguments([], [ast.arg("a")], None, [], [], None, []), expr))
        ast.fix_missing_locations(fn)
        return eval(compile(fn, "<precompile guard>", "eval"), dict(_SCOPE))  # noqa: S307 - checked above

    def _describe(self, expr: ast.expr) -> str:
        class Named(ast.NodeTransformer):
            def visit_Subscript(inner, node: ast.Subscript) -> ast.AST:  # noqa: N805
                inner.generic_visit(node)
                if isinstance(node.value, ast.Name) and node.value.id == "a":
                    return ast.Name(self._names[node.slice.value], ast.Load())
                return node

        return ast.unparse(Named().visit(ast.parse(ast.unparse(expr), mode="eval")))

    def failures(self, flat: Sequence[Any]) -> list[str]:
        """The guards ``flat`` breaks, each written with placeholder names (empty when all hold)."""
        try:
            if self._all(flat):
                return []
        except Exception:  # noqa: BLE001 - a wrong type is reported per guard below
            pass
        out = []
        for text, fn in self._parts:
            try:
                ok = fn(flat)
            except Exception as err:  # noqa: BLE001
                out.append(f"{text} (cannot be evaluated: {type(err).__name__}: {err})")
                continue
            if not ok:
                out.append(text)
        return out


def evaluate_size(text: int | str, values: dict[str, int]) -> int:
    """A stored size (an int, or an expression over symbols like ``"16*s0"``) for given symbol values.

    Raises:
        GuardSyntaxError: the expression is not plain arithmetic over the given symbols.
    """
    if isinstance(text, int):
        return text
    tree = _parse(text)
    _check(tree, frozenset(values))
    return int(eval(compile(tree, "<precompile size>", "eval"), {**_SCOPE, **values}))  # noqa: S307 - checked


def with_range(text: str | None, sources: list[str], lower: int, upper: int | None) -> str:
    """``text`` with its range conditions on one symbol replaced by ``lower <= symbol <= upper``.

    A range condition is a comparison between int constants and the symbol's sources only (``2 <= L['t2']``,
    ``L['t3'].size()[0] <= 512``); every other guard stays.  ``sources`` are the symbol's sources as the guards
    write them, the first one used for the new bounds.

    Raises:
        GuardSyntaxError: ``text`` does not parse.
    """
    if not sources:
        raise GuardSyntaxError("a symbol without a source cannot be bounded")
    parts: list[ast.expr] = []
    if text:
        body = _parse(text).body
        parts = list(body.values) if isinstance(body, ast.BoolOp) and isinstance(body.op, ast.And) else [body]

    def is_bound(e: ast.expr) -> bool:
        if not isinstance(e, ast.Compare):
            return False
        sides = [e.left, *e.comparators]
        consts = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, int)]
        return bool(consts) and all(s in consts or ast.unparse(s) in sources for s in sides)

    kept = [ast.unparse(e) for e in parts if not is_bound(e)]
    bounds = [f"{int(lower)} <= {sources[0]}"] + ([f"{sources[0]} <= {int(upper)}"] if upper is not None else [])
    return " and ".join([*kept, *bounds])
