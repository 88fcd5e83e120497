"""The one filter expression tree of arrowlake.

Build filters with operators or parse them from strings; both give the same tree::

    >>> from arrowlake.expressions import col, parse_filter
    >>> (col("x") > 3) & col("s").startswith("ab") == parse_filter("x > 3 AND s LIKE 'ab%'")
    True

The tree is turned into a ``pyarrow.compute.Expression`` (:func:`to_arrow`), a row mask
(:func:`evaluate`), or per-file pruning answers from statistics (:func:`may_match`,
:func:`all_match`).
"""

from arrowlake.expressions.arrow import evaluate, to_arrow
from arrowlake.expressions.binding import bind, coerce_literal
from arrowlake.expressions.parser import and_all, or_any, parse_filter, to_expression
from arrowlake.expressions.stats import all_match, may_match
from arrowlake.expressions.tree import (
    AlwaysFalse,
    AlwaysTrue,
    And,
    Column,
    Comparison,
    Expr,
    In,
    IsNotNull,
    IsNull,
    Literal,
    Not,
    Or,
    StartsWith,
    col,
    conjuncts,
    format_filter,
    lit,
    referenced_columns,
    rename_columns,
)

__all__ = [
    "AlwaysFalse",
    "AlwaysTrue",
    "And",
    "Column",
    "Comparison",
    "Expr",
    "In",
    "IsNotNull",
    "IsNull",
    "Literal",
    "Not",
    "Or",
    "StartsWith",
    "all_match",
    "and_all",
    "bind",
    "coerce_literal",
    "col",
    "conjuncts",
    "evaluate",
    "format_filter",
    "lit",
    "may_match",
    "or_any",
    "parse_filter",
    "referenced_columns",
    "rename_columns",
    "to_arrow",
    "to_expression",
]
