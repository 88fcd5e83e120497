"""arrowlake filters as Spark SQL conditions that keep exactly the rows arrowlake keeps.

The bound tree (:mod:`arrowlake.expressions.binding`, in negation normal form, literals coerced
to their column's type) is printed as one SQL text, which Spark parses in one call (a Column
per term would cost a JVM round trip each in a classic session) and keeps as a balanced tree
(Catalyst walks expressions recursively).

Where Spark's semantics differ from arrowlake's (docs/architecture.md, "Values"), the text
says so explicitly. Spark orders NaN above every number and makes it equal to itself; for
arrowlake every comparison with NaN is false but ``!=``, and ``IN`` is a disjunction of ``=``.
So on floating columns ``>`` and ``>=`` add ``NOT isnan(x)`` (kept beside the plain comparison,
which Spark still pushes into the Parquet scan), a NaN literal compares false (``!=``: true)
with every non-null value, column-to-column comparisons test ``isnan`` on both sides, and
``IN`` lists hold no NaN (binding drops it) and both zeros when they hold one (Spark's hashed
``IN`` of a long list would tell -0.0 from 0.0). ``<``, ``<=``, ``=`` and ``!=`` against a
number give arrowlake's answer for a NaN row as they are, and Spark compares -0.0 equal to 0.0.

A leaf's result only matters where it is true: NOT has been pushed onto the leaves, so a
leaf that is null where arrowlake's is false (or the reverse) drops the same rows.

Literals are printed so their value does not depend on session settings: numbers as ``CAST``
of their exact text, strings quoted (or, holding a quote or backslash, as UTF-8 bytes, which
no escaping setting reads differently), timestamps with an explicit ``+00:00`` or as
``TIMESTAMP_NTZ``. Whatever Spark cannot compare exactly (a literal finer than Spark's
microseconds, years outside 1-9999, decimals over 38 digits, times, durations, integers
against unsigned ones) gives None: the caller must then filter with arrowlake's reader.

>>> to_spark_sql("x > 1 AND s = 'a'", pa.schema([("x", pa.float64()), ("s", pa.string())]))
"((`x` > CAST('1.0' AS DOUBLE) AND NOT isnan(`x`)) AND `s` = 'a')"
"""

from __future__ import annotations

import datetime as _dt
import math
from decimal import Decimal
from typing import Any

import pyarrow as pa

from arrowlake.expressions import Expr, bind, to_expression
from arrowlake.expressions.binding import (
    BoundAnd,
    BoundColumn,
    BoundColumnCompare,
    BoundCompare,
    BoundConst,
    BoundExpr,
    BoundIn,
    BoundIsNull,
    BoundOr,
    BoundStartsWith,
    value_type,
)

_OPS = {"=": "=", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}
_EPOCH = _dt.datetime(1970, 1, 1)
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


class _NoSparkForm(Exception):
    """The filter has no Spark SQL form that keeps exactly arrowlake's rows."""


def to_spark_sql(expr: Expr | str | None, schema: pa.Schema) -> str | None:
    """The filter as a Spark SQL condition over columns named and typed as ``schema`` (as
    Spark reads them: :func:`arrowlake.spark.types.spark_type`), or None when it has no form
    that keeps exactly the rows arrowlake keeps."""
    bound = bind(to_expression(expr), schema)
    try:
        return _sql(bound)
    except _NoSparkForm:
        return None


def quote_identifier(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _sql(node: BoundExpr) -> str:
    if isinstance(node, BoundConst):
        return "TRUE" if node.value else "FALSE"
    if isinstance(node, (BoundAnd, BoundOr)):
        return _balanced(" AND " if isinstance(node, BoundAnd) else " OR ",
                         [_sql(c) for c in node.children])
    if isinstance(node, BoundIn):
        return _in(node)
    if isinstance(node, BoundIsNull):  # any type, nested ones included
        return f"{quote_identifier(node.column.name)} IS {'NOT ' if node.negated else ''}NULL"
    if isinstance(node, BoundCompare):
        return _compare(node)
    if isinstance(node, BoundColumnCompare):
        text = _column_compare(node)
    elif isinstance(node, BoundStartsWith):
        text = f"startswith({_column(node.column)}, {_string(node.prefix)})"
    else:
        raise _NoSparkForm(repr(node))
    return f"(NOT {text})" if node.negated else text


def _balanced(word: str, parts: list[str]) -> str:
    """``parts`` joined by ``word`` as a balanced tree of parentheses (a generated filter's
    thousands of terms would otherwise nest thousands deep)."""
    while len(parts) > 1:
        pairs = [f"({a}{word}{b})" for a, b in zip(parts[::2], parts[1::2], strict=False)]
        parts = [*pairs, parts[-1]] if len(parts) % 2 else pairs
    return parts[0]


def _floating(column: BoundColumn) -> bool:
    return bool(pa.types.is_floating(column.compare_type))


def _column(column: BoundColumn) -> str:
    """The column, cast to the type it is compared in where Spark's type differs."""
    own, compared = _spark_sql_type(column.type), _spark_sql_type(column.compare_type)
    name = quote_identifier(column.name)
    return name if own == compared else f"CAST({name} AS {compared})"


def _compare(node: BoundCompare) -> str:
    if not node.value.is_valid:
        return "FALSE"  # a comparison with NULL is NULL, and so is its negation
    column = _column(node.column)
    if _floating(node.column) and math.isnan(node.value.as_py()):
        # A NaN literal: arrowlake's comparisons with it are all false but != (Spark's are
        # not: NaN = NaN, NaN > 1), so the leaf is true for every non-null value or none.
        return f"{column} IS NOT NULL" if (node.op == "!=") != node.negated else "FALSE"
    text = f"{column} {_OPS[node.op]} {_literal(node.value)}"
    if not _floating(node.column):
        return f"(NOT {text})" if node.negated else text
    if node.op in (">", ">="):
        # Spark: NaN > 1. Kept beside the comparison, which Spark still pushes into the scan.
        text = f"({text} AND NOT isnan({column}))"
        return f"(NOT {text})" if node.negated else text
    if node.negated:
        text = f"(NOT {text})"
    if (node.op == "!=") != node.negated:
        # True for NaN rows (Spark agrees), which the files' statistics leave out: pushed into
        # the scan, NOT (x < 1) would prune a row group of [0.5, NaN] by its max 0.5. OR'ed with
        # isnan, Spark keeps it out of the scan.
        return f"({text} OR isnan({column}))"
    return text


def _column_compare(node: BoundColumnCompare) -> str:
    left, right = node.left.compare_type, node.right.compare_type
    # Only pairs both engines bring to the same common type (int64 against uint64, for one,
    # Arrow and Spark compare differently).
    same_kind = (
        _spark_sql_type(left) == _spark_sql_type(right)
        or (pa.types.is_signed_integer(left) and pa.types.is_signed_integer(right))
        or (pa.types.is_floating(left) and pa.types.is_floating(right))
        or (pa.types.is_decimal128(left) and pa.types.is_decimal128(right))
    )
    if not same_kind:
        raise _NoSparkForm(repr(node))
    a, b = _column(node.left), _column(node.right)
    op = _OPS[node.op]
    nans = [f"isnan({c})" for c, bound in ((a, node.left), (b, node.right)) if _floating(bound)]
    if not nans:
        return f"{a} {op} {b}"
    unequal = "TRUE" if node.op == "!=" else "FALSE"
    return (f"(CASE WHEN {a} IS NULL OR {b} IS NULL THEN NULL "
            f"WHEN {' OR '.join(nans)} THEN {unequal} ELSE {a} {op} {b} END)")


def _in(node: BoundIn) -> str:
    column = _column(node.column)
    values = [_literal(v) for v in node.values]
    if _floating(node.column) and any(v.as_py() == 0 for v in node.values):
        # Binding keeps +0.0 only; a hashed IN (Spark's InSet, past 10 values) would miss -0.0.
        values.append(_literal(pa.scalar(-0.0, node.column.compare_type)))
    found = f"{column} IN ({', '.join(values)})"
    if not node.negated:
        return found
    if node.has_null:
        return "FALSE"  # NOT IN a list holding NULL is never true
    if _floating(node.column):  # true for NaN rows: kept out of the scan (see _compare)
        return f"((NOT {found}) OR isnan({column}))"
    return f"(NOT {found})"


def _spark_sql_type(typ: pa.DataType) -> str:
    """The SQL name of the Spark type of ``typ`` (``spark.types.spark_type``), for the types a
    filter compares exactly; others raise :class:`_NoSparkForm`."""
    t = value_type(typ)
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_integer(t):
        width = t.bit_width + (8 if pa.types.is_unsigned_integer(t) else 0)
        for limit, name in ((8, "TINYINT"), (16, "SMALLINT"), (32, "INT"), (64, "BIGINT")):
            if width <= limit:
                return name
        return "DECIMAL(20,0)"
    if pa.types.is_float16(t) or pa.types.is_float32(t):
        return "FLOAT"
    if pa.types.is_float64(t):
        return "DOUBLE"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "STRING"
    if (pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t)
            or pa.types.is_fixed_size_binary(t)):
        return "BINARY"
    if pa.types.is_date(t):
        return "DATE"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP" if t.tz is not None else "TIMESTAMP_NTZ"
    if pa.types.is_decimal(t) and t.precision <= 38:
        return f"DECIMAL({t.precision},{t.scale})"
    raise _NoSparkForm(str(typ))


def _literal(value: pa.Scalar) -> str:
    """A Spark SQL literal of exactly ``value`` (a valid scalar), typed as Spark reads a column
    of its type."""
    typ = value_type(value.type)
    name = _spark_sql_type(typ)
    py: Any = value.as_py()
    if py is None:
        raise _NoSparkForm("null literal")
    if pa.types.is_boolean(typ):
        return "TRUE" if py else "FALSE"
    if pa.types.is_integer(typ) or pa.types.is_decimal(typ):
        text = str(int(py)) if pa.types.is_integer(typ) else format(Decimal(py), "f")
        return f"CAST('{text}' AS {name})"
    if pa.types.is_floating(typ):
        return f"CAST('{float(py)!r}' AS {name})"  # repr: the shortest exact text; 'inf'
    if name == "STRING":
        return _string(str(py))
    if name == "BINARY":
        return f"X'{bytes(py).hex()}'"
    if name == "DATE":
        if not 1 <= py.year <= 9999:
            raise _NoSparkForm(str(py))
        return f"DATE '{py.isoformat()}'"
    if pa.types.is_timestamp(typ):
        return _timestamp(value.value, typ)
    raise _NoSparkForm(repr(value))


def _string(text: str) -> str:
    """A Spark SQL string literal read the same whatever ``spark.sql.parser.
    escapedStringLiterals`` says: quoted as it is unless it holds a quote or a backslash, else
    its UTF-8 bytes cast to a string (folded into a plain literal before Spark plans the
    scan, so it still prunes)."""
    if "'" not in text and "\\" not in text:
        return f"'{text}'"
    return f"CAST(X'{text.encode('utf-8').hex()}' AS STRING)"


def _timestamp(count: int, typ: pa.TimestampType) -> str:
    """The timestamp ``count`` units after the epoch as a Spark literal: microseconds, like
    Spark's timestamps, in UTC for a zoned column."""
    micros, rest = divmod(int(count) * 1_000_000, _PER_SECOND[typ.unit])
    if rest:
        raise _NoSparkForm("a timestamp finer than Spark's microseconds")
    try:
        moment = _EPOCH + _dt.timedelta(microseconds=micros)
    except OverflowError:
        raise _NoSparkForm("a timestamp outside Spark's years") from None
    text = moment.strftime("%Y-%m-%d %H:%M:%S") + f".{moment.microsecond:06d}"
    if moment.year < 1000:  # strftime drops leading zeros of years on some platforms
        text = f"{moment.year:04d}" + text[text.index("-"):]
    if typ.tz is not None:
        return f"TIMESTAMP '{text}+00:00'"
    return f"TIMESTAMP_NTZ '{text}'"
