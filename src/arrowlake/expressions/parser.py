"""The filter string syntax: a hand-written tokenizer and recursive-descent parser.

The syntax is a small SQL ``WHERE`` clause::

    filter     := or_expr
    or_expr    := and_expr ("OR" and_expr)*
    and_expr   := not_expr ("AND" not_expr)*
    not_expr   := "NOT" not_expr | predicate
    predicate  := "(" or_expr ")" | operand [tail]
    tail       := op operand | ["NOT"] "IN" "(" value ("," value)* ")" | "IS" ["NOT"] "NULL"
                | ["NOT"] "BETWEEN" operand "AND" operand | ["NOT"] "LIKE" string
    operand    := identifier | value
    identifier := name ("." name)*        name: bare, "double quoted" or `backticked`
    value      := ["-"] number | string | TRUE | FALSE | NULL | X'hex'
                | DATE 'yyyy-mm-dd' | TIMESTAMP 'yyyy-mm-dd hh:mm:ss[.f][+hh:mm]'
                | DECIMAL '1.50' | DOUBLE 'nan' | TIME 'hh:mm:ss' | INTERVAL 'n' SECOND

Keywords are case-insensitive. A bare boolean column (``active``, ``NOT active``) means
``active = TRUE``. ``LIKE`` supports prefix patterns only (``'abc%'``; ``\\%``, ``\\_`` and
``\\\\`` escape); a pattern without wildcards is an equality.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from typing import Literal as TypingLiteral

from arrowlake.errors import FilterSyntaxError, ValidationError
from arrowlake.expressions.literal_values import require_pandas
from arrowlake.expressions.tree import (
    SWAPPED_OP,
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
    Literal,
    Not,
    Or,
    StartsWith,
)

TokenKind = TypingLiteral["name", "quoted", "string", "hex", "number", "op", "punct", "end"]


@dataclass(frozen=True)
class Token:
    kind: TokenKind
    text: str  # the value: identifier name, unescaped string, operator, number text
    position: int

    def is_word(self, *words: str) -> bool:
        return self.kind == "name" and self.text.upper() in words

    def describe(self) -> str:
        if self.kind == "end":
            return "the end of the filter"
        if self.kind == "string":
            return "'" + self.text.replace("'", "''") + "'"
        if self.kind == "quoted":
            return '"' + self.text + '"'
        return f"'{self.text}'"


_OPERATORS = ("<=", ">=", "<>", "!=", "==", "=", "<", ">")
_NORMALIZED_OP: dict[str, ComparisonOp] = {
    "=": "=",
    "==": "=",
    "!=": "!=",
    "<>": "!=",
    "<": "<",
    "<=": "<=",
    ">": ">",
    ">=": ">=",
}
# Words that end an operand or can never start one: they must not be read as column names.
_KEYWORDS = frozenset({"AND", "OR", "NOT", "IN", "IS", "NULL", "BETWEEN", "LIKE"})


def tokenize(text: str) -> list[Token]:
    """Split a filter into tokens; raises :class:`FilterSyntaxError` on bad characters."""
    tokens: list[Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "xX" and i + 1 < n and text[i + 1] == "'":
            value, end = _read_quoted(text, i + 1, "'", "string")
            tokens.append(Token("hex", value, i))
            i = end
        elif ch.isalpha() or ch == "_":
            start = i
            while i < n and (text[i].isalnum() or text[i] == "_"):
                i += 1
            tokens.append(Token("name", text[start:i], start))
        elif ch.isdigit() or (ch == "." and i + 1 < n and text[i + 1].isdigit()):
            start = i
            while i < n and text[i].isdigit():
                i += 1
            if i < n and text[i] == ".":
                i += 1
                while i < n and text[i].isdigit():
                    i += 1
            if i < n and text[i] in "eE":
                j = i + 1
                if j < n and text[j] in "+-":
                    j += 1
                if j < n and text[j].isdigit():
                    i = j
                    while i < n and text[i].isdigit():
                        i += 1
            if i < n and (text[i].isalpha() or text[i] == "_"):
                raise FilterSyntaxError(
                    f"Unexpected character {text[i]!r} after the number {text[start:i]} "
                    f"at position {i}",
                    text,
                    i,
                )
            tokens.append(Token("number", text[start:i], start))
        elif ch == "'":
            value, end = _read_quoted(text, i, "'", "string")
            tokens.append(Token("string", value, i))
            i = end
        elif ch in '"`':
            value, end = _read_quoted(text, i, ch, "quoted identifier")
            if not value:
                raise FilterSyntaxError(f"Empty quoted identifier at position {i}", text, i)
            tokens.append(Token("quoted", value, i))
            i = end
        elif ch in "(),.-":
            tokens.append(Token("punct", ch, i))
            i += 1
        else:
            op = next((op for op in _OPERATORS if text.startswith(op, i)), None)
            if op is None:
                raise FilterSyntaxError(f"Unexpected character {ch!r} at position {i}", text, i)
            tokens.append(Token("op", op, i))
            i += len(op)
    tokens.append(Token("end", "", n))
    return tokens


def _read_quoted(text: str, start: int, quote: str, what: str) -> tuple[str, int]:
    """The content of a quoted token starting at ``start`` (a doubled quote is one quote)."""
    parts: list[str] = []
    i = start + 1
    while True:
        end = text.find(quote, i)
        if end < 0:
            raise FilterSyntaxError(
                f"Unterminated {what} starting at position {start}", text, start
            )
        parts.append(text[i:end])
        if text.startswith(quote * 2, end):
            parts.append(quote)
            i = end + 2
        else:
            return "".join(parts), end + 1


class _Group:
    """A parenthesized group (or the whole filter) being parsed: OR of ANDs of operands."""

    def __init__(self, opened: Token | None, outer_nots: list[Token]) -> None:
        self.opened = opened  # the '(' token; None for the whole filter
        self.outer_nots = outer_nots  # NOTs written before the '('
        self.ors: list[Expr] = []
        self.ands: list[Expr] = []

    def add(self, operand: Expr) -> None:
        self.ands.append(operand)

    def close_and(self) -> None:
        self.ors.append(self.ands[0] if len(self.ands) == 1 else And(*self.ands))
        self.ands = []

    def finish(self) -> Expr:
        self.close_and()
        return self.ors[0] if len(self.ors) == 1 else Or(*self.ors)


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = tokenize(text)
        self.index = 0

    # -- token helpers ------------------------------------------------------------------------

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def peek(self, offset: int = 1) -> Token:
        return self.tokens[min(self.index + offset, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.token
        if token.kind != "end":
            self.index += 1
        return token

    def accept_word(self, *words: str) -> Token | None:
        if self.token.is_word(*words):
            return self.advance()
        return None

    def accept_punct(self, char: str) -> Token | None:
        if self.token.kind == "punct" and self.token.text == char:
            return self.advance()
        return None

    def error(self, message: str, token: Token | None = None) -> FilterSyntaxError:
        token = token or self.token
        return FilterSyntaxError(
            f"{message} at position {token.position}", self.text, token.position
        )

    def expect_punct(self, char: str, context: str) -> Token:
        token = self.accept_punct(char)
        if token is None:
            raise self.error(f"Expected '{char}' {context}; found {self.token.describe()}")
        return token

    # -- grammar ------------------------------------------------------------------------------

    def parse(self) -> Expr:
        if self.token.kind == "end":
            raise FilterSyntaxError("The filter is empty", self.text, 0)
        expr = self.or_expr()
        if self.token.kind != "end":
            if self.token.kind == "punct" and self.token.text == ")":
                raise self.error("Unmatched ')'")
            raise self.error(
                f"Unexpected {self.token.describe()} after a complete filter; "
                "combine conditions with AND or OR"
            )
        return expr

    def or_expr(self) -> Expr:
        """``or_expr``, ``and_expr``, ``not_expr`` and parentheses without recursion: one
        frame per open parenthesis on an explicit stack, and each chain of ANDs or ORs
        collected into one node, so neither long chains nor deep parentheses reach Python's
        recursion limit."""
        stack: list[_Group] = []
        group = _Group(None, [])
        while True:
            # An operand: NOTs, then a parenthesized group or a predicate.
            nots: list[Token] = []
            while self.token.is_word("NOT"):
                nots.append(self.advance())
            start = self.token
            if self.accept_punct("("):
                if self.token.kind == "punct" and self.token.text == ")":
                    raise self.error("Expected a condition inside the parentheses")
                stack.append(group)
                group = _Group(start, nots)
                continue
            operand = self.predicate()
            while True:
                group.add(self.negate(operand, nots))
                # After an operand: AND, OR, the end of a group or of the filter.
                if self.accept_word("AND"):
                    break
                if self.accept_word("OR"):
                    self.nested(group.close_and)
                    break
                expr = self.nested(group.finish)
                if group.opened is None:
                    return expr
                self.expect_punct(")", f"to close the '(' opened at position "
                                       f"{group.opened.position}")
                operand, nots = expr, group.outer_nots
                group = stack.pop()

    def nested(self, build: Callable[[], Any]) -> Any:
        try:
            return build()
        except ValidationError as exc:  # nested past MAX_NESTING
            raise self.error(str(exc)) from None

    def negate(self, expr: Expr, nots: list[Token]) -> Expr:
        for token in reversed(nots):
            try:
                expr = Not(expr)
            except ValidationError as exc:
                raise self.error(str(exc), token) from None
        return expr

    def predicate(self) -> Expr:
        start = self.token
        if start.kind == "end":
            raise self.error("Expected a condition")
        left = self.operand("a condition")
        compared = self.tail(left, start)
        if compared is not None:
            return compared
        # No comparison follows: a bare TRUE/FALSE, or a boolean column.
        if isinstance(left, Column):
            return Comparison("=", left, Literal(True))
        if isinstance(left.value, bool):
            return AlwaysTrue() if left.value else AlwaysFalse()
        raise self.error(
            f"Expected a comparison after {start.describe()}, found {self.token.describe()}"
        )

    def tail(self, left: Column | Literal, start: Token) -> Expr | None:
        token = self.token
        if token.kind == "op":
            self.advance()
            op = _NORMALIZED_OP[token.text]
            right_token = self.token
            right = self.operand(f"a value after '{token.text}'")
            return self.comparison(op, left, right, start, right_token)
        negated = False
        if token.is_word("NOT") and self.peek().is_word("IN", "BETWEEN", "LIKE"):
            self.advance()
            negated = True
        if self.token.is_word("IN"):
            expr: Expr = self.in_list(self.require_column(left, start, "IN"))
        elif self.token.is_word("BETWEEN"):
            expr = self.between(left, start)
        elif self.token.is_word("LIKE"):
            expr = self.like(self.require_column(left, start, "LIKE"))
        elif not negated and self.token.is_word("IS"):
            return self.is_null(self.require_column(left, start, "IS NULL"))
        else:
            return None
        return Not(expr) if negated else expr

    def require_column(self, left: Column | Literal, start: Token, what: str) -> Column:
        if not isinstance(left, Column):
            raise self.error(f"Expected a column before {what}, found {start.describe()}", start)
        return left

    def comparison(
        self,
        op: ComparisonOp,
        left: Column | Literal,
        right: Column | Literal,
        left_token: Token,
        right_token: Token,
    ) -> Expr:
        if isinstance(left, Literal) and isinstance(right, Column):
            left, right, op = right, left, SWAPPED_OP[op]
            left_token, right_token = right_token, left_token
        if isinstance(left, Column):
            if isinstance(right, Literal) and right.value is None:
                suggestion = "IS NOT NULL" if op == "!=" else "IS NULL"
                raise self.error(
                    f"Comparing with NULL using '{op}' is never true; use "
                    f"'{left} {suggestion}' instead",
                    right_token,
                )
            return Comparison(op, left, right)
        # Two constants (``1 = 1`` from generated SQL): fold them.
        assert isinstance(right, Literal)
        try:
            result = _fold(op, left.value, right.value)
        except TypeError:
            raise self.error(
                f"Cannot compare {left} with {right}; a comparison needs a column on "
                "at least one side",
                left_token,
            ) from None
        return AlwaysTrue() if result else AlwaysFalse()

    def in_list(self, column: Column) -> Expr:
        in_token = self.advance()
        self.expect_punct("(", "after IN")
        values: list[Any] = []
        while True:
            if self.token.kind == "punct" and self.token.text == ")" and not values:
                raise self.error("Expected at least one value in the IN list")
            values.append(self.value(f"a value in the IN list at position {in_token.position}"))
            if self.accept_punct(")"):
                return In(column, tuple(values))
            if not self.accept_punct(","):
                raise self.error(
                    f"Expected ',' or ')' in the IN list, found {self.token.describe()}"
                )

    def between(self, left: Column | Literal, start: Token) -> Expr:
        between = self.advance()
        lo_token = self.token
        lo = self.operand("a value after BETWEEN")
        if not self.accept_word("AND"):
            raise self.error(
                f"Expected AND to finish the BETWEEN started at position {between.position}; "
                f"found {self.token.describe()}"
            )
        hi_token = self.token
        hi = self.operand("a value after BETWEEN ... AND")
        return And(
            self.comparison(">=", left, lo, start, lo_token),
            self.comparison("<=", left, hi, start, hi_token),
        )

    def like(self, column: Column) -> Expr:
        self.advance()
        token = self.token
        if token.kind != "string":
            raise self.error(f"Expected a quoted pattern after LIKE, found {token.describe()}")
        self.advance()
        chars: list[str] = []
        pattern = token.text
        i = 0
        wildcard_at: int | None = None
        while i < len(pattern):
            ch = pattern[i]
            if ch == "\\" and i + 1 < len(pattern):
                if wildcard_at is not None:
                    break
                chars.append(pattern[i + 1])
                i += 2
                continue
            if ch == "%":
                if wildcard_at is None:
                    wildcard_at = i
            elif ch == "_" or wildcard_at is not None:
                raise self.error(
                    f"Unsupported LIKE pattern {token.describe()}: only prefix patterns such as "
                    "'abc%' are supported ('_' and '%' elsewhere than at the end are not)",
                    token,
                )
            else:
                chars.append(ch)
            i += 1
        if i < len(pattern):  # an escape after the wildcard
            raise self.error(
                f"Unsupported LIKE pattern {token.describe()}: only prefix patterns such as "
                "'abc%' are supported",
                token,
            )
        prefix = "".join(chars)
        if wildcard_at is None:
            return Comparison("=", column, Literal(prefix))
        return StartsWith(column, prefix)

    def is_null(self, column: Column) -> Expr:
        self.advance()
        negated = self.accept_word("NOT") is not None
        if not self.accept_word("NULL"):
            raise self.error(
                f"Expected NULL after IS{' NOT' if negated else ''}, found {self.token.describe()}"
            )
        return IsNotNull(column) if negated else IsNull(column)

    # -- operands -----------------------------------------------------------------------------

    def operand(self, expected: str) -> Column | Literal:
        token = self.token
        if token.kind == "quoted" or (
            token.kind == "name"
            and token.text.upper() not in _KEYWORDS
            and not token.is_word("TRUE", "FALSE")
            and not (_is_typed_literal_word(token) and self.peek().kind == "string")
        ):
            return self.identifier()
        return Literal(self.value(expected))

    def identifier(self) -> Column:
        parts = [self.advance().text]
        while self.token.kind == "punct" and self.token.text == ".":
            dot = self.advance()
            if self.token.kind not in ("name", "quoted"):
                raise self.error(f"Expected a name after the '.' at position {dot.position}")
            parts.append(self.advance().text)
        return Column(".".join(parts))

    def value(self, expected: str) -> Any:
        token = self.token
        if token.kind == "punct" and token.text == "-":
            self.advance()
            if self.token.kind != "number":
                raise self.error(f"Expected a number after '-', found {self.token.describe()}")
            return -_number(self.advance().text)
        if token.kind == "number":
            return _number(self.advance().text)
        if token.kind == "string":
            return self.advance().text
        if token.kind == "hex":
            self.advance()
            try:
                return bytes.fromhex(token.text)
            except ValueError:
                raise self.error(f"Invalid hex literal X'{token.text}'", token) from None
        if token.is_word("TRUE", "FALSE"):
            return self.advance().text.upper() == "TRUE"
        if token.is_word("NULL"):
            self.advance()
            return None
        if _is_typed_literal_word(token) and self.peek().kind == "string":
            return self.typed_literal()
        raise self.error(f"Expected {expected}, found {token.describe()}")

    def typed_literal(self) -> Any:
        word = self.advance().text.upper()
        token = self.advance()
        text = token.text.strip()
        try:
            if word == "DATE":
                return _dt.date.fromisoformat(text)
            if word == "TIMESTAMP":
                return _timestamp(text)
            if word == "TIME":
                return _dt.time.fromisoformat(text)
            if word == "DECIMAL":
                value = Decimal(text)
                if not value.is_finite():
                    raise ValueError("not a finite number")
                return value
            if word == "DOUBLE":
                return float(text)
            if word == "INTERVAL":
                unit = self.accept_word("SECOND", "SECONDS")
                if unit is None:
                    raise self.error("Expected SECOND after the INTERVAL value")
                return _interval(text)
        except (ValueError, InvalidOperation, OverflowError) as exc:
            raise self.error(f"Invalid {word} literal {token.describe()}: {exc}", token) from None
        raise AssertionError(word)  # pragma: no cover - _TYPED_WORDS and the branches agree


# The fraction of seconds in an ISO timestamp (the first one: a UTC offset may follow).
_FRACTION = re.compile(r"(?<=\d)([.,])(\d+)")


def _timestamp(text: str) -> _dt.datetime:
    """An ISO timestamp; up to nine digits of fraction are kept, as a pandas.Timestamp when
    there are nanoseconds (the standard library holds microseconds)."""
    match = _FRACTION.search(text)
    nanos = 0
    if match and len(match.group(2)) > 6:
        digits = match.group(2)
        if len(digits) > 9 and digits[9:].strip("0"):
            raise ValueError("more precise than nanoseconds")
        nanos = int(digits[6:9].ljust(3, "0"))
        text = text[: match.start(2)] + digits[:6] + text[match.end(2):]
    value = _dt.datetime.fromisoformat(text)
    if not nanos:
        return value
    pd = require_pandas("A TIMESTAMP literal with nanoseconds")
    # From integer nanoseconds: pandas refuses to hold the microsecond part alone near the
    # ends of its range (1677 and 2262), where the whole value still fits.
    epoch = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC if value.tzinfo else None)
    total = (value - epoch) // _dt.timedelta(microseconds=1) * 1000 + nanos
    if value.tzinfo is None:
        naive: _dt.datetime = pd.Timestamp(total, unit="ns")
        return naive
    aware: _dt.datetime = pd.Timestamp(total, unit="ns", tz=_dt.UTC).tz_convert(value.tzinfo)
    return aware


def _interval(text: str) -> _dt.timedelta:
    """Decimal seconds as an exact duration: a timedelta, or a pandas.Timedelta when there are
    nanoseconds. Text recorded by older versions (float seconds such as ``'1e-09'``) reads the
    same way; digits past nanoseconds are rounded."""
    seconds = Decimal(text)
    if not seconds.is_finite():
        raise ValueError("not a finite number of seconds")
    nanos = int((seconds * 1_000_000_000).to_integral_value())
    if nanos % 1000 == 0:
        return _dt.timedelta(microseconds=nanos // 1000)
    pd = require_pandas("An INTERVAL literal with nanoseconds")
    duration: _dt.timedelta = pd.Timedelta(nanos, unit="ns")
    return duration


_TYPED_WORDS = frozenset({"DATE", "TIMESTAMP", "TIME", "DECIMAL", "DOUBLE", "INTERVAL"})


def _is_typed_literal_word(token: Token) -> bool:
    # ``date`` is a common column name: DATE is a type prefix only when a string follows.
    return token.kind == "name" and token.text.upper() in _TYPED_WORDS


def _number(text: str) -> int | float:
    if any(c in text for c in ".eE"):
        return float(text)
    return int(text)


def _fold(op: ComparisonOp, left: Any, right: Any) -> bool:
    if left is None or right is None:
        return False  # NULL compares as unknown, which filters out
    numbers = (int, float, Decimal)
    same_kind = (
        (
            isinstance(left, numbers)
            and isinstance(right, numbers)
            and isinstance(left, bool) == isinstance(right, bool)
        )
        or type(left) is type(right)
        # a pandas.Timestamp (nanoseconds) and a datetime, or Timedelta and timedelta
        or all(isinstance(v, _dt.datetime) for v in (left, right))
        or all(isinstance(v, _dt.timedelta) for v in (left, right))
    )
    if not same_kind:
        raise TypeError(f"{type(left).__name__} vs {type(right).__name__}")
    if op == "=":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def parse_filter(text: str) -> Expr:
    """Parse a filter string into an expression tree.

    >>> print(parse_filter("x > 3 AND (name LIKE 'ab%' OR d = DATE '2026-11-01')"))
    x > 3 AND (name LIKE 'ab%' OR d = DATE '2026-11-01')

    Errors raise :class:`~arrowlake.errors.FilterSyntaxError` with the 0-based ``position`` of
    the offending token.
    """
    if not isinstance(text, str):
        raise ValidationError(f"A filter string must be a str, got {type(text).__name__}")
    return _Parser(text).parse()


def to_expression(filter: Expr | str | None) -> Expr:
    """The expression for a filter argument: ``None`` is everything, a string is parsed.

    >>> to_expression(None)
    TRUE
    >>> to_expression("a = 1")
    a = 1
    """
    if filter is None:
        return AlwaysTrue()
    if isinstance(filter, Expr):
        return filter
    if isinstance(filter, str):
        return parse_filter(filter)
    if isinstance(filter, bool):
        return AlwaysTrue() if filter else AlwaysFalse()
    raise ValidationError(
        f"A filter must be an expression (col('x') > 1), a string ('x > 1') or None, "
        f"got {type(filter).__name__}"
    )


def and_all(exprs: Iterable[Expr | str | None]) -> Expr:
    """All filters at once; an empty iterable is :class:`AlwaysTrue`. Strings are parsed.

    >>> print(and_all([col("a") > 1, "b = 2", None]))
    a > 1 AND b = 2
    """
    parts: list[Expr] = []
    for item in exprs:
        expr = to_expression(item)
        if isinstance(expr, AlwaysFalse):
            return expr
        if not isinstance(expr, AlwaysTrue):
            parts.append(expr)
    # One node for the lot (``a & b & ...`` would copy the growing operand list each time).
    return parts[0] if len(parts) == 1 else And(*parts) if parts else AlwaysTrue()


def or_any(exprs: Iterable[Expr | str]) -> Expr:
    """Any of the filters; an empty iterable is :class:`AlwaysFalse`."""
    parts: list[Expr] = []
    for item in exprs:
        expr = to_expression(item)
        if isinstance(expr, AlwaysTrue):
            return expr
        if not isinstance(expr, AlwaysFalse):
            parts.append(expr)
    return parts[0] if len(parts) == 1 else Or(*parts) if parts else AlwaysFalse()
