"""One rule for every object of results.json: only the fields of the dataclass it is read as, each holding a value
of the type the dataclass gives it.

qbench writes each section from its dataclass's fields and nothing else, so a key this qbench does not
know was written by another qbench (a newer one, say, recording a figure that changes the verdict) or
added by hand. The gate fails closed: such results are refused with the field named (and, by
`read_results`, the qbench version that wrote them), never judged with the field silently dropped.

The same holds for the figures themselves, the ones no verdict rests on included (intervals, drops, costs, load
simulations, range analysis): each numeric field is checked against the dataclass's type hint (a float is a number
or null, which is how NaN is written; an int is a whole number >= 0: every int qbench records is a count, a size, a
seed or an index), so a hand-edited or corrupted figure is one error naming its path, never a string rendered as a
number in a report.

Each key once: qbench writes every object from a dataclass, so no key twice; a file naming one twice (a hand merge,
another tool's output) has two values for it, of which Python's parser keeps the last and others the first (a
`"complete": false` above a `"complete": true` read as complete; an `"agreement": 0.2` above a 1.0 as 1.0), so such a
file is refused naming where (`unique_json`), never judged by the value one parser happens to keep.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from collections.abc import Callable
from typing import Any

from qbench.errors import QbenchError, did_you_mean, short_repr


def known_fields(raw: Any, cls: type, where: str, *, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """`raw`, the JSON object at `where` read as `cls`, once it holds no key but `cls`'s fields (and `extra`) and
    every numeric field holds a value of its type."""
    if not isinstance(raw, dict):
        raise QbenchError(f"{where}: got {type(raw).__name__}, expected a JSON object")
    names = [f.name for f in dataclasses.fields(cls)] + list(extra)
    unknown = [key for key in raw if key not in names]
    if unknown:
        key = str(unknown[0])
        raise QbenchError(f"{where}: unknown field {short_repr(key)}{did_you_mean(key, names)}: this qbench does not "
                          "know it, and judges no results it would read without it")  # fmt: skip
    hints = _hints(cls)
    for name, value in raw.items():
        if name in hints:
            _check(value, hints[name], f"{where}.{name}")
    return raw


def unique_json(text: str, *, parse_constant: Callable[[str], Any] | None = None) -> Any:
    """`text` parsed as JSON, once no object in it names a key twice; a QbenchError naming the first such object's
    path ('variants[1].accuracy.overall.metrics') and the key otherwise."""
    repeated: dict[int, str] = {}  # id of each object naming a key twice -> that key

    def pairs_to_dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        parsed = dict(pairs)
        if len(parsed) < len(pairs):
            keys = [key for key, _ in pairs]
            repeated[id(parsed)] = next(key for index, key in enumerate(keys) if key in keys[:index])
        return parsed

    raw = json.loads(text, object_pairs_hook=pairs_to_dict, parse_constant=parse_constant, parse_float=_finite)
    found = _first_repeated(raw, repeated, "") if repeated else None
    if found is not None:
        where, key = found
        raise QbenchError(f"{where or 'results'}: the key {short_repr(key)} is given twice, which qbench never "
                          "writes; expected each key once (JSON readers disagree on which value counts)")  # fmt: skip
    return raw


def _finite(text: str) -> float:
    """A JSON number as a float, refused where it is beyond a float's range (1e400 reads as inf, which qbench writes as
    null): the digest check failed on it with 'Out of range float values are not JSON compliant'."""
    value = float(text)
    if not math.isfinite(value):
        raise QbenchError(f"holds the number {short_repr(text)}, beyond a float's range, which qbench never writes "
                          "(non-finite values are written as null)")  # fmt: skip
    return value


def _first_repeated(value: Any, repeated: dict[int, str], where: str) -> tuple[str, str] | None:
    """(path, key) of the first object in `value` (found at `where`, '' for the whole file), in the file's order, that
    `repeated` names; None if none does."""
    if isinstance(value, dict):
        if id(value) in repeated:
            return where, repeated[id(value)]
        items = ((f"{where}.{key}" if where else key, item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{where}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    return next((found for path, item in items if (found := _first_repeated(item, repeated, path))), None)


# The params the gate and the report read, by key, with the type each must hold: `params` is free-form (every builder
# and backend records its own), but a value of the wrong type here would be misread, not refused (a count of integer
# kernels written as "0" is no 0: the gate would not say that the variant computes in FP32).
READ_PARAMS: dict[str, Any] = {
    "quantized_nodes": int, "quantized_linears": int, "runtime.lowered_ops": int,  # variants.base.lowered_nothing
    "contractions": int, "lowered_contractions": int, "fp32_predictors": int,  # variants.fp16.partly_lowered
    # variants.fp16.computed_after: the gate's note on arithmetic after them
    "lowered_after_predictors": dict[str, int],
    "integer_kernels_of": str, "identical_to": str, "search.chosen_on": str,  # the gate's "computes in FP32" and
    "runtime.kernels": str, "runtime.graph_optimization_level": str,  # selection notes; the report's kernels, options
    "one_class_outputs": list[str],  # the gate's note on FP32 deciding one class (gate_notes.one_class_reference)
    "shared_cosines": dict[str, float],  # the gate's note on a cosine tolerance confused rows keep within
}  # fmt: skip


def checked_params(raw: Any, where: str) -> dict[str, Any]:
    """`raw`, a result's params at `where`, once it is a JSON object and each of READ_PARAMS it holds has its type."""
    if not isinstance(raw, dict):
        raise QbenchError(f"{where}: got {short_repr(raw)}, expected a JSON object")
    for key, hint in READ_PARAMS.items():
        if key not in raw:
            continue
        if hint is str and not isinstance(raw[key], str):
            raise QbenchError(f"{where}.{key}: got {short_repr(raw[key])}, expected a string")
        if hint == list[str] and not (isinstance(raw[key], list) and all(isinstance(v, str) for v in raw[key])):
            raise QbenchError(f"{where}.{key}: got {short_repr(raw[key])}, expected a list of strings")
        _check(raw[key], hint, f"{where}.{key}")
    return raw


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


@functools.cache
def _numeric(hint: Any) -> bool:
    """Whether `hint` holds an int or float anywhere (a bool is no number; a nested dataclass checks itself)."""
    return hint in (int, float) or any(_numeric(arg) for arg in typing.get_args(hint) if arg is not Ellipsis)


def _check(value: Any, hint: Any, where: str) -> None:
    """Raise naming `where` unless `value` fits the numeric parts of `hint`; other parts are not checked here."""
    if not _numeric(hint):
        return
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is float:
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise QbenchError(f"{where}: got {short_repr(value)}, expected a number or null")
    elif hint is int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise QbenchError(f"{where}: got {short_repr(value)}, expected a whole number >= 0")
    elif origin in (typing.Union, types.UnionType):
        if value is not None or type(None) not in args:
            options = [arg for arg in args if arg is not type(None)]
            if len(options) == 1:
                _check(value, options[0], where)
    elif origin is dict:
        if not isinstance(value, dict):
            raise QbenchError(f"{where}: got {short_repr(value)}, expected a JSON object")
        for key, item in value.items():
            _check(item, args[1], f"{where}.{key}")
    elif origin in (tuple, list):
        if not isinstance(value, list):
            raise QbenchError(f"{where}: got {short_repr(value)}, expected a list")
        each = [args[0]] * len(value) if origin is list or args[-1] is Ellipsis else list(args)
        if len(each) != len(value):
            raise QbenchError(f"{where}: got {len(value)} values, expected {len(each)}")
        for i, (item, item_hint) in enumerate(zip(value, each, strict=True)):
            _check(item, item_hint, f"{where}[{i}]")
