"""Binding: check a filter against a schema and turn its literals into typed Arrow scalars.

The bound tree is what the Arrow and statistics visitors walk. It is in negation normal form:
``NOT`` is pushed down through AND/OR (De Morgan holds in SQL's three-valued logic) onto the
leaves, which carry a ``negated`` flag. A negated leaf is *not* rewritten into the opposite
comparison here, because ``NOT (x < 1)`` and ``x >= 1`` differ on NaN; visitors decide when the
rewrite is exact.

Literal coercion rules (value -> column type):

- integers: int, integral float/Decimal, numeric strings; a fractional number compares the
  column as float64;
- floats: int, float, Decimal, numeric strings;
- decimals: int, float (via its shortest repr), str, Decimal; a value with more digits than the
  column's scale or precision compares the column as a wider decimal;
- strings (string, large_string, string_view): str; binaries: bytes or str (UTF-8);
- date32/date64: date, ISO string, or a datetime at midnight;
- timestamps of any unit: datetime, date (midnight) or ISO string. A naive literal against a
  tz-aware column is taken as **UTC**; an aware literal against a naive column is converted to
  UTC and compared as wall-clock time. A literal finer than the column's unit compares the
  column in that finer unit, so ``ts_s > '10:00:00.5'`` is exact;
- durations: timedelta (pandas.Timedelta for nanoseconds); times of day: time. As with
  timestamps, a literal finer than the column's unit compares the column in the finer unit;
- dictionary columns: by their value type; booleans: bool only;
- anything else: whatever ``pyarrow.scalar(value, type)`` accepts.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from arrowlake.errors import ColumnNotFound, ValidationError
from arrowlake.expressions.tree import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    Column,
    Comparison,
    ComparisonOp,
    Expr,
    In,
    IsNotNull,
    IsNull,
    Not,
    Or,
    StartsWith,
    format_identifier,
    format_value,
)

_UTC = _dt.UTC


# ---------------------------------------------------------------------------------------------
# Bound tree


@dataclass(frozen=True)
class BoundConst:
    value: bool


@dataclass(frozen=True)
class BoundAnd:
    children: tuple[BoundExpr, ...]


@dataclass(frozen=True)
class BoundOr:
    children: tuple[BoundExpr, ...]


@dataclass(frozen=True)
class BoundColumn:
    """A column as a predicate reads it: ``compare_type`` is the type both sides are compared
    in; the column is cast to it when it differs from ``type`` (dictionary decoding, widening)."""

    name: str
    type: pa.DataType  # the schema's type
    compare_type: pa.DataType

    @property
    def needs_cast(self) -> bool:
        return self.compare_type != self.type


@dataclass(frozen=True)
class BoundCompare:
    """``column op value`` with ``value`` a scalar of ``column.compare_type``."""

    op: ComparisonOp
    column: BoundColumn
    value: pa.Scalar
    negated: bool = False


@dataclass(frozen=True)
class BoundColumnCompare:
    op: ComparisonOp
    left: BoundColumn
    right: BoundColumn
    negated: bool = False


@dataclass(frozen=True)
class BoundIn:
    """``column IN values``; ``values`` holds the non-null values, ``has_null`` whether the
    list contained NULL (which makes non-matching rows NULL)."""

    column: BoundColumn
    values: pa.Array
    has_null: bool
    negated: bool = False


@dataclass(frozen=True)
class BoundIsNull:
    column: BoundColumn
    negated: bool = False  # IS NOT NULL


@dataclass(frozen=True)
class BoundStartsWith:
    column: BoundColumn
    prefix: str
    negated: bool = False


BoundLeaf = BoundCompare | BoundColumnCompare | BoundIn | BoundIsNull | BoundStartsWith
BoundExpr = BoundConst | BoundAnd | BoundOr | BoundLeaf


def is_floating(t: pa.DataType) -> bool:
    return bool(pa.types.is_floating(t))


def value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


# ---------------------------------------------------------------------------------------------
# Binding


def bind(expr: Expr, schema: pa.Schema) -> BoundExpr:
    """Resolve columns against ``schema``, coerce literals, push NOT down to the leaves.

    Raises :class:`ColumnNotFound` for unknown columns and :class:`ValidationError` for literals
    that do not fit their column.
    """
    return _bind(expr, schema, negated=False)


def _bind(expr: Expr, schema: pa.Schema, negated: bool) -> BoundExpr:
    if isinstance(expr, AlwaysTrue):
        return BoundConst(not negated)
    if isinstance(expr, AlwaysFalse):
        return BoundConst(negated)
    while isinstance(expr, Not):
        expr, negated = expr.child, not negated
    if isinstance(expr, (And, Or)):
        conjunction = isinstance(expr, And) != negated  # De Morgan
        # Recursion only as deep as AND/OR alternate (MAX_NESTING), not as long as chains.
        children = tuple([_bind(child, schema, negated) for child in expr.children])
        return _combine(children, conjunction)
    if isinstance(expr, Comparison):
        left = _field(schema, expr.left)
        if isinstance(expr.right, Column):
            return _bind_column_compare(expr, left, _field(schema, expr.right), negated)
        try:  # the error message names the filter: formatted only when it is needed
            scalar = _coerce(expr.right.value, value_type(left.type))
        except Exception:
            coerce_literal(left.name, expr.right.value, left.type, f"{expr}")
            raise
        return BoundCompare(expr.op, _compare_column(left, scalar.type), scalar, negated)
    if isinstance(expr, In):
        return _bind_in(expr, _field(schema, expr.column), negated)
    if isinstance(expr, (IsNull, IsNotNull)):
        field = _field(schema, expr.column)
        column = BoundColumn(field.name, field.type, field.type)
        return BoundIsNull(column, negated != isinstance(expr, IsNotNull))
    if isinstance(expr, StartsWith):
        field = _field(schema, expr.column)
        t = value_type(field.type)
        if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)):
            raise ValidationError(
                f"LIKE/startswith needs a string column, but {field.name!r} is {field.type} "
                f"in {expr}"
            )
        # starts_with has kernels for string and large_string only.
        compare_type = pa.large_string() if pa.types.is_string_view(t) else t
        return BoundStartsWith(
            BoundColumn(field.name, field.type, compare_type), expr.prefix, negated
        )
    raise TypeError(f"Not a filter expression: {expr!r}")


def _combine(children: tuple[BoundExpr, ...], conjunction: bool) -> BoundExpr:
    # Flatten nested AND/AND and fold constants so visitors see small, shallow trees.
    kind = BoundAnd if conjunction else BoundOr
    flat: list[BoundExpr] = []
    for child in children:
        if isinstance(child, BoundConst):
            if child.value != conjunction:  # FALSE in an AND, TRUE in an OR
                return BoundConst(child.value)
            continue
        if isinstance(child, kind):
            flat.extend(child.children)
        else:
            flat.append(child)
    if len(flat) > 1:
        flat = _merge_equalities(flat, conjunction)
    if not flat:
        return BoundConst(conjunction)
    if len(flat) == 1:
        return flat[0]
    return kind(tuple(flat))


def _merge_equalities(leaves: list[BoundExpr], conjunction: bool) -> list[BoundExpr]:
    """``x = 1 OR x = 2 OR ...`` as ``x IN (1, 2, ...)``, and ``x != 1 AND x != 2 AND ...`` as
    ``x NOT IN (...)``: generated filters send thousands of such terms, which would cost a
    kernel call each per batch and per file's statistics. Under SQL's three-valued logic, with
    NaN and -0.0 treated as ``IN`` treats them, both forms give the same result everywhere."""
    groups: dict[BoundColumn, list[int]] = {}
    for i, leaf in enumerate(leaves):
        # In an OR: x = v, or NOT (x != v). In an AND: x != v, or NOT (x = v).
        if (
            isinstance(leaf, BoundCompare)
            and leaf.op in ("=", "!=")
            and ((leaf.op == "=") != leaf.negated) is not conjunction
        ):
            groups.setdefault(leaf.column, []).append(i)
    merged: dict[int, BoundExpr | None] = {}
    for column, members in groups.items():
        if len(members) < 2 or not _has_is_in(column.compare_type):
            continue
        scalars = [leaves[i].value for i in members]  # type: ignore[union-attr]
        values = pa.array(scalars, column.compare_type)
        merged.update(dict.fromkeys(members))
        merged[members[0]] = _in_of_values(column, values, has_null=False, negated=conjunction)
    if not merged:
        return leaves
    out: list[BoundExpr] = []
    for i, leaf in enumerate(leaves):
        if i not in merged:
            out.append(leaf)
            continue
        replacement = merged[i]
        if isinstance(replacement, BoundConst):
            if replacement.value != conjunction:
                return [replacement]
        elif replacement is not None:
            out.append(replacement)
    return out


_IS_IN_TYPES: dict[pa.DataType, bool] = {}


def _has_is_in(t: pa.DataType) -> bool:
    known = _IS_IN_TYPES.get(t)
    if known is None:
        try:
            pc.is_in(pa.array([], t), value_set=pa.array([], t))
            known = True
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
            known = False
        _IS_IN_TYPES[t] = known
    return known


def _field(schema: pa.Schema, column: Column) -> pa.Field:
    index = schema.get_field_index(column.name)
    if index < 0:
        available = ", ".join(format_identifier(n) for n in schema.names) or "(none)"
        if schema.get_all_field_indices(column.name):
            raise ValidationError(
                f"Column {column.name!r} is ambiguous: the schema has it more than once"
            )
        raise ColumnNotFound(
            f"Column {column.name!r} in the filter does not exist; available columns: {available}"
        )
    return schema.field(index)


def _compare_column(field: pa.Field, compare_type: pa.DataType) -> BoundColumn:
    return BoundColumn(field.name, field.type, compare_type)


def _bind_column_compare(
    expr: Comparison, left: pa.Field, right: pa.Field, negated: bool
) -> BoundColumnCompare:
    def operand_type(t: pa.DataType) -> pa.DataType:
        t = value_type(t)
        # Comparison kernels take string_view only against string_view; large_string meets
        # every string type.
        return pa.large_string() if pa.types.is_string_view(t) else t

    lt, rt = operand_type(left.type), operand_type(right.type)
    if pa.types.is_string(lt) and pa.types.is_large_string(rt):
        lt = rt
    elif pa.types.is_large_string(lt) and pa.types.is_string(rt):
        rt = lt
    try:  # let the kernel registry say whether these types compare; cheaper than a table
        pc.less(pa.array([], lt), pa.array([], rt))
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        raise ValidationError(
            f"Cannot compare column {left.name!r} ({left.type}) with column {right.name!r} "
            f"({right.type}) in {expr}"
        ) from None
    return BoundColumnCompare(
        expr.op,
        BoundColumn(left.name, left.type, lt),
        BoundColumn(right.name, right.type, rt),
        negated,
    )


def _bind_in(expr: In, field: pa.Field, negated: bool) -> BoundExpr:
    non_null = [v for v in expr.values if v is not None]
    has_null = len(non_null) < len(expr.values)
    if not non_null:
        # x IN () is false; x IN (NULL) is NULL: both never true, so NOT of them is never
        # true either except for NOT IN (): true for every row.
        return BoundConst(negated and not has_null)
    fast = _native_values(non_null, value_type(field.type))
    if fast is not None:
        column = BoundColumn(field.name, field.type, fast.type)
        return _in_of_values(column, fast, has_null, negated)
    t = value_type(field.type)
    try:
        scalars = [_coerce(v, t) for v in non_null]
    except Exception:
        # The message spells out the filter; formatting it for every value would cost
        # quadratic time in a long list, so only the failing value gets it.
        for v in non_null:
            coerce_literal(field.name, v, field.type, f"{expr}")
        raise
    # Literals may have widened differently (1 vs 2.5 on an int column); compare all of them in
    # the widest type any one needed.
    common = t
    for s in scalars:
        if s.type != t:
            common = s.type if common == t else _wider(common, s.type)
    if pa.types.is_string_view(common):
        common = pa.large_string()  # is_in has no string_view kernel
    try:  # scalars, not as_py() values: those lose nanoseconds without pandas
        values = pa.array([s.cast(common) for s in scalars], common)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValidationError(f"Cannot bring the values of {expr} to one type: {exc}") from None
    return _in_of_values(BoundColumn(field.name, field.type, common), values, has_null, negated)


def _in_of_values(
    column: BoundColumn, values: pa.Array, has_null: bool, negated: bool
) -> BoundExpr:
    common = column.compare_type
    if is_floating(common):
        # IN is a disjunction of =: NaN equals nothing, and -0.0 equals 0.0. is_in hashes
        # values (NaN finds NaN, -0.0 misses 0.0), so the list keeps no NaN and only +0.0,
        # and evaluation adds 0.0 to the column (-0.0 + 0.0 is +0.0).
        values = pc.add(values.filter(pc.invert(pc.is_nan(values))), pa.scalar(0.0, common))
        if len(values) == 0:
            if negated and not has_null:
                return BoundIsNull(column, negated=True)  # NOT IN (NaN): every non-null value
            return BoundConst(False)
    return BoundIn(column, values, has_null, negated)


def _native_values(values: list[Any], t: pa.DataType) -> pa.Array | None:
    """Long lists of plain ints, strs, float64s or dates in one conversion instead of a
    scalar each (exact for these types: pyarrow refuses what does not fit)."""
    if pa.types.is_integer(t):
        native = all(type(v) is int for v in values)
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        native = all(type(v) is str for v in values)
        t = pa.large_string() if pa.types.is_string_view(t) else t
    elif t == pa.float64():
        native = all(type(v) is float for v in values)
    elif pa.types.is_date(t):
        native = all(type(v) is _dt.date for v in values)
    else:
        native = False
    if not native:
        return None
    try:
        return pa.array(values, t)
    except (pa.ArrowInvalid, OverflowError):
        return None  # out of the column's range: the careful path widens


def _wider(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if pa.types.is_decimal(a) and pa.types.is_decimal(b):
        scale = max(a.scale, b.scale)
        precision = max(a.precision - a.scale, b.precision - b.scale) + scale
        return (
            pa.decimal128(precision, scale)
            if precision <= 38
            else pa.decimal256(min(precision, 76), scale)
        )
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        order = ["s", "ms", "us", "ns"]
        return a if order.index(a.unit) >= order.index(b.unit) else b
    return pa.float64()


# ---------------------------------------------------------------------------------------------
# Literal coercion


class _Mismatch(Exception):
    """A literal does not fit a type; the message says why."""


def coerce_literal(
    column: str, value: Any, column_type: pa.DataType, context: str = ""
) -> pa.Scalar:
    """``value`` as a pyarrow scalar to compare with ``column``.

    The scalar has the column's (value) type, or a wider type the column must be cast to
    (see the module docstring). Raises :class:`ValidationError` naming column, value and type.

    >>> coerce_literal("d", "2026-11-01", pa.date32())
    <pyarrow.Date32Scalar: datetime.date(2026, 11, 1)>
    """
    t = value_type(column_type)
    try:
        return _coerce(value, t)
    except _Mismatch as exc:
        reason = str(exc)
    except (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        OverflowError,
        TypeError,
        ValueError,
    ) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    where = f" in {context}" if context else ""
    raise ValidationError(
        f"Cannot compare column {column!r} of type {column_type} with {format_value(value)} "
        f"({type(value).__name__}){where}: {reason}"
    )


def _coerce(value: Any, t: pa.DataType) -> pa.Scalar:
    if value is None:
        return pa.scalar(None, t)
    if pa.types.is_boolean(t):
        if isinstance(value, bool):
            return pa.scalar(value, t)
        raise _Mismatch("a boolean column compares with TRUE or FALSE only")
    if isinstance(value, bool) and (
        pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)
    ):
        raise _Mismatch("TRUE/FALSE is not a number")
    if pa.types.is_integer(t):
        return _coerce_integer(value, t)
    if pa.types.is_floating(t):
        number = _as_number(value)
        if t == pa.float16():
            return pa.scalar(float(number), pa.float32())  # no float16 Python scalars
        return pa.scalar(float(number), t)
    if pa.types.is_decimal(t):
        return _coerce_decimal(value, t)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        if not isinstance(value, str):
            raise _Mismatch(f"a string column compares with strings; quote the value: '{value}'")
        return pa.scalar(value, t)
    if (
        pa.types.is_binary(t)
        or pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        if isinstance(value, str):
            value = value.encode()
        if not isinstance(value, bytes):
            raise _Mismatch("a binary column compares with bytes or X'..' literals")
        return pa.scalar(value, t)
    if pa.types.is_date(t):
        return pa.scalar(_as_date(value), t)
    if pa.types.is_timestamp(t):
        return _coerce_timestamp(value, t)
    if pa.types.is_duration(t) and isinstance(value, _dt.timedelta):
        return _coerce_duration(value, t)
    if (pa.types.is_time32(t) or pa.types.is_time64(t)) and isinstance(value, _dt.time):
        return _coerce_time(value, t)
    if pa.types.is_nested(t):
        raise _Mismatch(f"columns of type {t} cannot be compared with a value")
    return pa.scalar(value, t)


def _as_number(value: Any) -> int | float | Decimal:
    if isinstance(value, (int, float, Decimal)):
        return value
    if isinstance(value, str):
        text = value.strip()
        try:
            return int(text)
        except ValueError:
            pass
        try:
            number = Decimal(text)
        except InvalidOperation:
            raise _Mismatch(f"{value!r} is not a number") from None
        return number if number.is_finite() else float(text)
    raise _Mismatch("the column is numeric")


_INT_RANGES = {
    pa.int8(): (-(2**7), 2**7 - 1),
    pa.int16(): (-(2**15), 2**15 - 1),
    pa.int32(): (-(2**31), 2**31 - 1),
    pa.int64(): (-(2**63), 2**63 - 1),
    pa.uint8(): (0, 2**8 - 1),
    pa.uint16(): (0, 2**16 - 1),
    pa.uint32(): (0, 2**32 - 1),
    pa.uint64(): (0, 2**64 - 1),
}


def _coerce_integer(value: Any, t: pa.DataType) -> pa.Scalar:
    number = _as_number(value)
    if isinstance(number, float) and not number.is_integer():
        return pa.scalar(number, pa.float64())  # compare the column as float64
    if isinstance(number, Decimal) and number != number.to_integral_value():
        return pa.scalar(float(number), pa.float64())
    integer = int(number)
    lo, hi = _INT_RANGES[t]
    if lo <= integer <= hi:
        return pa.scalar(integer, t)
    # Out of the column's range: compare in a wider integer type so that ``u8 < 1000`` is
    # simply true for every value, as in SQL.
    if -(2**63) <= integer < 2**63 and t != pa.uint64():
        return pa.scalar(integer, pa.int64())
    if 0 <= integer < 2**64 and pa.types.is_unsigned_integer(t):
        return pa.scalar(integer, pa.uint64())
    return pa.scalar(float(integer), pa.float64())


def _coerce_decimal(value: Any, t: pa.DataType) -> pa.Scalar:
    number = _as_number(value)
    if isinstance(number, float):
        if number != number or number in (float("inf"), float("-inf")):
            raise _Mismatch("a decimal column cannot hold NaN or infinity")
        number = Decimal(repr(number))  # 0.1 means 0.1, not 0.1000000000000000055...
    decimal = Decimal(number)
    _sign, digits, exponent = decimal.as_tuple()
    assert isinstance(exponent, int)
    scale = max(t.scale, -exponent)
    integer_digits = max(t.precision - t.scale, len(digits) + exponent)
    precision = max(integer_digits, 1) + scale
    if scale == t.scale and precision <= t.precision:
        return pa.scalar(decimal, t)
    if precision <= 38 and pa.types.is_decimal128(t):
        wider = pa.decimal128(precision, scale)
    elif precision <= 76:
        wider = pa.decimal256(precision, scale)
    else:
        raise _Mismatch("the value has more digits than a decimal can hold")
    return pa.scalar(decimal, wider)


def _as_date(value: Any) -> _dt.date:
    if isinstance(value, str):
        try:
            return _dt.date.fromisoformat(value.strip())
        except ValueError:
            try:
                value = _dt.datetime.fromisoformat(value.strip())
            except ValueError:
                raise _Mismatch("not an ISO date (YYYY-MM-DD)") from None
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None or value.time() != _dt.time():
            raise _Mismatch(
                "a date column compares with dates; this timestamp has a time of day or a time zone"
            )
        return value.date()
    if isinstance(value, _dt.date):
        return value
    raise _Mismatch("a date column compares with dates or 'YYYY-MM-DD' strings")


_UNIT_DIVISORS = {"s": 1_000_000, "ms": 1_000, "us": 1}


def _coerce_timestamp(value: Any, t: pa.DataType) -> pa.Scalar:
    if isinstance(value, str):
        try:
            value = _dt.datetime.fromisoformat(value.strip())
        except ValueError:
            raise _Mismatch("not an ISO timestamp (YYYY-MM-DD HH:MM:SS[.ffffff][+HH:MM])") from None
    elif isinstance(value, _dt.date) and not isinstance(value, _dt.datetime):
        value = _dt.datetime.combine(value, _dt.time())
    if not isinstance(value, _dt.datetime):
        raise _Mismatch("a timestamp column compares with datetimes, dates or ISO strings")
    if t.tz is not None and value.tzinfo is None:
        value = value.replace(tzinfo=_UTC)  # documented: naive literals are UTC
    elif t.tz is None and value.tzinfo is not None:
        value = value.astimezone(_UTC).replace(tzinfo=None)
    nanosecond = int(getattr(value, "nanosecond", 0))  # pandas.Timestamp
    if t.unit == "ns" or nanosecond:
        try:
            # A coarser column is cast to ns for this comparison.
            return pa.scalar(value, pa.timestamp("ns", t.tz))
        except (pa.ArrowInvalid, OverflowError):
            if nanosecond:
                raise
            # Outside the ns range (years before 1677 or after 2262): compare in microseconds;
            # truncating the column's nanoseconds cannot change the order against such a value.
    micros = pa.scalar(value, pa.timestamp("us", t.tz))
    divisor = _UNIT_DIVISORS.get(t.unit, 1)
    if t.unit != "ns" and micros.value % divisor == 0:
        return pa.scalar(micros.value // divisor, t)
    return micros  # finer than the column: the column is compared in microseconds


_NANOS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_INT64 = (-(2**63), 2**63 - 1)


def _finest_fit(nanos: int, unit: str) -> tuple[int, str]:
    """``nanos`` in ``unit`` if exact there, else in the coarsest finer unit that holds it
    (pyarrow would truncate): the column is then cast to that unit for the comparison."""
    for candidate in ("s", "ms", "us", "ns"):
        if _NANOS[candidate] <= _NANOS[unit] and nanos % _NANOS[candidate] == 0:
            return nanos // _NANOS[candidate], candidate
    raise AssertionError(nanos)  # pragma: no cover - every integer is whole nanoseconds


def _coerce_duration(value: _dt.timedelta, t: pa.DataType) -> pa.Scalar:
    nanos = getattr(value, "value", None)  # pandas.Timedelta
    if not isinstance(nanos, int):
        nanos = ((value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds) * 1000
    count, unit = _finest_fit(nanos, t.unit)
    if not _INT64[0] <= count <= _INT64[1] and t.unit == "ns" and nanos % 1000 == 0:
        # Past the ns range (about 292 years): every value of the column is nearer zero, so
        # comparing the column truncated to microseconds keeps the order.
        count, unit = nanos // 1000, "us"
    if not _INT64[0] <= count <= _INT64[1]:
        raise _Mismatch(f"the duration does not fit a 64-bit count of {unit}")
    return pa.scalar(count, pa.duration(unit))


def _coerce_time(value: _dt.time, t: pa.DataType) -> pa.Scalar:
    micros = ((value.hour * 60 + value.minute) * 60 + value.second) * 1_000_000
    count, unit = _finest_fit((micros + value.microsecond) * 1000, t.unit)
    if unit == t.unit:
        return pa.scalar(count, t)
    return pa.scalar(count, pa.time32(unit) if unit in ("s", "ms") else pa.time64(unit))
