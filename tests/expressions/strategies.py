"""Hypothesis strategies shared by the expression tests."""

from __future__ import annotations

from hypothesis import strategies as st

from arrowlake.expressions import Expr


def boolean_trees(leaves: st.SearchStrategy[Expr], max_leaves: int = 8
                  ) -> st.SearchStrategy[Expr]:
    """Filters built from ``leaves`` with ``&``, ``|`` and ``~``."""
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(lambda a, b: a & b, inner, inner),
            st.builds(lambda a, b: a | b, inner, inner),
            st.builds(lambda a: ~a, inner),
        ),
        max_leaves=max_leaves,
    )
