"""Turn a pydantic ValidationError on a recipe into one line: 'file: field.path: expected …'."""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from qbench.errors import RecipeError, did_you_mean, expected_one_of, short_repr


def recipe_error(path: Path, exc: ValidationError, root: type[BaseModel]) -> RecipeError:
    """Turn pydantic's first error into 'file: field.path: expected …' (with a count of the rest)."""
    errors = exc.errors(include_url=False)
    tags = _model_names(root)
    first = _inside_the_value(errors, tags)
    loc = [part for part in first["loc"] if not _is_type_tag(part, tags)]
    kind = first["type"]
    key_error = "[key]" in loc  # a mapping key of the wrong type: the loc ends with (key, "[key]")
    if key_error:
        loc = loc[: loc.index("[key]") - 1]
    field = _format_loc(loc)
    if key_error:
        key = first["input"]
        message = f"keys are text, got the key {short_repr(key)}{_quote_hint(key, ['string_type'])}"
    elif kind == "extra_forbidden":
        parent = _model_at(root, loc[:-1])
        known = list(parent.model_fields) if parent else []
        message = f"unknown key {short_repr(loc[-1])}{did_you_mean(str(loc[-1]), known)}"
        if known:
            message += f"; expected one of {', '.join(known)}"
    elif kind == "missing":
        message = "required field is missing"
    elif kind == "literal_error":
        expected = first.get("ctx", {}).get("expected", "")
        choices = re.findall(r"'([^']*)'", expected)
        message = expected_one_of(first["input"], choices)
    elif kind == "value_error":
        message = str(first.get("ctx", {}).get("error", first["msg"]))
        message, field = _split_field_prefix(message, field)
    elif kind in _TYPE_MESSAGES:
        kinds = _union_kinds(errors, first, tags)
        message = f"{_expected_types(kinds)}, got {short_repr(first['input'])}{_quote_hint(first['input'], kinds)}"
    else:
        message = f"{first['msg'][0].lower()}{first['msg'][1:]}, got {short_repr(first['input'])}"
    firsts: dict[str, Any] = {}  # each field's first error, in pydantic's order
    for error in errors:
        firsts.setdefault(_field_of(error, tags), error)
    # a union's members share one field, or (_inside_the_value) the other member's is the field around the one reported
    reported = {_field_of(first, tags), _field_of(errors[0], tags)}
    others = [other for other in firsts if other not in reported]
    if others:
        shown = "; ".join(f"{other}: {_in_brief(errors, firsts[other], tags)}" for other in others[:_OTHERS_SHOWN])
        shown += "; ..." if len(others) > _OTHERS_SHOWN else ""
        message += f" (and {len(others)} more problem{'s' if len(others) > 1 else ''}: {shown})"
    return RecipeError(path, field, message)


def _in_brief(errors: list[Any], error: Any, tags: set[str]) -> str:
    """What is wrong at a further problem's field, in a few words: the line named the field alone ('and 1 more
    problem: at foo'), where an unknown key, a missing field and a wrong type each want another edit."""
    kind = error["type"]
    if kind in _TYPE_MESSAGES:
        return _expected_types(_union_kinds(errors, error, tags))
    brief = {"extra_forbidden": "unknown key", "missing": "required field is missing",
             "literal_error": "not one of the values it takes"}.get(kind)  # fmt: skip
    if brief is None and kind != "value_error":  # pydantic's own constraint messages are short ('input should be ...')
        brief = f"{error['msg'][0].lower()}{error['msg'][1:]}"
    return brief or "not a value it takes"


def _plain_loc(error: Any, tags: set[str]) -> list[Any]:
    return [p for p in error["loc"] if not _is_type_tag(p, tags) and p != "[key]"]


def _field_of(error: Any, tags: set[str]) -> str:
    return _format_loc(_plain_loc(error, tags)) or "the recipe"


def _inside_the_value(errors: list[Any], tags: set[str]) -> Any:
    """The error to report. A value no member of a union (`str | list[str]`) takes gets one error per member, the
    first member's first: a list of a name and a number given to `data.label` reads 'expected a string' at
    data.label, while what is wrong lies inside the list, at data.label[1]. An error inside the value (its field
    extends the first error's, a type error) comes from the member that takes the value's kind: it is the one
    that says what to change."""
    first = errors[0]
    if first["type"] not in _TYPE_MESSAGES:
        return first
    outer = _plain_loc(first, tags)
    inner = [e for e in errors if len(loc := _plain_loc(e, tags)) > len(outer) and loc[: len(outer)] == outer]
    return inner[0] if inner else first


def _expected_types(kinds: list[str]) -> str:
    """'expected a string or a whole number': what the members of a union (or a plain type) take."""
    return "expected " + " or ".join(dict.fromkeys(_TYPE_MESSAGES[k].removeprefix("expected ") for k in kinds))


def _union_kinds(errors: list[Any], first: Any, tags: set[str]) -> list[str]:
    """The type errors pydantic gives for each member of a union (`str | int`) at the first error's field: together
    they say what the field takes ('expected a string or a whole number'), not only the first member."""
    field = _field_of(first, tags)
    return [e["type"] for e in errors if e["type"] in _TYPE_MESSAGES and _field_of(e, tags) == field]


_OTHERS_SHOWN = 4  # fields of further problems named in the one line (each fix otherwise needs another run)


_MAPPING = "expected a mapping (key: value, ...)"
_TYPE_MESSAGES = {
    "dict_type": _MAPPING,
    "model_type": _MAPPING,
    "model_attributes_type": _MAPPING,
    "list_type": "expected a list ([a, b, ...])",
    "string_type": "expected a string",
    "int_type": "expected a whole number",
    "float_type": "expected a number",
    "bool_type": "expected true or false",
    "path_type": "expected a path (a string)",
}
_PLAIN_TYPES = {"str", "int", "float", "bool", "none"}


_TEXT_KINDS = {"string_type", "path_type"}


def _quote_hint(value: Any, kinds: list[str]) -> str:
    """YAML reads 2024-01-01 as a date, no/yes/off/on as false/true and 13 or 12:30 as numbers: a class named no
    or an output named 13 (as PyTorch's exporter numbers them) arrives as another type; say how to keep it text.
    A key with nothing after it is null: say so, rather than Python's None alone."""
    if value is None:  # `gate:` with every entry under it commented out, or with nothing after it
        return " (YAML's null: a key with nothing after it, or whose entries are all commented out)"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return " (quote it to keep it text)"
    if not _TEXT_KINDS & set(kinds):
        return ""
    if isinstance(value, bool):
        return (" (YAML reads unquoted yes/no/on/off/true/false as true or false: quote text such as "
                f"'{'yes' if value else 'no'}')")
    if isinstance(value, (int, float)):
        return f" (YAML reads it as a number: quote it, '{value}', to keep it text)"
    return ""


def _is_type_tag(part: Any, model_names: set[str]) -> bool:
    """pydantic puts the tried union member into the loc ('str', 'TextInputSpec', 'list[int]'): not a field."""
    if not isinstance(part, str):
        return False
    return part in _PLAIN_TYPES or part in model_names or part.endswith("]") and "[" in part and part != "[key]"


def _model_names(root: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    pending: list[type[BaseModel]] = [root]
    while pending:
        model = pending.pop()
        if model.__name__ in names:
            continue
        names.add(model.__name__)
        for field in model.model_fields.values():
            pending += _all_models(field.annotation)
    return names


def _all_models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in getattr(annotation, "__args__", ()) or () for m in _all_models(arg)]


def _split_field_prefix(message: str, field: str) -> tuple[str, str]:
    """Model-level validators prefix their message with a field path ('gate.metric: …'); move it into the field."""
    match = re.match(r"^([a-z_]+(?:\[\d+\])?(?:\.[a-z_]+(?:\[\d+\])?)*): (.*)$", message, flags=re.S)
    if match:
        sub, rest = match.groups()
        return rest, f"{field}.{sub}" if field else sub
    return message, field


def _format_loc(loc: list[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(("function-after", "function-before")):
            continue
        else:
            out += f".{part}" if out else str(part)
    return out


def _model_at(model: type[BaseModel], loc: list[Any]) -> type[BaseModel] | None:
    """The pydantic model class that sits at `loc` inside `model` (for 'expected one of' key lists)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if isinstance(current, type) and issubclass(current, BaseModel) else None
        if field is None:
            return None
        current = _inner_model(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _inner_model(annotation: Any) -> Any:
    """Unwrap list[X] / X | None to the BaseModel X, if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
