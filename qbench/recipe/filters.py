"""The schema of a declarative row filter (evaluated later by `qbench.data.filters`, never as code).

A filter maps a column to a single value (equality) or to `{op: value}`; every
mistake a type checker cannot see is caught here, at load time: a list where one
value is meant, an empty filter or condition, `ne` / `eq` with a list, a
comparison with a boolean or NaN, an empty `in` list. A date YAML reads from an unquoted
`2024-01-31` is taken as the text it was written as (a date column compares with it).
"""

from __future__ import annotations

import datetime
import math
from typing import Any

from qbench.errors import expected_one_of, short_repr

FILTER_OPS = ("eq", "ne", "in", "not_in", "lt", "le", "gt", "ge")
_MEANINGS = {"eq": "equal to", "ne": "not equal to", "in": "one of a list", "not_in": "none of a list",
             "lt": "less than", "le": "less than or equal to", "gt": "greater than", "ge": "greater than or equal to"}
_OTHER_SPELLINGS = {
    "ge": ("gte", "geq", ">="), "le": ("lte", "leq", "<="), "gt": (">",), "lt": ("<",),
    "eq": ("=", "==", "equals", "is"), "ne": ("neq", "!=", "<>", "not", "is_not", "not_eq"),
    "in": ("isin", "in_", "one_of"), "not_in": ("nin", "notin", "not in", "not_isin", "none_of"),
}
"""The operators of other query languages (MongoDB's $gte and $nin, Django's __lte, SQL's <>, pandas' isin) by the
op they mean here. Their spelling misleads a guess by closeness: 'gte' is closest to 'gt', which leaves out the bound,
and 'nin' to 'in', its opposite; the error names the op they mean instead."""
_SAME_AS = {spelling: op for op, spellings in _OTHER_SPELLINGS.items() for spelling in (op, *spellings)}


def check_filter(value: Any) -> dict[str, Any]:
    """A filter maps a column to a value (equality) or to {op: value} with ops from FILTER_OPS."""
    if not isinstance(value, dict) or not value:
        raise ValueError(f"expected a non-empty mapping of column -> value or {{op: value}}, got {short_repr(value)}")
    checked: dict[str, Any] = {}
    for column, condition in value.items():
        if not isinstance(column, str):
            raise ValueError(f"column names are strings, got {short_repr(column)}")
        if isinstance(condition, dict):
            if not condition:
                raise ValueError(f"column {short_repr(column)}: expected {{op: "
                                 "value} with an op, got an empty mapping")
            checked[column] = {op: _as_written(operand) for op, operand in condition.items()}
            for op, operand in checked[column].items():
                _check_operand(column, op, operand)
        elif isinstance(condition, list):
            raise ValueError(f"column {short_repr(column)}: use {{in: [...]}} to match a list of values")
        else:
            checked[column] = _as_written(condition)
            _check_operand(column, "eq", checked[column])
    return checked


def _as_written(operand: Any) -> Any:
    """YAML reads an unquoted 2024-01-31 (or 2024-01-31 12:30:00) as a date: the text it was written as."""
    if isinstance(operand, list):
        return [_as_written(item) for item in operand]
    if isinstance(operand, datetime.datetime):
        return operand.isoformat(sep=" ")
    if isinstance(operand, datetime.date):
        return operand.isoformat()
    return operand


def _check_operand(column: str, op: Any, operand: Any) -> None:
    where = f"column {short_repr(column)}"
    if op not in FILTER_OPS:
        raise ValueError(f"{where}: operator {expected_one_of(op, FILTER_OPS, hint=_same_op_hint(op))}")
    if op in ("in", "not_in"):
        if not isinstance(operand, list) or not operand:
            raise ValueError(f"{where}: {op!r} expects a non-empty list of values, got {short_repr(operand)}")
        for item in operand:
            _check_scalar(where, op, item)
    elif op in ("lt", "le", "gt", "ge"):
        number = isinstance(operand, (int, float)) and not isinstance(operand, bool) and math.isfinite(operand)
        if not number and not (isinstance(operand, str) and operand.strip()):
            raise ValueError(f"{where}: {op!r} expects a finite number, or a date or time written as text "
                             f"('2024-01-31'), got {short_repr(operand)}")  # fmt: skip
    else:
        _check_scalar(where, op, operand)


def _same_op_hint(op: Any) -> str | None:
    """'$gte' / 'GTE' / '__gte' -> "'$gte' is written 'ge' here: greater than or equal to" ('$in', 'GT' too); None for
    an op that is no other language's (a typo, left to the guess by spelling)."""
    if not isinstance(op, str):
        return None
    same = _SAME_AS.get(op.strip().lstrip("$_").lower())
    return None if same is None else f"{op!r} is written {same!r} here: {_MEANINGS[same]}"


def _check_scalar(where: str, op: str, operand: Any) -> None:
    """eq / ne / list items compare one cell value: a string, number, boolean or null (never NaN)."""
    if operand is not None and not isinstance(operand, (str, int, float, bool)):
        hint = " (use in / not_in for several values)" if isinstance(operand, list) and op in ("eq", "ne") else ""
        raise ValueError(f"{where}: {op!r} expects a single value, got {short_repr(operand)}{hint}")
    if isinstance(operand, float) and math.isnan(operand):
        raise ValueError(f"{where}: {op!r} with NaN matches nothing; use null to match missing cells")
