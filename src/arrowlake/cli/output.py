"""What the command line prints: aligned text tables for people, JSON for programs."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, TextIO

#: Cells of user data are cut to this many characters in text tables.
MAX_CELL_WIDTH = 60


def jsonable(value: Any) -> Any:
    """``value`` with every Arrow/Python scalar turned into something ``json.dumps`` accepts.

    Dates and times become ISO strings, Decimals strings (no float rounding), bytes base64 and
    non-finite floats strings (JSON has no NaN).
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        # Arrow map values come back as lists of (key, value) tuples; keep them as pairs.
        return [jsonable(v) for v in value]
    return str(value)


def dumps(value: Any, **kwargs: Any) -> str:
    return json.dumps(jsonable(value), ensure_ascii=False, **kwargs)


def write_json(value: Any, out: TextIO) -> None:
    out.write(dumps(value, indent=2))
    out.write("\n")




def cell(value: Any, max_width: int | None = None) -> str:
    """One value as text for a table cell, cut to ``max_width`` characters when given."""
    if value is None:
        return "null"
    if isinstance(value, datetime):
        # Snapshot times are milliseconds; do not pad them with three zeros.
        spec = "milliseconds" if value.microsecond % 1000 == 0 else "auto"
        return value.isoformat(sep=" ", timespec=spec)
    if isinstance(value, (bytes, bytearray)):
        text = "0x" + bytes(value).hex()
    elif isinstance(value, (Mapping, list, tuple)):
        text = dumps(value)
    else:
        text = str(value)
    text = text.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if max_width is not None and len(text) > max_width:
        text = text[: max_width - 1] + "…"
    return text


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal)) and not isinstance(value, bool)


def format_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *,
                 max_width: int | None = None) -> str:
    """``rows`` as an aligned text table under a header; numbers are right-aligned.

    ``max_width`` cuts long cells (user data), so one wide value does not push every column
    off the screen.

    >>> rows = [{"name": "a", "rows": 3}, {"name": "bc", "rows": 12}]
    >>> print(format_table(rows, ["name", "rows"]))
    name  rows
    ----  ----
    a        3
    bc      12
    """
    texts = [[cell(row.get(c), max_width) for c in columns] for row in rows]
    widths = [len(c) for c in columns]
    for line in texts:
        for i, text in enumerate(line):
            widths[i] = max(widths[i], len(text))
    right = [bool(rows) and all(_is_number(r.get(c)) or r.get(c) is None for r in rows)
             for c in columns]

    def render(line: Sequence[str], numeric: Sequence[bool]) -> str:
        cells = zip(line, widths, numeric, strict=True)
        parts = [t.rjust(w) if r else t.ljust(w) for t, w, r in cells]
        return "  ".join(parts).rstrip()

    out = [render(columns, right), render(["-" * w for w in widths], right)]
    out.extend(render(line, right) for line in texts)
    return "\n".join(out)


def format_fields(pairs: Sequence[tuple[str, Any]]) -> str:
    """``key: value`` lines with the values aligned."""
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k + ':':<{width + 1}} {cell(v)}" for k, v in pairs)
