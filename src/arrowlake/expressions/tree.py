"""The filter expression tree: immutable nodes built with operators or parsed from a string.

>>> from arrowlake.expressions import col
>>> expr = (col("x") > 3) & col("name").isin(["a", "b"]) | col("y").is_null()
>>> print(expr)
x > 3 AND name IN ('a', 'b') OR y IS NULL

Nodes compare structurally with ``==`` (``(col("x") > 3) == (col("x") > 3)`` is ``True``), except
:class:`Column`, whose ``==`` builds a predicate. Nodes never have a truth value: Python's
``and``/``or``/``not`` cannot be overloaded, so using them on a filter raises ``TypeError`` instead
of silently keeping one side.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import Any, ClassVar
from typing import Literal as TypingLiteral

from arrowlake.errors import ValidationError
from arrowlake.expressions.literal_values import normalize_value, normalize_values

ComparisonOp = TypingLiteral["=", "!=", "<", "<=", ">", ">="]

#: The operator that gives the same result with the operands swapped (``3 < x`` is ``x > 3``).
SWAPPED_OP: dict[str, ComparisonOp] = {
    "=": "=",
    "!=": "!=",
    "<": ">",
    "<=": ">=",
    ">": "<",
    ">=": "<=",
}
#: The operator of the negated comparison under SQL's three-valued logic, ignoring NaN.
NEGATED_OP: dict[str, ComparisonOp] = {
    "=": "!=",
    "!=": "=",
    "<": ">=",
    "<=": ">",
    ">": "<=",
    ">=": "<",
}

# Words the parser treats as syntax; a column with such a name is printed double-quoted.
RESERVED_WORDS = frozenset(
    {"AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE", "BETWEEN", "LIKE"}
)
_BARE_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")

_BOOL_MISUSE = (
    "A filter expression has no truth value: combine filters with & (and), | (or) and ~ (not) "
    "instead of 'and', 'or', 'not', and wrap comparisons in parentheses: "
    "(col('a') > 1) & (col('b') < 2)"
)


def _structural_key(value: Any) -> Any:
    if isinstance(value, _Node):
        return value._key()
    if isinstance(value, tuple):
        return tuple([_structural_key(v) for v in value])
    if isinstance(value, float) and value != value:
        return ("float", "nan")  # NaN is one literal, though it equals nothing
    # The type is part of the key so that TRUE and 1, or 1 and 1.0, are different literals.
    return (type(value).__name__, value)


class _Node:
    """Structural equality and hashing for every node (dataclass fields, in order)."""

    __slots__ = ()

    def _key(self) -> tuple[Any, ...]:
        # Computed once per node (nodes are immutable): comparing and hashing long filters
        # costs one pass, and the recursion is only as deep as the nesting (see MAX_NESTING).
        cached: tuple[Any, ...] | None = getattr(self, "_cached_key", None)
        if cached is None:
            cached = (
                type(self).__name__,
                *[_structural_key(getattr(self, f.name)) for f in fields(self)],  # type: ignore[arg-type]
            )
            object.__setattr__(self, "_cached_key", cached)
        return cached

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, _Node):
            return NotImplemented
        return self._key() == other._key()

    def __ne__(self, other: object) -> bool:
        if not isinstance(other, _Node):
            return NotImplemented
        return self._key() != other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_cached_key", None)  # rebuilt on demand; it doubles a long IN's size
        return state


# ---------------------------------------------------------------------------------------------
# Terms: the operands of predicates


@dataclass(frozen=True, eq=False, repr=False)
class Column(_Node):
    """A reference to a column by name; ``name`` may contain dots (``"source.ts"``).

    Comparison operators on a column build predicates, so ``col("a") == 1`` is a filter, not a
    ``bool``.
    """

    name: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValidationError(f"A column name must be a non-empty string, got {self.name!r}")

    # Python's comparison protocol: returning a node instead of a bool is what makes
    # ``col("x") > 3`` a filter. ``3 < col("x")`` reaches ``__gt__`` by reflection.
    def __eq__(self, other: object) -> Comparison:  # type: ignore[override]
        return _compare("=", self, other)

    def __ne__(self, other: object) -> Comparison:  # type: ignore[override]
        return _compare("!=", self, other)

    def __lt__(self, other: object) -> Comparison:
        return _compare("<", self, other)

    def __le__(self, other: object) -> Comparison:
        return _compare("<=", self, other)

    def __gt__(self, other: object) -> Comparison:
        return _compare(">", self, other)

    def __ge__(self, other: object) -> Comparison:
        return _compare(">=", self, other)

    def __hash__(self) -> int:
        return hash(("Column", self.name))

    def __bool__(self) -> bool:
        raise TypeError(_BOOL_MISUSE)

    def isin(self, values: Iterable[Any]) -> In:
        """Rows whose value is one of ``values`` (SQL ``IN``).

        >>> print(col("x").isin([1, 2, 3]))
        x IN (1, 2, 3)
        """
        return In(self, normalize_values(values, _value_of))

    def is_null(self) -> IsNull:
        """Rows where the column is null."""
        return IsNull(self)

    def is_not_null(self) -> IsNotNull:
        """Rows where the column is not null."""
        return IsNotNull(self)

    not_null = is_not_null

    def between(self, lo: Any, hi: Any) -> Expr:
        """Rows with ``lo <= value <= hi`` (both ends included, as in SQL ``BETWEEN``).

        >>> print(col("x").between(1, 5))
        x >= 1 AND x <= 5
        """
        return And(_compare(">=", self, lo), _compare("<=", self, hi))

    def startswith(self, prefix: str) -> StartsWith:
        """Rows whose string value starts with ``prefix`` (SQL ``LIKE 'prefix%'``).

        >>> print(col("name").startswith("ab"))
        name LIKE 'ab%'
        """
        if not isinstance(prefix, str):
            raise ValidationError(f"startswith() needs a str prefix, got {prefix!r}")
        return StartsWith(self, prefix)

    def __repr__(self) -> str:
        return f"col({self.name!r})"

    def __str__(self) -> str:
        return format_identifier(self.name)


@dataclass(frozen=True, eq=False, repr=False)
class Literal(_Node):
    """A constant value: None, bool, int, float, str, bytes, Decimal, date, datetime, time,
    or timedelta. Its type is reconciled with the column's type when the filter is bound."""

    value: Any

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _value_of(self.value))

    def __eq__(self, other: object) -> Any:
        # ``lit(3) == col("x")``: let the column build the predicate by reflection.
        if isinstance(other, Column):
            return NotImplemented
        return super().__eq__(other)

    def __ne__(self, other: object) -> Any:
        if isinstance(other, Column):
            return NotImplemented
        return super().__ne__(other)

    __hash__ = _Node.__hash__

    def __repr__(self) -> str:
        return f"lit({self.value!r})"

    def __str__(self) -> str:
        return format_value(self.value)


Term = Column | Literal


def _value_of(value: Any) -> Any:
    """A literal's value: another literal's, or ``value`` normalized."""
    return value.value if isinstance(value, Literal) else normalize_value(value)


def col(name: str) -> Column:
    """A column reference.

    >>> print((col("x") >= 1) & (col("source.ts") > col("target.ts")))
    x >= 1 AND source.ts > target.ts
    """
    return Column(name)


def lit(value: Any) -> Literal:
    """A literal value, for when the constant has to come first or be explicit.

    >>> print(lit(3) < col("x"))
    x > 3
    """
    return Literal(value)


def _compare(op: ComparisonOp, left: Column, right: object) -> Comparison:
    if isinstance(right, Column):
        return Comparison(op, left, right)
    if isinstance(right, _Node) and not isinstance(right, Literal):
        raise ValidationError(f"Cannot compare column {left.name!r} with the filter {right}")
    return Comparison(op, left, right if isinstance(right, Literal) else Literal(right))


# ---------------------------------------------------------------------------------------------
# Boolean expressions


class Expr(_Node):
    """A boolean filter expression. Combine with ``&``, ``|`` and ``~``."""

    __slots__ = ()

    def __and__(self, other: Expr | bool) -> Expr:
        return _and(self, _as_expr(other))

    def __rand__(self, other: Expr | bool) -> Expr:
        return _and(_as_expr(other), self)

    def __or__(self, other: Expr | bool) -> Expr:
        return _or(self, _as_expr(other))

    def __ror__(self, other: Expr | bool) -> Expr:
        return _or(_as_expr(other), self)

    def __invert__(self) -> Expr:
        return Not(self)

    def __bool__(self) -> bool:
        raise TypeError(_BOOL_MISUSE)

    def __str__(self) -> str:
        return format_filter(self)

    # The filter syntax is unambiguous and short, which makes it the most useful repr in
    # logs, test failures and notebooks.
    def __repr__(self) -> str:
        return format_filter(self)


def _as_expr(value: Expr | bool) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return AlwaysTrue() if value else AlwaysFalse()
    raise TypeError(f"Cannot combine a filter with {value!r}; both sides must be filters")


def _and(left: Expr, right: Expr) -> Expr:
    # Constant sides fold away, so ``and_all`` and chained ``&`` never carry a TRUE around.
    if isinstance(left, AlwaysFalse) or isinstance(right, AlwaysFalse):
        return AlwaysFalse()
    if isinstance(left, AlwaysTrue):
        return right
    if isinstance(right, AlwaysTrue):
        return left
    return And(left, right)


def _or(left: Expr, right: Expr) -> Expr:
    if isinstance(left, AlwaysTrue) or isinstance(right, AlwaysTrue):
        return AlwaysTrue()
    if isinstance(left, AlwaysFalse):
        return right
    if isinstance(right, AlwaysFalse):
        return left
    return Or(left, right)


@dataclass(frozen=True, eq=False, repr=False)
class AlwaysTrue(Expr):
    """Matches every row (the filter of an unfiltered scan)."""


@dataclass(frozen=True, eq=False, repr=False)
class AlwaysFalse(Expr):
    """Matches no row."""


#: How deeply AND, OR and NOT may nest in one filter. Chains of one kind do not nest (``a OR b
#: OR c ...`` is one node with many children, however long), so this limits only alternations
#: such as ``a AND (b OR (c AND ...))`` and stacked NOTs. Every visitor recurses at most this
#: deep, and so do pickle, Spark and Arrow, which have no other bound.
MAX_NESTING = 100


def _depth(node: Expr) -> int:
    depth: int = getattr(node, "_depth", 1)  # leaves are 1
    return depth


class _Junction(Expr):
    """An n-ary AND or OR. Operands of the same kind are absorbed: ``And(And(a, b), c)`` is
    ``And(a, b, c)``, which is what keeps long chains flat for every visitor."""

    __slots__ = ()
    children: tuple[Expr, ...]

    def __init__(self, *operands: Expr) -> None:
        flat: list[Expr] = []
        depth = 0
        kind = type(self)
        for operand in operands:
            if not isinstance(operand, Expr):
                raise TypeError(f"{kind.__name__}() takes filters, got {operand!r}")
            if type(operand) is kind:
                flat.extend(operand.children)
                depth = max(depth, _depth(operand) - 1)
            else:
                flat.append(operand)
                depth = max(depth, _depth(operand))
        if len(flat) < 2:
            raise TypeError(f"{kind.__name__}() needs at least two operands, got {len(flat)}")
        _check_depth(depth + 1)
        object.__setattr__(self, "children", tuple(flat))
        object.__setattr__(self, "_depth", depth + 1)

    # The binary view of older code: ``left`` is all but the last operand.
    @property
    def left(self) -> Expr:
        rest = self.children[:-1]
        return rest[0] if len(rest) == 1 else type(self)(*rest)

    @property
    def right(self) -> Expr:
        return self.children[-1]


def _check_depth(depth: int) -> None:
    if depth > MAX_NESTING:
        raise ValidationError(
            f"The filter nests AND, OR and NOT more than {MAX_NESTING} levels deep; write it "
            "flatter: a chain of one kind does not nest (a OR b OR c ...), nor does a list of "
            "values (x IN (1, 2, 3)), and NOT can be folded into its operand (x != 1)"
        )


@dataclass(frozen=True, eq=False, repr=False, init=False)
class And(_Junction):
    """All operands hold: ``And(a, b, c)`` is ``a AND b AND c``."""

    children: tuple[Expr, ...]


@dataclass(frozen=True, eq=False, repr=False, init=False)
class Or(_Junction):
    """Some operand holds: ``Or(a, b, c)`` is ``a OR b OR c``."""

    children: tuple[Expr, ...]


@dataclass(frozen=True, eq=False, repr=False)
class Not(Expr):
    child: Expr

    def __post_init__(self) -> None:
        if not isinstance(self.child, Expr):
            raise TypeError(f"Not() takes a filter, got {self.child!r}")
        depth = _depth(self.child) + 1
        _check_depth(depth)
        object.__setattr__(self, "_depth", depth)


@dataclass(frozen=True, eq=False, repr=False)
class Comparison(Expr):
    """``left op right``; the column is always on the left (``3 < x`` is stored as ``x > 3``)."""

    op: ComparisonOp
    left: Column
    right: Column | Literal

    OPS: ClassVar[frozenset[str]] = frozenset(SWAPPED_OP)

    def __post_init__(self) -> None:
        if self.op not in self.OPS:
            raise ValidationError(f"Unknown comparison operator {self.op!r}")
        if isinstance(self.right, Literal) and self.right.value is None:
            # SQL would make this NULL (never true); nobody writes it on purpose.
            negation = "NOT " if self.op == "!=" else ""
            raise ValidationError(
                f"Comparing column {self.left.name!r} with NULL using '{self.op}' is never true; "
                f"use {format_identifier(self.left.name)} IS {negation}NULL "
                f"(col(...).is_{'not_' if negation else ''}null()) instead"
            )


@dataclass(frozen=True, eq=False, repr=False)
class In(Expr):
    """``column IN (values)``; ``NOT IN`` is ``Not(In(...))``. A NULL among the values makes
    non-matching rows NULL rather than false, as in SQL."""

    column: Column
    values: tuple[Any, ...]


@dataclass(frozen=True, eq=False, repr=False)
class IsNull(Expr):
    column: Column


@dataclass(frozen=True, eq=False, repr=False)
class IsNotNull(Expr):
    column: Column


@dataclass(frozen=True, eq=False, repr=False)
class StartsWith(Expr):
    """String prefix match, SQL ``column LIKE 'prefix%'``."""

    column: Column
    prefix: str


# ---------------------------------------------------------------------------------------------
# Functions over trees


def _operands(node: Any) -> list[Any]:
    """The nodes directly below ``node`` (children of AND/OR, NOT's child, a predicate's
    column and literal)."""
    if isinstance(node, _Junction):
        return list(node.children)
    if isinstance(node, Comparison):
        return [node.left, node.right]
    if isinstance(node, (In, IsNull, IsNotNull, StartsWith)):
        return [node.column]
    if isinstance(node, _Node):
        return [v for f in fields(node) if isinstance(v := getattr(node, f.name), _Node)]  # type: ignore[arg-type]
    return []


def referenced_columns(expr: Expr) -> set[str]:
    """Names of all columns a filter reads.

    >>> sorted(referenced_columns((col("a") > 1) | (col("b") == col("c"))))
    ['a', 'b', 'c']
    """
    names: set[str] = set()
    stack: list[Any] = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, Column):
            names.add(node.name)
        else:
            stack.extend(_operands(node))
    return names


def rename_columns(expr: Expr, mapping: Mapping[str, str]) -> Expr:
    """The same filter with columns renamed; names missing from ``mapping`` are kept.

    >>> print(rename_columns(col("ts") > col("target.ts"), {"ts": "source.ts"}))
    source.ts > target.ts
    """

    def rename(node: Any) -> Any:
        if isinstance(node, Column):
            return Column(mapping.get(node.name, node.name))
        if isinstance(node, _Junction):  # recursion only as deep as the nesting
            return type(node)(*[rename(child) for child in node.children])
        if isinstance(node, (Expr, Literal)) and not isinstance(node, (AlwaysTrue, AlwaysFalse)):
            changes = {f.name: rename(getattr(node, f.name)) for f in fields(node)}  # type: ignore[arg-type]
            return type(node)(**changes)
        return node

    result: Expr = rename(expr)
    return result


def conjuncts(expr: Expr) -> list[Expr]:
    """The top-level AND terms of a filter, left to right (``AlwaysTrue`` has none).

    >>> conjuncts((col("a") > 1) & ((col("b") == 2) | (col("c") == 3)) & col("d").is_null())
    [a > 1, b = 2 OR c = 3, d IS NULL]
    """
    if isinstance(expr, AlwaysTrue):
        return []
    if isinstance(expr, And):
        return list(expr.children)
    return [expr]


# ---------------------------------------------------------------------------------------------
# Printing in the filter syntax (what ``parse_filter`` reads back)


def format_identifier(name: str) -> str:
    """A column name as the parser reads it: bare when possible, else ``"double quoted"``."""
    if _BARE_IDENTIFIER.fullmatch(name) and not any(
        part.upper() in RESERVED_WORDS for part in name.split(".")
    ):
        return name
    return '"' + name.replace('"', '""') + '"'


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def format_value(value: Any) -> str:
    """A literal value in the filter syntax (``'it''s'``, ``DATE '2026-11-01'``, ``TRUE``)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            return f"DOUBLE {_quote(repr(value))}"
        return repr(value)
    if isinstance(value, Decimal):
        return f"DECIMAL {_quote(str(value))}"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, bytes):
        return f"X'{value.hex()}'"
    if isinstance(value, _dt.datetime):
        return f"TIMESTAMP {_quote(value.isoformat(sep=' '))}"
    if isinstance(value, _dt.date):
        return f"DATE {_quote(value.isoformat())}"
    if isinstance(value, _dt.time):
        return f"TIME {_quote(value.isoformat())}"
    if isinstance(value, _dt.timedelta):
        return f"INTERVAL {_quote(format_seconds(value))} SECOND"
    return repr(value)  # unreachable for normalized literals


def format_seconds(value: _dt.timedelta) -> str:
    """A duration as exact decimal seconds (``'-90.000001'``, ``'0.000000001'``); floats
    (``total_seconds()``) lose microseconds past 2**33 seconds."""
    nanos = getattr(value, "value", None)  # pandas.Timedelta: its integer nanoseconds
    if isinstance(nanos, int):
        total, digits = nanos, 9
    else:
        total = (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
        digits = 6
    whole, fraction = divmod(abs(total), 10**digits)
    sign = "-" if total < 0 else ""
    return f"{sign}{whole}" + (f".{fraction:0{digits}d}".rstrip("0") if fraction else "")


def _format_like_prefix(prefix: str) -> str:
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return _quote(escaped + "%")


_PRECEDENCE = {Or: 1, And: 2, Not: 3}


def format_filter(expr: Expr) -> str:
    """The filter in the syntax :func:`parse_filter` reads (``str(expr)`` does the same)."""

    def fmt(node: Expr, parent_precedence: int) -> str:
        precedence = _PRECEDENCE.get(type(node), 4)
        text = fmt_node(node)
        return f"({text})" if precedence < parent_precedence else text

    def fmt_node(node: Expr) -> str:
        if isinstance(node, AlwaysTrue):
            return "TRUE"
        if isinstance(node, AlwaysFalse):
            return "FALSE"
        if isinstance(node, _Junction):
            word, precedence = (" AND ", 2) if isinstance(node, And) else (" OR ", 1)
            # Operands are never of the node's own kind (they are absorbed), so parentheses
            # appear exactly where an OR sits inside an AND; recursion is as deep as nesting.
            return word.join([fmt(child, precedence) for child in node.children])
        if isinstance(node, Not):
            child = node.child
            if isinstance(child, In) and child.values:
                return f"{child.column} NOT IN ({_format_values(child.values)})"
            if isinstance(child, StartsWith):
                return f"{child.column} NOT LIKE {_format_like_prefix(child.prefix)}"
            # Comparisons bind tighter than NOT; parentheses only make that visible.
            return f"NOT {fmt(child, 5 if not isinstance(child, Not) else 3)}"
        if isinstance(node, Comparison):
            return f"{node.left} {node.op} {node.right}"
        if isinstance(node, In):
            if not node.values:
                return "FALSE"  # SQL has no empty IN list; nothing matches one
            return f"{node.column} IN ({_format_values(node.values)})"
        if isinstance(node, IsNull):
            return f"{node.column} IS NULL"
        if isinstance(node, IsNotNull):
            return f"{node.column} IS NOT NULL"
        if isinstance(node, StartsWith):
            return f"{node.column} LIKE {_format_like_prefix(node.prefix)}"
        raise TypeError(f"Not a filter expression: {node!r}")

    return fmt(expr, 0)


def _format_values(values: tuple[Any, ...]) -> str:
    return ", ".join(format_value(v) for v in values)
