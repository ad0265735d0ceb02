"""The schema of a declarative row filter (evaluated later by `qbench.data.filters`, never as code).

A filter maps a column to a single value (equality) or to `{op: value}`; every
mistake a type checker cannot see is caught here, at load time: a list where one
value is meant, an empty filter or condition, `ne` / `eq` with a list, a
comparison with text, a boolean or NaN, an empty `in` list.
"""

from __future__ import annotations

import math
from typing import Any

from qbench.errors import expected_one_of, short_repr

FILTER_OPS = ("eq", "ne", "in", "not_in", "lt", "le", "gt", "ge")


def check_filter(value: Any) -> dict[str, Any]:
    """A filter maps a column to a value (equality) or to {op: value} with ops from FILTER_OPS."""
    if not isinstance(value, dict) or not value:
        raise ValueError(f"expected a non-empty mapping of column -> value or {{op: value}}, got {short_repr(value)}")
    for column, condition in value.items():
        if not isinstance(column, str):
            raise ValueError(f"column names are strings, got {short_repr(column)}")
        if isinstance(condition, dict):
            if not condition:
                raise ValueError(f"column {short_repr(column)}: expected {{op: value}} with an op, got an empty mapping")
            for op, operand in condition.items():
                _check_operand(column, op, operand)
        elif isinstance(condition, list):
            raise ValueError(f"column {short_repr(column)}: use {{in: [...]}} to match a list of values")
        else:
            _check_operand(column, "eq", condition)
    return value


def _check_operand(column: str, op: Any, operand: Any) -> None:
    where = f"column {short_repr(column)}"
    if op not in FILTER_OPS:
        raise ValueError(f"{where}: operator {expected_one_of(op, FILTER_OPS)}")
    if op in ("in", "not_in"):
        if not isinstance(operand, list) or not operand:
            raise ValueError(f"{where}: {op!r} expects a non-empty list of values, got {short_repr(operand)}")
        for item in operand:
            _check_scalar(where, op, item)
    elif op in ("lt", "le", "gt", "ge"):
        if isinstance(operand, bool) or not isinstance(operand, (int, float)) or not math.isfinite(operand):
            raise ValueError(f"{where}: {op!r} expects a finite number, got {short_repr(operand)}")
    else:
        _check_scalar(where, op, operand)


def _check_scalar(where: str, op: str, operand: Any) -> None:
    """eq / ne / list items compare one cell value: a string, number, boolean or null (never NaN)."""
    if operand is not None and not isinstance(operand, (str, int, float, bool)):
        hint = " (use in / not_in for several values)" if isinstance(operand, list) and op in ("eq", "ne") else ""
        raise ValueError(f"{where}: {op!r} expects a single value, got {short_repr(operand)}{hint}")
    if isinstance(operand, float) and math.isnan(operand):
        raise ValueError(f"{where}: {op!r} with NaN matches nothing; use null to match missing cells")
