"""Literal values of filters: what a Python, numpy, pandas or pyarrow value becomes.

A literal is kept as exactly one of a few plain types (subclasses and foreign scalars are
converted), so that a filter prints as text that parses back into the same value of the same
type; anything else is refused with a :class:`~arrowlake.errors.ValidationError` saying which
types are taken.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterable
from decimal import Decimal
from typing import Any

from arrowlake.errors import ValidationError, require

# Literal values are kept as exactly these types (subclasses such as numpy.float64 or
# pandas.Timestamp are converted), so that a literal prints as text that parses back into the
# same value of the same type. Nanosecond values, which the standard library cannot hold, are
# the exception: they stay pandas.Timestamp / pandas.Timedelta (see normalize_value).
_LITERAL_TYPES = frozenset(
    {bool, int, float, str, bytes, Decimal, _dt.date, _dt.datetime, _dt.time, _dt.timedelta}
)
_SUPPORTED = (
    "use None, bool, int, float, str, bytes, Decimal, date, datetime, time or timedelta "
    "(pandas, numpy and pyarrow scalars of these kinds are converted)"
)


def _unsupported(value: Any, why: str = "") -> ValidationError:
    try:
        shown = repr(value)
    except (ValueError, OverflowError):  # a pyarrow scalar whose as_py() fails
        shown = str(getattr(value, "value", "?"))
    return ValidationError(
        f"Unsupported literal {shown} of type {type(value).__name__}"
        f"{': ' + why if why else ''}; {_SUPPORTED}"
    )


def _fixed_offset(tz: _dt.tzinfo | None, offset: _dt.timedelta | None) -> _dt.tzinfo | None:
    # A zone such as Europe/Paris becomes its offset at that instant: the same instant, and
    # the text form (which holds the offset) parses back into an equal value. An aware
    # datetime in a zone compares unequal to itself in another zone during a DST fold.
    if tz is None or offset is None or tz is _dt.UTC:
        return tz
    return _dt.UTC if not offset else _dt.timezone(offset)


def normalize_value(value: Any) -> Any:
    """The plain Python value of a literal, or a ValidationError for unsupported types."""
    kind = type(value)
    if value is None or kind in _LITERAL_TYPES:
        if kind is _dt.datetime and value.tzinfo is not None:
            tz = _fixed_offset(value.tzinfo, value.utcoffset())
            return value if tz is value.tzinfo else value.replace(tzinfo=tz)
        if kind is _dt.time and value.tzinfo is not None:
            return _normalize_time(value)
        if kind is Decimal and not value.is_finite():
            raise _unsupported(value, "a decimal literal must be finite (use float('nan'))")
        return value
    if isinstance(value, _dt.datetime):  # pandas.Timestamp, pandas.NaT, other subclasses
        return _normalize_datetime(value)
    if isinstance(value, _dt.timedelta):  # pandas.Timedelta
        return _normalize_timedelta(value)
    if isinstance(value, _dt.date):
        return _dt.date(value.year, value.month, value.day)
    if isinstance(value, _dt.time):
        return normalize_value(_dt.time(value.hour, value.minute, value.second,
                                          value.microsecond, value.tzinfo, fold=value.fold))
    if isinstance(value, bool):
        return bool(value)
    base: Any
    for base in (int, float, str, bytes, Decimal):  # numpy.float64, numpy.str_, IntEnum, ...
        if isinstance(value, base):
            return normalize_value(base(value))
    module = kind.__module__.split(".")[0]
    if module == "pyarrow" and callable(getattr(value, "as_py", None)):
        return _normalize_arrow_scalar(value)
    if module == "numpy" and callable(getattr(value, "item", None)):
        return _normalize_numpy_scalar(value)
    raise _unsupported(value)


def _normalize_datetime(value: _dt.datetime) -> Any:
    if value != value:  # pandas.NaT: a missing value
        return None
    tz = _fixed_offset(value.tzinfo, value.utcoffset())
    if getattr(value, "nanosecond", 0):  # pandas.Timestamp with nanoseconds: kept as it is
        return value if tz is value.tzinfo else value.astimezone(tz)
    return _dt.datetime(value.year, value.month, value.day, value.hour, value.minute,
                        value.second, value.microsecond, tz, fold=value.fold)


def _normalize_timedelta(value: _dt.timedelta) -> Any:
    if value != value:
        return None
    if getattr(value, "nanoseconds", 0):  # pandas.Timedelta with nanoseconds
        return value
    return _dt.timedelta(value.days, value.seconds, value.microseconds)


def _normalize_time(value: _dt.time) -> _dt.time:
    offset = value.utcoffset()
    if offset is None:
        raise _unsupported(value, "its time zone gives no UTC offset for a time of day alone")
    tz = _fixed_offset(value.tzinfo, offset)
    return value if tz is value.tzinfo else value.replace(tzinfo=tz)


def _normalize_arrow_scalar(value: Any) -> Any:
    """A pyarrow scalar's value, refusing what ``as_py()`` would get wrong: nanosecond times
    (silently truncated to microseconds)."""
    t = value.type
    if getattr(t, "unit", None) == "ns" and value.is_valid and value.value % 1000 == 0:
        # Whole microseconds: a plain datetime/timedelta/time, with or without pandas.
        import pyarrow as pa  # the value is a pyarrow scalar: pyarrow is loaded

        if pa.types.is_timestamp(t):
            value = value.cast(pa.timestamp("us", t.tz))
        elif pa.types.is_duration(t):
            value = value.cast(pa.duration("us"))
        elif pa.types.is_time64(t):
            value = value.cast(pa.time64("us"))
    elif str(t) == "time64[ns]" and value.is_valid:
        raise _unsupported(value, "a time-of-day literal holds microseconds at most")
    try:
        return normalize_value(value.as_py())
    except (ValueError, OverflowError, TypeError) as exc:  # e.g. ns values without pandas
        raise _unsupported(value, str(exc).splitlines()[0] if str(exc) else "") from None


def _normalize_numpy_scalar(value: Any) -> Any:
    """A numpy scalar's value. ``item()`` turns datetime64/timedelta64 values it cannot hold in
    the standard library (nanoseconds, years past 9999, months) into plain ints, which would
    compare as numbers; those are converted exactly here or refused."""
    import numpy as np  # a dependency of arrowlake; imported only when numpy values appear

    if isinstance(value, (np.datetime64, np.timedelta64)):
        if np.isnat(value):
            return None
        is_time = isinstance(value, np.datetime64)
        unit = np.datetime_data(value.dtype)[0]
        if unit in ("Y", "M") and not is_time:
            raise _unsupported(value, "months and years have no fixed length")
        if unit in ("Y", "M", "W", "D") and is_time:
            item = value.item()
            if not isinstance(item, _dt.date):
                raise _unsupported(value, "outside the years 1 to 9999")
            return item
        micros = value.astype(f"{value.dtype.kind}8[us]")
        if micros == value:
            item = micros.item()
            if isinstance(item, int):
                raise _unsupported(value, "outside the range a datetime/timedelta can hold")
            return normalize_value(item)
        nanos = value.astype(f"{value.dtype.kind}8[ns]")
        if nanos != value:
            raise _unsupported(value, "finer than nanoseconds")
        pd = require_pandas("A nanosecond literal")
        return normalize_value(pd.Timestamp(nanos) if is_time else pd.Timedelta(nanos))
    return normalize_value(value.item())


def require_pandas(what: str) -> Any:
    """pandas, which holds nanosecond timestamps and durations, or MissingDependency."""
    return require("pandas", "pandas", what)


def normalize_values(values: Iterable[Any],
                     convert: Callable[[Any], Any] = normalize_value) -> tuple[Any, ...]:
    """The values of an ``isin``, each as :func:`normalize_value` (or ``convert``) gives it;
    values of the plain types are taken as they are, without a call each."""
    if isinstance(values, (str, bytes)):
        raise ValidationError(
            f"isin() needs a collection of values, got the string {values!r}; "
            f"use isin([{values!r}])"
        )
    to_pylist = getattr(values, "to_pylist", None)  # pyarrow arrays
    if callable(to_pylist) and "[ns" not in str(getattr(values, "type", "")):
        values = to_pylist()  # nanosecond types go value by value, checked
    plain = _PLAIN_TYPES  # long ID lists: no call per value
    return tuple([v if type(v) in plain else convert(v) for v in values])


_PLAIN_TYPES = frozenset({type(None), bool, int, float, str, bytes, _dt.date, _dt.timedelta})
